"""Flux.2 VAE benchmark: ours beside diffusers at the published config, decode and encode, in one run.

    python bench/bench_flux2.py                    # 512x512, 2 timed calls per row
    python bench/bench_flux2.py --size 256 --repeat 1
    python bench/bench_flux2.py --tile 256         # also ours tiled: fast 256/32 and exact 256
    python bench/bench_flux2.py --json out.json    # the figures as JSON

The published FLUX.2 VAE config (diffusers' AutoencoderKLFlux2 defaults: 128/256/512/512, 2 layers per
block, 32 latent channels, quant convs, mid-block attention, BatchNorm eps 1e-4) with random weights and
random BatchNorm statistics under a fixed seed, saved to a temporary .safetensors file that both
libraries load. diffusers' side is its Flux.2 pipeline's own VAE steps around AutoencoderKLFlux2
(tests/diffusers_flux2.py): BatchNorm un-normalise + unpatchify + decode + postprocess, and encode
(mode) + patchify + normalise. Ours: ``VAE.decode`` / ``VAE.encode`` on the 128-channel LATENT.

One subprocess per row; every weight is read once after loading, then the kernel's peak-RSS mark is
reset (bench_decode.py), so ``work`` = peak RSS - RSS after load is the call's working set. Outputs
are compared in the parent: 0..1 pixels for decode, the LATENT for encode (ours vs diffusers; tiled
vs ours untiled). Nothing here asserts on timings."""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from importlib import metadata
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
from harness.measure import run_child  # noqa: E402
from harness.workers import diffusers_from_file, measure_saved  # noqa: E402

SEED = 0
STATS_VAR = (0.25, 4.0)     # BatchNorm variances at a latent's scale (log-uniform)


def _rows(tile: int | None) -> list[tuple[str, str, int | None, str, str]]:
    """(op, library, tile px, mode, label)"""
    rows = []
    for op in ("decode", "encode"):
        rows += [(op, "diffusers", None, "fast", f"{op} diffusers pipeline"), (op, "ours", None, "fast", f"{op} ours")]
        if tile:
            rows += [(op, "ours", tile, "fast", f"{op} ours fast {tile}/{tile // 8}"),
                     (op, "ours", tile, "exact", f"{op} ours exact {tile}")]
    return rows


def _tests_on_path() -> None:
    for p in (ROOT / "tests", ROOT):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))


def _prepare(tmp: Path, size: int) -> None:
    import numpy as np
    import torch
    from safetensors.torch import save_file

    _tests_on_path()
    import diffusers_flux2
    model = diffusers_flux2.model(**diffusers_flux2.PUBLISHED, var=STATS_VAR)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "flux2.safetensors"))
    g = torch.Generator().manual_seed(SEED)
    np.save(tmp / "latent.npy", torch.randn(1, 128, size // 16, size // 16, generator=g).numpy())
    np.save(tmp / "image.npy", torch.rand(1, 3, size, size, generator=g).numpy())


def _diffusers(weights: Path, op: str):
    from diffusers import AutoencoderKLFlux2

    _tests_on_path()
    import diffusers_flux2
    model = diffusers_from_file(AutoencoderKLFlux2, weights).requires_grad_(False)
    pipe = diffusers_flux2.Pipeline()
    return model, ((lambda t: pipe.decode(model, t)) if op == "decode" else (lambda t: pipe.encode(model, t)))


def _ours(weights: Path, op: str, tile, mode: str):
    sys.path.insert(0, str(ROOT))
    import vae

    v = vae.load(weights)
    call = v.decode if op == "decode" else v.encode
    overlap = tile // 8 if tile else None
    return v.model, lambda t: call(t, tile=tile, overlap=overlap, mode=mode)


def worker(args) -> None:
    tmp = Path(args.tmp)
    weights = tmp / "flux2.safetensors"
    build = lambda: (_diffusers(weights, args.op) if args.lib == "diffusers"
                     else _ours(weights, args.op, args.tile, args.mode))
    measure_saved(args.threads, tmp / ("latent.npy" if args.op == "decode" else "image.npy"), build, tmp / args.key,
                  args.repeat)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=512, help="image side in pixels (a multiple of 16)")
    p.add_argument("--repeat", type=int, default=2, help="timed calls per row (no warm-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tile", type=int, default=0, help="also run ours tiled at this tile size (px)")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    for name in ("tmp", "op", "lib", "mode", "key"):
        p.add_argument(f"--{name}", help=argparse.SUPPRESS)
    p.add_argument("--tile-px", dest="tile_px", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.prepare:
        return _prepare(Path(args.tmp), args.size)
    if args.worker:
        args.tile = args.tile_px or None
        return worker(args)

    import numpy as np      # the parent stays small: children's ru_maxrss starts at the parent's peak

    if args.size % 16:
        p.error("--size must be a multiple of 16 (Flux.2 LATENTs are 16x smaller, packed 2x2)")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    me = [sys.executable, str(Path(__file__).resolve())]
    print(f"Flux.2 VAE benchmark: {args.size}x{args.size} image, LATENT 1 x 128 x {args.size // 16} x "
          f"{args.size // 16}, fp32, {args.threads} threads, {args.repeat} timed call(s), published config, "
          "random weights")
    print(f"torch {metadata.version('torch')}, diffusers {metadata.version('diffusers')}, "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="vaekit-flux2-") as d:
        print("  building the published-config model ...", flush=True)
        if not run_child(me + ["--prepare", "--tmp", d, "--size", str(args.size)], env):
            return
        for i, (op, lib, tile, mode, label) in enumerate(_rows(args.tile)):
            key = f"row{i}"
            print(f"  {label} ...", flush=True)
            cmd = me + ["--worker", "--tmp", d, "--op", op, "--lib", lib, "--mode", mode, "--key", key,
                        "--tile-px", str(tile or 0), "--repeat", str(args.repeat), "--threads", str(args.threads)]
            if run_child(cmd, env):
                results[label] = dict(json.loads(Path(d, f"{key}.json").read_text()), op=op, lib=lib, tile=tile,
                                      mode=mode, out=Path(d, f"{key}.npy"))
        for label, r in results.items():
            vs = f"{r['op']} diffusers pipeline" if r["tile"] is None else f"{r['op']} ours"
            r["vs"] = vs if vs != label else None
            if r["vs"] in results:
                a, b = (np.load(results[k]["out"]).astype(np.float64) for k in (label, vs))
                r["max_abs"] = float(np.abs(a - b).max()) if a.shape == b.shape else float("nan")
                r["ratio"] = r["best_s"] / results[vs]["best_s"]
        for r in results.values():
            del r["out"]

    print()
    head = (f"{'row':<26} {'best s':>8} {'ratio':>6} {'vs':<24} {'work MiB':>9} {'peak MiB':>9} {'max abs':>9}")
    print(head)
    print("-" * len(head))
    for label, r in results.items():
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
        err = f"{r['max_abs']:.1e}" if "max_abs" in r else "-"
        print(f"{label:<26} {r['best_s']:>8.2f} {ratio:>6} {r['vs'] or '(reference)':<24} "
              f"{r['working_set_mib']:>9.0f} {r['peak_rss_mib']:>9.0f} {err:>9}")
    print("\nratio = best time / the 'vs' row's; work = peak RSS during the calls - RSS after load; max abs on "
          "0..1 pixels (decode) or on the LATENT (encode).")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
