"""A persistent pool of worker processes, one per extra device, that take their share of every
exact or fast tiled call (vae/engine/distributed.py) made through it.

    pool = Pool(["cuda:0", "cuda:1"])          # this process is rank 0 on the first device
    images = pool.run(vae, "decode", z, tile=512, mode="exact")
    pool.close()                               # also at exit

The workers are ``python -m vae.workers`` processes joined to this one by ``torch.distributed``
(NCCL for CUDA devices, gloo for CPUs) over a TCP store this process hosts. Each call posts a small
JSON header (the VAE's file, the operation, its options) to the store under the call's number, then
broadcasts the input tensor; each worker loads a VAE file with this library's loader the first time
it is named and keeps it, so weights are read once per worker and never pickled. Nothing is unpickled.
Between calls the workers wait on the store, outside any collective, so an idle pool lives as long as
this process (a collective pending longer than the group's timeout would end it: NCCL's watchdog
aborts it, gloo raises); when this process ends, the store's connection closes and the workers end.
A failure anywhere (a worker that cannot load the file, a tile that fails, an interrupt here) ends
the call on every rank with that rank's message, and the pool stays ready for the next call.
"""
from __future__ import annotations

import argparse
import atexit
import datetime
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence
from urllib.parse import urlsplit

import torch

from .engine.distributed import Ranks, ranks
from .errors import VAEKitError

log = logging.getLogger("VAEKit")
_ROOT = Path(__file__).resolve().parents[1]
_START_S = 300       # the least time the store gives the workers to start (import torch, set up CUDA) and join


class DevicesAbsent(VAEKitError):
    """A well-formed device list naming devices this machine does not have (a workflow from another
    machine): the nodes run on one device instead and say why."""


POOL_TYPES = ("cuda", "cpu")           # the pool's process groups: NCCL on CUDA devices, gloo on CPUs


def parse_devices(text: str) -> list[torch.device]:
    """'cuda:0,cuda:1' or 'cpu,cpu' -> devices, checked against what this machine has (a list naming
    devices it does not have: ``DevicesAbsent``)."""
    if not isinstance(text, str):
        raise VAEKitError(f"the device list is a {type(text).__name__}, not text.", input="devices",
                          fix="write devices as torch names separated by commas, e.g. 'cuda:0,cuda:1' or 'cpu,cpu'.")
    names = [t.strip() for t in text.split(",") if t.strip()]
    try:
        devices = [torch.device(n) for n in names]
    except RuntimeError as e:
        raise VAEKitError(f"cannot read the device list {text!r}: {e}.", input="devices",
                          fix="write devices as torch names separated by commas, e.g. 'cuda:0,cuda:1' or 'cpu,cpu'.")
    other = sorted({d.type for d in devices} - set(POOL_TYPES))
    if other:
        raise VAEKitError(f"{text!r} names {', '.join(other)} devices; worker pools run on CUDA devices or CPUs.",
                          input="devices", fix="name CUDA devices ('cuda:0,cuda:1') or CPUs ('cpu,cpu').")
    if len(devices) < 2:
        raise VAEKitError(f"{text!r} names {len(devices)} device(s); a pool needs two or more.", input="devices",
                          fix="list every device of the call, this process's first, e.g. 'cuda:0,cuda:1'.")
    if len({d.type for d in devices}) > 1:
        raise VAEKitError(f"{text!r} mixes device types.", input="devices", fix="use only CUDA devices or only CPUs.")
    if devices[0].type == "cuda":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        missing = [str(d) for d in devices if (d.index or 0) >= have]
        if missing:
            raise DevicesAbsent(f"{', '.join(missing)} not found: this machine has {have} CUDA device(s).",
                              input="devices", fix=f"name devices cuda:0 .. cuda:{max(have - 1, 0)}, or leave "
                                                   "'devices' empty to use one device.")
    return devices


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _post(store, number: int, header: dict) -> None:
    """Rank 0: call ``number``'s header, for the workers; the previous call's is dropped (every worker
    read it: that call's first collective needed them all)."""
    store.set(f"call/{number}", json.dumps(header))
    if number:
        store.delete_key(f"call/{number - 1}")


def _next_call(store, number: int, wait: datetime.timedelta) -> dict:
    """A worker: call ``number``'s header, waited for on the store (not in a collective, so no group
    timeout applies) in waits of ``wait``, retried for as long as the pool is idle. A closed store (rank
    0's process ended) raises ``DistNetworkError``."""
    import torch.distributed as dist
    key = f"call/{number}"
    while True:
        try:
            store.wait([key], wait)
        except dist.DistStoreError:          # the wait timed out: still idle
            continue
        return json.loads(store.get(key))


def _call(comm: Ranks, vae, header: dict, x: torch.Tensor, load_error: Optional[BaseException], progress=None,
          out_device=None):
    """Every rank: agree that each has its VAE (a worker's load may fail), then the call itself."""
    comm.step(load_error, True)
    with ranks(comm.group):
        return getattr(vae, header["op"])(x, progress=progress, out_device=out_device, **header["kw"])


class Pool:
    """Workers on ``devices[1:]``; this process is rank 0 on ``devices[0]``."""

    def __init__(self, devices: Sequence, timeout: float = 1800):
        import torch.distributed as dist
        if dist.is_initialized():
            raise VAEKitError("this process already belongs to a torch.distributed group; a worker pool makes "
                              "its own.", fix="use vae.engine.distributed.ranks() inside the existing group instead.")
        self.devices = [torch.device(d) for d in devices]
        port, self.calls = _free_port(), 0
        init = f"tcp://127.0.0.1:{port}"
        # TORCH_CPP_LOG_LEVEL: an idle worker's store waits time out and are retried; torch's C++ side would
        # print two warning lines for each (errors still print)
        env = {"TORCH_CPP_LOG_LEVEL": "ERROR", **os.environ,
               "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")])}
        self.procs = [subprocess.Popen([sys.executable, "-m", "vae.workers", "--rank", str(r), "--world",
                                        str(len(self.devices)), "--init", init, "--device", str(d),
                                        "--timeout", str(timeout)], cwd=str(_ROOT), env=env)
                      for r, d in enumerate(self.devices) if r > 0]
        if self.devices[0].type == "cuda":
            torch.cuda.set_device(self.devices[0])
        # every worker joins the store before the group forms (the group's setup waits only its timeout)
        self.store = dist.TCPStore("127.0.0.1", port, len(self.devices), True, wait_for_workers=True,
                                   timeout=datetime.timedelta(seconds=max(timeout, _START_S)))
        dist.init_process_group(_backend(self.devices[0]), store=self.store, rank=0, world_size=len(self.devices),
                                timeout=datetime.timedelta(seconds=timeout))
        self.comm = Ranks()
        atexit.register(self.close)
        log.info("VAEKit: worker pool on %s (%d worker processes)", ", ".join(map(str, self.devices)),
                 len(self.procs))

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def run(self, vae, op: str, x: torch.Tensor, progress=None, out_device=None, **kw) -> torch.Tensor:
        """``vae.<op>(x, **kw)`` with the tiles shared among the pool's processes; the result here (on
        ``out_device``). ``kw``: the call's options (numbers and strings: they travel as JSON)."""
        if vae.path is None:
            raise VAEKitError("this VAE was not loaded from a file, so the workers cannot load it.", input="vae",
                              fix="load it with VAE Load (VAEKit) / vae.load(path), or leave 'devices' empty.")
        if not self.alive:
            raise VAEKitError("the worker pool's processes have stopped (see their messages above).",
                              fix="run the prompt again: the nodes start a new pool.")
        header = {"op": op, "path": vae.path, "dtype": str(vae.dtype).removeprefix("torch."),
                  "shape": list(x.shape), "input_dtype": str(x.dtype).removeprefix("torch."), "kw": kw}
        import torch.distributed as dist
        sent = x.contiguous().to(self.comm.device)      # before the post: once posted, the workers wait in the broadcast
        self._post(header)
        dist.broadcast(sent, src=0)
        return _call(self.comm, vae, header, x, None, progress, out_device)

    def _post(self, header: dict) -> None:
        _post(self.store, self.calls, header)
        self.calls += 1

    def close(self) -> None:
        if not self.procs:
            return
        import torch.distributed as dist
        try:
            if self.alive:
                self._post({"op": "stop"})
            for p in self.procs:
                p.wait(timeout=60)
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
            self.procs = []
            if dist.is_initialized():
                dist.destroy_process_group()
            self.store = None


def serve(rank: int, world: int, init: str, device: torch.device, timeout: float) -> int:
    """A worker: wait for calls from rank 0, run this rank's share, until told to stop (0) or until rank
    0's process ends or the pool breaks (1, said in the log)."""
    import torch.distributed as dist
    if device.type == "cuda":
        torch.cuda.set_device(device)
    address, wait = urlsplit(init), datetime.timedelta(seconds=timeout)
    store = dist.TCPStore(address.hostname, address.port, world, False,
                          timeout=datetime.timedelta(seconds=max(timeout, _START_S)))
    dist.init_process_group(_backend(device), store=store, rank=rank, world_size=world, timeout=wait)
    try:
        _serve_calls(store, Ranks(), device, wait)
    except dist.DistNetworkError:
        log.warning("VAEKit worker %d: the pool's process ended without closing the pool; stopping.", rank)
        return 1
    except Exception:    # noqa: BLE001 - outside a call: the pool cannot go on; say why before stopping
        log.exception("VAEKit worker %d: the pool broke; stopping.", rank)
        return 1
    dist.destroy_process_group()
    return 0


def _serve_calls(store, comm: Ranks, device: torch.device, wait: datetime.timedelta) -> None:
    """The calls, one after the other, until the header says stop; a failed call is every rank's to report
    (rank 0's caller gets it), and this rank serves the next."""
    import torch.distributed as dist

    from .loading import load
    vaes = {}
    for number in itertools.count():
        header = _next_call(store, number, wait)
        if header["op"] == "stop":
            return
        x = torch.empty(header["shape"], dtype=getattr(torch, header["input_dtype"]), device=comm.device)
        dist.broadcast(x, src=0)
        key, error = (header["path"], header["dtype"]), None
        try:
            if key not in vaes:               # loaded once per worker, from the same file
                vaes[key] = load(header["path"], dtype=getattr(torch, header["dtype"]), device=device)
        except Exception as e:   # noqa: BLE001 - told to every rank by _call
            error = e
        try:
            _call(comm, vaes.get(key), header, x.to(device), error)
        except BaseException as e:    # noqa: BLE001 - rank 0 reports the call's failure; keep serving
            log.info("VAEKit worker %d: the call ended: %s", comm.rank, e)


def worker_args(description: str, argv=None, **more) -> argparse.Namespace:
    """A worker process's command line: its rank, the world, the group's init address and its device (and
    ``more``: name -> argparse options); the torch threads set to this process's share of the CPUs."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init", required=True)
    p.add_argument("--device", required=True)
    for name, kw in more.items():
        p.add_argument(name, **kw)
    a = p.parse_args(argv)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.world))
    return a


def main() -> None:
    a = worker_args("a VAEKit worker process (started by vae.workers.Pool)",
                    **{"--timeout": dict(type=float, default=1800)})
    logging.basicConfig(format="%(message)s")       # this process's warnings and errors reach the console
    sys.exit(serve(a.rank, a.world, a.init, torch.device(a.device), a.timeout))


if __name__ == "__main__":
    main()


def cli_call(vae, op: str, x: torch.Tensor, devices: Optional[str], progress=None, **kw) -> Optional[torch.Tensor]:
    """The command line's call: over a pool on ``devices`` (this process and one worker per extra
    device, for this call), or across torchrun's ranks when launched by torchrun (every rank runs the
    command; rank 0 gets the result, the others None), or here."""
    import torch.distributed as dist
    if devices:
        found = parse_devices(devices)
        vae.to(found[0], vae.dtype)
        pool = Pool(found)
        try:
            return pool.run(vae, op, x.to(found[0]), progress=progress, **kw)
        finally:
            pool.close()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        vae.to(device, vae.dtype)
        dist.init_process_group(_backend(device))          # torchrun's environment says where and who
        try:
            with ranks():
                y = getattr(vae, op)(x.to(device), progress=progress if dist.get_rank() == 0 else None, **kw)
            return y if dist.get_rank() == 0 else None
        finally:
            dist.destroy_process_group()
    return getattr(vae, op)(x, progress=progress, **kw)
