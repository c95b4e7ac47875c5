"""The Cosmos-1 tokenizer (CV8x8x8) through VAEKit beside diffusers' ``AutoencoderKLCosmos`` and ComfyUI core's
own (`comfy.sd.VAE`, `comfy/ldm/cosmos/vae.py`) on the same weights.

    python bench/comfyui_checks/compare_core_cosmos.py --comfyui PATH/TO/ComfyUI --python PATH/TO/ComfyUI/venv/bin/python
    python bench/comfyui_checks/compare_core_cosmos.py ... --quick          # fewer cases
    python bench/comfyui_checks/compare_core_cosmos.py ... --check          # exit 1 if a row is over 1e-4

The weights: diffusers' class at its default config, which is the published CV8x8x8-1.0 (the one core builds
for ``cosmos_cv8x8x8_1.0.safetensors``), random under a fixed seed (norm affines jittered), written in the
original's layout (core's file: ``.conv3d`` / ``.norm`` wrappers, the wavelet constants, the published latent
statistics as ``latent_mean`` / ``latent_std``) for core and for ours; diffusers keeps the module they came
from. Core runs in a subprocess under `--python` (CPU, fp32; this file in --worker mode), ours and diffusers
in this process (diffusers needs this python).

Rows (max / mean abs difference, and max relative to the larger side's largest magnitude; pixels 0..1 for
decode, LATENTs for encode), per case:
- `diffusers`: its pipelines' LATENT rule around the model (decode: z * std / 0.5 + mean before
  ``decode``; encode: (z - mean) * 0.5 / std after ``encode``), pixels mapped and clamped as ComfyUI does;
- `core`: core's VAE Decode / VAE Encode on the same LATENT / IMAGE;
- `core model, raw`: core's tokenizer modules without the statistics (decode: its post_quant_conv and
  decoder; encode: its encoder and quant_conv) against ours, in [-1, 1] / raw latents.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core

ROOT = Path(__file__).resolve().parents[2]
SEED = 0
TOL = 1e-4
# name -> (op, shape): decode LATENTs [1, 16, t, h, w]; encode clips [1, 3, T, H, W] in 0..1
CASES = {"decode_t1": ("decode", (1, 16, 1, 8, 8)), "decode_t3": ("decode", (1, 16, 3, 4, 6)),
         "decode_t18": ("decode", (1, 16, 18, 2, 2)),
         "encode_T1": ("encode", (1, 3, 1, 64, 64)), "encode_T9": ("encode", (1, 3, 9, 32, 48)),
         "encode_T17": ("encode", (1, 3, 17, 32, 32))}
QUICK = ("decode_t1", "decode_t3", "encode_T1", "encode_T9")


def published(seed: int = SEED):
    """diffusers' model at the published config, random weights, norms jittered."""
    import diffusers
    return comfy_core.diffusers_jittered(diffusers.AutoencoderKLCosmos, seed)


def worker(a) -> None:
    """Core's side: every case through comfy.sd.VAE, and its modules without the statistics."""
    comfy_core.video_worker(a, "_raw", lambda m, x: m.decoder(m.post_quant_conv(x)),
                            lambda m, x: m.quant_conv(m.encoder(x * 2 - 1)))


def main() -> None:
    a, cases = comfy_core.parse_video_comparison(__doc__, CASES, QUICK, f"exit 1 unless every row holds within {TOL}",
                                                 worker)
    if a is None:
        return
    sys.path.insert(0, str(ROOT))
    import vae
    from vae.archs import cosmos_layout
    ref = published()
    cfg = ref.config
    mean = torch.tensor(cfg.latents_mean).view(1, 16, -1, 1, 1)
    std = torch.tensor(cfg.latents_std).view(1, 16, -1, 1, 1)
    inputs = comfy_core.case_inputs(cases, SEED)
    canonical = cosmos_layout.to_canonical(ref.state_dict())
    weights = cosmos_layout.to_original(canonical)
    weights.update(latent_mean=mean.flatten().clone(), latent_std=std.flatten().clone())
    core, info = comfy_core.run_worker(str(Path(__file__).resolve()), a.comfyui, a.python, a.threads, weights,
                                       inputs, prefix="cmp_cosmos_")
    v = vae.from_state_dict(weights, source="the same weights")
    print(f"Cosmos-1 CV8x8x8, published config, random weights (seed {SEED}), fp32, CPU, {a.threads} threads; "
          f"{comfy_core.load_note(info)}; ours: {v.name}")
    rows = comfy_core.CheckedRows(TOL, 18, rel="8.3g")
    row = rows.row

    def table(t: torch.Tensor, n: int) -> torch.Tensor:       # frame i takes column i % 16, as core does
        return t[:, :, torch.arange(n) % t.shape[2]]

    with torch.inference_mode():
        for k, (op, shape) in cases.items():
            x = inputs[k]
            if op == "decode":
                ours = v.decode(x)
                z = x * table(std, shape[2]) / 0.5 + table(mean, shape[2])
                row(k, ours, "diffusers", ((ref.decode(z).sample + 1) / 2).clamp(0, 1))
                row(k, ours, "core", core[k])
                row(k, v.model.decode(x), "core model, raw", core[k + "_raw"])
            else:
                ours = v.encode(x)
                z = ref.encode(x * 2 - 1).latent_dist.mode()
                t = z.shape[2]
                row(k, ours, "diffusers", (z - table(mean, t)) * 0.5 / table(std, t))
                row(k, ours, "core", core[k])
                row(k, v.model.encode(x * 2 - 1), "core model, raw", core[k + "_raw"])
    if a.check and rows.failed:
        sys.exit(f"over {TOL}: {', '.join(rows.failed)}")


if __name__ == "__main__":
    main()
