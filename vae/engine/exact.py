"""Exact tiling: tiled encode/decode whose result equals one untiled pass (the ``exact`` mode).

A tile differs from the same region of an untiled pass for three reasons; each has its fix here:
1. Convolutions near a tile edge see the tile's padding instead of the neighbours' pixels. Each tile
   carries a halo at least the receptive field of the layers it runs before it is re-cut, measured
   from the architecture: every conv's kernel, dilation and padding at the resolution it runs,
   recorded by one probe pass on a tiny input. Each tile keeps only its core.
2. GroupNorm statistics would be the tile's own. Every GroupNorm pauses the tile (the norm asks the
   run state's ``stats`` hook, ``vae/nn/norm.py``); when all tiles are there, the fp32 sums of x and
   x^2 over the tiles' cores give the whole tensor's mean and variance (E[x^2] - E[x]^2, not an
   average of tile variances) and every tile resumes with them.
3. Attention mixes every position. At a module whose class sets ``exact_whole`` the tiles hand over
   their cores; the module runs once on the assembled tensor (attention sits at latent resolution,
   the cheapest level) and each tile resumes with its slice of the result.
Modules whose class sets ``exact_boundary`` (resamplers with no other activation live across them)
are re-cut points: the cores are assembled and each tile resumes with a fresh slice and the halo
that the next stretch of layers needs, so halos stay a few pixels instead of the whole network's
receptive field. ``exact_boundary = COARSE`` (residual blocks) re-cuts only at latent resolution or
coarser: there a halo pixel costs the most compute and an assembled map the least memory.

Time (``chunks``): for a model that streams (causal in time, statistics per frame or per voxel), each
spatial tile runs the clip chunk by chunk through its own causal caches, and the tiles meet at the
same points of the same chunk. The unit of work is one chunk of one tile, so the working set is
bounded in resolution and flat in the number of frames. Whole-tensor modules that keep state across
chunks (causal attention with a key/value cache) keep it in one stream memory of the run.

Across processes (``vae.engine.distributed.ranks``) each rank runs its share of the tiles and the rounds
become collectives: the sums and whole-module maps are all-reduced, re-cut slices are exchanged point
to point (``_exchange``), and the ranks agree after every step whether one of them failed.

Tiles are coroutines: each runs the model's own forward in a thread, and exactly one runs at a time
(a hand-off, not parallelism), so no model code changes and the result is deterministic. Everything
a run needs (each tile's hooks and stream memory) is held by the run, in the tile thread's context
(``vae/run.py``): nothing is installed on the shared modules, so concurrent calls on one model do not
see each other. Memory: the paused tiles together hold about one activation map of the level they are
at (plus halos and the residual input of the block they are in), one tile's working set while it
runs, and an assembled map at re-cut points.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import queue
import sys
import threading
from fractions import Fraction
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from . import distributed, park, stages, transfer
from . import memory as vram
from .. import run as runstate
from ..nn.norm import GroupNorm, group_moments
from .receptive import Event, Segment, active, probe, reach, scale_of, segments
from .tiles import Output, Tile, grid
from .tiling import Progress

Fn = Callable[[torch.Tensor, nn.Module], torch.Tensor]     # fn(x, model): a forward of ``model``
Spans = Sequence[tuple[int, int]]


# ---- coroutines ---------------------------------------------------------------------------------

class _Abort(BaseException):
    """Unwinds a paused tile when the run stops (error elsewhere, or an interrupt)."""


_ABORT = object()


class _Coroutine:
    """One tile's forward in its own thread; ``resume`` runs it until its next pause or its end.

    It is also the tile's exact-tiling hooks (``stats``, ``seam``), which its thread finds in its run
    state together with the tile's own stream memory."""

    def __init__(self, tile: Tile, memory: Optional[dict], body: Callable[["_Coroutine"], Callable],
                 device: Optional[torch.device] = None, park_to: Optional[torch.device] = None, force: bool = False,
                 transfers: Optional[transfer.Transfers] = None):
        self.tile, self._memory = tile, memory
        self.device, self.park_to, self.force = device, park_to, force   # parking a paused tile (vae/engine/park.py)
        self.transfers = transfers or transfer.Transfers()
        self._tracker = vram.current_tracker()      # a planner's dry run counts this thread's tensors too
        self._body = body(self)          # what the thread runs: a closure over this coroutine
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._started = False
        self.finished = False

    def _main(self) -> None:
        body, self._body = self._body, None
        if self._inbox.get() is _ABORT:
            self._outbox.put(("aborted", None))
            return
        try:
            with torch.inference_mode(), vram.following(self._tracker), \
                    runstate.using(runstate.Run(memory=self._memory, exact=self)):
                out = body()
            del body
            self._outbox.put(("done", out))
        except _Abort:
            self._outbox.put(("aborted", None))
        except BaseException as e:   # handed to the main thread, which raises it
            self._outbox.put(("error", e))

    def pause(self, kind: str, module: Optional[nn.Module], payload):
        parked = None
        if self.park_to is not None:        # wait on the offload device: what this thread's frames hold
            parked = park.park_frames(sys._getframe(1), self.device, self.park_to, [self._memory], self.force,
                                      self.transfers)
        self._outbox.put(("sync", (kind, module, payload)))
        reply = self._inbox.get()
        if reply is _ABORT:
            raise _Abort
        if parked is not None:
            parked.restore()
        return reply

    def resume(self, reply=None):
        if not self._started:
            self._started = True
            self._thread.start()
        self._inbox.put(reply)
        msg = self._outbox.get()
        self.finished = msg[0] != "sync"
        return msg

    def abort(self) -> None:
        if not self.finished:
            self.resume(_ABORT)
        if self._started:
            self._thread.join()

    # ---- the hooks the tile's modules call (through its run state) --------------------------------
    def extent(self, x: torch.Tensor):
        """The whole map's size at ``x``'s layer and where ``x`` lies in it (vae/nn/noise.py)."""
        return self.tile.extent(x)

    def stats(self, norm: GroupNorm, x: torch.Tensor):
        _, core = self.tile.locate(x)
        return self.pause("stats", norm, group_moments(x[core], norm.num_groups))

    def seam(self, module: nn.Module, x: torch.Tensor, forward: Callable[[torch.Tensor], torch.Tensor]):
        kind = "whole" if getattr(module, "exact_whole", False) else "boundary"
        scales, core = self.tile.locate(x)
        if kind == "boundary" and not active(module, scales):
            return forward(x)
        # handed over as a copy on the offload device (no view pins x), a temporary: parking at this pause
        # must not move it (it may be a copy still in flight)
        x = self.pause(kind, module, (x[core] if self.park_to is None else
                                      self.transfers.copy_to_host(x[core], self.park_to), scales))
        return x if kind == "whole" else forward(x)


# ---- the run ------------------------------------------------------------------------------------

def run_exact(fn: Fn, model: nn.Module, x: torch.Tensor, cores: Sequence[Spans], in_unit: int, out_unit: int,
              out_device: torch.device, chunks: Optional[tuple[Spans, Spans]] = None, probe_size: int = 4,
              progress: Optional[Progress] = None, offload: Optional[torch.device] = None,
              order: str = "auto", park_tiles=None, sample: bool = False, body=None,
              fixed: bool = False) -> torch.Tensor:
    """Apply ``fn(x, model)`` (a forward of ``model``) to ``x`` tile by tile with the untiled result.

    ``cores``: per spatial axis (the last two of ``x``), spans in latent units that partition it;
    ``in_unit``/``out_unit``: pixels per latent pixel of x and of the output (decode 1 and the
    spatial ratio, encode the reverse). ``chunks``: for a model that streams, the spans along time
    (dim 2) of the input chunks and of the output frames each gives (vae/engine/streaming.py); each tile
    then runs the clip chunk by chunk. The output (float32 on ``out_device``) is assembled from the
    tiles' cores, no blending. ``offload``: where maps and paused tiles wait (default ``out_device``).

    ``order``: "tiles" runs tile after tile (vae/engine/stages.py: one tile's working set), "rounds" runs
    every tile to each meeting point together (this module), "auto" the first where the model allows
    it (no GroupNorm statistics). ``park_tiles``: paused tiles of a "rounds" run wait on ``offload``
    (vae/engine/park.py; default: when it is another kind of device than the model's; "copy": parked on the
    same device too, emptied and refilled: the tests' check that nothing reads a parked storage). ``sample`` (the
    planner's dry run on the meta device): tile after tile, only the first and the most interior tile run.
    ``body``: how a tile-after-tile run calls the seam modules between its pauses (``body(module, x,
    *args)``: a compiled handle's graphs; vae/engine/stages.py), ``fixed`` (implied by ``body``): its tiles of
    one shape; tiles meeting in rounds run eagerly."""
    latent = tuple(n // in_unit for n in x.shape[-2:])
    events, segs, small = _probe(fn, model, x, in_unit, out_unit, chunks, probe_size)
    cores = edge_cores(cores, events, small)
    staged = stages.plan(events, small, in_unit, out_unit) if order != "rounds" else None
    if order == "tiles" and staged is None:
        raise ValueError("this model's tiles share GroupNorm statistics: they cannot run one after the other")
    if staged is not None:
        return stages.run_stages(fn, model, x, latent, staged, cores, in_unit, out_device, chunks, offload, progress,
                                 sample, body, fixed)
    device = next(model.parameters()).device
    offload = torch.device(offload or out_device)
    force = park_tiles == "copy"          # the tests' check: parked (emptied, refilled) on the same device
    if park_tiles is None:
        park_tiles = offload.type != device.type
    run = _Run(fn, model, x, latent, segs, events, small, chunks, out_device, device,
               (device, offload if device.type != "meta" else device) if park_tiles else None, force)
    try:
        return run.go(cores, in_unit, progress)
    finally:
        run.close()


def tile_major(fn: Fn, model: nn.Module, x: torch.Tensor, in_unit: int, out_unit: int, chunks=None,
               probe_size: int = 4) -> bool:
    """Whether ``run_exact`` runs this call tile after tile (the model has no GroupNorm statistics)."""
    events, segs, small = _probe(fn, model, x, in_unit, out_unit, chunks, probe_size)
    return stages.plan(events, small, in_unit, out_unit) is not None


def edge_cores(cores: Sequence[Spans], events: Sequence[Event], small) -> list[list[tuple[int, int]]]:
    """``cores`` with the first and last span of each axis merged into their neighbour while narrower
    than a windowed module needs (``exact_window``: a window that shifts inward at the map's border).
    Such a module reaches ``exact_reach`` (half its window) from a core away from the border; a core
    whose queries all lie within that of the border sees their shifted windows reach ``window - 1``
    inward, past its halo, unless it is at least ``window - reach`` wide (latent units at the module's
    scale)."""
    need = [1] * len(cores)
    for e in events:
        window = getattr(e.module, "exact_window", None)
        if window is None or e.kind == "whole":
            continue
        for d, (w, r, s) in enumerate(zip(window, reach(e.module), scale_of(e, small))):
            need[d] = max(need[d], math.ceil((w - r) / s))
    out = []
    for spans, n in zip(cores, need):
        spans = list(spans)
        while len(spans) > 1 and spans[0][1] - spans[0][0] < n:
            spans[:2] = [(spans[0][0], spans[1][1])]
        while len(spans) > 1 and spans[-1][1] - spans[-1][0] < n:
            spans[-2:] = [(spans[-2][0], spans[-1][1])]
        out.append(spans)
    return out


def _probe(fn, model, x, in_unit, out_unit, chunks, probe_size):
    latent = tuple(n // in_unit for n in x.shape[-2:])
    small = tuple(min(n, probe_size) for n in latent)
    sample = x[(slice(0, 1), ..., *(slice(0, n * in_unit) for n in small))]
    if chunks:
        sample = sample[:, :, slice(*chunks[0][0])]
    events = probe(fn, model, sample)
    segs = segments(events, small, in_unit, out_unit)
    # the model's own input checks want whole latent pixels (e.g. sides divisible by 8)
    segs[0] = dataclasses.replace(segs[0], align=tuple(math.lcm(a, in_unit) for a in segs[0].align))
    return events, segs, small


_CHUNK = Event("chunk", None, (0, 0))       # a round in which every tile hands over a chunk's output


def _rounds(events: Sequence[Event], small) -> tuple[list[Event], list[float]]:
    """The meeting points of every tile (GroupNorms, whole modules, active re-cut points), and the
    share of the work done before each (the last entry: after the last one)."""
    syncs, costs, acc = [], [], 0.0
    for e in events:
        if e.kind == "conv":
            acc += e.cost
        elif e.kind != "boundary" or active(e.module, scale_of(e, small)):
            syncs.append(e)
            costs.append(acc)
            acc = 0.0
    costs.append(acc)
    total = sum(costs) or 1.0
    return syncs, [c / total for c in costs]


class _Run:
    """One exact run whose tiles meet: their coroutines, the rounds they meet in, the output they fill."""

    def __init__(self, fn: Fn, model: nn.Module, x: torch.Tensor, latent, segs, events, small, chunks, out_device,
                 device: torch.device, parking: Optional[tuple[torch.device, torch.device]] = None,
                 force: bool = False):
        self.fn, self.model, self.x, self.latent = fn, model, x, latent
        self.device = device                 # where the tiles compute: the model's, never a payload's
        self.parking, self.force = parking, force
        self.segs, self.chunks, self.out_device = segs, chunks, out_device
        syncs, self.costs = _rounds(events, small)
        self.rounds = syncs + ([_CHUNK] if chunks else [])
        # whole-tensor modules run in this thread; in a stream they keep their state here
        self.whole_memory: Optional[dict] = {} if chunks else None
        self.cos: list[_Coroutine] = []      # this rank's tiles (all of them on one process)
        self.comm = distributed.current()
        self.transfers = transfer.Transfers()
        self.out = Output(out_device, self.comm.size > 1, chunks[1][-1][1] if chunks else None, self.transfers)

    def _body(self, src: torch.Tensor) -> Callable[[_Coroutine], Callable[[], Optional[torch.Tensor]]]:
        fn, model, chunks = self.fn, self.model, self.chunks

        def make(co: _Coroutine):
            return functools.partial(body, co)

        def body(co: _Coroutine):
            if not chunks:
                return fn(src, model)
            for i, (a, b) in enumerate(chunks[0]):
                co.pause("chunk", None, (i, fn(src[:, :, a:b], model)))
            return None
        return make

    def go(self, cores, in_unit: int, progress) -> torch.Tensor:
        self.tiles = grid(cores, self.latent)
        self.owner = [self.comm.owner(i, len(self.tiles)) for i in range(len(self.tiles))]
        tiles = [t for i, t in enumerate(self.tiles) if self.comm.owns(i, len(self.tiles))]
        n_chunks = len(self.chunks[0]) if self.chunks else 1
        units, done = len(tiles) * n_chunks, 0.0      # progress: tiles x chunks, weighted by work
        for tile in tiles:
            self._start(tile, in_unit)
            device, park_to = self.parking or (None, None)
            self.cos.append(_Coroutine(tile, {} if self.chunks else None, self._body(self.x[tile.slices()]),
                                       device, park_to, self.force, self.transfers))
        replies: list = [None] * len(self.cos)
        for step in itertools.count():
            msgs, error = [], None
            i = step % len(self.rounds) if self.rounds else 0
            # the work before round i (the chunk round: after the last meeting; the final step: the rest)
            if step >= len(self.rounds) * n_chunks:
                share = 0.0 if self.chunks else self.costs[-1]
            else:
                share = self.costs[-1] if self.rounds[i] is _CHUNK else self.costs[i]
            try:
                for k, co in enumerate(self.cos):
                    reply, replies[k] = replies[k], None
                    msgs.append(co.resume(reply() if callable(reply) else reply))
                    del reply
                    vram.trim()
                    done += share / units
                    if progress:              # ComfyUI's interrupt is raised here
                        progress(min(units, round(done * units)), units)
            except BaseException as e:        # noqa: BLE001 - every rank learns of it in step()
                error = e
            error = error or next((value for kind, value in msgs if kind == "error"), None)
            if not self.comm.step(error, any(kind != "done" for kind, _ in msgs)):
                if not self.chunks:
                    for co, (_, y) in zip(self.cos, msgs):
                        self.out.write(co.tile, y)
                return self.comm.sum_(self.out.result())        # the ranks' cores, assembled on every rank
            expect = self.rounds[i]
            _check(step, expect, msgs)
            if expect is _CHUNK:
                index = msgs[0][1][2][0]
                for co, (_, v) in zip(self.cos, msgs):
                    self.out.write(co.tile, v[2][1], self.chunks[1][index])
                for co in self.cos:        # the next chunk starts from the input's cut again
                    self._start(co.tile, in_unit)
                replies = [None] * len(self.cos)
                continue
            seg = None if expect.kind == "stats" else self.segs[1 + sum(e.kind != "stats" for e in self.rounds[:i])]
            with runstate.stream(self.whole_memory) if self.chunks else contextlib.nullcontext():
                if expect.kind == "boundary" and self.comm.size > 1:
                    replies = _exchange(seg, msgs, self.cos, self.tiles, self.owner, self.latent, self.device,
                                        self.comm, self.transfers)
                else:
                    replies = _answer(expect, seg, msgs, self.cos, self.latent, self.device, self.out_device,
                                      self.comm, self.transfers)
        raise AssertionError("unreachable")

    def _start(self, tile: Tile, in_unit: int) -> None:
        """The tile's extent in the model's input: its core plus the first stretch's halo."""
        tile.cut([Fraction(in_unit)] * 2, self.segs[0], self.x.shape[-2:])

    def close(self) -> None:
        for co in self.cos:
            co.abort()
        self.cos.clear()


def _check(step: int, expect: Event, msgs) -> None:
    for kind, value in msgs:
        if kind != "sync" or value[0] != expect.kind or value[1] is not expect.module:
            raise RuntimeError("exact tiling: the tiles took a different path than the probe pass "
                               f"(round {step}: expected {expect.kind}, got {kind} {value and value[0]})")


def _layout(msgs, latent) -> tuple:
    """At a map round: the first tile's core, the map's scales and whole size, its memory format."""
    first, scales = msgs[0][1][2]
    size = [int(n * s) for n, s in zip(latent, scales)]
    fmt = torch.channels_last if first.dim() == 4 and first.is_contiguous(memory_format=torch.channels_last) \
        else torch.contiguous_format
    return first, scales, size, fmt


def _answer(expect: Event, seg: Segment, msgs, cos, latent, device: torch.device, out_device,
            comm=distributed.LOCAL, transfers: Optional[transfer.Transfers] = None):
    """One round: every tile paused at the same place; compute what each resumes with on ``device`` (where
    the tiles compute; their payloads may wait on the host). Across ranks (``comm``) the sums and the
    assembled maps are all-reduced: each rank holds only its tiles. At a map round the tiles' cores,
    copied out at their pause (``transfers``), are landed first."""
    transfers = transfers or transfer.Transfers()
    if expect.kind == "stats":
        s1 = comm.sum_(sum(v[2][0] for _, v in msgs))
        s2 = comm.sum_(sum(v[2][1] for _, v in msgs))
        n = comm.sum_(torch.tensor(float(sum(v[2][2] for _, v in msgs)), dtype=torch.float64)).item()
        mean = s1 / n
        var = (s2 / n - mean.square()).clamp_min(0)
        return [(mean.float(), var.float())] * len(msgs)
    # gather the cores into one map, run a whole module on it, re-cut every tile
    transfers.wait()
    whole = expect.kind == "whole"
    first, scales, size, fmt = _layout(msgs, latent)
    # assembled where the output lives, not on the compute device, unless a whole module runs on it
    with contextlib.nullcontext() if whole else vram.placed_away():
        full = torch.empty(*first.shape[:-2], *size, dtype=first.dtype, device=device if whole else out_device,
                           memory_format=fmt)
    if comm.size > 1:
        full.zero_()                  # other ranks' cores arrive by the sum
    for co, (_, (_, _, (core, _))) in zip(cos, msgs):
        full[(..., *(slice(int(a * s), int(b * s)) for (a, b), s in zip(co.tile.core, scales)))] = core
    del msgs, first, core
    full = comm.sum_(full)
    if whole:
        full = expect.module(full)

    def recut(co: _Coroutine) -> torch.Tensor:     # made when the tile resumes: one new slice at a time
        co.tile.cut(scales, seg, size)
        return transfers.to_device(full[co.tile.slices()], device, fmt)
    return [functools.partial(recut, co) for co in cos]


def _exchange(seg: Segment, msgs, cos, tiles: Sequence[Tile], owner: Sequence[int], latent, device: torch.device,
              comm, transfers: transfer.Transfers):
    """A re-cut point across ranks: each local tile's new slice (core plus the next stretch's halo) is
    built on ``device`` (where the tiles compute) from the cores that overlap it: this rank's own, and the
    other ranks' sent point to point through the backend's device (``comm.device``). No rank assembles
    the whole map. The cores, copied out at their pause, are landed first."""
    transfers.wait()
    cores = {id(co.tile): core for co, (_, (_, _, (core, _))) in zip(cos, msgs)}
    first, scales, size, fmt = _layout(msgs, latent)
    boxes = [[(int(a * s), int(b * s)) for (a, b), s in zip(t.core, scales)] for t in tiles]
    for t in tiles:                           # every tile's new extent, the other ranks' too
        t.cut(scales, seg, size)
    mine = {id(co.tile) for co in cos}
    regions = {id(t): torch.empty(*first.shape[:-2], *(hi - lo for lo, hi in zip(t.lo, t.hi)), dtype=first.dtype,
                                  device=device).contiguous(memory_format=fmt) for t in tiles if id(t) in mine}
    sends, receives = [], []
    for u, box in zip(tiles, boxes):                      # the same order on every rank: sends meet receives
        for t in tiles:
            if id(u) not in mine and id(t) not in mine:
                continue
            cut = [(max(a, lo), min(b, hi)) for (a, b), lo, hi in zip(box, t.lo, t.hi)]
            if any(a >= b for a, b in cut):
                continue
            dst = (..., *(slice(a - lo, b - lo) for (a, b), lo in zip(cut, t.lo)))
            if id(u) in mine:
                part = cores[id(u)][(..., *(slice(a - c, b - c) for (a, b), (c, _) in zip(cut, box)))]
                if id(t) in mine:
                    regions[id(t)][dst] = part
                else:
                    sends.append((part.to(comm.device, copy=True, memory_format=torch.contiguous_format),
                                  owner[tiles.index(t)]))
            else:
                receives.append((regions[id(t)][dst], owner[tiles.index(u)]))
    buffers = [(torch.empty(view.shape, dtype=view.dtype, device=comm.device), peer) for view, peer in receives]
    comm.exchange(sends, buffers)
    for (view, _), (buf, _) in zip(receives, buffers):
        view.copy_(buf)
    del msgs, cores, sends, buffers
    return [regions[id(co.tile)] for co in cos]
