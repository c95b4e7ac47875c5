"""One rank of a distributed test run (tests/vae/test_distributed.py starts one process per rank).

    python tests/dist_worker.py --rank R --world N --init file:///... --cases cases.json --out DIR

Runs every case of ``cases.json`` (the same list on every rank, as torchrun would) inside
``vae.engine.distributed.ranks()``, writes each output to ``DIR/<case>.<rank>.safetensors`` and what became
of each case to ``DIR/status.<rank>.json``; a case may inject a failure or an interrupt on one rank."""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import apart  # noqa: E402
import vae  # noqa: E402
from vae.engine import distributed  # noqa: E402


def _progress(case: dict, rank: int, totals: dict):
    """The call's progress callback (it records this rank's step count, its share of the tiles' work):
    on the named rank, an interrupt or a failure after two steps."""
    steps = [0]
    kind = "interrupt" if case.get("interrupt_rank") == rank else "fail" if case.get("fail_rank") == rank else None

    def progress(done, total):
        totals[case["name"]] = total
        steps[0] += 1
        if kind and steps[0] > 2:
            raise KeyboardInterrupt if kind == "interrupt" else RuntimeError(f"injected failure on rank {rank}")
    return progress


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("--rank", "--world"):
        p.add_argument(name, type=int, required=True)
    for name in ("--init", "--cases", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--apart", action="store_true", help="compute on the stand-in CUDA device (tests/apart.py), "
                   "the group as NCCL: collectives take device tensors only")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout))
    with apart.nccl() if a.apart else contextlib.nullcontext():
        run(a)
    dist.destroy_process_group()


def run(a) -> None:
    device = "cuda" if a.apart else "cpu"
    out, status, models, totals = Path(a.out), {}, {}, {}
    for case in json.loads(Path(a.cases).read_text()):
        v = models.get(case["vae"]) or models.setdefault(case["vae"], vae.load(case["vae"], device=device))
        x = load_file(case["input"])["x"]
        try:
            with distributed.ranks():
                y = getattr(v, case["op"])(x, mode=case.get("mode", "exact"), progress=_progress(case, a.rank, totals),
                                           **case.get("kw", {}))
            save_file({"y": y.contiguous()}, str(out / f"{case['name']}.{a.rank}.safetensors"))
            status[case["name"]] = "ok"
        except BaseException as e:    # noqa: BLE001 - reported to the test, which decides
            status[case["name"]] = f"{type(e).__name__}: {e}"
    (out / f"status.{a.rank}.json").write_text(json.dumps({"status": status, "steps": totals}, indent=1))


if __name__ == "__main__":
    main()
