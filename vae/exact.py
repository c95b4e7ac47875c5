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

Across processes (``vae.distributed.ranks``) each rank runs its share of the tiles and the rounds
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
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from . import distributed
from . import run as runstate
from .nn.norm import STATISTICS, GroupNorm, group_moments
from .tiling import Progress

Fn = Callable[[torch.Tensor, nn.Module], torch.Tensor]     # fn(x, model): a forward of ``model``
Spans = Sequence[tuple[int, int]]


COARSE = "coarse"


def _active(module: nn.Module, scale: Sequence[Fraction]) -> bool:
    """Whether a re-cut point at ``scale`` (map pixels per latent pixel) is used."""
    flag = getattr(module, "exact_boundary", False)
    return bool(flag) and (flag != COARSE or max(scale) <= 1)


# ---- receptive field, from a probe pass ---------------------------------------------------------

@dataclass(frozen=True)
class Event:
    kind: str                       # "conv", "stats" (a GroupNorm), "whole", "boundary"
    module: nn.Module
    size: tuple[int, int]           # spatial size of the module's input


def reach(conv: nn.Module) -> tuple[int, int]:
    """How far (input pixels, per spatial axis) one output pixel of ``conv`` looks to either side:
    max(left padding, kernel span - left padding). Convs that pad themselves say so (``hw_padding``)."""
    pad = getattr(conv, "hw_padding", None) or conv.padding[-2:]
    if isinstance(pad, str):
        raise ValueError(f"exact tiling: string padding {pad!r} is not supported")
    return tuple(max(p, (k - 1) * d - p) for p, k, d in zip(pad, conv.kernel_size[-2:], conv.dilation[-2:]))


def probe(fn: Fn, model: nn.Module, x: torch.Tensor) -> list[Event]:
    """Run ``fn(x, model)`` once (a tiny input, as a whole clip) and record, in execution order, every
    spatial conv, GroupNorm, whole-tensor module and re-cut point with its input size. Modules inside
    a whole module are not recorded (they run on the whole tensor).

    The hooks go on a private copy of the module tree (same storage, no extra memory), never on the
    shared model; events name the shared model's modules."""
    from .guard import eager_copy
    shadow = eager_copy(model, lambda t: t)
    original = dict(zip(shadow.modules(), model.modules()))
    events: list[Event] = []
    inside = [0]

    def pre(m, args):
        if inside[0]:
            return
        size = tuple(args[0].shape[-2:])
        if getattr(m, "exact_boundary", False):
            events.append(Event("boundary", original[m], size))
        if getattr(m, "exact_whole", False):
            events.append(Event("whole", original[m], size))
            inside[0] += 1
        elif isinstance(m, STATISTICS):
            events.append(Event("stats", original[m], size))
        elif isinstance(m, nn.modules.conv._ConvNd) and any(k > 1 for k in m.kernel_size[-2:]):
            events.append(Event("conv", original[m], size))

    def post(m, args, out):
        if getattr(m, "exact_whole", False) and inside[0]:
            inside[0] -= 1

    for m in shadow.modules():
        m.register_forward_pre_hook(pre)
        m.register_forward_hook(post)
    with runstate.using(runstate.Run()):
        fn(x, shadow)
    return events


@dataclass(frozen=True)
class Segment:
    """The layers between two re-cut points: the halo they need (latent pixels, per axis) and the
    alignment (the segment's resolution drop: a tile cut must fall on its strided grid)."""
    halo: tuple[Fraction, Fraction]
    align: tuple[int, int]


def segments(events: Sequence[Event], latent_size: tuple[int, int], in_scale: int, out_scale: int) -> list[Segment]:
    """Split the probe's events at re-cut points; ``in_scale``/``out_scale``: pixels per latent pixel
    of the model's input and output."""
    out: list[Segment] = []

    def start(scale):
        return {"halo": [Fraction(0)] * 2, "start": scale, "low": list(scale)}

    def close(seg):
        out.append(Segment(tuple(seg["halo"]), tuple(math.ceil(s / lo) for s, lo in zip(seg["start"], seg["low"]))))

    seg = start((Fraction(in_scale),) * 2)
    for e in events:
        scale = tuple(Fraction(n, m) for n, m in zip(e.size, latent_size))
        if e.kind == "boundary" and not _active(e.module, scale):
            continue
        seg["low"] = [min(a, b) for a, b in zip(seg["low"], scale)]
        if e.kind in ("whole", "boundary"):
            close(seg)
            seg = start(scale)
        elif e.kind == "conv":
            seg["halo"] = [h + Fraction(r) / s for h, r, s in zip(seg["halo"], reach(e.module), scale)]
    seg["low"] = [min(a, Fraction(out_scale)) for a in seg["low"]]
    close(seg)
    return out


# ---- coroutines ---------------------------------------------------------------------------------

class _Abort(BaseException):
    """Unwinds a paused tile when the run stops (error elsewhere, or an interrupt)."""


_ABORT = object()


@dataclass
class Tile:
    core: tuple[tuple[int, int], ...]          # latent units, per spatial axis
    latent: tuple[int, ...]                    # the whole latent's size, per spatial axis
    lo: list[int] = field(default_factory=list)   # the tile tensor's extent, in units of `scale`
    hi: list[int] = field(default_factory=list)
    scale: list[Fraction] = field(default_factory=list)   # map units per latent unit at the last cut

    def locate(self, x: torch.Tensor) -> tuple[list[Fraction], tuple[slice, ...]]:
        """Where the core lies in ``x`` (this tile's tensor at some layer): x's scale, and slices."""
        scales, slices = [], []
        for d, ((a, b), lo, hi, s) in enumerate(zip(self.core, self.lo, self.hi, self.scale)):
            f = Fraction(x.shape[x.dim() - 2 + d], hi - lo)
            start, stop = (a * s - lo) * f, (b * s - lo) * f
            if start.denominator != 1 or stop.denominator != 1:
                raise RuntimeError("exact tiling: a tile's core does not fall on this layer's grid")
            scales.append(s * f)
            slices.append(slice(int(start), int(stop)))
        return scales, (..., *slices)


    def extent(self, x: torch.Tensor) -> tuple[list[int], tuple[slice, ...]]:
        """The whole map's size at ``x``'s layer, and where ``x`` lies in it."""
        sizes, slices = [], []
        for d, (n, lo, hi, s) in enumerate(zip(self.latent, self.lo, self.hi, self.scale)):
            f = Fraction(x.shape[x.dim() - 2 + d], hi - lo)
            sizes.append(int(n * s * f))
            slices.append(slice(int(lo * f), int(hi * f)))
        return sizes, (..., *slices)


class _Coroutine:
    """One tile's forward in its own thread; ``resume`` runs it until its next pause or its end.

    It is also the tile's exact-tiling hooks (``stats``, ``seam``), which its thread finds in its run
    state together with the tile's own stream memory."""

    def __init__(self, tile: Tile, memory: Optional[dict], body: Callable[["_Coroutine"], Callable]):
        self.tile, self._memory = tile, memory
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
            with torch.inference_mode(), runstate.using(runstate.Run(memory=self._memory, exact=self)):
                out = body()
            del body
            self._outbox.put(("done", out))
        except _Abort:
            self._outbox.put(("aborted", None))
        except BaseException as e:   # handed to the main thread, which raises it
            self._outbox.put(("error", e))

    def pause(self, kind: str, module: Optional[nn.Module], payload):
        self._outbox.put(("sync", (kind, module, payload)))
        reply = self._inbox.get()
        if reply is _ABORT:
            raise _Abort
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
        """The whole map's size at ``x``'s layer and where ``x`` lies in it (vae/noise.py)."""
        return self.tile.extent(x)

    def stats(self, norm: GroupNorm, x: torch.Tensor):
        _, core = self.tile.locate(x)
        return self.pause("stats", norm, group_moments(x[core], norm.num_groups))

    def seam(self, module: nn.Module, x: torch.Tensor, forward: Callable[[torch.Tensor], torch.Tensor]):
        kind = "whole" if getattr(module, "exact_whole", False) else "boundary"
        scales, core = self.tile.locate(x)
        if kind == "boundary" and not _active(module, scales):
            return forward(x)
        x = self.pause(kind, module, (x[core], scales))    # the re-cut tile (for "whole": of the output)
        return x if kind == "whole" else forward(x)


# ---- the run ------------------------------------------------------------------------------------

def _libc_trim() -> Callable[[], object]:
    """glibc's malloc_trim, or a no-op. Each tile thread allocates from its own malloc arena, and
    glibc keeps freed blocks under its (self-raising) mmap threshold in that arena: with tiles taking
    turns, every arena keeps a tile's worth of freed memory. Trimming after each turn gives it back
    (measured, SD decoder at 512 px, 2x2 exact tiles: peak working set 987 -> 532 MiB; ~15 us a call)."""
    try:
        import ctypes
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0)


_trim = _libc_trim()


def _cut(tile: Tile, scales: Sequence[Fraction], seg: Segment, full: Sequence[int]) -> None:
    """Set the tile's extent at the given scales: its core plus the segment's halo, inside the map."""
    tile.scale = list(scales)
    tile.lo, tile.hi = [], []
    for (a, b), s, h, al, n in zip(tile.core, scales, seg.halo, seg.align, full):
        pad = math.ceil(h * s / al) * al
        tile.lo.append(max(0, int(a * s) - pad))
        tile.hi.append(min(n, int(b * s) + pad))


def _slice(tile: Tile) -> tuple:
    return (..., *(slice(lo, hi) for lo, hi in zip(tile.lo, tile.hi)))


def run_exact(fn: Fn, model: nn.Module, x: torch.Tensor, cores: Sequence[Spans], in_unit: int, out_unit: int,
              out_device: torch.device, chunks: Optional[tuple[Spans, Spans]] = None, probe_size: int = 4,
              progress: Optional[Progress] = None) -> torch.Tensor:
    """Apply ``fn(x, model)`` (a forward of ``model``) to ``x`` tile by tile with the untiled result.

    ``cores``: per spatial axis (the last two of ``x``), spans in latent units that partition it;
    ``in_unit``/``out_unit``: pixels per latent pixel of x and of the output (decode 1 and the
    spatial ratio, encode the reverse). ``chunks``: for a model that streams, the spans along time
    (dim 2) of the input chunks and of the output frames each gives (vae/streaming.py); each tile
    then runs the clip chunk by chunk. The output (float32 on ``out_device``) is assembled from the
    tiles' cores, no blending."""
    latent = tuple(n // in_unit for n in x.shape[-2:])
    small = tuple(min(n, probe_size) for n in latent)
    sample = x[(slice(0, 1), ..., *(slice(0, n * in_unit) for n in small))]
    if chunks:
        sample = sample[:, :, slice(*chunks[0][0])]
    events = probe(fn, model, sample)
    segs = segments(events, small, in_unit, out_unit)
    # the model's own input checks want whole latent pixels (e.g. sides divisible by 8)
    segs[0] = dataclasses.replace(segs[0], align=tuple(math.lcm(a, in_unit) for a in segs[0].align))
    syncs = [e for e in events if e.kind != "conv" and not (
        e.kind == "boundary" and not _active(e.module, [Fraction(n, m) for n, m in zip(e.size, small)]))]
    run = _Run(fn, model, x, latent, segs, syncs, chunks, out_device)
    try:
        return run.go(cores, in_unit, progress)
    finally:
        run.close()


_CHUNK = Event("chunk", None, (0, 0))       # a round in which every tile hands over a chunk's output


class _Run:
    """One exact run: the tiles' coroutines, the rounds they meet in, the output they fill."""

    def __init__(self, fn: Fn, model: nn.Module, x: torch.Tensor, latent, segs, syncs, chunks, out_device):
        self.fn, self.model, self.x, self.latent = fn, model, x, latent
        self.segs, self.syncs, self.chunks, self.out_device = segs, syncs, chunks, out_device
        self.rounds = list(syncs) + ([_CHUNK] if chunks else [])
        # whole-tensor modules run in this thread; in a stream they keep their state here
        self.whole_memory: Optional[dict] = {} if chunks else None
        self.cos: list[_Coroutine] = []      # this rank's tiles (all of them on one process)
        self.out: Optional[torch.Tensor] = None
        self.comm = distributed.current()

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
        self.tiles = [Tile(tuple(c), self.latent) for c in itertools.product(*cores)]
        self.owner = [self.comm.owner(i, len(self.tiles)) for i in range(len(self.tiles))]
        tiles = [t for i, t in enumerate(self.tiles) if self.comm.owns(i, len(self.tiles))]
        n_chunks = len(self.chunks[0]) if self.chunks else 1
        total = len(tiles) * (len(self.rounds) * n_chunks + 1 - bool(self.chunks))
        for tile in tiles:
            self._start(tile, in_unit)
            self.cos.append(_Coroutine(tile, {} if self.chunks else None, self._body(self.x[_slice(tile)])))
        done = 0
        replies: list = [None] * len(self.cos)
        for step in itertools.count():
            msgs, error = [], None
            try:
                for i, co in enumerate(self.cos):
                    reply, replies[i] = replies[i], None
                    msgs.append(co.resume(reply() if callable(reply) else reply))
                    del reply
                    _trim()
                    done += 1
                    if progress:              # ComfyUI's interrupt is raised here
                        progress(min(done, total), total)
            except BaseException as e:        # noqa: BLE001 - every rank learns of it in step()
                error = e
            error = error or next((value for kind, value in msgs if kind == "error"), None)
            if not self.comm.step(error, any(kind != "done" for kind, _ in msgs)):
                if not self.chunks:
                    self._write([y for _, y in msgs], None)
                return self.comm.sum_(self.out)          # the ranks' cores, assembled on every rank
            i = step % len(self.rounds)
            expect = self.rounds[i]
            _check(step, expect, msgs)
            if expect is _CHUNK:
                index = msgs[0][1][2][0]
                self._write([v[2][1] for _, v in msgs], self.chunks[1][index])
                for co in self.cos:        # the next chunk starts from the input's cut again
                    self._start(co.tile, in_unit)
                replies = [None] * len(self.cos)
                continue
            seg = None if expect.kind == "stats" else self.segs[1 + sum(e.kind != "stats" for e in self.rounds[:i])]
            with runstate.stream(self.whole_memory) if self.chunks else contextlib.nullcontext():
                if expect.kind == "boundary" and self.comm.size > 1:
                    replies = _exchange(seg, msgs, self.cos, self.tiles, self.owner, self.latent, self.comm)
                else:
                    replies = _answer(expect, seg, msgs, self.cos, self.latent, self.out_device, self.comm)
        raise AssertionError("unreachable")

    def _start(self, tile: Tile, in_unit: int) -> None:
        """The tile's extent in the model's input: its core plus the first stretch's halo."""
        _cut(tile, [Fraction(in_unit)] * 2, self.segs[0], self.x.shape[-2:])

    def _write(self, ys: Sequence[torch.Tensor], frames: Optional[tuple[int, int]]) -> None:
        """Put each tile's core of its output (a chunk's frames ``frames``, or all) into the output."""
        for co, y in zip(self.cos, ys):
            scales, core = co.tile.locate(y)
            if self.out is None:
                size = [int(n * s) for n, s in zip(self.latent, scales)]
                lead = y.shape[:-2] if frames is None else (*y.shape[:2], self.chunks[1][-1][1])
                # zeros where other ranks' tiles go: the all-reduce at the end fills them in
                alloc = torch.empty if self.comm.size == 1 else torch.zeros
                self.out = alloc(*lead, *size, device=self.out_device, dtype=torch.float32)
            dst = tuple(slice(int(a * s), int(b * s)) for (a, b), s in zip(co.tile.core, scales))
            if frames is not None:
                if y.shape[2] != frames[1] - frames[0]:
                    raise RuntimeError(f"a chunk gave {y.shape[2]} frames, expected {frames[1] - frames[0]}")
                dst = (slice(None), slice(None), slice(*frames)) + dst
            self.out[(..., *dst)] = y[core].to(self.out_device, torch.float32)

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


def _answer(expect: Event, seg: Segment, msgs, cos, latent, out_device, comm=distributed.LOCAL):
    """One round: every tile paused at the same place; compute what each resumes with. Across ranks
    (``comm``) the sums and the assembled maps are all-reduced: each rank holds only its tiles."""
    if expect.kind == "stats":
        s1 = comm.sum_(sum(v[2][0] for _, v in msgs))
        s2 = comm.sum_(sum(v[2][1] for _, v in msgs))
        n = comm.sum_(torch.tensor(float(sum(v[2][2] for _, v in msgs)), dtype=torch.float64)).item()
        mean = s1 / n
        var = (s2 / n - mean.square()).clamp_min(0)
        return [(mean.float(), var.float())] * len(msgs)
    # gather the cores into one map, run a whole module on it, re-cut every tile
    whole = expect.kind == "whole"
    first, scales, size, fmt = _layout(msgs, latent)
    device = first.device                # where the tiles compute
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
        _cut(co.tile, scales, seg, size)
        return full[_slice(co.tile)].to(device).clone(memory_format=fmt)
    return [functools.partial(recut, co) for co in cos]


def _exchange(seg: Segment, msgs, cos, tiles: Sequence[Tile], owner: Sequence[int], latent, comm):
    """A re-cut point across ranks: each local tile's new slice (core plus the next stretch's halo) is
    built from the cores that overlap it: this rank's own, and the other ranks' sent point to point.
    No rank assembles the whole map."""
    cores = {id(co.tile): core for co, (_, (_, _, (core, _))) in zip(cos, msgs)}
    first, scales, size, fmt = _layout(msgs, latent)
    boxes = [[(int(a * s), int(b * s)) for (a, b), s in zip(t.core, scales)] for t in tiles]
    for t in tiles:                           # every tile's new extent, the other ranks' too
        _cut(t, scales, seg, size)
    mine = {id(co.tile) for co in cos}
    regions = {id(t): torch.empty(*first.shape[:-2], *(hi - lo for lo, hi in zip(t.lo, t.hi)), dtype=first.dtype,
                                  device=first.device).contiguous(memory_format=fmt) for t in tiles if id(t) in mine}
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
                    sends.append((part.contiguous(), owner[tiles.index(t)]))
            else:
                receives.append((regions[id(t)][dst], owner[tiles.index(u)]))
    buffers = [(torch.empty(view.shape, dtype=view.dtype, device=view.device), peer) for view, peer in receives]
    comm.exchange(sends, buffers)
    for (view, _), (buf, _) in zip(receives, buffers):
        view.copy_(buf)
    del msgs, cores, sends, buffers
    return [regions[id(co.tile)] for co in cos]
