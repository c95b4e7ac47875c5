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
        """Set the extent at ``scales``: the core plus the segment's halo, aligned, inside the map."""
        self.scale = list(scales)
        self.lo, self.hi = [], []
        for (a, b), s, h, al, n in zip(self.core, scales, seg.halo, seg.align, full):
            pad = math.ceil(h * s / al) * al
            self.lo.append(max(0, int(a * s) - pad))
            self.hi.append(min(n, int(b * s) + pad))

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


def grid(cores: Sequence[Sequence[tuple[int, int]]], latent: tuple[int, ...]) -> list[Tile]:
    """Every tile of the product of the per-axis core spans, row-major."""
    import itertools
    return [Tile(tuple(c), latent) for c in itertools.product(*cores)]


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
            self.tensor = alloc(*lead, *size, device=self.device, dtype=torch.float32)
            memory.offloaded(self.tensor, count=False)     # the intermediate device's, not the working set
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
