"""Copies between the compute device and host memory: every engine's one way to move a tile's result out
and a map's slice in.

The engines keep what outlives a tile in host memory when the compute device is a GPU: the output, the
maps exact tiles meet at (vae/engine/stages.py), the storages of paused tiles (vae/engine/park.py). On a
CUDA device a plain ``.to("cpu")`` would wait for the GPU to finish every queued kernel and then copy
from device to pageable memory with the host thread blocked. Here instead:

- **device -> host** (``to_host``): the tile's tensor is copied into a pinned (page-locked) staging
  buffer, ``non_blocking``, on this call's own CUDA stream, which first waits for the compute stream
  (an event: the copy starts once the tensor is computed, never before). The host thread goes on to
  queue the next tile's kernels at once, so the copy overlaps the next tile's compute. A copy "lands"
  (``land(staged)``: written into the output or a map, or a parked storage made current) when its event
  has completed; pending copies are landed whenever the engine calls in and finds them done, and all
  of them by ``wait()``, which the engines call before they read what was copied (a map at a stage's
  end, the output at the call's end). The source tensor is held until its copy has landed, so the
  caching allocator cannot hand its memory to the next tile while the copy still reads it.
- **host -> device** (``to_device``): the host slice is gathered into a pinned buffer and copied
  ``non_blocking`` on the compute stream itself: the next kernel needs it, so a stream of its own would
  only wait; the host thread still never blocks on the GPU. (The pinned buffer is safe to drop at once:
  torch's pinned allocator records the copy's event and reuses the block only after it.)
- No ``torch.cuda.synchronize()``: the host waits only on the events of the copies it is about to read,
  and ``empty_cache`` runs between stages (``between_stages``), never inside the tile loop.

Pinned vs plain memory (``pins``): pinned only where a CUDA device copies to or from host memory. The
large host tensors (output, maps) stay in plain memory: a tile's part of them is never contiguous (a
core inside a frame, a halo inside a map), and CUDA copies whole contiguous blocks, so their copies go
through the pinned staging buffers anyway; pinning them too would lock gigabytes of host memory (torch's
pinned allocator rounds to powers of two) for no faster copy. Parked storages are contiguous bytes and
go to pinned storages directly. On the CPU (or meta, the planner's dry run) every copy is a plain copy,
done at once.

``DEFER`` makes CPU copies behave like CUDA ones (staged at once, landed only when waited for or when
the engine calls in later): the tests' way to show, without a GPU, that every engine waits before it
reads what it copied out.
"""
from __future__ import annotations

import collections
import contextlib
from typing import Callable, Iterator, Optional

import torch

ASYNC = True                # CUDA copies on their own stream; False: plain synchronous copies everywhere
DEFER = False               # tests: CPU copies land late, as CUDA copies do
EMPTY_CACHE_BETWEEN_STAGES = True    # see between_stages
MAX_PENDING = 2 << 30       # bytes of copies in flight before the host waits for the oldest

Land = Callable[[torch.Tensor], None]
_HOST = torch.device("cpu")


def pins(device: torch.device, host: torch.device) -> bool:
    """Whether copies between ``device`` (compute) and ``host`` go through pinned memory and run
    asynchronously: a CUDA device and host (CPU) memory."""
    return ASYNC and torch.device(device).type == "cuda" and torch.device(host).type == "cpu"


def _staged(device: torch.device, host: torch.device) -> bool:
    """Copies from ``device`` to ``host`` go through a staging buffer and land later (CUDA; ``DEFER``)."""
    kinds = torch.device(device).type, torch.device(host).type
    return pins(device, host) or (DEFER and kinds == ("cpu", "cpu"))


class _Pending:
    """A copy out in flight: ``staged`` holds it once ``event`` has completed (deferred CPU copies:
    once ``source`` is copied into it at landing); ``source`` keeps the device memory it reads alive."""
    __slots__ = ("event", "staged", "land", "source", "nbytes", "deferred")

    def __init__(self, event, staged: torch.Tensor, land: Land, source: torch.Tensor, deferred: bool = False):
        self.event, self.staged, self.land, self.source = event, staged, land, source
        self.nbytes, self.deferred = source.nbytes, deferred

    def done(self) -> bool:
        return not self.deferred and self.event.query()


class Transfers:
    """One call's copies between the compute device and host memory (the offload or intermediate
    device), made by the engine for the call (run state belongs to the call); its CUDA stream is made on
    first use."""

    def __init__(self):
        self._streams: dict = {}
        self._pending: collections.deque = collections.deque()
        self._bytes = 0
        self.copied = 0            # bytes copied out asynchronously so far

    # ---- device -> host ------------------------------------------------------------------------
    def to_host(self, src: torch.Tensor, host: torch.device, land: Land) -> None:
        """Copy ``src`` to ``host`` and call ``land(copy)`` once the copy is there (at once where copies
        are synchronous): ``land`` writes it where it belongs."""
        if _staged(src.device, host):
            self._stage(src, land)
        else:
            land(src if src.device == torch.device(host) else src.to(host))

    def copy_to_host(self, src: torch.Tensor, host: torch.device) -> torch.Tensor:
        """A copy of ``src`` on ``host``, valid after ``wait()`` (at once where copies are synchronous)."""
        if _staged(src.device, host):
            return self._stage(src, _nothing)
        return src.to(host, copy=True)

    def _stage(self, src: torch.Tensor, land: Land) -> torch.Tensor:
        if pins(src.device, _HOST):
            compute = torch.cuda.current_stream(src.device)
            stream = self._streams.get(src.device)
            if stream is None:
                stream = self._streams[src.device] = torch.cuda.Stream(src.device)
            src = src.contiguous(memory_format=_format(src))    # a strided view becomes one block
            staged = _pinned(src)
            stream.wait_stream(compute)   # the copy starts once src is computed
            with torch.cuda.stream(stream):
                staged.copy_(src, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            pending = _Pending(event, staged, land, src)
        else:                             # DEFER: garbage until it lands, as a copy still in flight
            staged = torch.empty(src.shape, dtype=src.dtype)
            staged.fill_(float("nan") if staged.is_floating_point() else 123)
            pending = _Pending(None, staged, land, src.clone(), deferred=True)
        self.copied += pending.nbytes
        self._pending.append(pending)
        self._bytes += pending.nbytes
        self._land(block=False)
        while self._bytes > MAX_PENDING and len(self._pending) > 1:
            self._land_oldest()
        return staged

    def _land_oldest(self) -> None:
        p = self._pending.popleft()
        if p.deferred:
            p.staged.copy_(p.source)
        else:
            p.event.synchronize()         # this copy only, never the whole device
        self._bytes -= p.nbytes
        p.source = None                   # the device memory it read may be reused now
        p.land(p.staged)

    def _land(self, block: bool) -> None:
        """Land pending copies in the order they were made: all of them (``block``) or those done."""
        while self._pending and (block or self._pending[0].done()):
            self._land_oldest()

    def wait(self) -> None:
        """Land every pending copy: what was copied out is in place."""
        self._land(block=True)

    # ---- host -> device ------------------------------------------------------------------------
    def to_device(self, src: torch.Tensor, device: torch.device,
                  memory_format: torch.memory_format = torch.preserve_format, copy: bool = True) -> torch.Tensor:
        """A copy of ``src`` (host memory, any view) on ``device``, ordered before the compute stream's
        next kernels (``copy`` False: ``src`` itself where it is there already). Pending copies out land
        first (they may be what ``src`` reads)."""
        self.wait()
        device = torch.device(device)
        if not pins(device, src.device):
            return src.to(device, memory_format=memory_format, copy=copy)
        fmt = _format(src) if memory_format is torch.preserve_format else memory_format
        staged = _pinned(src, fmt)
        staged.copy_(src)                 # the gather, on the host, while the GPU runs queued work
        out = torch.empty(src.shape, dtype=src.dtype, device=device, memory_format=fmt)
        out.copy_(staged, non_blocking=True)
        return out

    # ---- storages (parked tiles) ---------------------------------------------------------------
    def park(self, storage: torch.UntypedStorage, host: torch.device) -> torch.Tensor:
        """``storage``'s bytes copied to ``host`` (pinned where they come from a CUDA device), and
        ``storage`` emptied (``resize_(0)``) once the copy has landed; the tensors on it keep it."""
        host = torch.device(host)
        src = _bytes(storage)
        if _staged(storage.device, host):
            return self._stage(src, lambda _: storage.resize_(0))
        away = src.to(host, copy=True)
        storage.resize_(0)
        return away

    def unpark(self, storage: torch.UntypedStorage, away: torch.Tensor) -> None:
        """``storage`` (emptied by ``park``) grown back and refilled from ``away``, ordered before the
        compute stream's next kernels."""
        self.wait()                      # its park copy may still be in flight (the storage not yet emptied)
        storage.resize_(away.nbytes)
        _bytes(storage).copy_(away, non_blocking=pins(storage.device, away.device))


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """The bytes of ``storage`` as a uint8 tensor on its own device (a view: no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _nothing(_: torch.Tensor) -> None:
    """Landing a copy whose staging buffer is itself the result."""


def _format(t: torch.Tensor) -> torch.memory_format:
    """The layout ``t`` (perhaps a strided view) is in: channels last where channels are innermost."""
    if t.dim() in (4, 5) and t.stride(1) == 1 and t.shape[1] > 1:
        return torch.channels_last if t.dim() == 4 else torch.channels_last_3d
    return torch.contiguous_format


def _pinned(like: torch.Tensor, memory_format: Optional[torch.memory_format] = None) -> torch.Tensor:
    """An empty pinned host tensor of ``like``'s shape and dtype, in ``like``'s layout (or ``memory_format``)."""
    return torch.empty(like.shape, dtype=like.dtype, memory_format=memory_format or _format(like), pin_memory=True)


def between_stages(device: torch.device) -> None:
    """Between two stages of an exact run (never inside the tile loop): give the caching allocator's
    unused blocks back to the device, so the next stage's block sizes do not stack on the last stage's
    (reserved bytes are what the device has lost to this process). One device synchronisation per
    stage; ``EMPTY_CACHE_BETWEEN_STAGES`` switches it off (bench/gpu_check.py measures both)."""
    if EMPTY_CACHE_BETWEEN_STAGES and torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def releasing(device: torch.device) -> Iterator[None]:
    """A call on ``device``; after it, the pinned host blocks it freed go back to the system. CUDA's caching
    host allocator keeps every freed pinned block for reuse, so without this a call's staging buffers and
    parked storages (2.7 GiB for a 2048 px KL decode) would stay page-locked in the process between calls.
    Blocks another call still uses are not touched."""
    try:
        yield
    finally:
        if torch.device(device).type == "cuda":
            empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None) or \
                getattr(torch._C, "_host_emptyCache", None)          # torch < 2.8
            if empty is not None:
                empty()
