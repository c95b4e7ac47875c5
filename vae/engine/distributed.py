"""One exact decode or encode across several processes (ranks) with ``torch.distributed``.

Exact mode already reduces a call to tiles that meet only at rounds (vae/engine/exact.py): GroupNorm sums,
whole-tensor modules and re-cut points at latent-ish resolution, and each chunk's output. Those
rounds are this module's collectives, so a distributed run is the same engine with a communicator:

- the tiles are split among the ranks in contiguous, balanced blocks (row-major order, so a rank's
  tiles are neighbours); each rank runs only its own tiles' coroutines;
- GroupNorm sums (float64, a few numbers per group) are all-reduced;
- at a whole-tensor module (attention, at latent resolution) each rank writes its tiles' cores into a
  zeroed map and the maps are all-reduced (the cores partition the map, so the sum is the assembled
  map, exactly); every rank runs the module itself and cuts its own tiles from the result;
- at a re-cut point no map is assembled: each rank builds its tiles' new slices (core plus the next
  stretch's halo) from its own cores and the overlapping parts of the other ranks' cores, sent point
  to point, so a rank holds its share of the map plus halos, not the whole map;
- the output is assembled the same way once, at the end: every rank returns the whole result;
- every step the ranks agree whether one of them failed or was interrupted (a two-number
  all-reduce), so a failure anywhere ends the call on every rank with that rank's message, and a
  rank never waits in a collective for one that has stopped.

Every rank must make the same call (same model weights, input, tiles and options), as under
``torchrun``. ``with ranks(group): vae.decode(...)`` makes the calls of this context distributed;
a plain call stays on one process. Backends: gloo (CPU tensors) and NCCL (each rank's CUDA device).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

import torch

from ..errors import VAEKitError

_MESSAGE_BYTES = 2048
PIECE_BYTES = 64 << 20     # the most of a host tensor that sum_ puts on the backend's device at once


def through(t: torch.Tensor, device: torch.device) -> Iterator[torch.Tensor]:
    """``t`` piece by piece on ``device``: each piece (at most ``PIECE_BYTES``) is copied into one buffer
    there and yielded; what the caller leaves in it is copied back into ``t`` before the next piece."""
    flat = t.view(-1) if t.is_contiguous() else t.contiguous().view(-1)
    step = max(1, PIECE_BYTES // t.element_size())
    buffer = torch.empty(min(step, flat.numel()), dtype=t.dtype, device=device)
    for start in range(0, flat.numel(), step):
        part = flat[start:start + step]
        piece = buffer[:part.numel()]
        piece.copy_(part)
        yield piece
        part.copy_(piece)
    if not t.is_contiguous():          # the pieces went back into a contiguous copy
        t.copy_(flat.view(t.shape))


class RankFailed(VAEKitError):
    """Another rank (or this one) failed or was interrupted during a distributed call."""


class Local:
    """The single-process case: every tile is ours, every collective is the identity."""
    size, rank = 1, 0

    def owns(self, index: int, count: int) -> bool:
        return True

    def owner(self, index: int, count: int) -> int:
        """The rank that runs tile ``index`` of ``count``: contiguous, balanced blocks."""
        return index * self.size // count

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def exchange(self, sends: list, receives: list) -> None:
        """Point-to-point: ``sends`` (tensor, to rank) and ``receives`` (buffer, from rank), posted in
        the same order on both ends of each pair."""
        if sends or receives:
            raise RuntimeError("one process has no one to exchange with")

    def step(self, error: Optional[BaseException], active: bool) -> bool:
        if error is not None:
            raise error
        return active


class Ranks(Local):
    """The ranks of a process group (the default group when None)."""

    def __init__(self, group=None):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise VAEKitError("no torch.distributed process group: call torch.distributed.init_process_group "
                              "first (torchrun sets up its environment).")
        self.dist, self.group = dist, group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        # NCCL moves CUDA tensors only; gloo CPU ones
        nccl = dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    def owns(self, index: int, count: int) -> bool:
        if count < self.size:
            raise VAEKitError(f"{self.size} ranks but only {count} tiles: every rank needs a tile.",
                              input="tile", fix=f"use smaller tiles (at least {self.size} of them) or fewer devices.")
        return self.owner(index, count) == self.rank

    def exchange(self, sends: list, receives: list) -> None:
        ops = [self.dist.P2POp(self.dist.isend, t, peer, self.group) for t, peer in sends]
        ops += [self.dist.P2POp(self.dist.irecv, t, peer, self.group) for t, peer in receives]
        if ops:
            for request in self.dist.batch_isend_irecv(ops):
                request.wait()

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """All-reduce (sum) into ``t``. A tensor on another device than the backend's (a host map under
        NCCL: the whole output, a stage's map) goes through that device in pieces of at most
        ``PIECE_BYTES``, so the device holds one piece beside the call's plan, never the whole map."""
        if t.device == self.device:
            self.dist.all_reduce(t, group=self.group)
            return t
        for piece in through(t, self.device):
            self.dist.all_reduce(piece, group=self.group)
        return t

    def step(self, error: Optional[BaseException], active: bool) -> bool:
        """Agree on the state after a step: raise on every rank if any failed, else whether any tile
        still runs."""
        flags = torch.tensor([error is not None, active], dtype=torch.int64, device=self.device)
        self.dist.all_reduce(flags, group=self.group)
        if not flags[0]:
            return bool(flags[1])
        text = torch.zeros(self.size, _MESSAGE_BYTES, dtype=torch.uint8, device=self.device)
        if error is not None:
            raw = f"{type(error).__name__}: {error}".encode()[:_MESSAGE_BYTES]
            text[self.rank, :len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
        self.dist.all_reduce(text, group=self.group)     # each rank filled only its own row
        failed = [(r, bytes(row.cpu().tolist()).rstrip(b"\0").decode(errors="replace"))
                  for r, row in enumerate(text) if row.any()]
        if error is not None and (not isinstance(error, Exception) or "Interrupt" in type(error).__name__):
            raise error      # this rank's own interrupt (Ctrl-C, ComfyUI's InterruptProcessingException) stays one
        rank, message = failed[0]
        raise RankFailed(f"rank {rank} of {self.size} failed, so every rank stopped: {message}",
                         fix=None if "Fix:" in message else "see that rank's error above.") from error


LOCAL = Local()
_CURRENT: contextvars.ContextVar[Optional[Ranks]] = contextvars.ContextVar("vaekit_ranks", default=None)


def current() -> Local:
    """The communicator of the calls in this context: ``Local`` unless inside ``ranks(...)``."""
    return _CURRENT.get() or LOCAL


@contextlib.contextmanager
def alone() -> Iterator[Local]:
    """Calls inside this block run on this process only (the planner's dry runs inside a distributed call)."""
    token = _CURRENT.set(None)
    try:
        yield LOCAL
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def ranks(group=None) -> Iterator[Ranks]:
    """Exact and fast tiled calls inside this block run across the ranks of ``group``."""
    token = _CURRENT.set(Ranks(group))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)
