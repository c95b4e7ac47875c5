"""Run state belongs to the call, not to the modules.

A VAE is shared: ComfyUI's server, API users with threads and several nodes of one graph call the same
modules. So nothing a call needs is stored on them: a stream's causal caches and an exact run's hooks
live in a ``Run`` that the call installs in a ``contextvars.ContextVar`` for the time it runs; the
modules read it. Two threads (or an exact run's tile threads) each see their own ``Run``; a call that
fails or is interrupted leaves nothing behind, because its state goes with its context.

- ``stream(memory)``: run a clip chunk by chunk. ``memory`` (a dict, one per stream) holds each
  stateful module's state between chunks, keyed by the module (``Streamable.recall/remember``), and
  ``FINAL`` once the last chunk is on its way.
- ``Run.exact``: the exact-tiling hooks of the tile this thread runs (vae/engine/exact.py): GroupNorm
  statistics and the ``Seam`` modules (re-cut points and whole-tensor modules) call into it.
- ``Run.place``: where a fast tile lies in the whole map (vae/engine/tiling.py), for noise drawn inside a
  network (vae/nn/noise.py): fast tiles, too, take their part of the untiled field.

Compiled graphs (vae/compile.py): dynamo cannot trace ``ContextVar.get``. While no stream runs in
the process, a graph reads no run state (``current()`` is the idle run, so nothing breaks the graph).
While one does, the state is read eagerly at a graph break (``_state``), so a streamed chunk through a
compiled model still uses its own stream's caches: correct in every thread, with the graph split at the
stateful modules. Exact tiles pause inside the model: their model call runs eagerly, and the seam
modules' own forwards between the pauses (``Body``) run through the compiled handle's graphs.
"""
from __future__ import annotations

import contextlib
import threading
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Iterator, Optional

import torch
from torch import nn


@dataclass(frozen=True)
class Run:
    memory: Optional[dict] = None      # stream state per module; None: not streaming
    exact: Any = None                  # the exact-tiling hooks of this thread's tile (vae/engine/exact.py)
    place: Any = None                  # where a fast tile lies in the whole map (vae/engine/tiling.py ``Place``)


_IDLE = Run()
_RUN: ContextVar[Run] = ContextVar("vaekit_run", default=_IDLE)
# whether any run with state is under way in the process: a module global bool, so that dynamo guards on
# it (two graph variants at most); _ACTIVE counts them
_STATEFUL = False
_ACTIVE = 0
_ACTIVE_LOCK = threading.Lock()


@torch.compiler.disable
def _state() -> Run:
    return _RUN.get()


def current() -> Run:
    if torch.compiler.is_compiling() and not _STATEFUL:
        return _IDLE
    return _state()


@contextlib.contextmanager
def using(run: Run) -> Iterator[Run]:
    """Install ``run`` for this thread's context until the block ends."""
    global _ACTIVE, _STATEFUL
    token = _RUN.set(run)
    stateful = run.memory is not None or run.exact is not None or run.place is not None
    if stateful:
        with _ACTIVE_LOCK:
            _ACTIVE += 1
            _STATEFUL = True
    try:
        yield run
    finally:
        _RUN.reset(token)
        if stateful:
            with _ACTIVE_LOCK:
                _ACTIVE -= 1
                _STATEFUL = _ACTIVE > 0


def stream(memory: Optional[dict] = None):
    """Run the calls in the block as consecutive chunks of one clip; ``memory`` (a new dict if None)
    holds the stream's state. Leaving the block ends the stream (its state is dropped with the dict)."""
    return using(replace(current(), memory={} if memory is None else memory))


# A stream memory key: the loop sets it before the clip's last chunk, after which no module's state is
# read again, so the causal caches are dropped as they are used instead of kept (a short clip's peak).
FINAL = "final chunk"


@contextlib.contextmanager
def replaying() -> Iterator[None]:
    """Earlier chunks run again inside the last one (the NaN guard's upcast re-stream, vae/engine/guard.py):
    they rebuild caches the last chunk then reads, so they are not final."""
    memory = current().memory
    final = memory.pop(FINAL, None) if memory is not None else None
    try:
        yield
    finally:
        if final is not None:
            memory[FINAL] = final


def streaming() -> bool:
    """Whether this call runs a clip chunk by chunk (a later chunk is r*k frames, not 1 + r*k)."""
    return current().memory is not None


class Streamable:
    """Mixin: a module whose output for a chunk depends on earlier chunks of the same stream.
    Its state lives in the stream's memory, never on the module."""

    @property
    def streaming(self) -> bool:
        return current().memory is not None

    def recall(self, default=None):
        memory = current().memory
        return default if memory is None else memory.get(self, default)

    def remember(self, value) -> None:
        memory = current().memory
        if memory is not None:
            memory[self] = value

    def first_chunk(self, starts: bool = True) -> bool:
        """Whether this call is the clip's start for this module: always outside a stream; in a stream
        until a call that ``starts`` it (e.g. one that produced frames) has been made. One read of the
        run state (one graph break in a compiled stream)."""
        memory = current().memory
        if memory is None:
            return True
        if memory.get(self):
            return False
        if starts:
            memory[self] = True
        return True


class Seam:
    """Mixin for modules where exact tiling synchronises its tiles: class attribute ``exact_whole``
    (runs once on the assembled tensor, e.g. attention) or ``exact_boundary`` (a re-cut point). Outside
    an exact run the module is called as usual; inside, the run's hooks get its ``Body``."""

    def __call__(self, x, *args, **kwargs):
        exact = None if torch.compiler.is_compiling() else current().exact    # in a graph: a plain call
        if exact is None:
            return super().__call__(x, *args, **kwargs)
        return exact.seam(self, x, Body(self, args, kwargs))


class Body:
    """A seam module's own forward, its arguments besides the tensor bound: what an exact tile runs
    between two pauses. Called, it runs eagerly; ``via(fn, x)`` runs it as ``fn(module, x, *args,
    **kwargs)`` (a compiled graph: vae/compile.py), where the module is called as usual."""

    __slots__ = ("module", "args", "kwargs")

    def __init__(self, module: nn.Module, args: tuple, kwargs: dict):
        self.module, self.args, self.kwargs = module, args, kwargs

    def __call__(self, x):
        return super(Seam, self.module).__call__(x, *self.args, **self.kwargs)

    def via(self, fn, x):
        return fn(self.module, x, *self.args, **self.kwargs)


_SEAMED: dict[type, type] = {}


def boundary(module: nn.Module) -> nn.Module:
    """Make one module instance a re-cut point (for classes used elsewhere too, e.g. a strided conv or
    ``nn.Upsample`` inside an ``nn.Sequential``): its class becomes a ``Seam`` subclass of itself, so
    parameters, keys and behaviour outside exact runs are unchanged. Done once, when the model is built."""
    cls = type(module)
    if not isinstance(module, Seam):
        if cls not in _SEAMED:
            _SEAMED[cls] = type(cls.__name__, (Seam, cls), {"exact_boundary": True, "__module__": cls.__module__})
        module.__class__ = _SEAMED[cls]
    return module

