"""Exact decode across 1, 2 and 3 ranks on this CPU (torch.distributed, gloo): per-rank time and
working set against the one-process exact run, and the error against one untiled pass.

    python3 bench/run.py distributed                          # SD-shape KL at 1024 px, Wan 2.1 33 frames
    python3 bench/run.py distributed --only kl --size 512 --tile 256

Random weights at the published configs (SD's VAE as diffusers' AutoencoderKL; AutoencoderKLWan()),
saved once to a temporary file that every process loads. One process per rank (file rendezvous),
each measured by bench/harness/measure.py's ``measure``: weights copied in, the peak-RSS mark reset, then
the call; working set = VmHWM after the call - RSS after load, per rank. `ranks 1` is the one-process exact
run (no group). 2 cores are shared by all ranks here, so wall time cannot show a speed-up (a GPU per rank
would); CPU seconds per rank show how the work is split.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from harness.families import FAMILIES, shape, write_weights  # noqa: E402


def _case(name: str, size: int, frames: int):
    """(input, call options) for a case: SD's KL at size x size, Wan at size x 1.5 size, each tile of Wan
    streamed one latent frame at a time."""
    import torch
    family = FAMILIES[name]
    z = torch.randn(*shape(family, "decode", f"{size}x{size * 3 // 2 if family.temporal else size}x{frames}"),
                    generator=torch.Generator().manual_seed(0))
    return z, ({"tile_frames": family.temporal} if family.temporal else {})


def worker(a) -> None:
    import datetime

    import torch
    from harness.measure import measure
    from safetensors.torch import load_file

    import vae
    from vae.engine import distributed
    torch.set_num_threads(max(1, a.threads))
    v = vae.load(a.weights)
    opts = json.loads(a.opts)
    if a.world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world,
                                timeout=datetime.timedelta(seconds=3600))

    def fn(t):
        with distributed.ranks() if a.world > 1 else contextlib.nullcontext():
            return v.decode(t, **opts)
    measure(fn, load_file(a.input)["x"], v.model, 1, Path(a.out))
    if a.world > 1:
        dist.destroy_process_group()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="kl or wan")
    p.add_argument("--size", type=int, help="image height in px (kl: 1024; wan: 128, width 1.5x)")
    p.add_argument("--frames", type=int, default=33)
    p.add_argument("--tile", type=int, help="exact tile in px (kl: 256 -> 16 tiles at 1024; wan: 64)")
    p.add_argument("--ranks", default="1,2,3")
    for name in ("--worker", "--weights", "--input", "--opts", "--init", "--out"):
        p.add_argument(name, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    import numpy as np
    import torch

    import vae
    from harness import save
    cases = [a.only] if a.only else ["kl", "wan"]
    print(f"{'case':<28} {'ranks':>5} {'rank':>4} {'wall s':>7} {'cpu s':>7} {'work MiB':>9} {'vs 1 rank':>9} "
          f"{'max err':>9}")
    with tempfile.TemporaryDirectory(prefix="bench_dist_") as tmp:
        d = Path(tmp)
        for name in cases:
            size = a.size or (1024 if name == "kl" else 128)
            tile = a.tile or (256 if name == "kl" else 64)
            z, opts = _case(name, size, a.frames)
            weights = write_weights(FAMILIES[name], d)
            save({"x": z}, d / f"{name}.in.safetensors")
            with torch.inference_mode():
                want = vae.load(weights).decode(z, **opts).numpy()      # one untiled pass
            label = f"{name} {'x'.join(map(str, z.shape[2:]))} latent, tile {tile}"
            opts = {**opts, "tile": tile, "mode": "exact"}
            base = None
            for world in map(int, a.ranks.split(",")):
                init = f"file://{d / f'rdv_{name}_{world}'}"
                procs = [subprocess.Popen([sys.executable, __file__, "--worker", "1", "--weights",
                                           str(weights), "--input", str(d / f"{name}.in.safetensors"),
                                           "--opts", json.dumps(opts), "--init", init, "--rank", str(r), "--world",
                                           str(world), "--threads", str(max(1, 2 // world)),
                                           "--out", str(d / f"{name}_{world}_{r}")],
                                          env={**os.environ, "OMP_NUM_THREADS": str(max(1, 2 // world))})
                         for r in range(world)]
                if any(proc.wait() for proc in procs):
                    print(f"{label:<28} {world:>5}  FAILED")
                    continue
                for r in range(world):
                    m = json.loads((d / f"{name}_{world}_{r}.json").read_text())
                    err = float(np.abs(np.load(d / f"{name}_{world}_{r}.npy") - want).max())
                    base = base or m["working_set_mib"]
                    print(f"{label:<28} {world:>5} {r:>4} {m['best_s']:>7.1f} {m['cpu_s']:>7.1f} "
                          f"{m['working_set_mib']:>9.0f} {m['working_set_mib'] / base:>9.2f} {err:>9.1e}", flush=True)


if __name__ == "__main__":
    main()
