"""The CogVideoX VAE through VAEKit beside diffusers' ``AutoencoderKLCogVideoX`` (the original's port) and
ComfyUI core's own (`comfy.sd.VAE`, `comfy/ldm/cogvideo/vae.py`) on the same file.

    python bench/comfyui_checks/compare_core_cogvideox.py --comfyui PATH/TO/ComfyUI --python PATH/TO/ComfyUI/venv/bin/python
    python bench/comfyui_checks/compare_core_cogvideox.py ... --quick          # fewer cases (a few minutes)
    python bench/comfyui_checks/compare_core_cogvideox.py ... --check          # exit 1 if an expected match fails

The weights: diffusers' class at its default config, which is every published one (2B, 5B, 5B-I2V, 1.5-5B),
random under a fixed seed (GroupNorm affines and SpatialNorm convs jittered), saved with diffusers' keys,
which are ComfyUI's, for core; ours reads the same tensors, diffusers keeps the module they came from. Core runs
in a subprocess under `--python` (CPU, fp32; this file in --worker mode), ours and diffusers in this process
(diffusers needs this python).

Rows (max / mean abs difference, and max relative to the larger side's largest magnitude; pixels 0..1 for
decode, raw latents for encode), per case:
- `ours vs diffusers`: the original's grouping of frames both ways (decode: batches of 2 latent frames,
  the first with t % 2 more; encode: diffusers' 8-frame batches, which is one pass up to 15 frames);
- `ours vs diffusers one pass` (encode): diffusers' encoder run as one batch, the original's encode;
- `ours vs core`: core's VAE Decode / VAE Encode (its decode runs conv_in, the mid block and the two
  time-resampling levels over the whole clip and the rest in 4-frame chunks; its encode runs the T % 8
  leftover frames, then 8 at a time: GroupNorm statistics over other frames than the original's);
- `ours vs core, original's grouping`: core's own model run as the original groups frames (decode: its
  `_decode_batched`, the original's batches; encode: its encoder in one pass), which isolates the
  grouping as the difference.
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
# name -> (op, shape): decode latents [1, 16, t, h, w]; encode clips [1, 3, T, H, W] in 0..1
CASES = {"decode_t1": ("decode", (1, 16, 1, 8, 8)), "decode_t3": ("decode", (1, 16, 3, 4, 4)),
         "decode_t4": ("decode", (1, 16, 4, 4, 4)), "decode_t13": ("decode", (1, 16, 13, 4, 4)),
         "encode_T1": ("encode", (1, 3, 1, 64, 64)), "encode_T5": ("encode", (1, 3, 5, 32, 32)),
         "encode_T9": ("encode", (1, 3, 9, 32, 32)), "encode_T17": ("encode", (1, 3, 17, 32, 32)),
         "encode_T49": ("encode", (1, 3, 49, 32, 32))}
QUICK = ("decode_t1", "decode_t3", "encode_T1", "encode_T5", "encode_T9")


def published(seed: int = SEED):
    """diffusers' model at the published config, random weights, norms jittered."""
    import diffusers
    return comfy_core.diffusers_jittered(diffusers.AutoencoderKLCogVideoX, seed)


def worker(a) -> None:
    """Core's side: every case through comfy.sd.VAE, and core's model in the original's grouping."""
    comfy_core.video_worker(a, "_original", lambda m, x: ((m._decode_batched(x) + 1) / 2).clamp(0, 1),
                            lambda m, x: m.encoder(x * 2 - 1)[0].chunk(2, dim=1)[0])


def main() -> None:
    a, cases = comfy_core.parse_video_comparison(__doc__, CASES, QUICK, f"exit 1 unless the expected matches hold "
                                                 f"within {TOL}", worker)
    if a is None:
        return
    sys.path.insert(0, str(ROOT))
    import vae
    ref = published()
    inputs = comfy_core.case_inputs(cases, SEED)
    weights = ref.state_dict()
    core, info = comfy_core.run_worker(str(Path(__file__).resolve()), a.comfyui, a.python, a.threads, weights,
                                       inputs, prefix="cmp_cogvideox_")
    v = vae.from_state_dict(weights, source="the same weights")
    print(f"CogVideoX VAE, published config, random weights (seed {SEED}), fp32, CPU, {a.threads} threads; "
          f"{comfy_core.load_note(info)}; ours: {v.name}")
    rows = comfy_core.CheckedRows(TOL, 34)
    row = rows.row
    with torch.inference_mode():
        for k, (op, shape) in cases.items():
            x = inputs[k]
            if op == "decode":
                ours = v.decode(x)
                diffusers_out = ((ref.decode(x).sample + 1) / 2).clamp(0, 1)
                row(k, ours, "diffusers", diffusers_out, True)
            else:
                ours = v.encode(x)
                old = ref.num_sample_frames_batch_size
                batched = ref.encode(x * 2 - 1).latent_dist.mean
                ref.num_sample_frames_batch_size = shape[2]
                one = ref.encode(x * 2 - 1).latent_dist.mean
                ref.num_sample_frames_batch_size = old
                row(k, ours, "diffusers (8-frame batches)", batched, shape[2] < 16)
                row(k, ours, "diffusers one pass", one, True)
            t = shape[2]
            # core's VAE Decode / Encode: the original's grouping for one frame, and encodes of <= 8 frames
            row(k, ours, "core", core[k], t == 1 or (op == "encode" and t <= 8))
            row(k, ours, "core, original's grouping", core[k + "_original"], True)
    if a.check and rows.failed:
        sys.exit(f"expected matches failed: {', '.join(rows.failed)}")


if __name__ == "__main__":
    main()
