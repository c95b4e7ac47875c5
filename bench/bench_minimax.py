"""MiniMax H3 video VAE decode (and encode): VAEKit beside ComfyUI core on the same file, one run each.

    python bench/bench_minimax.py --comfyui PATH/TO/ComfyUI \\
        --comfy-python PATH/TO/venv/bin/python --newer-tiled-decode FILE --frames 22 --height 512 --width 512

Weights: the published config (2.60 G parameters) with random weights under a fixed seed
(compare_core_minimax.random_weights), stored fp16 in ComfyUI's layout as
``minimax_h3_video_vae_fp16.safetensors`` is; with ``--int8`` that file quantized by core's own code
(the format of ``minimax_h3_video_vae_int8_convrot.safetensors``). Both sides run it as ComfyUI does
on a CPU: fp32 compute (int8 layers: int8 matmuls, activations quantized per row). Latent randn(1, 24, t, H/16, W/16) for a clip of
17k+5 frames (t = 5k+2); encode: rand clip of that many frames.

One subprocess per run (core's under ComfyUI's python), the peak-RSS mark reset after loading
(bench/harness/measure.py): ``load MiB`` = RSS after load (the weights as held), ``working MiB`` = peak RSS
during the call - RSS after load (the float32 output included: ``output MiB``), ``cpu s`` = process CPU
time of the call. ``max err`` against the first run of the same direction (0..1 pixels / latents).

Runs: ``ours`` (VAE.decode / encode: the definition's units, ``blend``), ``ours_stitch`` (tiling="stitch"),
``core`` (comfy.sd.VAE.decode / encode, core 783545f6: ``stitch``; attention as core picks it on a CPU:
its sub-quadratic attention), ``core_sdpa`` (the same with ``--use-pytorch-cross-attention``: PyTorch's
scaled_dot_product_attention, what core picks on NVIDIA GPUs and what ours runs), ``core_newer`` (core
with core 0.38.1's tiled decode grafted from ``--newer-tiled-decode``: ``blend``). The ``attention``
column names the function core's MiniMax H3 decoder called.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from harness import comfy_core
from harness.measure import measure
from harness.workers import core_flags, results, run, worker_flags

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("ours", "core_newer", "ours_stitch", "core", "core_sdpa")


def _fns(a, path: Path):
    """(decode, encode, model) of a run."""
    import torch
    if a.worker.startswith("core"):
        comfy_core.start(a.comfyui, pytorch_attention=a.worker == "core_sdpa")   # read when comfy is imported
        import comfy.ldm.minimax.vae as mm
        import comfy.sd
        import comfy.utils
        if a.worker == "core_newer":
            from comfyui_checks.compare_core_minimax import newer_tiled_decode
            newer_tiled_decode(mm, a.newer_tiled_decode)
        v = comfy.sd.VAE(sd=comfy.utils.load_torch_file(str(path)))
        return (lambda z: v.decode(z).movedim(-1, 1), lambda x: v.encode(x[0].movedim(0, -1)),
                v.first_stage_model)
    sys.path.insert(0, str(ROOT))
    import vae
    # built in the file's fp16, then cast, so this shared machine never holds the fp16 file and the fp32
    # weights at once (the same handle as vae.load(path); core's load holds both: 14.6 GB at its peak)
    v = vae.load(path, dtype=torch.float16).to(dtype=torch.float32)
    tiling = "stitch" if a.worker == "ours_stitch" else "blend"
    torch.set_num_threads(a.threads)
    return (lambda z: v.decode(z, tiling=tiling)), (lambda x: v.encode(x)), v.model


def worker(a) -> None:
    import numpy as np
    import torch
    torch.set_num_threads(a.threads)
    tmp = Path(a.tmp)
    decode, encode, model = _fns(a, tmp / a.weights)
    x = torch.from_numpy(np.load(tmp / f"{a.op}_input.npy"))
    fn = decode if a.op == "decode" else encode
    if a.worker.startswith("core"):           # see compare_core_minimax.worker: core's int8 path and inference_mode
        torch.inference_mode = torch.no_grad
    measure(fn, x, model, 1, tmp / f"{a.worker}_{a.op}")
    if a.worker.startswith("core"):           # which attention core's decoder ran (its choice for the device)
        import comfy.ldm.minimax.vae as mm
        out = tmp / f"{a.worker}_{a.op}.json"
        out.write_text(json.dumps({**json.loads(out.read_text()), "attention": mm.optimized_attention.__name__}))


def _run(a, name: str, op: str, weights: str) -> dict:
    flags = ["--op", op, "--tmp", a.tmp, "--weights", weights, "--threads", str(a.threads),
             "--comfyui", a.comfyui or "", "--newer-tiled-decode", a.newer_tiled_decode or ""]
    return run(__file__, name, flags, Path(a.tmp) / f"{name}_{op}", a.comfy_python)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=22, help="pixel frames, 17k + 5")
    p.add_argument("--height", type=int, default=512)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--ops", default="decode", help="decode, encode or both (comma list)")
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--int8", action="store_true", help="the int8 file (ComfyUI's convrot format) instead of fp16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tmp", default=None, help="folder for the 4.9 GB weight file (kept: reused by later runs)")
    core_flags(p, "ComfyUI source directory (the core runs)")
    p.add_argument("--newer-tiled-decode", help="core 0.38.1's _decode_tile_row and tiled_decode (core_newer)")
    worker_flags(p, op=str, weights=str)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    import numpy as np
    import torch
    from safetensors.torch import save_file
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from comfyui_checks.compare_core_minimax import PUBLISHED, random_weights
    if (a.frames - 5) % 17:
        p.error("--frames must be 17k + 5 (22, 39, 56, ...)")
    if a.height % 16 or a.width % 16:
        p.error("--height and --width must be multiples of 16")
    tmp = Path(a.tmp or (ROOT.parent / "bench_minimax_tmp"))
    tmp.mkdir(parents=True, exist_ok=True)
    a.tmp = str(tmp)
    fp16 = tmp / "minimax_h3_video_vae_fp16.safetensors"
    if not fp16.exists():
        save_file(random_weights(PUBLISHED, torch.float16), str(fp16))
    weights = fp16.name
    if a.int8:
        int8 = tmp / "minimax_h3_video_vae_int8_convrot.safetensors"
        if not int8.exists():
            proc = subprocess.run([a.comfy_python, str(Path(__file__).resolve().parent / "compare_core_minimax.py"),
                                   "--worker", str(tmp), "--quantize", "--size", "int8",
                                   "--comfyui", a.comfyui],
                                  capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"quantizing failed: {proc.stderr[-2000:]}")
        weights = int8.name
    runs = [r for r in a.runs.split(",") if a.comfyui or not r.startswith("core")]
    runs = [r for r in runs if r != "core_newer" or a.newer_tiled_decode]
    rng = np.random.default_rng(0)
    t = (a.frames - 5) // 17 * 5 + 2
    np.save(tmp / "decode_input.npy", rng.standard_normal((1, 24, t, a.height // 16, a.width // 16), dtype=np.float32))
    np.save(tmp / "encode_input.npy", rng.random((1, 3, a.frames, a.height, a.width), dtype=np.float32))
    print(f"MiniMax H3 (published config, random weights, {weights}), {a.frames} frames at {a.width}x{a.height} "
          f"(latent 1x24x{t}x{a.height // 16}x{a.width // 16}), fp32 compute, {a.threads} threads, CPU")
    print(f"{'run':<12} {'op':<7} {'time s':>8} {'cpu s':>8} {'load MiB':>9} {'working MiB':>12} {'output MiB':>11} "
          f"{'max err':>9}  attention")
    for op in a.ops.split(","):
        ref = None
        # encode tiles are stitched in every version; no attention
        names = [r for r in runs if op == "decode" or r not in ("ours_stitch", "core_newer", "core_sdpa")]
        label = lambda name: f"{name:<12} {op:<7} "
        for name, r, out in results(names, lambda name: _run(a, name, op, weights), label):
            ref = out if ref is None else ref
            err = float(np.abs(out - ref).max()) if out.shape == ref.shape else float("nan")
            print(f"{name:<12} {op:<7} {r['best_s']:>8.1f} {r['cpu_s']:>8.1f} {r['rss_after_load_mib']:>9.0f} "
                  f"{r['working_set_mib']:>12.0f} {out.size * 4 / 2 ** 20:>11.0f} {err:>9.2e}  {r.get('attention', 'sdpa')}",
                  flush=True)


if __name__ == "__main__":
    main()
