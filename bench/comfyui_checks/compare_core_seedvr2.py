"""SeedVR2's VAE through VAEKit beside ComfyUI core's own (`comfy.sd.VAE`, `comfy/ldm/seedvr/vae.py`) on
the same file: parity of decode and encode (one frame and a clip), core's chunked definition against
one pass, and the official templates' tiled nodes (VAE Decode / Encode (Tiled), 512 px, 128 overlap).

    python bench/comfyui_checks/compare_core_seedvr2.py --comfyui PATH/TO/ComfyUI --python PATH/TO/ComfyUI/venv/bin/python
    python bench/comfyui_checks/compare_core_seedvr2.py ... --skip-tiles        # parity only (a minute)

diffusers has no SeedVR2 class, so the weights are ours: the published config (widths 128/256/512/512,
2 resnets a level, temporal levels 1 and 2, 16 latent channels; core hard-codes it) with random weights
under a fixed seed (GroupNorm affines jittered), written in core's layout (the original's names,
`seedvr2_layout.to_original`) and loaded by both sides from that one file. Core runs in a subprocess
under `--python` (CPU, fp32; this file in --worker mode), ours in this process. Nothing is asserted.

Rows (max / mean abs difference; pixels 0..1 for decode, LATENTs for encode):
- `decode t=..`, `encode T=..`: ours (VAE.decode / VAE.encode, streamed in the model's own chunks)
  against core's VAE Decode / VAE Encode. `encode T=11`: core encodes all 11 frames (its causal encoder
  ignores the 2 past the last group of 4); ours takes the first 9, as our nodes and core's VAE Encode of
  other video VAEs do.
- `core chunks vs one pass`: core's model with its slicing and 0.5 GiB splits (its definition) against
  the same model with both off.
- `tiles ...` (one 640x640 frame): core's tiled path (what the SeedVR2 templates run: the model's own
  256..512 px tiler, cosine blends) and ours in fast mode (blended tiles) and exact mode, each against
  core's untiled result.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core

ROOT = Path(__file__).resolve().parents[2]
SEED = 0
PUBLISHED = dict(widths=(128, 256, 512, 512), layers_per_block=2, temporal=(False, True, True))
# name -> (op, shape): decode latents [1, 16, t, h, w]; encode clips [1, 3, T, H, W] in 0..1
CASES = {"decode_t1": ("decode", (1, 16, 1, 8, 8)), "decode_t5": ("decode", (1, 16, 5, 8, 8)),
         "encode_T1": ("encode", (1, 3, 1, 64, 64)), "encode_T17": ("encode", (1, 3, 17, 64, 64)),
         "encode_T11": ("encode", (1, 3, 11, 64, 64))}
TILES = {"tiles_decode": ("decode", (1, 16, 1, 80, 80)), "tiles_encode": ("encode", (1, 3, 1, 640, 640))}
TEMPLATE = dict(tile=512, overlap=128, temporal=64, temporal_overlap=8)   # the templates' tiled nodes


def published_weights(seed: int = SEED) -> dict:
    """Random weights at the published config, in core's layout (the original's names)."""
    sys.path.insert(0, str(ROOT))
    from vae.archs import seedvr2, seedvr2_layout
    torch.manual_seed(seed)
    model = seedvr2.SeedVR2VAE(seedvr2.SeedVR2Config(**PUBLISHED)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return {k: v.contiguous() for k, v in seedvr2_layout.to_original(model.state_dict()).items()}


def worker(a) -> None:
    """Core's side: every case through comfy.sd.VAE (and the tiled node calls), results saved."""
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(a.threads)
    d = Path(a.worker)
    sd = load_file(d / "weights.safetensors")
    v = comfy_core.vae(a.comfyui, sd)
    keys = set(v.first_stage_model.state_dict())
    inputs = load_file(d / "inputs.safetensors")
    image = lambda x: x[0].movedim(0, -1)                   # [1, 3, T, H, W] -> IMAGE batch [T, H, W, 3]
    clip = lambda y: y.movedim(-1, 1)                      # core's [B, T, H, W, 3] -> [B, 3, T, H, W]
    t = TEMPLATE
    out = {}
    with torch.inference_mode():
        for k, x in inputs.items():
            if k.startswith("decode") or k == "tiles_decode":
                out[k] = clip(v.decode(x))
            else:
                out[k] = v.encode(image(x))
            if k == "tiles_decode":       # VAE Decode (Tiled) 512/128 px: latent units, as the node passes them
                out[k + "_tiled"] = clip(v.decode_tiled(x, tile_x=t["tile"] // 8, tile_y=t["tile"] // 8,
                                                        overlap=t["overlap"] // 8, tile_t=t["temporal"] // 4,
                                                        overlap_t=t["temporal_overlap"] // 4))
            if k == "tiles_encode":
                out[k + "_tiled"] = v.encode_tiled(image(x), tile_x=t["tile"], tile_y=t["tile"], overlap=t["overlap"],
                                                   tile_t=t["temporal"], overlap_t=t["temporal_overlap"])
        # the definition (chunks, 0.5 GiB splits) against one pass of the same modules
        m = v.first_stage_model
        for k in ("decode_t5", "encode_T17"):
            if k in inputs:
                chunked = m.decode(inputs[k]) if k.startswith("decode") else m.encode(inputs[k] * 2 - 1)
                m.use_slicing = False
                m.set_memory_limit(None, None)
                whole = m.decode(inputs[k]) if k.startswith("decode") else m.encode(inputs[k] * 2 - 1)
                m.use_slicing = True
                m.set_memory_limit(0.5, 0.5)
                out[k + "_chunks"], out[k + "_whole"] = chunked, whole
    save_file({k: x.contiguous() for k, x in out.items()}, d / "core.safetensors")
    (d / "core.json").write_text(json.dumps({"model": type(m).__name__, "missing": sorted(keys - set(sd)),
                                             "unexpected": sorted(set(sd) - keys)}))


def row(name: str, ours: torch.Tensor, core: torch.Tensor, note: str = "") -> str:
    if ours.shape != core.shape:
        return f"{name:<34} SHAPE {tuple(ours.shape)} vs {tuple(core.shape)}"
    d = (ours.float() - core.float()).abs()
    return f"{name:<34} {str(tuple(ours.shape[2:])):<18} {d.max().item():>9.2e} {d.mean().item():>9.2e}  {note}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True, help="ComfyUI source directory (the one with comfy/)")
    p.add_argument("--python", help="ComfyUI's python (its venv); default: this one")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-tiles", action="store_true", help="leave out the 640x640 tile rows")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    a.comfyui, a.python = str(Path(a.comfyui).resolve()), a.python or sys.executable
    torch.set_num_threads(a.threads)
    from safetensors.torch import load_file, save_file
    with tempfile.TemporaryDirectory(prefix="cmp_seedvr2_") as tmp:
        d = Path(tmp)
        save_file(published_weights(), d / "weights.safetensors")
        g = torch.Generator().manual_seed(SEED)
        cases = {**CASES, **({} if a.skip_tiles else TILES)}
        inputs = {k: torch.randn(shape, generator=g) if op == "decode" else torch.rand(shape, generator=g)
                  for k, (op, shape) in cases.items()}
        save_file(inputs, d / "inputs.safetensors")
        proc = subprocess.run([a.python, str(Path(__file__).resolve()), "--worker", tmp, "--comfyui", a.comfyui,
                               "--threads", str(a.threads)], capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"ComfyUI FAILED:\n{proc.stderr[-3000:]}")
        info = json.loads((d / "core.json").read_text())
        core = load_file(d / "core.safetensors")
        import vae
        v = vae.load(d / "weights.safetensors")
        print(f"SeedVR2 VAE, published config, random weights (seed {SEED}), fp32, CPU, {a.threads} threads; "
              f"core model {info['model']}, core load: {len(info['missing'])} missing, "
              f"{len(info['unexpected'])} unexpected keys; ours: {v.name}")
        print(f"{'case':<34} {'out (T, H, W)':<18} {'max':>9} {'mean':>9}  note")
        t = TEMPLATE
        with torch.inference_mode():
            for k, (op, shape) in CASES.items():
                x = inputs[k]
                if op == "decode":
                    ours = v.decode(x)
                    sat = ((ours <= 0) | (ours >= 1)).float().mean().item()
                    print(row(f"decode t={shape[2]}", ours, core[k], f"vs core VAE Decode; {100 * sat:.0f}% clamped"))
                    one = ((v.model.decode(x) + 1) / 2).clamp(0, 1)
                    print(row(f"decode t={shape[2]} (ours one pass)", one, core[k], "vs core VAE Decode"))
                else:
                    keep = 1 + 4 * ((shape[2] - 1) // 4)
                    ours = v.encode(x[:, :, :keep])
                    note = "" if keep == shape[2] else f" (ours: the first {keep} frames)"
                    print(row(f"encode T={shape[2]}", ours, core[k], "vs core VAE Encode" + note))
            for k in ("decode_t5", "encode_T17"):
                print(row(f"core chunks vs one pass ({k})", core[k + "_chunks"], core[k + "_whole"],
                          "core's model: its slicing + 0.5 GiB splits vs neither ([-1, 1] / raw mean)"))
            for op in () if a.skip_tiles else ("decode", "encode"):
                x, untiled, call = inputs[f"tiles_{op}"], core[f"tiles_{op}"], getattr(v, op)
                print(row(f"tiles {op}: core untiled", call(x), untiled, "ours untiled vs core untiled"))
                print(row(f"tiles {op}: core tiled 512/128", core[f"tiles_{op}_tiled"], untiled,
                          f"core VAE {op.capitalize()} (Tiled) vs core untiled"))
                print(row(f"tiles {op}: ours fast 512/128", call(x, tile=t["tile"], overlap=t["overlap"]),
                          untiled, "ours fast tiles vs core untiled"))
                print(row(f"tiles {op}: ours exact 512", call(x, tile=t["tile"], mode="exact"), untiled,
                          "ours exact tiles vs core untiled"))


if __name__ == "__main__":
    main()
