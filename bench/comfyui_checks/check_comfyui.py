"""The pack in a given ComfyUI: its versions, then the two checks that need it.

    python bench/comfyui_checks/check_comfyui.py --comfyui PATH/TO/ComfyUI --python PATH/TO/venv/bin/python
    python bench/comfyui_checks/check_comfyui.py ... --skip-core-nodes          # server + frontend part only
    python bench/comfyui_checks/check_comfyui.py ... --only image_tiled_roundtrip --families wan

1. ``browser_check.py``: a server with the pack linked into a temporary base directory's custom_nodes
   and its pinned frontend in headless Chromium; our nodes in /object_info (V3 schemas) against their V1
   declarations; every UI workflow loaded with ``app.loadGraphData``, queued to success and queued again
   unchanged to be served from the cache (loaded / ran / cached, seconds).
2. ``check_core_nodes.py``: our VAE in the core's own family nodes against core's VAE on the same file
   (max abs difference per output), and what core's memory manager is told about each.
This python needs torch, diffusers and selenium (the weights are written here); ``--python`` is
ComfyUI's. Exit status 1 when the browser part fails (the node comparison prints, it does not judge).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def versions(comfyui: Path, python: str) -> str:
    def run(cmd, cwd=None):
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
        return p.stdout.strip() if p.returncode == 0 else "?"
    commit = run(["git", "rev-parse", "HEAD"], cwd=comfyui)
    date = run(["git", "log", "-1", "--format=%cs"], cwd=comfyui)
    probe = ("import importlib.metadata as m, sys, torch; sys.path.insert(0, '.'); from comfyui_version import "
             "__version__ as v\ndef get(n):\n  try: return m.version(n)\n  except Exception: return 'absent'\n"
             "print(v, get('comfyui-frontend-package'), torch.__version__, sys.version.split()[0])")
    core, frontend, torch_v, py = (run([python, "-c", probe], cwd=comfyui).split() + ["?"] * 4)[:4]
    return (f"ComfyUI {core} at {commit[:8]} ({date}), frontend package {frontend}, torch {torch_v}, "
            f"Python {py}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True, help="ComfyUI source directory (with main.py)")
    p.add_argument("--python", required=True, help="ComfyUI's python (its venv)")
    p.add_argument("--port", type=int, default=8190)
    p.add_argument("--only", help="UI workflows (comma list, without .json); default: all")
    p.add_argument("--families", help="core-node families (comma list); default: all of check_core_nodes.py")
    p.add_argument("--skip-browser", action="store_true")
    p.add_argument("--skip-core-nodes", action="store_true")
    a = p.parse_args()
    comfyui = Path(a.comfyui).resolve()
    print(versions(comfyui, a.python), flush=True)
    rc = 0
    if not a.skip_browser:
        cmd = [sys.executable, str(HERE / "browser_check.py"), "--comfyui", str(comfyui), "--python", a.python,
               "--port", str(a.port)] + (["--only", a.only] if a.only else [])
        rc = subprocess.run(cmd, cwd=HERE).returncode
    if not a.skip_core_nodes:
        print(flush=True)
        cmd = [sys.executable, str(HERE / "check_core_nodes.py"), "--comfyui", str(comfyui), "--python", a.python] \
            + (["--families", a.families] if a.families else [])
        subprocess.run(cmd, cwd=HERE)
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
