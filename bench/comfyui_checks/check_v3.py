"""The nodes as ComfyUI builds them (V3 ``io.ComfyNode`` where ``comfy_api.latest`` exists) against the
V1 declarations they are made from: same inputs in the same order with the same options, same outputs,
and the same results when ComfyUI's V3 ``execute`` runs a tiled encode and decode of the demo image.

    COMFYUI_DIR=PATH/TO/ComfyUI PATH/TO/ComfyUI/venv/bin/python bench/comfyui_checks/check_v3.py

Prints one line per node and exits 1 on any difference (tests/nodes/test_v3.py runs it when
COMFYUI_DIR and COMFYUI_PYTHON are set)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core
from check_core_nodes import _pack      # the repository imported as ComfyUI imports a custom node folder

ROOT = Path(__file__).resolve().parents[2]


def _normal(spec: dict) -> list:
    """(section, name, type, options) with combos as V1 writes them (a list of choices)."""
    out = []
    for section in ("required", "optional"):
        for name, decl in spec.get(section, {}).items():
            kind, opts = decl[0], dict(decl[1]) if len(decl) > 1 else {}
            if kind == "COMBO":
                kind = opts.pop("options")
                opts.pop("multiselect", None)
            if opts.get("multiline") is False:      # V3 strings state the frontend's default
                del opts["multiline"]
            out.append((section, name, kind, opts))
    return out


def main() -> int:
    comfy_core.start(os.environ["COMFYUI_DIR"])
    pack = _pack()
    import torch
    from comfy_api.latest import io
    from vaekit.nodes import NODE_CLASS_MAPPINGS as v1
    bad = 0
    for name, node in pack.NODE_CLASS_MAPPINGS.items():
        same = (issubclass(node, io.ComfyNode) and _normal(node.INPUT_TYPES()) == _normal(v1[name].INPUT_TYPES())
                and tuple(node.RETURN_TYPES) == tuple(v1[name].RETURN_TYPES))
        bad += not same
        print(f"{name:<24} V3 {'same inputs and outputs as V1' if same else 'DIFFERS from V1'}")
    from vaekit.vae.files.imageio import read_image
    vae = pack.vae.load(ROOT / "vae" / "demo" / "vaekit_demo.safetensors")
    image = read_image(ROOT / "vae" / "demo" / "vaekit_sample.png")[None, :256, :256]
    opts = dict(tile_size=128, overlap=32)
    with torch.inference_mode():
        z3 = pack.NODE_CLASS_MAPPINGS["VAEKitTiledEncode"].execute(pixels=image, vae=vae, **opts).result[0]
        x3 = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"].execute(samples=z3, vae=vae, **opts).result[0]
        z1 = v1["VAEKitTiledEncode"]().encode(image, vae, **opts)[0]
        x1 = v1["VAEKitTiledDecode"]().decode(z1, vae, **opts)[0]
        compiled = pack.NODE_CLASS_MAPPINGS["VAEKitCompile"].execute(
            vae=vae, compile_encoder=True, compile_decoder=True, backend="eager", mode="default", dynamic="auto",
            fuse_qkv=False)
        # one untiled pass each (a compiled handle cuts fast tiles on a fixed-size plan of its own)
        whole = dict(tile_size=512, overlap=64)
        xc = v1["VAEKitTiledDecode"]().decode(z1, compiled.result[0], **whole)[0]
        xe = v1["VAEKitTiledDecode"]().decode(z1, vae, **whole)[0]
    err = max((z3["samples"] - z1["samples"]).abs().max().item(), (x3 - x1).abs().max().item())
    print(f"V3 Compile VAE (eager) -> a VAE whose untiled decode differs by {(xc - xe).abs().max().item():.1e}; "
          f"its report: {compiled.ui}")
    bad += (xc - xe).abs().max().item() > 1e-5 or not compiled.ui
    bad += err != 0
    print(f"V3 execute vs V1 call, tiled encode + decode 256 px: max abs {err:.1e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
