"""TAEHV beside the full VAE of the same latent space: time and memory of a decode of the same latent by
the tiny autoencoder and by the VAE it stands in for (Wan 2.1, HunyuanVideo), CPU, one run each;
ComfyUI core's TAEHV in the same run when a ComfyUI is given.

    python bench/bench_taehv.py                                         # 17 frames of 256x320, Wan + HunyuanVideo
    python bench/bench_taehv.py --frames 16 --height 320 --width 512    # the taehv README's 61 frames of 512x320
    python bench/bench_taehv.py --comfyui PATH/TO/ComfyUI --comfy-python PATH/TO/venv/bin/python

Weights: random at the published configs, fixed seed. TAEHV: encoder 64 wide, decoder 256/128/64/64,
time strides (2, 2, 1) / (1, 2, 2), randn / sqrt(fan-in) (the head x 0.4, +0.5), written as ``lighttaew2_1.safetensors`` (fp32:
core reads it as lighttaew2_1 too). taehv (HunyuanVideo's) has the same tensors and differs only by its
latent scale, so one TAEHV run stands for both.
Full VAEs: diffusers ``AutoencoderKLWan()`` and ``AutoencoderKLHunyuanVideo()`` (their default configs
are the published ones), decoded by VAEKit. Latent randn(1, 16, t, h/8, w/8): the same tensor for every
run. One subprocess per run; the peak-RSS mark is reset after loading (bench/harness/measure.py), so
``working MiB`` = peak RSS during the decode - RSS after load, ``w/o output`` less the float32 output.
``cpu s``: the process's CPU time (user + system) of the call. ``max err``: against the same model's
one pass (its ``*_one_pass`` run).

Runs:
  taehv_one_pass   TAEHV: VAE.model.decode(z), the whole clip at once (the original's parallel=True)
  taehv            TAEHV: VAE.decode(z), its default: 4 latent frames at a time through the MemBlocks' memory
  taehv_frame      TAEHV: VAE.decode(z, tile_frames=4): one latent frame at a time (ComfyUI core's schedule)
  taehv_exact      TAEHV: VAE.decode(z, tile=--tile, mode="exact"): exact spatial tiles, streamed
  core_taehv       ComfyUI core's VAE Decode of the same file (its TAEHV, one frame at a time), clamped
                   to 0..1 as the original and we clamp (core's IMAGE is left unclamped)
  wan              Wan 2.1's full VAE: VAE.decode(z) (one latent frame at a time, as Wan decodes)
  hunyuan_video    HunyuanVideo's full VAE: VAE.decode(z) (one pass: GroupNorm over the clip)
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from harness import comfy_core
from harness.workers import measure_saved, parse_runs, results, run, run_flags

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("taehv_one_pass", "taehv", "taehv_frame", "taehv_exact", "core_taehv", "wan", "hunyuan_video")
FILES = {"taehv": "lighttaew2_1.safetensors", "wan": "wan.safetensors", "hunyuan_video": "hunyuan_video.safetensors"}


def _decoder(args, tmp: Path):
    """The run's decode: latent -> pixels [B, 3, T, H, W] in 0..1."""
    if args.worker.startswith("core"):
        from safetensors.torch import load_file
        v = comfy_core.vae(args.comfyui, load_file(str(tmp / FILES["taehv"])))
        return v.first_stage_model, lambda z: v.decode(z).movedim(-1, 1).clamp_(0, 1)   # core leaves it unclamped
    sys.path.insert(0, str(ROOT))
    import vae
    family = args.worker if args.worker in FILES else "taehv"
    v = vae.load(tmp / FILES[family])
    if args.worker == "taehv_one_pass":
        return v.model, lambda z: v.model.decode(z).clamp_(0, 1)
    kw = {"taehv_frame": dict(tile_frames=4), "taehv_exact": dict(tile=args.tile, mode="exact")}.get(args.worker, {})
    return v.model, lambda z: v.decode(z, **kw)


def worker(args) -> None:
    tmp = Path(args.tmp)
    measure_saved(args.threads, tmp / "latent.npy", lambda: _decoder(args, tmp), tmp / args.worker)


def write_weights(tmp: Path, runs) -> None:
    import torch
    from safetensors.torch import save_file
    sys.path.insert(0, str(ROOT))
    from vae.archs import taehv
    model = taehv.TAEHV(taehv.TAEHVConfig(16))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p[0].numel() if p.dim() > 1 else 10) ** 0.5)
        model.decoder[-1].weight.mul_(0.4)            # frames mostly inside the pixel range, not clamped
        model.decoder[-1].bias.add_(sum(model.config.value_range) / 2)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(tmp / FILES["taehv"]))
    import diffusers
    for name, cls in (("wan", "AutoencoderKLWan"), ("hunyuan_video", "AutoencoderKLHunyuanVideo")):
        if name in runs:
            torch.manual_seed(0)
            ref = getattr(diffusers, cls)().eval()
            save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp / FILES[name]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=5, help="latent frames (pixel frames 1 + 4(t-1))")
    p.add_argument("--height", type=int, default=256)
    p.add_argument("--width", type=int, default=320)
    run_flags(p, RUNS, 128, "our exact tile, pixels")
    a, runs = parse_runs(p, worker)
    if a is None:
        return
    import numpy as np
    with tempfile.TemporaryDirectory(prefix="bench_taehv_") as tmp:
        tmp = Path(tmp)
        write_weights(tmp, runs)
        rng = np.random.default_rng(0)
        np.save(tmp / "latent.npy", rng.standard_normal((1, 16, a.frames, a.height // 8, a.width // 8), dtype=np.float32))
        frames = 1 + 4 * (a.frames - 1)
        print(f"latent 1x16x{a.frames}x{a.height // 8}x{a.width // 8} -> {frames} frames of {a.width}x{a.height}, "
              f"published configs, random weights, fp32, CPU, {a.threads} threads")
        print(f"{'run':<16} {'time s':>8} {'cpu s':>8} {'working MiB':>12} {'w/o output':>11} {'max err':>9}")
        flags = ["--tmp", str(tmp), "--threads", str(a.threads), "--tile", str(a.tile), "--comfyui", a.comfyui or ""]
        start = lambda name: run(__file__, name, flags, tmp / name, a.comfy_python, tail=2,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
        one_pass = None
        for name, r, out in results(runs, start, lambda name: f"{name:<16}  "):
            one_pass = out if name == "taehv_one_pass" else one_pass
            ref = one_pass if name.endswith("taehv") or name.startswith("taehv") else None
            err = float(np.abs(out - ref).max()) if ref is not None and out.shape == ref.shape else float("nan")
            output_mib = out.size * 4 / 2 ** 20
            print(f"{name:<16} {r['best_s']:>8.2f} {r['cpu_s']:>8.2f} {r['working_set_mib']:>12.0f} "
                  f"{r['working_set_mib'] - output_mib:>11.0f} {err:>9.2e}", flush=True)


if __name__ == "__main__":
    main()
