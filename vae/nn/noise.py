"""Noise a model draws inside its network, seeded, and exact under tiling.

A decoder that injects noise (LTX-Video 0.9.1+, the Consistency Decoder, diffusion decoders) draws it
with a ``torch.Generator`` the call seeded, so a decode repeats. Under exact tiling (vae/engine/exact.py) a
tile must see its own part of the field an untiled pass draws, not a field of its own: the run state's
exact hooks say where the tile lies in the whole map (``extent``), and the whole field is drawn and cut.
Fast tiles (vae/engine/tiling.py) say where they lie too, so their overlaps blend one noise field, not two
(the time axis excepted: a temporal tile draws its frames from the first).
Models with absolute positions (rotary embeddings) number them from the whole map's origin likewise.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .. import run as runstate


@torch.compiler.disable      # Python bookkeeping: a compiled graph reads it at a break
def _extent(like: torch.Tensor):
    """The whole map's size at ``like``'s layer and where ``like`` lies in it, per the hooks that know:
    an exact tile's, a fast tile's (vae/engine/tiling.py ``Place``); None for the whole map."""
    run = runstate.current()
    hooks = run.exact if run.exact is not None else run.place
    return None if hooks is None else hooks.extent(like)


def region_randn(shape: Sequence[int], gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """``torch.randn(shape, generator=gen)`` (float32, CPU) whose last two dims are ``like``'s spatial
    size. In a tile it is the tile's part of the draw an untiled pass makes (the whole map's noise,
    then cut), so noise does not break exactness."""
    extent = _extent(like)
    if extent is None:
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)
    size, where = extent
    return torch.randn((*shape[:-2], *size), generator=gen, dtype=torch.float32)[where]


def region_origin(like: torch.Tensor) -> tuple[int, int]:
    """Where ``like``'s map (its last two dims) starts in the whole map: (0, 0) but in a tile."""
    extent = _extent(like)
    if extent is None:
        return 0, 0
    _, where = extent
    return where[-2].start, where[-1].start
