"""A call that runs out of memory is run again in less: with a budget, planned again for half of it
(``planned``); without one, in spatial tiles of half the size (``retried``). Between two attempts what
the failed one held is freed (``released``, ``free_memory``), so the new plan starts from what is
really free. Each retry is said in the log."""
from __future__ import annotations

import dataclasses
import gc
import logging
import traceback
from typing import Callable, Optional

import torch

from . import budget as planner
from . import memory
from .route import Call

log = logging.getLogger("VAEKit")

# what CUDA libraries raise when the caching allocator cannot give them their workspace. cuDNN's plan
# search (PyTorch's cudnn/Conv_v8.cpp) skips each plan whose workspace allocation fails and, with none
# left, raises "GET (or FIND) was unable to find an engine to execute this computation". The same words
# end a search that failed for another reason (no engine for the dtype on that card): such a call is
# retried with smaller tiles until none is left, then fails.
ALLOC_FAILED = ("out of memory", "can't allocate memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED",
                "unable to find an engine to execute this computation")


def out_of_memory(e: BaseException) -> bool:
    """A device (CUDA: torch.OutOfMemoryError, or a library's failed workspace allocation, cuDNN's plan
    search included) or host (CPU allocator) out-of-memory error."""
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and any(m in str(e) for m in ALLOC_FAILED))


def released(e: BaseException) -> None:
    """Drop the tensors a failed attempt still holds through ``e``: its traceback keeps every frame of
    the attempt alive (an exact run's tile threads included), and with them their tensors, until the
    handler exits; clearing the frames' locals lets them go. Chained exceptions too."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__


def free_memory(device: torch.device) -> None:
    """Collect what the failed attempt left (reference cycles through its frames) and give the
    allocator's cached blocks back, so the new plan starts from what is really free."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def planned(handle, call: Call, budget: Optional[int], out_device, offload,
            run: Callable[[Call], torch.Tensor]) -> torch.Tensor:
    """``run(call)``, with its tile and chunk planned for ``budget`` first when one is given; on
    running out of memory, again with a plan for half the budget (or, without one, see ``retried``).
    Before the new plan runs, what the failed attempt held is freed (``released``)."""
    where = dict(device=handle.device, out_device=torch.device(out_device or "cpu"),
                 offload=torch.device(offload or out_device or "cpu"))
    if budget is None:
        return retried(handle, call, run)
    while True:
        p = planner.plan(handle, call, budget, **where)
        log.info("VAEKit %s: %s", "decode" if call.decode else "encode", p.describe())
        try:
            with memory.host_limit(p.on_device(), handle.device):     # the CPU allocator held to the plan
                return run(p.call)
        except Exception as e:        # noqa: BLE001 - only out-of-memory errors are retried
            if not out_of_memory(e) or budget <= 1 << 20:
                raise
            released(e)
        free_memory(handle.device)       # outside the handler: the failed attempt's frames are gone
        log.warning("VAEKit: out of memory with a plan for %s; planning again for half of it",
                    planner.gib(budget))
        budget //= 2


def retried(handle, call: Call, run: Callable[[Call], torch.Tensor]) -> torch.Tensor:
    """``run(call)``; when the device runs out of memory, again with spatial tiles of half the size
    (down to 4 latent pixels), as core falls back to tiles. A call that asked for no tiles at all (one
    pass) is retried in exact tiles: the result it asked for, in less memory. Said in the log each time."""
    r = handle.caps.spatial_ratio
    while True:
        try:
            return run(call)
        except Exception as e:        # noqa: BLE001 - only out-of-memory errors are retried
            if not out_of_memory(e):
                raise
            tile = call.tile
            sizes = tile if isinstance(tile, (tuple, list)) else (tile or 0,) * 2
            now = [t or max(call.grid[-2:]) * r for t in sizes]                # untiled: the longer side
            smaller = tuple(max(4 * r, t // 2 // r * r) for t in now)
            if smaller == tuple(now):
                raise
            released(e)
        free_memory(handle.device)       # outside the handler: the failed attempt's frames are gone
        mode = "exact" if not (tile or call.tile_frames) else call.mode      # one pass asked: its result
        log.warning("VAEKit %s: out of memory with %s tiles; retrying with %dx%d px %s tiles",
                    "decode" if call.decode else "encode", "no" if not tile else f"{now[1]}x{now[0]} px",
                    smaller[1], smaller[0], mode)
        call = dataclasses.replace(call, tile=smaller, mode=mode)
