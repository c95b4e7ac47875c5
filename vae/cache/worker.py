"""A process of a several-device cache run (``--devices cuda:0,cuda:1``): this process is rank 0 on the
first device; ``spawn`` starts one ``python -m vae.cache.worker`` per other device. Each loads the VAE
on its device and caches its share of the sources (whole sources, one VAE per process); torch.distributed
(gloo, CPU tensors only) makes them start after every rank has read the manifest and adds up the counts
at the end. Each writes its own manifest log; rank 0 folds them into the manifest. (runner.spawn starts them.)"""
from __future__ import annotations

from pathlib import Path

import torch

from .options import CacheOptions


def main() -> None:
    import torch.distributed as dist

    from ..workers import worker_args
    from .runner import run
    a = worker_args("a VAEKit cache worker (started by vaekit cache --devices)", **{"--options": dict(required=True)})
    opts = CacheOptions.from_json(Path(a.options).read_text())
    if a.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(a.device))
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world)
    if a.rank == a.world - 1:
        Path(a.options).unlink(missing_ok=True)        # every worker has read it (the group is complete)
    run(opts, say=lambda text: None, rank=a.rank, world=a.world, device=a.device)


if __name__ == "__main__":
    main()
