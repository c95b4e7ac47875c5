"""Frame-wise decode benchmark: peak memory and time of streamed (frame-wise) decoding against the
one-pass decode and diffusers' own chunked decode, same weights, same run.

    python bench/bench_framewise.py                      # Magvit at its published config, 8/16/32 latent frames
    python bench/bench_framewise.py --frames 8,16 --size 8

EasyAnimate's Magvit (diffusers AutoencoderKLMagvit, default = published config) with random
weights under a fixed seed, saved once; latents randn(1, 16, T, size, size). One subprocess per
(run, T); the peak-RSS mark is reset after loading (bench_decode.py), so ``working set`` = peak RSS
during the decode - RSS after load, and ``w/o output`` subtracts the float32 output buffer
(1 x 3 x (1 + 4(T-1)) x 8size x 8size), which every method must hold. Runs:
  ours frame-wise   VAE.decode(z, tile_frames=4): one latent frame per chunk through the causal caches
  ours one pass     VAE.decode(z)
  diffusers         AutoencoderKLMagvit.decode: its own definition decodes the first latent frame, then
                    one latent frame at a time with caches, and concatenates the results
Max abs difference of each output against ours one pass is printed. One timed call per run.

    python bench/bench_framewise.py --approx             # the approximate families' error

``--approx``: HunyuanVideo and LTX-Video 0.9.0 at their published configs (random weights) cannot
stream exactly; their frame-wise decode (2 latent frames per chunk, 1 overlapping, blended) is
compared with the one-pass decode on 0..1 pixels: max / mean abs error and PSNR, and both times.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.measure import MIB, maxrss_kib, reset_peak, loaded_rss_kib
from harness.workers import diffusers_from_file

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("ours_framewise", "ours_one_pass", "diffusers")


def worker(args) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    tmp = Path(args.tmp)
    z = torch.from_numpy(np.load(tmp / f"latent_{args.t}.npy"))
    if args.worker == "diffusers":
        import diffusers
        model = diffusers_from_file(diffusers.AutoencoderKLMagvit, tmp / "magvit.safetensors")
        decode = lambda z: (model.decode(z).sample / 2 + 0.5).clamp_(0, 1)
    else:
        sys.path.insert(0, str(ROOT))
        import vae
        v = vae.load(tmp / "magvit.safetensors")
        model = v.model
        frames = 4 if args.worker == "ours_framewise" else None
        decode = lambda z: v.decode(z, tile_frames=frames)
    rss = loaded_rss_kib(model)
    reset = reset_peak()
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = decode(z)
        dt = time.perf_counter() - t0
    peak = maxrss_kib()
    np.save(tmp / f"{args.worker}_{args.t}.npy", out.numpy())
    (tmp / f"{args.worker}_{args.t}.json").write_text(json.dumps(dict(
        s=dt, working_mib=(peak - rss) / MIB, output_mib=out.numel() * 4 / 2 ** 20, reset=reset)))


def approx(threads: int) -> None:
    import diffusers
    import torch
    sys.path.insert(0, str(ROOT))
    import vae

    torch.set_num_threads(threads)
    print("approximate families, frame-wise (2 latent frames per chunk, 1 overlapping) vs one pass:")
    for name, cls, shape in (("hunyuan_video", "AutoencoderKLHunyuanVideo", (1, 16, 8, 8, 8)),
                             ("ltx", "AutoencoderKLLTXVideo", (1, 128, 5, 4, 4))):
        torch.manual_seed(0)
        v = vae.from_state_dict(getattr(diffusers, cls)().state_dict())
        z = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        r = v.caps.temporal_ratio
        t0 = time.perf_counter()
        full = v.decode(z)
        t1 = time.perf_counter()
        fw = v.decode(z, tile_frames=2 * r, overlap_frames=r)
        t2 = time.perf_counter()
        err = (fw - full).abs()
        psnr = -10 * torch.log10(err.square().mean()).item()
        print(f"  {name:<14} {tuple(full.shape[2:])} frames x H x W: max {err.max():.3f}, mean {err.mean():.4f}, "
              f"PSNR {psnr:.1f} dB; one pass {t1 - t0:.1f} s, frame-wise {t2 - t1:.1f} s")
        del v, full, fw


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", default="8,16,32", help="latent frame counts")
    p.add_argument("--size", type=int, default=8, help="latent height and width")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    p.add_argument("--t", type=int, help=argparse.SUPPRESS)
    p.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--approx", action="store_true", help="the approximate families' frame-wise error")
    args = p.parse_args()
    if args.approx:
        return approx(args.threads)
    frames = [int(f) for f in args.frames.split(",")]
    if args.worker:
        return worker(args)
    if args.prepare:
        import diffusers
        import numpy as np
        import torch
        from safetensors.torch import save_file
        torch.manual_seed(0)
        m = diffusers.AutoencoderKLMagvit()
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(Path(args.tmp) / "magvit.safetensors"))
        for t in frames:
            g = torch.Generator().manual_seed(t)
            np.save(Path(args.tmp) / f"latent_{t}.npy", torch.randn(1, 16, t, args.size, args.size, generator=g).numpy())
        return

    import numpy as np
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    me = [sys.executable, str(Path(__file__).resolve())]
    print(f"frame-wise decode benchmark: Magvit (published config), latent 1 x 16 x T x {args.size} x {args.size}, "
          f"fp32, {args.threads} threads, load {os.getloadavg()[0]:.2f}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vaekit-fw-") as d:
        subprocess.run(me + ["--prepare", "--tmp", d, "--frames", args.frames, "--size", str(args.size)],
                       env=env, check=True)
        for t in frames:
            res = {}
            for run in RUNS:
                print(f"  T={t}: {run} ...", flush=True)
                proc = subprocess.run(me + ["--worker", run, "--tmp", d, "--t", str(t), "--frames", args.frames,
                                            "--threads", str(args.threads)], env=env, capture_output=True, text=True)
                if proc.returncode:
                    print(f"    FAILED: {proc.stderr.strip().splitlines()[-1:]}")
                    continue
                res[run] = json.loads(Path(d, f"{run}_{t}.json").read_text())
            ref = np.load(Path(d, f"ours_one_pass_{t}.npy")) if "ours_one_pass" in res else None
            for run, r in res.items():
                out = np.load(Path(d, f"{run}_{t}.npy"))
                r["max_abs"] = float(np.abs(out - ref).max()) if ref is not None else float("nan")
                rows.append((t, run, r))
    print(f"\n{'T':>3} {'frames':>6} {'run':<15} {'time s':>7} {'vs one pass':>11} {'working MiB':>12} "
          f"{'w/o output':>11} {'max abs':>9}")
    base = {t: r["s"] for t, run, r in rows if run == "ours_one_pass"}
    for t, run, r in rows:
        print(f"{t:>3} {1 + 4 * (t - 1):>6} {run:<15} {r['s']:>7.2f} {r['s'] / base.get(t, r['s']):>11.2f} "
              f"{r['working_mib']:>12.0f} {r['working_mib'] - r['output_mib']:>11.0f} {r['max_abs']:>9.1e}")
    fw = {t: r["working_mib"] - r["output_mib"] for t, run, r in rows if run == "ours_framewise"}
    if frames[0] in fw and frames[-1] in fw:
        print(f"\nframe-wise working set w/o output, T={frames[-1]} vs T={frames[0]}: "
              f"{fw[frames[-1]] / max(fw[frames[0]], 1e-9):.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    main()
