"""Decode benchmark: VAEKit's AutoencoderKL against diffusers' on the CPU, in one run.

    python bench/bench_decode.py                 # 512x512, 2 timed calls per configuration
    python bench/bench_decode.py --quick         # 128x128, 1 call (smoke run)
    python bench/bench_decode.py --json out.json # also write the figures as JSON
    python bench/bench_decode.py --profile       # plus one profiled untiled decode per library

A diffusers AutoencoderKL at the SD shape (128/256/512/512, 2 layers per block, 4 latent channels)
is built with random weights under a fixed seed and saved to a temporary .safetensors file; both
libraries load those same weights from that file. Every configuration runs in its own subprocess,
so peak RSS is per configuration. Nothing here asserts on timings: it prints figures and the
targets beside them.

Memory: ``rss after load`` is VmRSS once the weights are loaded and every weight has been read
once (safetensors weights may stay memory-mapped and be paged in only on first use); the kernel's
peak-RSS mark is then reset (/proc/self/clear_refs) so that ``peak RSS`` (ru_maxrss after the
decodes) is the peak of the decode phase, not a load-time transient; ``working set`` = peak RSS -
rss after load.
Outputs (0..1, clamped) are saved as .npy and compared in the parent: parity of ours vs diffusers
(both untiled) and seam error of each tiled run vs the untiled run of the same library.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from harness.measure import MIB, cpu_s, loaded_rss_kib, maxrss_kib, reset_peak, vm_hwm_kib

ROOT = Path(__file__).resolve().parents[1]
SEED = 0
KL_SHAPE = dict(
    in_channels=3, out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4,
    norm_num_groups=32, sample_size=512,
)

# name -> (library, tile px, overlap px, label). Tile None: untiled.
CONFIGS = {
    "diffusers": ("diffusers", None, None, "diffusers untiled"),
    "ours": ("ours", None, None, "ours untiled"),
    "ours_t512": ("ours", 512, 64, "ours tiled 512/64"),
    "ours_t256": ("ours", 256, 32, "ours tiled 256/32"),
    "diffusers_tiling": ("diffusers", "default", None, "diffusers enable_tiling()"),
    "diffusers_tiling_256": ("diffusers", 256, None, "diffusers enable_tiling() tile_sample_min_size=256"),
}
REFERENCE = {"diffusers": None, "ours": "diffusers", "ours_t512": "ours", "ours_t256": "ours",
             "diffusers_tiling": "diffusers", "diffusers_tiling_256": "diffusers"}
TARGET = {"ours": 1.0, "ours_t512": 1.15, "ours_t256": 1.15}   # max ratio vs REFERENCE (best times)


# ---- worker (one configuration, one process) -------------------------------------------------------

def _load_diffusers(weights: Path, tile):
    from diffusers import AutoencoderKL
    from harness.workers import diffusers_from_file

    model = diffusers_from_file(AutoencoderKL, weights, **KL_SHAPE).requires_grad_(False)
    note = ""
    if tile is not None:
        model.enable_tiling()
        if tile != "default":
            if not hasattr(model, "tile_sample_min_size"):
                raise SystemExit("skipped: this diffusers AutoencoderKL has no tile_sample_min_size attribute")
            model.tile_sample_min_size = tile
            # decode splits on the latent grid: keep the latent tile consistent with the pixel tile
            model.tile_latent_min_size = tile // 2 ** (len(KL_SHAPE["block_out_channels"]) - 1)
        note = (f"tile_sample_min_size={model.tile_sample_min_size} tile_latent_min_size="
                f"{model.tile_latent_min_size} overlap_factor={model.tile_overlap_factor}")

    def decode(z):
        y = model.decode(z).sample
        return (y / 2 + 0.5).clamp_(0, 1)          # the pipelines' [-1, 1] -> 0..1 mapping

    def tiles(hw):
        """(tile count, largest tile in pixels)"""
        if tile is None or all(n <= model.tile_latent_min_size for n in hw):
            return 1, [n * 8 for n in hw]
        step = int(model.tile_latent_min_size * (1 - model.tile_overlap_factor))
        return (math.prod(len(range(0, n, step)) for n in hw),
                [min(n, model.tile_latent_min_size) * 8 for n in hw])

    return decode, tiles, note, model


def _load_ours(weights: Path, tile, overlap):
    sys.path.insert(0, str(ROOT))
    import vae
    from vae.engine import tiling

    v = vae.load(weights)

    def decode(z):
        return v.decode(z, tile=tile, overlap=overlap)

    def tiles(hw):
        """(tile count, largest tile in pixels)"""
        plans = v._plans(tuple(hw), tile, overlap, None, None)     # an image model: no frame axis
        r = v.caps.spatial_ratio
        return tiling.tile_count(plans), [max(b - a for a, b in p.spans) * r for p in plans]

    return decode, tiles, repr(v), v.model


def worker(args) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    lib, tile, overlap, label = CONFIGS[args.worker]
    tmp = Path(args.tmp)
    weights = tmp / "kl.safetensors"
    z = torch.from_numpy(np.load(tmp / "latent.npy"))
    if lib == "diffusers":
        decode, tiles, note, model = _load_diffusers(weights, tile)
    else:
        decode, tiles, note, model = _load_ours(weights, tile, overlap)
    rss_load = loaded_rss_kib(model)      # the weights paged in: loading, not the decode's working set
    peak_load = maxrss_kib()
    reset = reset_peak()

    if args.profile:
        _profile(decode, z, label)
        return

    times, cpu, out = [], [], None
    with torch.inference_mode():
        for _ in range(args.repeat):
            out = None
            c0, t0 = cpu_s(), time.perf_counter()
            out = decode(z)
            times.append(time.perf_counter() - t0)
            cpu.append(cpu_s() - c0)
    peak = vm_hwm_kib()      # not ru_maxrss: it also keeps exited threads' peaks from before the reset
    np.save(tmp / f"{args.worker}.npy", out.float().numpy())
    n_tiles, tile_px = tiles(z.shape[-2:])
    result = dict(config=args.worker, label=label, library=lib, tile=tile, overlap=overlap,
                  tiles=n_tiles, tile_px=tile_px, note=note, times_s=times, best_s=min(times),
                  mean_s=sum(times) / len(times), cpu_s=cpu, cpu_best_s=min(cpu),
                  rss_after_load_mib=rss_load / MIB, peak_load_mib=peak_load / MIB, peak_rss_mib=peak / MIB,
                  vm_hwm_mib=vm_hwm_kib() / MIB, working_set_mib=(peak - rss_load) / MIB,
                  peak_reset=reset, threads=torch.get_num_threads())
    (tmp / f"{args.worker}.json").write_text(json.dumps(result))


def _profile(decode, z, label: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        decode(z)
    print(f"\n=== profile: {label} (one decode, {z.shape[-1] * 8}px) ===")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40))


# ---- parent --------------------------------------------------------------------------------------

def _prepare(tmp: Path, size: int) -> None:
    import numpy as np
    import torch
    from diffusers import AutoencoderKL
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    model = AutoencoderKL(**KL_SHAPE)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "kl.safetensors"))
    g = torch.Generator().manual_seed(SEED)
    z = torch.randn(1, 4, size // 8, size // 8, generator=g)
    np.save(tmp / "latent.npy", z.numpy())


def _child_env(args) -> dict:
    return dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))


def _run_worker(name: str, tmp: Path, args, profile: bool = False) -> dict | None:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--tmp", str(tmp),
           "--repeat", str(args.repeat), "--threads", str(args.threads)] + (["--profile"] if profile else [])
    env = _child_env(args)
    print(f"  running {CONFIGS[name][3]} ...", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=not profile, text=True)
    if proc.returncode != 0:
        print(f"  FAILED ({proc.returncode}):\n{proc.stderr if not profile else ''}", flush=True)
        return None
    if profile:
        return None
    res = json.loads((tmp / f"{name}.json").read_text())
    print(f"    done in {time.perf_counter() - t0:.1f}s (best {res['best_s']:.2f}s)", flush=True)
    return res


def _compare(a, b) -> tuple[float, float]:
    import numpy as np

    d = a.astype(np.float64) - b.astype(np.float64)
    mse = float(np.mean(d * d))
    return float(np.abs(d).max()), (math.inf if mse == 0 else 10 * math.log10(1.0 / mse))


def _fmt(x, spec: str, none: str = "-") -> str:
    if x is None:
        return none
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=512, help="image side in pixels (multiple of 8)")
    p.add_argument("--repeat", type=int, default=2, help="timed calls per configuration (no warm-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="smoke run: --size 128 --repeat 1")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    p.add_argument("--keep", metavar="DIR", help="copy the decoded images (.npy) and the latent to DIR")
    p.add_argument("--profile", action="store_true",
                   help="after the table, profile one untiled decode of each library (torch.profiler)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    p.add_argument("--prepare", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.prepare:
        return _prepare(Path(args.tmp), args.prepare)
    if args.quick:
        args.size, args.repeat = 128, 1
    if args.size % 8:
        p.error("--size must be a multiple of 8")
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"unknown configs {unknown}; choose from {list(CONFIGS)}")

    # The parent stays small (numpy only, no torch): a child's ru_maxrss starts at its parent's peak
    # RSS (the kernel carries it over at exec), so a heavy parent would hide the children's figures.
    import numpy as np

    versions = {m: metadata.version(m) for m in ("torch", "diffusers", "numpy")}
    started = datetime.datetime.now().astimezone()
    load0 = os.getloadavg()
    print(f"decode benchmark: {args.size}x{args.size}, latent 1x4x{args.size // 8}x{args.size // 8}, fp32, "
          f"{args.threads} threads, {args.repeat} timed call(s) each, no warm-up")
    print(f"torch {versions['torch']}, diffusers {versions['diffusers']}, python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {platform.machine()}, load average {load0[0]:.2f} at start")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="vaekit-bench-") as d:
        tmp = Path(d)
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--prepare", str(args.size), "--tmp", d],
                       env=_child_env(args), check=True)
        for name in names:
            r = _run_worker(name, tmp, args)
            if r is not None:
                results[name] = r
        outs = {n: np.load(tmp / f"{n}.npy") for n in results}
        if args.keep:
            keep = Path(args.keep)
            keep.mkdir(parents=True, exist_ok=True)
            for n in [*results, "latent"]:
                shutil.copyfile(tmp / f"{n}.npy", keep / f"{n}.npy")
        if args.profile:
            for name in ("diffusers", "ours"):
                _run_worker(name, tmp, args, profile=True)

    for name, r in results.items():
        ref = REFERENCE[name]
        r["reference"] = ref
        r["ratio"] = r["best_s"] / results[ref]["best_s"] if ref in results else None
        r["cpu_ratio"] = r["cpu_best_s"] / results[ref]["cpu_best_s"] if ref in results else None
        r["max_abs_err"], r["psnr_db"] = _compare(outs[name], outs[ref]) if ref in outs else (None, None)
        r["target_ratio"] = TARGET.get(name)
        r["target_met"] = None if r["ratio"] is None or name not in TARGET else r["ratio"] <= TARGET[name]
    if "diffusers" in outs:
        ref = outs["diffusers"]
        sat = float(np.mean((ref <= 0) | (ref >= 1)))
        print(f"reference output: mean {ref.mean():.3f}, std {ref.std():.3f}, {100 * sat:.1f}% of values clamped")

    # ---- table ----
    cols = ["config", "tiles", "best (s)", "mean (s)", "cpu (s)", "ratio", "cpu ratio", "vs", "target",
            "peak RSS (MiB)", "working set (MiB)", "max abs err", "PSNR (dB)"]
    rows = []
    for name, r in results.items():
        target = "" if r["target_ratio"] is None else f"<= {r['target_ratio']:.2f}x" + (
            "" if r["target_met"] is None else " ok" if r["target_met"] else " MISSED")
        rows.append([r["label"], str(r["tiles"]), _fmt(r["best_s"], ".2f"), _fmt(r["mean_s"], ".2f"),
                     _fmt(r["cpu_best_s"], ".2f"),
                     _fmt(r["ratio"], ".3f") + ("x" if r["ratio"] is not None else ""),
                     _fmt(r["cpu_ratio"], ".3f") + ("x" if r["cpu_ratio"] is not None else ""),
                     r["reference"] or "(reference)", target, _fmt(r["peak_rss_mib"], ".0f"),
                     _fmt(r["working_set_mib"], ".0f"), _fmt(r["max_abs_err"], ".2e"), _fmt(r["psnr_db"], ".1f")])
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = lambda cells: " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print()
    print(line(cols))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    print()
    print("ratio: best time / best time of 'vs'. cpu: process CPU time (all threads) of the fastest call; cpu ratio:\n"
          "the same against 'vs' (less sensitive than wall time to other processes on the machine).\n"
          "max abs err / PSNR: against 'vs' on 0..1 images (ours untiled vs diffusers untiled = parity;\n"
          "tiled vs untiled of the same library = seam error).")
    if not all(r["peak_reset"] for r in results.values()):
        print("note: the peak-RSS mark could not be reset after loading; peak RSS may be a load transient.")
    for name, r in results.items():
        if r["note"] and r["library"] == "diffusers" and r["tile"] is not None:
            print(f"{r['label']}: {r['note']}, {r['tiles']} tile(s)")
        if r["tiles"] == 1 and r["tile"] is not None:
            print(f"{r['label']}: the {args.size}px image fits one tile, so this run is not tiled.")

    load1 = os.getloadavg()
    print(f"load average at the end: {load1[0]:.2f} (1 min), {load1[1]:.2f} (5 min); above {args.threads} "
          "means other processes shared the CPUs and wall times are inflated (see cpu (s)).")

    # ---- targets ----
    print("\ntargets (informational, never asserted):")
    if "ours" in results and "diffusers" in results:
        r = results["ours"]
        print(f"  untiled no slower than diffusers: {r['ratio']:.3f}x -> {'ok' if r['target_met'] else 'MISSED'}"
              f"  (cpu time {r['cpu_ratio']:.3f}x)")
    for name in ("ours_t512", "ours_t256"):
        if name in results and results[name]["ratio"] is not None:
            r = results[name]
            print(f"  {r['label']} <= 1.15x ours untiled: {r['ratio']:.3f}x -> {'ok' if r['target_met'] else 'MISSED'}"
                  f"  (cpu time {r['cpu_ratio']:.3f}x)" + ("  (not tiled at this size)" if r["tiles"] == 1 else ""))
    ws = None
    if "ours_t256" in results and "ours" in results:
        t, u = results["ours_t256"], results["ours"]
        ws = t["working_set_mib"] / u["working_set_mib"] if u["working_set_mib"] > 0 else None
        area = math.prod(t["tile_px"]) / args.size ** 2
        print(f"  tiled working set bounded by the tile: 256/32 {t['working_set_mib']:.0f} MiB vs untiled "
              f"{u['working_set_mib']:.0f} MiB (ratio {_fmt(ws, '.2f')}; {t['tiles']} tile(s) of "
              f"{'x'.join(map(str, t['tile_px']))} px = {area:.2f} of the image area; "
              f"the output buffer is {3 * args.size * args.size * 4 / 2 ** 20:.0f} MiB)")

    if args.json:
        doc = dict(date=started.isoformat(timespec="seconds"), size=args.size, repeat=args.repeat,
                   threads=args.threads, dtype="float32", seed=SEED, **versions,
                   python=platform.python_version(), cpus=os.cpu_count(), load_average_start=load0,
                   load_average_end=load1,
                   machine=platform.machine(), kl_shape={k: list(v) if isinstance(v, tuple) else v
                                                         for k, v in KL_SHAPE.items()},
                   results=results, working_set_ratio_t256_vs_untiled=ws)
        Path(args.json).write_text(json.dumps(doc, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
