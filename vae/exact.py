"""Exact tiling: tiled encode/decode whose result equals one untiled pass (the ``exact`` mode).

A tile differs from the same region of an untiled pass for three reasons; each has its fix here:
1. Convolutions near a tile edge see the tile's padding instead of the neighbours' pixels. Each tile
   carries a halo at least the receptive field of the layers it runs before it is re-cut, measured
   from the architecture: every conv's kernel, dilation and padding at the resolution it runs,
   recorded by one probe pass on a tiny input. Each tile keeps only its core.
2. GroupNorm statistics would be the tile's own. Every GroupNorm pauses the tile (the norm's stats
   seam, ``vae/nn/norm.py``); when all tiles are there, the fp32 sums of x and x^2 over the tiles'
   cores give the whole tensor's mean and variance (E[x^2] - E[x]^2, not an average of tile
   variances) and every tile resumes with them.
3. Attention mixes every position. At a module whose class sets ``exact_whole`` the tiles hand over
   their cores; the module runs once on the assembled tensor (attention sits at latent resolution,
   the cheapest level) and each tile resumes with its slice of the result.
Modules whose class sets ``exact_boundary`` (resamplers with no other activation live across them)
are re-cut points: the cores are assembled and each tile resumes with a fresh slice and the halo
that the next stretch of layers needs, so halos stay a few pixels instead of the whole network's
receptive field. ``exact_boundary = COARSE`` (residual blocks) re-cuts only at latent resolution or
coarser: there a halo pixel costs the most compute and an assembled map the least memory.

Tiles are coroutines: each runs the model's own forward in a thread, and exactly one runs at a time
(a hand-off, not parallelism), so no model code changes and the result is deterministic. Memory: the
paused tiles together hold about one activation map of the level they are at (plus halos and the
residual input of the block they are in), one tile's working set while it runs, and an assembled
map at re-cut points.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import queue
import threading
import weakref
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from .nn.norm import GroupNorm, group_moments, set_stats_hook
from .tiling import Progress

Fn = Callable[[torch.Tensor], torch.Tensor]
_local = threading.local()


COARSE = "coarse"


def _active(module: nn.Module, scale: Sequence[Fraction]) -> bool:
    """Whether a re-cut point at ``scale`` (map pixels per latent pixel) is used."""
    flag = getattr(module, "exact_boundary", False)
    return bool(flag) and (flag != COARSE or max(scale) <= 1)


def boundary(module: nn.Module) -> nn.Module:
    """Mark one module instance as a re-cut point (for classes used elsewhere too, e.g. a strided
    conv or ``nn.Upsample`` inside an ``nn.Sequential``)."""
    module.exact_boundary = True
    return module


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
    """Run ``fn(x)`` once (a tiny input) and record, in execution order, every spatial conv,
    GroupNorm, whole-tensor module and re-cut point with its input size. Modules inside a whole
    module are not recorded (they run on the whole tensor)."""
    events: list[Event] = []
    inside = [0]
    handles = []

    def pre(m, args):
        if inside[0]:
            return
        size = tuple(args[0].shape[-2:])
        if getattr(m, "exact_boundary", False):
            events.append(Event("boundary", m, size))
        if getattr(m, "exact_whole", False):
            events.append(Event("whole", m, size))
            inside[0] += 1
        elif isinstance(m, GroupNorm):
            events.append(Event("stats", m, size))
        elif isinstance(m, nn.modules.conv._ConvNd) and any(k > 1 for k in m.kernel_size[-2:]):
            events.append(Event("conv", m, size))

    def post(m, args, out):
        if getattr(m, "exact_whole", False) and inside[0]:
            inside[0] -= 1

    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    try:
        fn(x)
    finally:
        for h in handles:
            h.remove()
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
        scale = tuple(Fraction(n, l) for n, l in zip(e.size, latent_size))
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
    """One tile's forward in its own thread; ``resume`` runs it until its next pause or its end."""

    def __init__(self, fn: Fn, x: torch.Tensor, tile: Tile):
        self.tile = tile
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, args=(fn, x), daemon=True)
        self._started = False
        self.finished = False

    def _main(self, fn: Fn, x: torch.Tensor) -> None:
        _local.co = self
        if self._inbox.get() is _ABORT:
            self._outbox.put(("aborted", None))
            return
        try:
            with torch.inference_mode():
                out = fn(x)
            del x
            self._outbox.put(("done", out))
        except _Abort:
            self._outbox.put(("aborted", None))
        except BaseException as e:   # handed to the main thread, which raises it
            self._outbox.put(("error", e))

    def pause(self, kind: str, module: nn.Module, payload):
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


def _current() -> Optional[_Coroutine]:
    return getattr(_local, "co", None)


def region_randn(shape: Sequence[int], gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """``torch.randn(shape, generator=gen)`` (float32, CPU) for noise a model draws inside its network,
    whose last two dims are ``like``'s spatial size. In an exact tile it is the tile's part of the draw
    an untiled pass makes (the whole map's noise, then cut), so noise does not break exactness."""
    co = _current()
    if co is None:
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)
    size, where = co.tile.extent(like)
    return torch.randn((*shape[:-2], *size), generator=gen, dtype=torch.float32)[where]


def _stats_hook(norm: GroupNorm, x: torch.Tensor):
    co = _current()
    if co is None:                       # the main thread: a whole-tensor module, plain statistics
        return None
    _, core = co.tile.locate(x)
    return co.pause("stats", norm, group_moments(x[core], norm.num_groups))


def _pausing_forward(module: nn.Module, kind: str):
    original = module.forward

    def forward(x, *args, **kwargs):
        co = _current()
        if co is None:
            return original(x, *args, **kwargs)
        scales, core = co.tile.locate(x)
        if kind == "boundary" and not _active(module, scales):
            return original(x, *args, **kwargs)
        x = co.pause(kind, module, (x[core], scales))    # the re-cut tile (for "whole": of the output)
        return x if kind == "whole" else original(x, *args, **kwargs)
    return forward


class _Installed:
    """The stats hook and pausing forwards on ``model`` for the duration of one exact run."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.wrapped = [(m, "whole" if getattr(m, "exact_whole", False) else "boundary") for m in model.modules()
                        if getattr(m, "exact_whole", False) or getattr(m, "exact_boundary", False)]

    def __enter__(self):
        set_stats_hook(self.model, _stats_hook)
        self.before = [m.__dict__.get("forward") for m, _ in self.wrapped]   # a forward set on the instance
        for m, kind in self.wrapped:
            m.forward = _pausing_forward(m, kind)
        return self

    def __exit__(self, *exc):
        set_stats_hook(self.model, None)
        for (m, _), before in zip(self.wrapped, self.before):
            if before is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = before


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
_running: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def running(model: nn.Module) -> bool:
    """Whether an exact run is going on in ``model`` (compiled callables run eagerly then: a tile
    pauses inside the model, which a compiled graph cannot do)."""
    return model in _running


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


def run_exact(fn: Fn, model: nn.Module, x: torch.Tensor, cores: Sequence[Sequence[tuple[int, int]]],
              in_unit: int, out_unit: int, out_device: torch.device, probe_size: int = 4,
              progress: Optional[Progress] = None) -> torch.Tensor:
    """Apply ``fn`` (a forward of ``model``) to ``x`` tile by tile with the untiled result.

    ``cores``: per spatial axis (the last two of ``x``), spans in latent units that partition it;
    ``in_unit``/``out_unit``: pixels per latent pixel of x and of the output (decode 1 and the
    spatial ratio, encode the reverse). The output
    (float32 on ``out_device``) is assembled from the tiles' cores, no blending."""
    _running.add(model)
    try:
        return _run(fn, model, x, cores, in_unit, out_unit, out_device, probe_size, progress)
    finally:
        _running.discard(model)


def _run(fn, model, x, cores, in_unit, out_unit, out_device, probe_size, progress) -> torch.Tensor:
    latent = tuple(n // in_unit for n in x.shape[-2:])
    small = tuple(min(n, probe_size) for n in latent)
    events = probe(fn, model, x[(slice(0, 1), ..., *(slice(0, n * in_unit) for n in small))])
    segs = segments(events, small, in_unit, out_unit)
    # the model's own input checks want whole latent pixels (e.g. sides divisible by 8)
    segs[0] = dataclasses.replace(segs[0], align=tuple(math.lcm(a, in_unit) for a in segs[0].align))
    syncs = [e for e in events if e.kind != "conv" and not (
        e.kind == "boundary" and not _active(e.module, [Fraction(n, l) for n, l in zip(e.size, small)]))]
    tiles = [Tile(tuple(c), latent) for c in itertools.product(*cores)]
    total = len(tiles) * (len(syncs) + 1)
    done = 0
    out = None
    with _Installed(model):
        cos = []
        for tile in tiles:
            _cut(tile, [Fraction(in_unit)] * 2, segs[0], x.shape[-2:])
            cos.append(_Coroutine(fn, x[_slice(tile)], tile))
        try:
            replies: list = [None] * len(cos)
            for step in itertools.count():
                msgs = []
                for i, co in enumerate(cos):
                    reply, replies[i] = replies[i], None
                    msgs.append(co.resume(reply() if callable(reply) else reply))
                    del reply
                    _trim()
                    done += 1
                    if progress:
                        progress(min(done, total), total)
                errors = [value for kind, value in msgs if kind == "error"]
                if errors:
                    raise errors[0]
                if all(kind == "done" for kind, _ in msgs):
                    for co, (_, y) in zip(cos, msgs):
                        scales, core = co.tile.locate(y)
                        if out is None:
                            size = [int(n * s) for n, s in zip(latent, scales)]
                            out = torch.empty(*y.shape[:-2], *size, device=out_device, dtype=torch.float32)
                        dst = tuple(slice(int(a * s), int(b * s)) for (a, b), s in zip(co.tile.core, scales))
                        out[(..., *dst)] = y[core].to(out_device, torch.float32)
                    return out
                replies = _answer(step, msgs, cos, syncs, segs, latent, out_device)
        finally:
            for co in cos:
                co.abort()


def _answer(step: int, msgs, cos, syncs: Sequence[Event], segs: Sequence[Segment], latent, out_device):
    """One round: every tile paused at the same place; compute what each resumes with."""
    expect = syncs[step] if step < len(syncs) else None
    for kind, value in msgs:
        if kind != "sync" or expect is None or value[0] != expect.kind or value[1] is not expect.module:
            raise RuntimeError("exact tiling: the tiles took a different path than the probe pass "
                               f"(round {step}: expected {expect and expect.kind}, got {kind} {value and value[0]})")
    if expect.kind == "stats":
        s1 = sum(v[2][0] for _, v in msgs)
        s2 = sum(v[2][1] for _, v in msgs)
        n = sum(v[2][2] for _, v in msgs)
        mean = s1 / n
        var = (s2 / n - mean.square()).clamp_min(0)
        return [(mean.float(), var.float())] * len(msgs)
    # gather the cores into one map, run a whole module on it, re-cut every tile
    whole = expect.kind == "whole"
    first = msgs[0][1][2][0]
    scales = msgs[0][1][2][1]
    device = first.device                # where the tiles compute
    size = [int(n * s) for n, s in zip(latent, scales)]
    fmt = torch.channels_last if first.dim() == 4 and first.is_contiguous(memory_format=torch.channels_last) \
        else torch.contiguous_format
    full = torch.empty(*first.shape[:-2], *size, dtype=first.dtype, device=device if whole else out_device,
                       memory_format=fmt)
    for co, (_, (_, _, (core, _))) in zip(cos, msgs):
        full[(..., *(slice(int(a * s), int(b * s)) for (a, b), s in zip(co.tile.core, scales)))] = core
    del msgs, first, core
    if whole:
        full = expect.module(full)
    seg = segs[1 + sum(e.kind != "stats" for e in syncs[:step])]

    def recut(co: _Coroutine) -> torch.Tensor:     # made when the tile resumes: one new slice at a time
        _cut(co.tile, scales, seg, size)
        return full[_slice(co.tile)].to(device).clone(memory_format=fmt)
    return [functools.partial(recut, co) for co in cos]
