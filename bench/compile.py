"""Compile benchmark: eager vs torch.compile'd decode of an SD-shape AutoencoderKL, in one run.

    python3 bench/run.py compile                  # 512x512 on CUDA if present, else CPU; inductor
    python3 bench/run.py compile --quick          # 128x128, 1 timed call (smoke run)
    python3 bench/run.py compile --tile 256 --overlap 32 --dtype bf16 --mode max-autotune-no-cudagraphs

Our AutoencoderKL at the SD shape (128/256/512/512, 2 res blocks per level, 4 latent channels) with
random weights under a fixed seed; the latent is randn(1, 4, size/8, size/8). Rows, all through
``VAE.decode`` (checks, tiling, NaN guard included):

- eager: the input handle; ``--repeat`` timed calls after one warm-up call.
- compiled, first call: graph capture + backend compile + one decode (the "compile time" column is
  this minus the best compiled call).
- compiled: ``--repeat`` timed calls after the first.
- a second resolution (``--second``, default 3/4 of the size, odd latent sides): one call on the same
  compiled handle, and the graph count after it (no recompile storm: tiled, the count stays put).

With ``--tile``, both are tiled with the compiled handle's fixed-size tiles (the eager reference is a
``compile_vae`` handle with nothing compiled), so ``max diff`` (compiled vs eager, 0..1 image) is
parity, not seam error. Nothing asserts on timings; the machine may be shared (say so with the figures).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from harness import configs                   # noqa: E402
from vae.compile import MODES, compile_vae    # noqa: E402
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> tuple[float, torch.Tensor]:
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t, out


def run(args) -> None:
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype]
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    eager = configs.build(configs.PUBLISHED["kl"], device, dtype)
    compiled, report = compile_vae(eager, encoder=False, backend=args.backend, mode=args.mode, dynamic=args.dynamic)
    if args.tile:                                  # the same fixed-size tiles, eager
        eager, _ = compile_vae(eager, encoder=False, decoder=False)
    z = torch.randn(1, 4, args.size // 8, args.size // 8, generator=torch.Generator().manual_seed(0))
    tiles = dict(tile=args.tile, overlap=args.overlap) if args.tile else {}
    decode = lambda v, latent=z: v.decode(latent, **tiles)

    rows = []
    timed(lambda: decode(eager), device)                                  # warm-up (oneDNN/cuDNN plans)
    eager_t = [timed(lambda: decode(eager), device) for _ in range(args.repeat)]
    want = eager_t[-1][1]
    first, _ = timed(lambda: decode(compiled), device)
    graphs_first = compiled.graph_count()
    comp_t = [timed(lambda: decode(compiled), device) for _ in range(args.repeat)]
    best_e = min(t for t, _ in eager_t)
    best_c = min(t for t, _ in comp_t)
    diff = (comp_t[-1][1] - want).abs().max().item()
    rows.append(("eager", best_e, sum(t for t, _ in eager_t) / len(eager_t), "", "", "-", ""))
    rows.append(("compiled, first call", first, first, f"{first - best_c:.1f}", "", graphs_first, ""))
    rows.append(("compiled", best_c, sum(t for t, _ in comp_t) / len(comp_t), "", f"{best_e / best_c:.2f}x",
                 compiled.graph_count(), f"{diff:.1e}"))
    if args.second:
        s = args.second // 8
        z2 = torch.randn(1, 4, s, s * 5 // 4, generator=torch.Generator().manual_seed(1))
        t2, _ = timed(lambda: decode(compiled, z2), device)
        te, _ = timed(lambda: decode(eager, z2), device)
        rows.append((f"second size {8 * s * 5 // 4}x{8 * s}: eager", te, te, "", "", "-", ""))
        rows.append((f"second size {8 * s * 5 // 4}x{8 * s}: compiled", t2, t2, "", f"{te / t2:.2f}x",
                     compiled.graph_count(), ""))

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.processor() or 'cpu'}, " \
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}"
    print(f"\nSD-shape AutoencoderKL decode {args.size}x{args.size}, {args.dtype}, {device} ({name}), torch "
          f"{torch.__version__}\n{report.message}; " + (f"tiled {args.tile}/{args.overlap} px" if args.tile else "untiled"))
    head = ("run", "best s", "mean s", "compile s", "speed-up", "graphs", "max diff")
    widths = [max(len(str(r[i])) if isinstance(r[i], str) else 8 for r in rows + [head]) for i in range(len(head))]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join((f"{c:.2f}" if isinstance(c, float) else str(c)).ljust(w) for c, w in zip(r, widths)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=512, help="image side in pixels (multiple of 8)")
    p.add_argument("--second", type=int, default=None, help="side of the second resolution (0: none)")
    p.add_argument("--repeat", type=int, default=2, help="timed calls per row")
    p.add_argument("--tile", type=int, default=0, help="tile size in pixels (0: untiled)")
    p.add_argument("--overlap", type=int, default=64)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--backend", default="inductor")
    p.add_argument("--mode", default=None, choices=list(MODES))
    p.add_argument("--dynamic", default="auto", choices=["auto", "true", "false"])
    p.add_argument("--threads", type=int, default=2, help="CPU threads")
    p.add_argument("--quick", action="store_true", help="smoke run: --size 128 --repeat 1")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.repeat = 128, 1
    if args.second is None:
        args.second = args.size * 3 // 4 // 8 * 8 if args.size >= 64 else 0
    run(args)


if __name__ == "__main__":
    main()
