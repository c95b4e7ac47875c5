"""Stable Video Diffusion's VAE decode: memory and time of ours beside ComfyUI core on the same file, same
LATENT, one run each (CPU, fp32).

    python bench/bench_svd.py --comfyui PATH/TO/ComfyUI --comfy-python PATH/TO/venv/bin/python
    python bench/bench_svd.py --frames 14 --height 320 --width 576 --runs ours,core

Weights: svd_xt's published config with random weights under a fixed seed, in the original's (= core's)
layout (compare_core_svd.published_model / original_layout); the LATENT is randn(T, 4, h/8, w/8), ComfyUI's
layout (one clip). One subprocess per run (core's under ComfyUI's python); the peak-RSS mark is reset after
loading (bench/harness/measure.py), so ``working MiB`` = peak RSS during the call - RSS after load, and
``w/o output`` subtracts the float32 output every run returns. ``max err``: max abs difference against the
first run (pixels 0..1). ``cpu s``: the process's CPU time of the call.

Runs:
  ours_one_pass    VAE.model.decode on the clip [1, 4, T, h, w]: the definition, whole
  ours             VAE.decode(z): the same through the handle (one pass: nothing asks for tiles)
  ours_exact       VAE.decode(z, tile, mode="exact"): spatial tiles meeting at every GroupNorm, the clip whole
  ours_fast        VAE.decode(z, tile, overlap): blended spatial tiles, each the whole clip
  core             comfy.sd.VAE.decode (VAE Decode): one clip when its free-memory estimate lets all frames
                   through (it does here), else clips of what fits
  core_tiled       VAE Decode (Tiled) at the node's defaults (512/64 px; SVD has no temporal tiles in core):
                   three passes of blended tiles, averaged
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness import comfy_core
from harness.workers import measure_saved, ours_call, parse_runs, results, run, run_flags

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("ours_one_pass", "ours", "ours_exact", "ours_fast", "core", "core_tiled")
WEIGHTS = "svd_xt_vae.safetensors"


def _call(args, tmp: Path):
    """The run's model and call: LATENT [T, 4, h, w] -> pixels [T, 3, H, W] in 0..1."""
    from safetensors.torch import load_file
    if args.worker.startswith("core"):
        comfy_core.start(args.comfyui)
        import nodes
        v = comfy_core.vae(args.comfyui, load_file(str(tmp / WEIGHTS)))
        if args.worker == "core_tiled":
            node = nodes.VAEDecodeTiled()
            return v.first_stage_model, lambda z: node.decode(v, {"samples": z}, 512, 64, 64, 8)[0].movedim(-1, 1)
        return v.first_stage_model, lambda z: v.decode(z).movedim(-1, 1)
    sys.path.insert(0, str(ROOT))
    import vae
    v = vae.load(tmp / WEIGHTS)
    if args.worker == "ours_one_pass":
        one = ours_call(v, args.worker, args.tile)
        return v.model, lambda z: one(z.movedim(0, 1)[None])[0].movedim(1, 0)
    return v.model, ours_call(v, args.worker, args.tile)


def worker(args) -> None:
    tmp = Path(args.tmp)
    measure_saved(args.threads, tmp / "input.npy", lambda: _call(args, tmp), tmp / args.worker)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=6)
    p.add_argument("--height", type=int, default=192)
    p.add_argument("--width", type=int, default=192)
    run_flags(p, RUNS, 96, "our spatial tile, pixels")
    a, runs = parse_runs(p, worker)
    if a is None:
        return
    import numpy as np
    from safetensors.torch import save_file
    from comfyui_checks.compare_core_svd import original_layout, published_model
    with tempfile.TemporaryDirectory(prefix="bench_svd_") as tmp:
        tmp = Path(tmp)
        save_file(original_layout(published_model().state_dict()), str(tmp / WEIGHTS))
        rng = np.random.default_rng(0)
        np.save(tmp / "input.npy", rng.standard_normal((a.frames, 4, a.height // 8, a.width // 8), dtype=np.float32))
        print(f"SVD VAE (svd_xt's config, random weights), LATENT {a.frames}x4x{a.height // 8}x{a.width // 8} -> "
              f"{a.frames} frames {a.height}x{a.width}, {a.threads} threads, fp32, our tile {a.tile} px")
        print(f"{'run':<15} {'time s':>8} {'cpu s':>8} {'working MiB':>12} {'w/o output':>11} {'max err':>9}")
        flags = ["--tmp", str(tmp), "--threads", str(a.threads), "--tile", str(a.tile), "--comfyui", a.comfyui or ""]
        start = lambda name: run(__file__, name, flags, tmp / name, a.comfy_python)     # noqa: E731
        ref = None
        for name, r, out in results(runs, start, lambda name: f"{name:<15}  "):
            ref = out if ref is None else ref
            err = float(np.abs(out - ref).max()) if out.shape == ref.shape else float("nan")
            print(f"{name:<15} {r['best_s']:>8.1f} {r['cpu_s']:>8.1f} {r['working_set_mib']:>12.0f} "
                  f"{r['working_set_mib'] - out.size * 4 / 2 ** 20:>11.0f} {err:>9.2e}", flush=True)


if __name__ == "__main__":
    main()
