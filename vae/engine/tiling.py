"""THE tiling engine: one planner per axis, one blender, for every model, encode and decode.

Units: plans are made on the latent grid (so encode and decode tile the same way and tile edges
always fall on latent pixels); ``scale`` maps latent units to the input or output of the call
(decode: in 1, out r; encode: in r, out 1).

The "does this axis need tiling?" question is answered by ``needs_tiling`` and nowhere else: an axis
is tiled iff its latent length exceeds the tile's min size. (diffusers once compared against the
stride instead, in four copies of the same code.)"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Optional, Sequence, Union

import torch

from .. import checks
from . import distributed
from .transfer import Transfers
from .. import run as runstate
from ..errors import VAEKitError

Progress = Callable[[int, int], None]


def needs_tiling(length: int, tile: int) -> bool:
    """True iff ``length`` (latent units) exceeds the tile's min size ``tile`` (latent units)."""
    return tile > 0 and length > tile


@dataclass(frozen=True)
class AxisPlan:
    length: int                              # latent units
    spans: tuple[tuple[int, int], ...]       # [start, end) per tile, latent units
    # causal time axis: a tile starting at latent a > 0 rebuilds latent a (or its last frame) from a
    # single frame, so that first element is context only and is dropped from the tile's output
    causal: bool = False

    @property
    def tiled(self) -> bool:
        return len(self.spans) > 1


@dataclass(frozen=True)
class Frames:
    """The time axis of a causal video VAE in pixel frames: latent frames [a, b) <-> pixel frames
    [r*a, r*(b-1) + 1). A clip's first latent frame stands for one frame and every later one for r,
    so a tile that starts at latent a reproduces frame r*a as its first frame."""
    r: int


Scale = Union[int, Frames]


def _span(scale: Scale, a: int, b: int) -> tuple[int, int]:
    if isinstance(scale, Frames):
        return scale.r * a, scale.r * (b - 1) + 1
    return a * scale, b * scale


def _total(scale: Scale, length: int) -> int:
    return _span(scale, 0, length)[1]


def out_spans(plan: AxisPlan, scale: Scale) -> list[tuple[int, int]]:
    """Where each tile's kept output lands, in output units (after a causal tile's first element is dropped)."""
    spans = []
    for a, b in plan.spans:
        lo, hi = _span(scale, a, b)
        spans.append((lo + (plan.causal and a > 0), hi))
    return spans


def plan_axis(length: int, tile: int, overlap: int, causal: bool = False, fixed: bool = False) -> AxisPlan:
    """Cover ``length`` with the fewest tiles of at most ``tile`` + ``overlap``, all of one size.

    ``n = ceil(length / tile)`` tiles; each is ``ceil((length + (n-1)*overlap) / n)`` long and the
    starts are spread evenly, so every neighbouring pair shares at least ``overlap`` and edge tiles
    are never slivers (same shape for every tile: fewer recompiles, no thin tiles with bad context).
    ``overlap`` is capped at ``tile // 2``. On a causal time axis tiles share at least one latent
    frame: a later tile's first one is context only.

    ``fixed`` (compiled models): every tile is exactly ``tile + overlap`` whatever ``length`` is, the
    edge ones shifted inward, so one static graph serves every image size; an axis no longer than
    that is one tile."""
    if not needs_tiling(length, tile):
        return AxisPlan(length, ((0, length),), causal)
    overlap = max(1 if causal else 0, min(overlap, tile // 2))
    if fixed:
        size = tile + overlap
        if length <= size:
            return AxisPlan(length, ((0, length),), causal)
        n = 1 + math.ceil((length - size) / tile)      # stride at most size - overlap = tile
    else:
        n = math.ceil(length / tile)
        size = min(length, math.ceil((length + (n - 1) * overlap) / n))
    starts = [round(i * (length - size) / (n - 1)) for i in range(n)]
    return AxisPlan(length, tuple((s, s + size) for s in starts), causal)


def plan_grid(latent_shape: Sequence[int], tile_px, overlap_px: Optional[int], ratio: int,
              fixed: bool = False) -> list[AxisPlan]:
    """Plans for each axis from the user's units: tile (one size, or one per axis) and overlap in
    pixels, ``ratio`` pixels per latent pixel. No tile (None/0) means one untiled pass. ``fixed``:
    see ``plan_axis``."""
    tile_px, overlap_px = checks.tiles(tile_px, overlap_px, ratio, latent_shape)
    tiles = tile_px if isinstance(tile_px, (tuple, list)) else (tile_px,) * len(latent_shape)
    o = (overlap_px or 0) // ratio
    return [plan_axis(n, max(1, t // ratio) if t else 0, o, fixed=fixed) for n, t in zip(latent_shape, tiles)]


def plan_frames(latent_frames: int, tile_frames: Optional[int], overlap_frames: Optional[int], r: int) -> AxisPlan:
    """The causal time axis from pixel frames: a tile of ``tile_frames`` frames holds
    ``tile_frames // r`` latent frames (at least 2: one of context, one of output)."""
    tile_frames, overlap_frames = checks.frames(tile_frames, overlap_frames)
    tile = max(2, tile_frames // r) if tile_frames else 0
    return plan_axis(latent_frames, tile, -(-(overlap_frames or 0) // r), causal=True)


def axis_weights(plan: AxisPlan, scale: Scale) -> list[torch.Tensor]:
    """Blend ramps per tile over its kept output (see ``out_spans``); they sum to 1 everywhere.

    Inside an overlap the ramp rises linearly across the whole shared region (pixel centres, so it
    never reaches exactly 0 or 1); outside overlaps the weight is 1."""
    spans = out_spans(plan, scale)
    ramps = []
    for i, (a, b) in enumerate(spans):
        n = b - a
        w = torch.ones(n, dtype=torch.float64)
        if i > 0:
            shared = spans[i - 1][1] - a
            if shared > 0:
                w[:shared] = torch.minimum(w[:shared], (torch.arange(shared, dtype=torch.float64) + 0.5) / shared)
        if i < len(spans) - 1:
            shared = b - spans[i + 1][0]
            if shared > 0:
                down = 1 - (torch.arange(shared, dtype=torch.float64) + 0.5) / shared
                w[n - shared:] = torch.minimum(w[n - shared:], down)
        ramps.append(w)
    total = torch.zeros(_total(scale, plan.length), dtype=torch.float64)
    for (a, b), w in zip(spans, ramps):
        total[a:b] += w
    return [(w / total[a:b]).float() for (a, b), w in zip(spans, ramps)]


@dataclass(frozen=True)
class Place:
    """Where a fast tile lies in the whole map: its spans and the map's lengths (latent units, the last
    two axes). Noise drawn inside a network (vae/nn/noise.py) asks it, so a tile takes its part of the
    untiled field and overlapping tiles blend the same noise."""
    spans: tuple[tuple[int, int], ...]
    lengths: tuple[int, ...]

    def extent(self, x: torch.Tensor) -> tuple[list[int], tuple]:
        """The whole map's size at ``x``'s layer (its last two dims), and where ``x`` lies in it."""
        sizes, slices = [], []
        for d, ((a, b), n) in enumerate(zip(self.spans, self.lengths)):
            f = Fraction(x.shape[x.dim() - 2 + d], b - a)
            sizes.append(int(n * f))
            slices.append(slice(int(a * f), int(b * f)))
        return sizes, (..., *slices)


def tile_count(plans: Sequence[AxisPlan]) -> int:
    return math.prod(len(p.spans) for p in plans)


def run_tiled(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, plans: Sequence[AxisPlan],
              in_scale: Sequence[Scale], out_scale: Sequence[Scale], out_channels: int,
              out_device: Optional[torch.device] = None, out_dtype: torch.dtype = torch.float32,
              progress: Optional[Progress] = None) -> torch.Tensor:
    """Apply ``fn`` tile by tile over the trailing ``len(plans)`` axes of ``x`` and blend.

    Scales map latent units to the input and output of ``fn`` per axis: an int for space, ``Frames``
    for a causal time axis in pixel frames. Output is a preallocated tensor on ``out_device`` (the
    intermediate device); each tile is moved there, weighted and added, so memory is one output
    plus one tile's working set. ``progress`` is called after every tile and may raise to
    interrupt: the partial output is then dropped."""
    out_device = out_device or x.device
    k = len(plans)
    lead = x.shape[: x.dim() - k - 1]
    total = tile_count(plans)
    if total == 1:
        y = fn(x)
        if progress:
            progress(1, 1)
        return y.to(out_device, out_dtype)
    out = torch.zeros(*lead, out_channels, *(_total(s, p.length) for p, s in zip(plans, out_scale)),
                      device=out_device, dtype=out_dtype)
    weights = [axis_weights(p, s) for p, s in zip(plans, out_scale)]
    kept = [out_spans(p, s) for p, s in zip(plans, out_scale)]
    comm = distributed.current()          # across ranks: each blends its share, the sums add up
    order = itertools.product(*(range(len(p.spans)) for p in plans))
    mine = [idx for i, idx in enumerate(order) if comm.owns(i, total)]
    error = None
    try:
        _blend(fn, x, plans, in_scale, out_scale, out_channels, out, weights, kept, mine, progress)
    except BaseException as e:    # noqa: BLE001 - one rank's failure ends the call on every rank
        error = e
    comm.step(error, False)
    return comm.sum_(out)


def _blend(fn, x, plans, in_scale, out_scale, out_channels, out, weights, kept, tiles, progress) -> None:
    """Run the tiles ``tiles`` (index tuples) and add each, weighted, into ``out``: each tile's output
    is copied out (asynchronously from a GPU, vae/engine/transfer.py) while the next tile runs."""
    k, lead, total = len(plans), x.shape[: x.dim() - len(plans) - 1], len(tiles)
    out_device = out.device
    transfers = Transfers()
    for done, idx in enumerate(tiles, 1):
        spans = [p.spans[i] for p, i in zip(plans, idx)]
        src = x[(..., *(slice(*_span(s, a, b)) for (a, b), s in zip(spans, in_scale)))]
        place = Place(tuple(spans[-2:]), tuple(p.length for p in plans[-2:]))
        with runstate.using(dataclasses.replace(runstate.current(), place=place)):
            y = fn(src)
        expect = (*lead, out_channels, *(_span(s, 0, b - a)[1] for (a, b), s in zip(spans, out_scale)))
        if tuple(y.shape) != expect:
            raise _misfit(src.shape, y.shape, expect)
        dst_spans = [kept[d][i] for d, i in enumerate(idx)]
        # drop what a causal tile rebuilt from a single frame (its first output element)
        y = y[(..., *(slice(y.shape[y.dim() - k + d] - (b - a), None) for d, (a, b) in enumerate(dst_spans)))]
        w = weights[0][idx[0]].reshape(-1, *([1] * (k - 1)))
        for d in range(1, k):
            w = w * weights[d][idx[d]].reshape(-1, *([1] * (k - 1 - d)))
        dst = out[(..., *(slice(a, b) for a, b in dst_spans))]
        transfers.to_host(y, out_device, functools.partial(_add, dst, w.to(out_device)))
        del y, src
        if progress:
            progress(done, total)
    transfers.wait()


def _add(dst: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
    """A tile's output ``y``, weighted by its blend ramp ``w``, added into its place ``dst``."""
    dst.addcmul_(y.to(dst.dtype), w)


def _misfit(src, got, expect) -> VAEKitError:
    """A model whose output for a tile is not the size the plan gives it (no family here does that for
    any tile the planner cuts: tests/vae/test_input_checks.py fuzzes them; this is the net under a new
    one): the call is refused with a way out rather than an error from inside the engine."""
    return VAEKitError(f"a tile of {tuple(src)} gave an output of {tuple(got)} where the plan expects {tuple(expect)}: "
                       "this model does not take tiles of this size.", input="tile",
                       fix="run untiled (tile 0) or with another tile size and overlap, and please report the VAE's "
                           "family with these sizes.")


def core_spans(length: int, tile: int) -> list[tuple[int, int]]:
    """Exact mode's tiles along one axis (latent units): near-equal spans that partition it, no
    overlap (exact tiles carry halos instead and need no blending). Same threshold as every plan."""
    if not needs_tiling(length, tile):
        return [(0, length)]
    n = math.ceil(length / tile)
    cuts = [round(i * length / n) for i in range(n + 1)]
    return list(zip(cuts, cuts[1:]))
