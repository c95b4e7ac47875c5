"""Wan 2.1 decode benchmark: ours (one pass, frame-wise, fast tiles, exact tiles streamed in time) beside
diffusers (decode, and with enable_tiling) and ComfyUI core (VAE Decode, VAE Decode (Tiled)), same
weights from the same file, same latent, one run.

    python bench/bench_wan.py --comfyui PATH/TO/ComfyUI --comfy-python PATH/TO/venv/bin/python
    python bench/bench_wan.py --frames 9 --height 128 --width 192 --tile 128 --runs ours_exact,core
    python bench/bench_wan.py --flat          # ours frame-wise and exact tiles+stream at T and 4T frames

Weights: diffusers ``AutoencoderKLWan()`` (its default config is Wan 2.1's published one) with random
weights under a fixed seed, written once in Wan's original layout (ComfyUI's file format); ours and
core load that file, diffusers its own state dict of the same tensors. Latent randn(1, 16, t, h/8, w/8).
One subprocess per run (core's under ComfyUI's python), CPU, fp32; the peak-RSS mark is reset after
loading (bench_decode.py), so ``working set`` = peak RSS during the decode - RSS after load, and
``w/o output`` subtracts the float32 output every method returns. ``max err`` is the max abs
difference on 0..1 pixels against ours one pass (the model's forward over the whole clip). ``cpu s``:
the process's CPU time of the call (user + system, both threads), less sensitive than wall time to
other processes on a shared machine.

Runs:
  ours_one_pass    VAE.model.decode(z): the whole clip in one pass (no chunks)
  ours_framewise   VAE.decode(z): Wan's own chunking, one latent frame at a time through the caches
  ours_fast        VAE.decode(z, tile, overlap): spatial tiles (blended), each streamed in time
  ours_exact       VAE.decode(z, tile, mode="exact"): spatial tiles with halos and the attention on the
                   assembled latent, each streamed one latent frame at a time: the one-pass result
  diffusers        AutoencoderKLWan.decode (one latent frame at a time, its definition)
  diffusers_tiled  the same after enable_tiling() (256/192 px tiles, blended)
  core             comfy.sd.VAE.decode (ComfyUI's VAE Decode)
  core_tiled       ComfyUI's VAE Decode (Tiled) node (its defaults 512/64 px, 64/8 frames; --core-tile
                   sets the tile, overlap a quarter of it, to compare seams at our tile size)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness import comfy_core
from harness.workers import core_flags, diffusers_from_file, measure_saved, ours_call, results, run, worker_flags

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("ours_one_pass", "ours_framewise", "ours_fast", "ours_exact", "diffusers", "diffusers_tiled", "core",
        "core_tiled")


def _decoder(args, tmp: Path):
    """The run's decode: latent -> pixels [B, 3, T, H, W] in 0..1."""
    from safetensors.torch import load_file
    if args.worker.startswith("diffusers"):
        import diffusers
        model = diffusers_from_file(diffusers.AutoencoderKLWan, tmp / "wan_diffusers.safetensors")
        if args.worker == "diffusers_tiled":
            model.enable_tiling()
        return model, lambda z: (model.decode(z).sample / 2 + 0.5).clamp_(0, 1)
    if args.worker.startswith("core"):
        v = comfy_core.vae(args.comfyui, load_file(str(tmp / "wan_2.1_vae.safetensors")))
        if args.worker == "core":
            return v.first_stage_model, lambda z: v.decode(z).movedim(-1, 1)
        import nodes
        node = nodes.VAEDecodeTiled()
        return v.first_stage_model, lambda z: _core_tiled(node, v, z, args.core_tile)
    sys.path.insert(0, str(ROOT))
    import vae
    v = vae.load(tmp / "wan_2.1_vae.safetensors")
    return v.model, ours_call(v, args.worker, args.tile)


def _core_tiled(node, v, z, tile: int):
    """Core's VAE Decode (Tiled) node; its IMAGE batch [B*T, H, W, 3] back to [B, 3, T, H, W]."""
    (images,) = node.decode(v, {"samples": z}, tile, min(64, tile // 4), 64, 8)
    return images.reshape(z.shape[0], -1, *images.shape[-3:]).movedim(-1, 1)


def worker(args) -> None:
    tmp = Path(args.tmp)
    measure_saved(args.threads, tmp / f"latent_{args.t}.npy", lambda: _decoder(args, tmp),
                  tmp / f"{args.worker}_{args.t}")


def write_weights(tmp: Path) -> None:
    import torch
    import diffusers
    from safetensors.torch import save_file
    sys.path.insert(0, str(ROOT))
    import vae
    from vae.archs.wan_layout import to_original
    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLWan().eval()
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    save_file(sd, str(tmp / "wan_diffusers.safetensors"))
    canonical = vae.from_state_dict(sd).state_dict()
    save_file({k: v.contiguous() for k, v in to_original(canonical, nested=False).items()},
              str(tmp / "wan_2.1_vae.safetensors"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=9, help="latent frames (pixel frames 1 + 4(t-1))")
    p.add_argument("--height", type=int, default=128)
    p.add_argument("--width", type=int, default=192)
    p.add_argument("--tile", type=int, default=128, help="our spatial tile, pixels")
    p.add_argument("--core-tile", type=int, default=512, help="core's VAE Decode (Tiled) tile_size (its default 512)")
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--flat", action="store_true", help="ours frame-wise and exact at T and 4T latent frames")
    p.add_argument("--threads", type=int, default=2)
    core_flags(p)
    worker_flags(p, tmp=str, t=int)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    import numpy as np
    runs = a.runs.split(",")
    if not a.comfyui:
        runs = [r for r in runs if not r.startswith("core")]
    frames = [a.frames, 4 * a.frames] if a.flat else [a.frames]
    if a.flat:
        runs = [r for r in runs if r in ("ours_framewise", "ours_exact")]
    with tempfile.TemporaryDirectory(prefix="bench_wan_") as tmp:
        tmp = Path(tmp)
        write_weights(tmp)
        rng = np.random.default_rng(0)
        for t in frames:
            np.save(tmp / f"latent_{t}.npy", rng.standard_normal((1, 16, t, a.height // 8, a.width // 8),
                                                                 dtype=np.float32))
        print(f"Wan 2.1 (published config, random weights), latent 1x16x{{{','.join(map(str, frames))}}}x"
              f"{a.height // 8}x{a.width // 8} -> {a.height}x{a.width}, {a.threads} threads, fp32, our tile {a.tile} px")
        print(f"{'run':<16} {'frames':>6} {'time s':>8} {'cpu s':>8} {'working MiB':>12} {'w/o output':>11} {'max err':>9}")
        for t in frames:
            ref = None
            flags = ["--tmp", str(tmp), "--t", str(t), "--threads", str(a.threads), "--tile", str(a.tile),
                     "--core-tile", str(a.core_tile), "--comfyui", a.comfyui or ""]
            start = lambda name: run(__file__, name, flags, tmp / f"{name}_{t}", a.comfy_python)
            label = lambda name: f"{name:<16} {1 + 4 * (t - 1):>6}  "
            for name, r, out in results(runs, start, label):
                output_mib = out.size * 4 / 2 ** 20
                if name == "ours_one_pass" or ref is None and not a.flat:
                    ref = out if name == "ours_one_pass" else ref
                err = float(np.abs(out - ref).max()) if ref is not None and out.shape == ref.shape else float("nan")
                print(f"{name:<16} {1 + 4 * (t - 1):>6} {r['best_s']:>8.1f} {r['cpu_s']:>8.1f} {r['working_set_mib']:>12.0f} "
                      f"{r['working_set_mib'] - output_mib:>11.0f} {err:>9.2e}", flush=True)


if __name__ == "__main__":
    main()
