"""The UI workflows in ComfyUI's real frontend (headless Chromium): loaded with no unknown node, no
flagged node and no rejected widget value, queued from the page to success, and an unchanged re-queue
served from ComfyUI's cache; our nodes in /object_info the same as their V1 declarations. Runs
bench/comfyui_checks/browser_check.py; skipped unless a browser, its driver, selenium and a ComfyUI (COMFYUI_DIR,
COMFYUI_PYTHON) are here. All workflows: run the script itself (or bench/comfyui_checks/check_comfyui.py)."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

READY = (shutil.which("chromium") or shutil.which("google-chrome")) and shutil.which("chromedriver") \
    and importlib.util.find_spec("selenium") and os.environ.get("COMFYUI_DIR") and os.environ.get("COMFYUI_PYTHON")


@pytest.mark.browser
@pytest.mark.skipif(not READY, reason="needs chromium, chromedriver, selenium, COMFYUI_DIR and COMFYUI_PYTHON")
def test_workflows_in_the_real_frontend():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "comfyui_checks" / "browser_check.py"),
                           "--comfyui", os.environ["COMFYUI_DIR"], "--python", os.environ["COMFYUI_PYTHON"],
                           "--only", "image_tiled_roundtrip,image_qwen_roundtrip,video_framewise_decode_wan"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT / "bench" / "comfyui_checks")
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    # each graph: loaded, ran, and its unchanged re-queue served wholly from the cache (n/n nodes)
    rows = re.findall(r"^(\S+)\s+yes\s+yes\s+[\d.]+\s+(\d+)/(\d+)\s", proc.stdout, re.M)
    assert len(rows) == 3 and all(c == n for _, c, n in rows), proc.stdout
    assert proc.stdout.count("same as V1") == 5
