"""Stable Cascade's stage A through VAEKit beside ComfyUI core's own (`comfy.sd.VAE` ->
`comfy/ldm/cascade/stage_a.py`) on the same file, and beside diffusers' `PaellaVQModel` when diffusers
is importable: decode, encode, the codebook, our exact tiles, and core's tiled decode.

    python bench/comfyui_checks/compare_core_stage_a.py --comfyui PATH/TO/ComfyUI --python PATH/TO/venv/bin/python
    python bench/comfyui_checks/compare_core_stage_a.py ... --json rows.json

Weights: no published file is available offline, so they are random (randn / sqrt(fan-in), the six
learned scalars of each block and the latent BatchNorm's statistics off their defaults, the head scaled
so that most pixels stay inside 0..1; fixed seed) at the published config (2 levels, 12 bottleneck
blocks, 384 wide, 4 latent channels, 8192 codes), written in the original's / ComfyUI's layout as
``stage_a.safetensors``. Core loads it with ``comfy.sd.VAE(sd=...)`` as its VAE Loader does, in a
subprocess under ``--python`` (CPU, fp32); core's own ``StageA`` also loads it strictly, to show the
file has exactly core's keys. Ours: ``vae.load``. diffusers: the same tensors under its codebook name.
Nothing is asserted here (tests/vae/test_stage_a.py asserts the parity rows with ``--json``).

Rows (max / mean abs difference; pixels 0..1 for decode, LATENTs for encode). ``parity`` rows compare
the same computation; the others show where the references differ:
- decode: core's IMAGE is the network's output unclamped (stage A's ``process_output`` is the identity);
  we clamp to 0..1 as every other image VAE does. Compared clamped; the note says how much of core's
  output lies outside 0..1.
- encode: core's VAE Encode runs ``StageA.encode`` without quantizing; so do diffusers and we. The
  ``quantized`` row is core's ``encode(x, quantize=True)`` beside our ``quantize(encode(x))``.
- ``core tiled``: core's VAE Decode (Tiled) (independent tiles, blended) beside core untiled.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core

ROOT = Path(__file__).resolve().parents[2]
SEED = 0
LATENT = (64, 48)      # latent side (rows, columns): 256x192 px
TILE = 128             # px: our exact tiles and core's tiled decode


def published_weights() -> dict:
    """Random weights at the published config, in the original's / ComfyUI's layout."""
    sys.path.insert(0, str(ROOT))
    from vae.archs import stage_a
    cfg = stage_a.StageAConfig(widths=(192, 384), hidden=4, bottleneck_blocks=12, latent_channels=4,
                               codebook_size=8192, patch=2, image_channels=3, has_encoder=True, has_decoder=True)
    model = stage_a.StageA(cfg)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.5 if name.endswith("gammas") else 1 / (p[0].numel() if p.dim() > 1 else 10) ** 0.5
            p.copy_(scale * torch.randn(p.shape, generator=g))
        bn = model.down_blocks[-1][1]
        bn.running_mean.copy_(0.1 * torch.randn(4, generator=g))
        bn.running_var.copy_(0.5 + torch.rand(4, generator=g))
        model.out_block[0].weight.mul_(0.2)           # pixels mostly inside 0..1, not clamped
        model.out_block[0].bias.fill_(0.5)
    sd = model.state_dict()
    return {k.replace(".depthwise.", ".depthwise.1."): v.contiguous() for k, v in sd.items()}


def worker(a) -> None:
    """Core's side: the file through comfy.sd.VAE (decode, encode, tiled decode) and core's StageA
    (strict load, quantized encode)."""
    torch.set_num_threads(a.threads)
    weights, inputs = comfy_core.worker_files(a.worker)
    comfy_core.start(a.comfyui)
    import comfy.sd
    from comfy.ldm.cascade.stage_a import StageA
    out, info = {}, {}
    with torch.inference_mode():
        v = comfy.sd.VAE(sd=dict(weights))
        info.update(model=type(v.first_stage_model).__name__, latent_channels=v.latent_channels,
                    ratios=[v.downscale_ratio, v.upscale_ratio])
        out["decode"] = v.decode(inputs["z"]).movedim(-1, 1)
        out["encode"] = v.encode(inputs["x"].movedim(1, -1))
        r = v.upscale_ratio
        out["decode_tiled"] = v.decode_tiled(inputs["z"], tile_x=TILE // r, tile_y=TILE // r,
                                             overlap=TILE // r // 4).movedim(-1, 1)
        strict = StageA()
        missing, unexpected = strict.load_state_dict(dict(weights), strict=False)
        info.update(missing=list(missing), unexpected=list(unexpected))
        out["encode_quantized"] = strict.eval().encode(inputs["x"], quantize=True)[0]
    comfy_core.save_worker(a.worker, {k: x.float() for k, x in out.items()}, info)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    comfy_core.comparison_flags(p)
    p.add_argument("--json", help="write the rows here")
    a = comfy_core.parse_comparison(p, worker)
    if a is None:
        return
    sys.path.insert(0, str(ROOT))
    from safetensors.torch import save_file
    import vae
    table = comfy_core.ParityTable(width=34, skip=1)
    weights = published_weights()
    g = torch.Generator().manual_seed(SEED + 1)
    h, w = LATENT
    inputs = {"z": torch.randn(1, 4, h, w, generator=g), "x": torch.rand(1, 3, 4 * h, 4 * w, generator=g)}
    core, info = comfy_core.run_worker(str(Path(__file__).resolve()), a.comfyui, a.python, a.threads, weights,
                                       inputs, prefix="cmp_stage_a_")
    print(f"Stable Cascade stage A, published config, random weights (seed {SEED}), fp32, CPU, {a.threads} threads, "
          f"latent {h}x{w} ({4 * h}x{4 * w} px)")
    print(f"  core: {info['model']}, {info['latent_channels']} latent channels, ratios {info['ratios']}; "
          f"core's StageA on the file: missing {info['missing'] or 'none'}, unexpected {info['unexpected'] or 'none'}")
    print(f"{'case':<34} {'out (C, H, W)':<16} {'max':>9} {'mean':>9}")
    z, x = inputs["z"], inputs["x"]
    with tempfile.TemporaryDirectory(prefix="cmp_stage_a_") as tmp, torch.inference_mode():
        path = Path(tmp) / "stage_a.safetensors"
        save_file(weights, str(path))
        v = vae.load(path, dtype=torch.float32)
        raw = core["decode"]
        ref = raw.clamp(0, 1)
        outside = f"{100 * ((raw < 0) | (raw > 1)).float().mean():.1f}% of core's values outside 0..1"
        untiled = v.decode(z)
        table.add("decode", untiled, ref, f"vs core VAE Decode clamped; {outside}", True)
        table.add("decode, network output", v.model.decode(z), raw, "ours unclamped vs core's IMAGE", True)
        table.add(f"decode exact {TILE} px tiles", v.decode(z, tile=TILE, mode="exact"), ref,
                  "ours exact tiles vs core untiled", True)
        lat = v.encode(x)
        table.add("encode", lat, core["encode"], "vs core VAE Encode (not quantized)", True)
        table.add(f"encode exact {TILE} px tiles", v.encode(x, tile=TILE, mode="exact"), core["encode"],
                  "ours exact tiles vs core untiled", True)
        table.add("encode quantized", v.model.quantize(lat), core["encode_quantized"],
                  "ours quantize(encode) vs core StageA.encode(quantize=True)", True)
        table.add(f"core tiled {TILE} px", core["decode_tiled"].clamp(0, 1), ref,
                  "core VAE Decode (Tiled) vs core untiled", False)
        table.add(f"ours fast {TILE} px tiles", v.decode(z, tile=TILE, overlap=TILE // 4), ref,
                  "ours fast tiles vs core untiled", False)
        diffusers_rows(weights, z, x, core, table, untiled, lat)
    if a.json:
        Path(a.json).write_text(json.dumps(table.rows, indent=1))


def diffusers_rows(weights: dict, z: torch.Tensor, x: torch.Tensor, core: dict, table: comfy_core.ParityTable,
                   ours_decode: torch.Tensor, ours_encode: torch.Tensor) -> None:
    """diffusers' PaellaVQModel on the same tensors (its codebook key) beside ours and core."""
    try:
        from diffusers.pipelines.deprecated.wuerstchen.modeling_paella_vq_model import PaellaVQModel
    except ImportError:
        print("diffusers not importable: no diffusers rows")
        return
    m = PaellaVQModel().eval()
    m.load_state_dict({k.replace("vquantizer.codebook.", "vquantizer.embedding."): t for k, t in weights.items()})
    dec, enc = m.decode(z).sample, m.encode(x).latents
    table.add("decode vs diffusers", ours_decode, dec.clamp(0, 1), "ours vs diffusers' decode clamped", True)
    table.add("encode vs diffusers", ours_encode, enc, "ours vs diffusers' encode", True)
    table.add("diffusers decode vs core", dec, core["decode"], "both unclamped", True)
    table.add("diffusers encode vs core", enc, core["encode"], "", True)


if __name__ == "__main__":
    main()
