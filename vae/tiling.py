"""THE tiling engine: one planner per axis, one blender, for every model, encode and decode.

Units: plans are made on the latent grid (so encode and decode tile the same way and tile edges
always fall on latent pixels); ``scale`` maps latent units to the input or output of the call
(decode: in 1, out r; encode: in r, out 1).

The "does this axis need tiling?" question is answered by ``needs_tiling`` and nowhere else: an axis
is tiled iff its latent length exceeds the tile's min size. (diffusers once compared against the
stride instead, in four copies of the same code.)"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

Progress = Callable[[int, int], None]


def needs_tiling(length: int, tile: int) -> bool:
    """True iff ``length`` (latent units) exceeds the tile's min size ``tile`` (latent units)."""
    return tile > 0 and length > tile


@dataclass(frozen=True)
class AxisPlan:
    length: int                              # latent units
    spans: tuple[tuple[int, int], ...]       # [start, end) per tile, latent units

    @property
    def tiled(self) -> bool:
        return len(self.spans) > 1


def plan_axis(length: int, tile: int, overlap: int) -> AxisPlan:
    """Cover ``length`` with the fewest tiles of at most ``tile`` + ``overlap``, all of one size.

    ``n = ceil(length / tile)`` tiles; each is ``ceil((length + (n-1)*overlap) / n)`` long and the
    starts are spread evenly, so every neighbouring pair shares at least ``overlap`` and edge tiles
    are never slivers (same shape for every tile: fewer recompiles, no thin tiles with bad context).
    ``overlap`` is capped at ``tile // 2``."""
    if not needs_tiling(length, tile):
        return AxisPlan(length, ((0, length),))
    overlap = max(0, min(overlap, tile // 2))
    n = math.ceil(length / tile)
    size = min(length, math.ceil((length + (n - 1) * overlap) / n))
    starts = [round(i * (length - size) / (n - 1)) for i in range(n)]
    return AxisPlan(length, tuple((s, s + size) for s in starts))


def plan_grid(latent_shape: Sequence[int], tile_px, overlap_px: Optional[int], ratio: int) -> list[AxisPlan]:
    """Plans for each axis from the user's units: tile (one size, or one per axis) and overlap in
    pixels, ``ratio`` pixels per latent pixel. No tile (None/0) means one untiled pass."""
    tiles = tile_px if isinstance(tile_px, (tuple, list)) else (tile_px,) * len(latent_shape)
    o = (overlap_px or 0) // ratio
    return [plan_axis(n, max(1, t // ratio) if t else 0, o) for n, t in zip(latent_shape, tiles)]


def axis_weights(plan: AxisPlan, scale: int) -> list[torch.Tensor]:
    """Blend ramps per tile in output units (latent * ``scale``); they sum to 1 everywhere.

    Inside an overlap the ramp rises linearly across the whole shared region (pixel centres, so it
    never reaches exactly 0 or 1); outside overlaps the weight is 1."""
    spans = plan.spans
    ramps = []
    for i, (a, b) in enumerate(spans):
        n = (b - a) * scale
        w = torch.ones(n, dtype=torch.float64)
        if i > 0:
            shared = (spans[i - 1][1] - a) * scale
            if shared > 0:
                w[:shared] = torch.minimum(w[:shared], (torch.arange(shared, dtype=torch.float64) + 0.5) / shared)
        if i < len(spans) - 1:
            shared = (b - spans[i + 1][0]) * scale
            if shared > 0:
                down = 1 - (torch.arange(shared, dtype=torch.float64) + 0.5) / shared
                w[n - shared:] = torch.minimum(w[n - shared:], down)
        ramps.append(w)
    total = torch.zeros(plan.length * scale, dtype=torch.float64)
    for (a, _), w in zip(spans, ramps):
        total[a * scale: a * scale + len(w)] += w
    return [(w / total[a * scale: a * scale + len(w)]).float() for (a, _), w in zip(spans, ramps)]


def tile_count(plans: Sequence[AxisPlan]) -> int:
    return math.prod(len(p.spans) for p in plans)


def run_tiled(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, plans: Sequence[AxisPlan],
              in_scale: Sequence[int], out_scale: Sequence[int], out_channels: int,
              out_device: Optional[torch.device] = None, out_dtype: torch.dtype = torch.float32,
              progress: Optional[Progress] = None) -> torch.Tensor:
    """Apply ``fn`` tile by tile over the trailing ``len(plans)`` axes of ``x`` and blend.

    Output is a preallocated tensor on ``out_device`` (the intermediate device); each tile is moved
    there, weighted and added, so memory is one output plus one tile's working set. ``progress``
    is called after every tile and may raise to interrupt: the partial output is then dropped."""
    out_device = out_device or x.device
    k = len(plans)
    lead = x.shape[: x.dim() - k - 1]
    total = tile_count(plans)
    if total == 1:
        y = fn(x)
        if progress:
            progress(1, 1)
        return y.to(out_device, out_dtype)
    out = torch.zeros(*lead, out_channels, *(p.length * s for p, s in zip(plans, out_scale)),
                      device=out_device, dtype=out_dtype)
    weights = [axis_weights(p, s) for p, s in zip(plans, out_scale)]
    for done, idx in enumerate(itertools.product(*(range(len(p.spans)) for p in plans)), 1):
        spans = [p.spans[i] for p, i in zip(plans, idx)]
        src = x[(..., *(slice(a * s, b * s) for (a, b), s in zip(spans, in_scale)))]
        y = fn(src)
        expect = (*lead, out_channels, *((b - a) * s for (a, b), s in zip(spans, out_scale)))
        if tuple(y.shape) != expect:
            raise RuntimeError(f"tile function returned {tuple(y.shape)}, expected {expect}")
        w = weights[0][idx[0]].reshape(-1, *([1] * (k - 1)))
        for d in range(1, k):
            w = w * weights[d][idx[d]].reshape(-1, *([1] * (k - 1 - d)))
        dst = out[(..., *(slice(a * s, b * s) for (a, b), s in zip(spans, out_scale)))]
        dst.addcmul_(y.to(out_device, out_dtype), w.to(out_device))
        del y, src
        if progress:
            progress(done, total)
    return out
