"""One declaration per node: V1 classes outside ComfyUI (and in the headless runner), V3 schemas built
from them inside a ComfyUI that has comfy_api.latest (checked against a real ComfyUI when
COMFYUI_DIR and COMFYUI_PYTHON name one)."""
from __future__ import annotations

import os
import subprocess

import pytest

from helpers import ROOT


def test_without_comfyui_the_v1_classes_are_registered(pack):
    from vaekit.nodes import NODE_CLASS_MAPPINGS as v1
    from vaekit.nodes.v3 import comfy_io
    assert comfy_io() is None
    assert pack.NODE_CLASS_MAPPINGS == v1


@pytest.mark.skipif(not (os.environ.get("COMFYUI_DIR") and os.environ.get("COMFYUI_PYTHON")),
                    reason="set COMFYUI_DIR and COMFYUI_PYTHON to check the V3 nodes in a real ComfyUI")
def test_v3_nodes_in_comfyui_match_their_v1_declarations():
    proc = subprocess.run([os.environ["COMFYUI_PYTHON"], str(ROOT / "bench" / "comfyui_checks" / "check_v3.py")],
                          capture_output=True, text=True, timeout=600, cwd=os.environ["COMFYUI_DIR"])
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.count("same inputs and outputs as V1") == 5
