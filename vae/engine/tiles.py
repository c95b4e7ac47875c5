"""An exact tile: its core on the latent grid and the extent its tensor covers at the layer it is at.

Both exact engines (vae/engine/exact.py: tiles meeting in rounds; vae/engine/stages.py: tiles run one after the
other) cut tiles the same way: a core (latent units, the part of the output the tile owns) plus a halo
at least the reach of the layers it runs before the next cut, aligned to the strided grid of those
layers and clipped to the map (at the map's edge the model's own padding is the real one).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional, Sequence

import torch

from . import memory
from .receptive import Segment
from .transfer import Transfers


@dataclass
class Tile:
    core: tuple[tuple[int, int], ...]          # latent units, per spatial axis
    latent: tuple[int, ...]                    # the whole latent's size, per spatial axis
    lo: list[int] = field(default_factory=list)   # the tile tensor's extent, in units of `scale`
    hi: list[int] = field(default_factory=list)
    scale: list[Fraction] = field(default_factory=list)   # map units per latent unit at the last cut
    width: Optional[tuple[int, ...]] = None    # fixed shape: every extent as wide as a core this wide

    def _factor(self, x: torch.Tensor, d: int) -> Fraction:
        """Map units at ``x``'s layer per map unit at the last cut, along spatial axis ``d``."""
        return Fraction(x.shape[x.dim() - 2 + d], self.hi[d] - self.lo[d])

    def locate(self, x: torch.Tensor) -> tuple[list[Fraction], tuple[slice, ...]]:
        """Where the core lies in ``x`` (this tile's tensor at some layer): x's scale, and slices."""
        scales, slices = [], []
        for d, ((a, b), lo, s) in enumerate(zip(self.core, self.lo, self.scale)):
            f = self._factor(x, d)
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
            f = self._factor(x, d)
            sizes.append(int(n * s * f))
            slices.append(slice(int(lo * f), int(hi * f)))
        return sizes, (..., *slices)

    def cut(self, scales: Sequence[Fraction], seg: Segment, full: Sequence[int]) -> None:
        """Set the extent at ``scales``: the core plus the segment's halo, aligned, inside the map. With
        a fixed ``width`` every tile's extent has one shape (compiled graphs): as wide as a core of that
        width with its halo, from the core's start less the halo, moved inward at the map's end (the
        layers' valid context at a cut covers the next cut's extent the same way)."""
        self.scale = list(scales)
        self.lo, self.hi = [], []
        for d, ((a, b), s, h, al, n) in enumerate(zip(self.core, scales, seg.halo, seg.align, full)):
            pad = math.ceil(h * s / al) * al
            lo, hi = max(0, int(a * s) - pad), min(n, int(b * s) + pad)
            if self.width is not None:
                size = int(self.width[d] * s) + 2 * pad
                lo = max(0, min(int(a * s) - pad, n - size))
                hi = min(n, lo + size)
            self.lo.append(lo)
            self.hi.append(hi)

    def shift(self, scales: Sequence[Fraction], seg: Segment, lead: Sequence[Fraction],
              full: Sequence[int]) -> tuple[list[int], list[Optional[int]]]:
        """Set the extent at ``scales`` for a tile that shares its halo with the tiles before it (row-major
        order, vae/engine/stages.py): the core moved ahead by ``seg.halo`` (latent units per axis: the reach
        of the layers still to come before the next cut) and reaching ``lead`` behind that, into what the
        tile before it computed and hands over; a tile at the map's start begins at 0, and none is
        narrower than its lead (near the map's end the tile before may have computed all of it).
        Returns per axis where the part this tile computes itself begins, and where the next tile's
        extent begins (None: none follows)."""
        self.scale = list(scales)
        self.lo, self.hi, own, after = [], [], [], []
        for (a, b), s, d, e, al, n, m in zip(self.core, scales, seg.halo, lead, seg.align, full, self.latent):
            if any(v.denominator != 1 for v in (a * s, d * s, e * s)):
                raise RuntimeError("exact tiling: a shared halo does not fall on this layer's grid")
            least = max(int(e * s), al)

            def start(c):           # where the extent of a core starting at c begins
                return max(0, min(int((c + d - e) * s), n - least))
            self.lo.append(start(a) if a else 0)
            self.hi.append(min(n, int((b + d) * s)))
            own.append(min(n, int((a + d) * s)) if a else 0)
            after.append(start(b) if b < m else None)
        return own, after

    def slices(self) -> tuple:
        return (..., *(slice(lo, hi) for lo, hi in zip(self.lo, self.hi)))

    def crop(self, x: torch.Tensor, seg: Segment) -> torch.Tensor:
        """Cut ``x`` (this tile's tensor) down to the core plus ``seg``'s halo: a re-cut from the tile's
        own tensor, which must still hold that much valid context (the halo it was cut with covers
        every layer since)."""
        f = [self._factor(x, d) for d in range(len(self.core))]
        now = [lo * k for lo, k in zip(self.lo, f)]
        scales = [s * k for s, k in zip(self.scale, f)]
        if any(n.denominator != 1 for n in now):
            raise RuntimeError("exact tiling: a tile's extent does not fall on this layer's grid")
        self.cut(scales, seg, [int(n * s) for n, s in zip(self.latent, scales)])
        cut = []
        for d, (lo, hi, start) in enumerate(zip(self.lo, self.hi, now)):
            a, b = lo - int(start), hi - int(start)
            if a < 0 or b > x.shape[x.dim() - 2 + d]:
                raise RuntimeError("exact tiling: a tile's halo ran short of the layers' reach")
            cut.append(slice(a, b))
        return x[(..., *cut)]


def grid(cores: Sequence[Sequence[tuple[int, int]]], latent: tuple[int, ...], fixed: bool = False) -> list[Tile]:
    """Every tile of the product of the per-axis core spans, row-major; ``fixed``: every tile's extents
    of one shape (``Tile.width``: the widest core's)."""
    import itertools
    width = tuple(max(b - a for a, b in spans) for spans in cores) if fixed else None
    return [Tile(tuple(c), latent, width=width) for c in itertools.product(*cores)]


class Output:
    """The run's result, assembled from each tile's core (float32 on ``device``). Across ranks each
    rank fills its tiles' cores into zeros and the sum assembles it (``comm.sum_``). A core is copied
    out through ``transfers`` (asynchronously from a GPU, vae/engine/transfer.py): ``result()`` waits
    for the copies."""

    def __init__(self, device: torch.device, zeros: bool, frames: Optional[int] = None,
                 transfers: Optional[Transfers] = None):
        self.device, self.zeros, self.frames = device, zeros, frames
        self.transfers = transfers or Transfers()
        self.tensor: Optional[torch.Tensor] = None

    def write(self, tile: Tile, y: torch.Tensor, frames: Optional[tuple[int, int]] = None) -> None:
        """Put the tile's core of ``y`` (its output; a chunk's frames ``frames``, or all) in place."""
        scales, core = tile.locate(y)
        if self.tensor is None:
            size = [int(n * s) for n, s in zip(tile.latent, scales)]
            lead = y.shape[:-2] if frames is None else (*y.shape[:2], self.frames)
            alloc = torch.zeros if self.zeros else torch.empty
            with memory.placed_away(count=False):     # the intermediate device's, not the working set
                self.tensor = alloc(*lead, *size, device=self.device, dtype=torch.float32)
        dst = tuple(slice(int(a * s), int(b * s)) for (a, b), s in zip(tile.core, scales))
        if frames is not None:
            if y.shape[2] != frames[1] - frames[0]:
                raise RuntimeError(f"a chunk gave {y.shape[2]} frames, expected {frames[1] - frames[0]}")
            dst = (slice(None), slice(None), slice(*frames)) + dst
        target = self.tensor[(..., *dst)]
        self.transfers.to_host(y[core].to(dtype=torch.float32), self.device, target.copy_)

    def result(self) -> torch.Tensor:
        """The assembled output, every copy landed."""
        self.transfers.wait()
        return self.tensor
