"""Qwen-Image 2.1 VAE benchmark: ours (untiled, exact tiles, fast tiles) beside diffusers'
AutoencoderKLQwenImage21 (decode/encode, and with enable_tiling) and, where the given ComfyUI core has
the model (upstream after 783545f6: comfy/sd.py's Qwen Image 2.1 branch), core's VAE Decode / Encode;
same weights from the same file, same input, one run each.

    python bench/bench_qwen21.py                          # 1024x1024 decode and encode, ours + diffusers
    python bench/bench_qwen21.py --op decode --size 512 --runs ours,diffusers
    python bench/bench_qwen21.py --comfyui PATH/TO/ComfyUI --comfy-python PATH/TO/venv/bin/python

Weights: diffusers ``AutoencoderKLQwenImage21()`` (its default config is the published one: base 96,
decoder base 144, z 64, RGBA) with random weights under a fixed seed, written once in ComfyUI's layout
(Wan 2.2's original names, causal convs 5-D with time size 1: the template's file format); ours and
core load that file, diffusers its own state dict of the same tensors. Decode: latent
randn(1, 64, S/16, S/16) -> RGBA S x S; encode: rand(1, 3, S, S) RGB (alpha 1 appended for diffusers,
as ours and core pad it). One subprocess per run (core's under ComfyUI's python), CPU, fp32; the peak
RSS mark is reset after loading (bench_decode.py), so ``working MiB`` = peak RSS during the call -
RSS after load; ``w/o output`` subtracts the float32 output every method returns. ``max err``: max
abs difference against ours untiled (0..1 pixels; latents: relative to the latent's max abs).
``cpu s``: the process's CPU time of the call (user + system), less sensitive than wall time to other
processes on a shared machine.

Runs:
  ours             VAE.decode(z) / VAE.encode(x): one pass
  ours_exact       tiles of --tile px, mode="exact": the untiled result
  ours_fast        tiles of --tile px, a quarter overlap, blended
  diffusers        AutoencoderKLQwenImage21 on the image as a one-frame clip (its definition)
  diffusers_tiled  the same after enable_tiling() (256 px tiles at a 192 px stride, blended)
  core             comfy.sd.VAE.decode / .encode (ComfyUI's VAE Decode / VAE Encode)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness import comfy_core
from harness.workers import core_flags, diffusers_from_file, measure_saved, ours_call, results, run, worker_flags

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("ours", "ours_exact", "ours_fast", "diffusers", "diffusers_tiled", "core")
FILE = "qwen_image_2.1_vae.safetensors"


def _runner(args, tmp: Path):
    """The run's model and call: decode latent -> RGBA [B, 4, H, W] in 0..1, or encode RGB -> latent."""
    import torch
    from safetensors.torch import load_file
    decode = args.op == "decode"
    if args.worker.startswith("diffusers"):
        import diffusers
        model = diffusers_from_file(diffusers.AutoencoderKLQwenImage21, tmp / "diffusers.safetensors")
        if args.worker == "diffusers_tiled":
            model.enable_tiling()
        if decode:
            return model, lambda z: (model.decode(z.unsqueeze(2)).sample.squeeze(2) / 2 + 0.5).clamp_(0, 1)
        rgba = lambda x: torch.cat([x, torch.ones_like(x[:, :1])], 1) * 2 - 1
        return model, lambda x: model.encode(rgba(x).unsqueeze(2)).latent_dist.mode().squeeze(2)
    if args.worker == "core":
        v = comfy_core.vae(args.comfyui, load_file(str(tmp / FILE)))
        if decode:
            return v.first_stage_model, lambda z: v.decode(z).movedim(-1, 1)
        return v.first_stage_model, lambda x: v.encode(x.movedim(1, -1))
    sys.path.insert(0, str(ROOT))
    import vae
    v = vae.load(tmp / FILE)
    return v.model, ours_call(v, args.worker, args.tile, encode=not decode)


def worker(args) -> None:
    tmp = Path(args.tmp)
    measure_saved(args.threads, tmp / f"{args.op}_in.npy", lambda: _runner(args, tmp), tmp / f"{args.worker}_{args.op}")


def write_weights(tmp: Path) -> None:
    import diffusers
    import torch
    from safetensors.torch import save_file
    sys.path.insert(0, str(ROOT))
    import vae
    from vae.archs.wan_layout import to_original
    torch.manual_seed(0)
    sd = {k: v.contiguous() for k, v in diffusers.AutoencoderKLQwenImage21().eval().state_dict().items()}
    save_file(sd, str(tmp / "diffusers.safetensors"))
    canonical = vae.from_state_dict(sd).state_dict()
    save_file({k: v.contiguous() for k, v in to_original(canonical, nested=True).items()}, str(tmp / FILE))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=1024, help="image side, pixels (a multiple of 16)")
    p.add_argument("--op", default="decode,encode", help="decode, encode or both (comma list)")
    p.add_argument("--tile", type=int, default=512, help="our spatial tile, pixels")
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--threads", type=int, default=2)
    core_flags(p, "ComfyUI source directory (for the core run)")
    worker_flags(p, tmp=str)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    import numpy as np
    runs = [r for r in a.runs.split(",") if r != "core" or a.comfyui]
    with tempfile.TemporaryDirectory(prefix="bench_qwen21_") as tmp:
        tmp = Path(tmp)
        write_weights(tmp)
        rng = np.random.default_rng(0)
        s = a.size
        np.save(tmp / "decode_in.npy", rng.standard_normal((1, 64, s // 16, s // 16), dtype=np.float32))
        np.save(tmp / "encode_in.npy", rng.random((1, 3, s, s), dtype=np.float32))
        print(f"Qwen-Image 2.1 VAE (published config, random weights), {s}x{s} px, {a.threads} threads, fp32, "
              f"our tile {a.tile} px")
        print(f"{'op':<7} {'run':<16} {'time s':>8} {'cpu s':>8} {'working MiB':>12} {'w/o output':>11} {'max err':>9}")
        for op in a.op.split(","):
            ref = None
            flags = ["--tmp", str(tmp), "--op", op, "--threads", str(a.threads), "--tile", str(a.tile),
                     "--comfyui", a.comfyui or ""]
            start = lambda name: run(__file__, name, flags, tmp / f"{name}_{op}", a.comfy_python, tail=2)
            for name, r, out in results(runs, start, lambda name: f"{op:<7} {name:<16}  "):
                ref = out if name == "ours" else ref
                scale = 1.0 if op == "decode" or ref is None else float(np.abs(ref).max())
                err = float(np.abs(out - ref).max()) / scale if ref is not None and out.shape == ref.shape \
                    else float("nan")
                output_mib = out.size * 4 / 2 ** 20
                print(f"{op:<7} {name:<16} {r['best_s']:>8.1f} {r['cpu_s']:>8.1f} {r['working_set_mib']:>12.0f} "
                      f"{r['working_set_mib'] - output_mib:>11.0f} {err:>9.2e}", flush=True)


if __name__ == "__main__":
    main()
