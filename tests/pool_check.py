"""A worker pool's life, in a process of its own (a pool makes this process rank 0 of a group):
prints one JSON line with what each call gave. Run by tests/vae/test_workers.py.

    python tests/pool_check.py           # calls, failures, an interrupt, close
    python tests/pool_check.py idle      # idle past the group's timeout, a call, then this process ends
                                         # without closing the pool (as a killed ComfyUI would)"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import vae  # noqa: E402
from vae.workers import Pool  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "vae" / "demo" / "vaekit_demo.safetensors"


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    z, x = torch.randn(1, 8, 8, 8, generator=g), torch.rand(1, 3, 64, 64, generator=g)
    v = vae.load(DEMO)
    out = {}
    pool = Pool(["cpu", "cpu", "cpu"])
    try:
        out["decode"] = (pool.run(v, "decode", z, tile=32, mode="exact") - v.decode(z)).abs().max().item()
        out["encode"] = (pool.run(v, "encode", x, tile=32, mode="exact") - v.encode(x)).abs().max().item()
        with tempfile.TemporaryDirectory() as d:          # a file the workers cannot load any more
            gone = vae.load(shutil.copy(DEMO, Path(d) / "gone.safetensors"))
            Path(gone.path).unlink()
            try:
                pool.run(gone, "decode", z, tile=32, mode="exact")
            except vae.VAEKitError as e:
                out["missing file"] = str(e)

        def interrupt(done, total):
            raise KeyboardInterrupt
        try:
            pool.run(v, "decode", z, tile=32, mode="exact", progress=interrupt)
        except KeyboardInterrupt:
            out["interrupt"] = "KeyboardInterrupt"
        out["after"] = (pool.run(v, "decode", z, tile=32, overlap=8) - v.decode(z, tile=32, overlap=8)).abs().max().item()
        out["alive"] = pool.alive
    finally:
        pool.close()
    out["closed"] = not pool.procs
    print(json.dumps(out))


def idle() -> None:
    torch.set_num_threads(1)
    z = torch.randn(1, 8, 8, 8, generator=torch.Generator().manual_seed(0))
    v = vae.load(DEMO)
    pool = Pool(["cpu", "cpu"], timeout=3)
    time.sleep(7)        # idle for over twice the group's timeout: the workers' waits time out and are retried
    out = {"alive": pool.alive, "workers": [p.pid for p in pool.procs]}
    out["decode"] = (pool.run(v, "decode", z, tile=32, mode="exact") - v.decode(z)).abs().max().item()
    print(json.dumps(out), flush=True)
    os._exit(0)                                       # no close, no exit handlers: the workers must end alone


if __name__ == "__main__":
    idle() if sys.argv[1:] == ["idle"] else main()
