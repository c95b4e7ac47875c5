"""One gloo rank of tests/vae/test_distributed.py's piecewise sum: the backend's device set apart from
the tensor's, as NCCL's CUDA device is from a host map, with every all-reduce recorded. Prints one JSON line.

    python tests/sum_check.py --rank R --world N --init file:///..."""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from vae.engine import distributed  # noqa: E402


class Recorder:
    """torch.distributed, with the bytes and addresses of every all-reduced tensor written down."""

    def __init__(self):
        self.reduced = []

    def all_reduce(self, t, group=None):
        self.reduced.append({"bytes": t.numel() * t.element_size(), "ptr": t.data_ptr()})
        return dist.all_reduce(t, group=group)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=60))
    distributed.PIECE_BYTES = 4096
    comm = distributed.Ranks()
    comm.device = torch.device("cpu", 0)      # not the tensors' device ("cpu"), so sum_ moves them through it
    comm.dist = recorder = Recorder()
    g = torch.Generator().manual_seed(a.rank)
    out = {}
    # a map of 10 pieces and a bit; a non-contiguous one (a stage map's slice); a GroupNorm sum's scalar
    for name, t in (("map", torch.randn(2, 3, 21, 41, generator=g)),
                    ("slice", torch.randn(4, 30, 40, dtype=torch.float64, generator=g)[:, 5:25, ::2]),
                    ("scalar", torch.tensor(a.rank + 0.5, dtype=torch.float64))):
        whole = t.clone()
        dist.all_reduce(whole)                # the whole-tensor sum, for comparison
        recorder.reduced.clear()
        got = comm.sum_(t)
        # the storage's own range (a slice's data_ptr lies past its start: from there, nbytes would reach
        # beyond the storage, where the piece buffer may well be allocated)
        start = t.untyped_storage().data_ptr()
        end = start + t.untyped_storage().nbytes()
        out[name] = {"same": got is t and torch.equal(t, whole), "bytes": t.numel() * t.element_size(),
                     "pieces": [r["bytes"] for r in recorder.reduced],
                     "inside": any(start <= r["ptr"] < end for r in recorder.reduced)}
    print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
