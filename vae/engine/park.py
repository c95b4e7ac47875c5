"""Paused exact tiles wait on the offload device (host memory), not on the compute device.

Where tiles must keep meeting at high resolution (GroupNorm statistics, vae/engine/exact.py), every tile is
paused inside the model's forward while the others catch up; what it holds then is whatever its
frames reference: the norm's input, the residual of the block it is in, its stream caches. At a pause
the tile's own thread copies those storages' bytes to the offload device and, once the copy has landed,
shrinks each device storage to nothing (``resize_(0)``: its memory goes back to the device's allocator);
when it resumes, each storage is grown back and the bytes copied in. The storages and the tensors on
them never change device (CUDA refuses a tensor a storage of another device), so every reference the
forward holds sees its data again, views keep their offsets and aliasing is kept.

Only storages the thread's frames hold in full are parked: a storage with a reference the frames do not
show (a parameter, a buffer, a temporary on the interpreter's stack) stays, since emptying it would
pull data from under its other owner. That is safe by construction and saves what it finds (on a GPU,
the paused tiles' activation maps and caches: the compute device then holds the running tile, the
round's buffers and what could not be parked). On a CPU-only machine the offload device is the compute
device and nothing is parked. Tested on the CPU with a forced park (same device: emptied and refilled),
and with the compute device apart from the host on a stand-in device (tests/apart.py).
"""
from __future__ import annotations

import sys
from types import FrameType
from typing import Iterable, Optional

import torch
from torch import nn

from . import memory
from .transfer import Transfers


def _tensors(value, depth: int = 0) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 2 and isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v, depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for v in list(value.values()):
            if not isinstance(v, nn.Module):
                yield from _tensors(v, depth + 1)


def held(frame: Optional[FrameType], device: torch.device, extra: Iterable = ()) -> list[torch.Tensor]:
    """The tensors on ``device`` that the frames from ``frame`` outwards hold (locals, and tuples,
    lists and dicts in them), plus those in ``extra`` (e.g. the tile's stream memory)."""
    seen: dict[int, torch.Tensor] = {}
    values = list(extra)
    while frame is not None:
        values.extend(frame.f_locals.values())
        frame = frame.f_back
    for v in values:
        for t in _tensors(v):
            if t.device == device and not isinstance(t, nn.Parameter) and id(t) not in seen:
                seen[id(t)] = t
    return list(seen.values())


class Parked:
    """Storages emptied at a pause, their bytes on the offload device; ``restore`` refills them (both
    through ``transfers``: from a GPU, pinned copies that overlap the next tile, vae/engine/transfer.py)."""

    def __init__(self, transfers: Transfers):
        self.transfers = transfers
        self.groups: list[tuple[torch.UntypedStorage, torch.Tensor]] = []    # (device storage, its bytes away)
        self.dry: list[torch.Tensor] = []        # meta tensors the planner's tracker counted as away
        self.bytes = 0

    def restore(self) -> None:
        for t in self.dry:
            memory.returned(t)
        self.dry.clear()
        for storage, away in self.groups:
            self.transfers.unpark(storage, away)
        self.groups.clear()


def park(tensors: list[torch.Tensor], offload: torch.device, force: bool = False,
         transfers: Optional[Transfers] = None) -> Parked:
    """Park the storages of ``tensors`` that nothing else references: their bytes to ``offload``, the
    storages emptied. ``force``: park even on the same device (the tests' check that nothing reads a
    parked storage, nor keeps a pointer into it)."""
    parked = Parked(transfers or Transfers())
    by_storage: dict[int, list[torch.Tensor]] = {}
    for t in tensors:
        by_storage.setdefault(t.untyped_storage()._cdata, []).append(t)
    for group in by_storage.values():
        storage = group[0].untyped_storage()
        # one reference per tensor in the group, plus ``storage`` itself: nothing unseen shares it
        if torch._C._storage_Use_Count(storage._cdata) != len(group) + 1 or storage.nbytes() == 0:
            continue
        if storage.device.type == "meta":        # a planner's dry run: the tracker counts it as offloaded
            memory.offloaded(group[0])
            parked.dry.append(group[0])
            continue
        if storage.device == offload and not force:
            continue
        parked.bytes += storage.nbytes()
        parked.groups.append((storage, parked.transfers.park(storage, offload)))
    return parked


def park_frames(frame: Optional[FrameType], device: torch.device, offload: torch.device, extra: Iterable = (),
                force: bool = False, transfers: Optional[Transfers] = None) -> Parked:
    """Park what the calling thread's frames (from ``frame`` outwards) and ``extra`` hold on ``device``."""
    return park(held(frame, device, extra), offload, force, transfers)


def caller(depth: int = 1) -> FrameType:
    return sys._getframe(depth + 1)
