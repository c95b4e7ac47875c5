"""One declaration per node: V1 classes outside ComfyUI (and in the headless runner), V3 schemas built
from them inside a ComfyUI that has comfy_api.latest (checked against a real ComfyUI when
COMFYUI_DIR and COMFYUI_PYTHON name one)."""
from __future__ import annotations

from helpers import IN_COMFYUI, run_in_comfyui


def test_without_comfyui_the_v1_classes_are_registered(pack):
    from vaekit.nodes import NODE_CLASS_MAPPINGS as v1
    from vaekit.nodes.v3 import comfy_io
    assert comfy_io() is None
    assert pack.NODE_CLASS_MAPPINGS == v1


@IN_COMFYUI
def test_v3_nodes_in_comfyui_match_their_v1_declarations():
    assert run_in_comfyui("check_v3.py").count("same inputs and outputs as V1") == 5
