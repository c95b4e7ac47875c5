"""SeedVR2 VAE decode and encode: memory and time of ours beside ComfyUI core on the same file, same input,
one run each (CPU, fp32).

    python bench/bench_seedvr2.py --comfyui PATH/TO/ComfyUI --comfy-python PATH/TO/venv/bin/python
    python bench/bench_seedvr2.py --frames 5 --height 256 --width 256 --runs ours_framewise,core

Weights: the published config with random weights under a fixed seed, in core's layout
(compare_core_seedvr2.published_weights); latent randn(1, 16, t, h/8, w/8), clip rand(1, 3, 1+4(t-1), h, w).
One subprocess per run (core's under ComfyUI's python); the peak-RSS mark is reset after loading
(bench/harness/measure.py), so ``working MiB`` = peak RSS during the call - RSS after load, and ``w/o output``
subtracts the float32 output every run returns. ``max err``: max abs difference against the op's first run (decode:
ours one pass, pixels 0..1; encode: ours framewise, latents). ``cpu s``: the process's CPU time of the call.

Runs (decode):
  ours_one_pass    VAE.model.decode(z): the whole clip in one pass
  ours_framewise   VAE.decode(z): the model's own chunk, one latent frame at a time through the caches
  ours_exact       VAE.decode(z, tile, mode="exact"): spatial tiles, streamed one latent frame at a time
  ours_fast        VAE.decode(z, tile, overlap): blended spatial tiles, each streamed in time
  core             comfy.sd.VAE.decode (VAE Decode): the model's chunks, 0.5 GiB splits, no tiles
  core_tiled       VAE Decode (Tiled) at the SeedVR2 templates' settings (512/128 px, 64/8 frames)
Runs (encode, with --encode): ours_framewise, ours_exact, core, core_tiled (VAE Encode / VAE Encode (Tiled)).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness import comfy_core
from harness.workers import core_flags, measure_saved, ours_call, results, run, worker_flags

ROOT = Path(__file__).resolve().parents[1]
DECODE_RUNS = ("ours_one_pass", "ours_framewise", "ours_exact", "ours_fast", "core", "core_tiled")
ENCODE_RUNS = ("ours_framewise", "ours_exact", "core", "core_tiled")
TEMPLATE = (512, 128, 64, 8)      # the templates' VAE Decode / Encode (Tiled): tile, overlap, frames, overlap


def _call(args, tmp: Path):
    """The run's model and call: latent -> pixels [B, 3, T, H, W] in 0..1 / clip -> latent."""
    from safetensors.torch import load_file
    encode = args.op == "encode"
    if args.worker.startswith("core"):
        comfy_core.start(args.comfyui)
        import nodes
        v = comfy_core.vae(args.comfyui, load_file(str(tmp / "seedvr2_ema_vae.safetensors")))
        frames = lambda x: x[0].movedim(0, -1)     # [1, 3, T, H, W] -> IMAGE [T, H, W, 3]
        tiled = args.worker == "core_tiled"
        if encode:
            node = nodes.VAEEncodeTiled()
            return v.first_stage_model, ((lambda x: node.encode(v, frames(x), *TEMPLATE)[0]["samples"]) if tiled
                                         else (lambda x: v.encode(frames(x))))
        node = nodes.VAEDecodeTiled()
        flat = (lambda z: node.decode(v, {"samples": z}, *TEMPLATE)[0]) if tiled else (lambda z: v.decode(z)[0])
        return v.first_stage_model, lambda z: flat(z).movedim(-1, 0)[None]     # [T, H, W, 3] -> [1, 3, T, H, W]
    sys.path.insert(0, str(ROOT))
    import vae
    v = vae.load(tmp / "seedvr2_ema_vae.safetensors")
    return v.model, ours_call(v, args.worker, args.tile, encode=encode)


def worker(args) -> None:
    tmp = Path(args.tmp)
    measure_saved(args.threads, tmp / f"{args.op}_input.npy", lambda: _call(args, tmp),
                  tmp / f"{args.op}_{args.worker}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=5, help="latent frames (pixel frames 1 + 4(t-1))")
    p.add_argument("--height", type=int, default=256)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--tile", type=int, default=128, help="our spatial tile, pixels")
    p.add_argument("--runs", default=",".join(DECODE_RUNS))
    p.add_argument("--encode", action="store_true", help="also the encode runs (" + ",".join(ENCODE_RUNS) + ")")
    p.add_argument("--threads", type=int, default=2)
    core_flags(p)
    worker_flags(p, op=str, tmp=str)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    import numpy as np
    from safetensors.torch import save_file
    from comfyui_checks.compare_core_seedvr2 import published_weights
    plan = [("decode", r) for r in a.runs.split(",")] + [("encode", r) for r in ENCODE_RUNS if a.encode]
    if not a.comfyui:
        plan = [(op, r) for op, r in plan if not r.startswith("core")]
    t, frames = a.frames, 1 + 4 * (a.frames - 1)
    with tempfile.TemporaryDirectory(prefix="bench_seedvr2_") as tmp:
        tmp = Path(tmp)
        save_file(published_weights(), str(tmp / "seedvr2_ema_vae.safetensors"))
        rng = np.random.default_rng(0)
        np.save(tmp / "decode_input.npy", rng.standard_normal((1, 16, t, a.height // 8, a.width // 8), dtype=np.float32))
        np.save(tmp / "encode_input.npy", rng.random((1, 3, frames, a.height, a.width), dtype=np.float32))
        print(f"SeedVR2 VAE (published config, random weights), latent 1x16x{t}x{a.height // 8}x{a.width // 8} <-> "
              f"{frames} frames {a.height}x{a.width}, {a.threads} threads, fp32, our tile {a.tile} px, core tiled "
              f"{TEMPLATE[0]}/{TEMPLATE[1]} px")
        print(f"{'op':<7} {'run':<15} {'time s':>8} {'cpu s':>8} {'working MiB':>12} {'w/o output':>11} {'max err':>9}")
        ref = {}
        flags = ["--tmp", str(tmp), "--threads", str(a.threads), "--tile", str(a.tile), "--comfyui", a.comfyui or ""]
        start = lambda step: run(__file__, step[1], ["--op", step[0], *flags], tmp / f"{step[0]}_{step[1]}",
                                 a.comfy_python)
        label = lambda step: f"{step[0]:<7} {step[1]:<15}  "
        for (op, name), r, out in results(plan, start, label):
            ref.setdefault(op, out)
            err = float(np.abs(out - ref[op]).max()) if out.shape == ref[op].shape else float("nan")
            print(f"{op:<7} {name:<15} {r['best_s']:>8.1f} {r['cpu_s']:>8.1f} {r['working_set_mib']:>12.0f} "
                  f"{r['working_set_mib'] - out.size * 4 / 2 ** 20:>11.0f} {err:>9.2e}", flush=True)


if __name__ == "__main__":
    main()
