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


def _where():
    """The hooks that say where this call's map lies in the whole one: an exact tile's, a fast tile's
    (vae/engine/tiling.py ``Place``), or None (the whole map)."""
    run = runstate.current()
    return run.exact if run.exact is not None else run.place


def region_randn(shape: Sequence[int], gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """``torch.randn(shape, generator=gen)`` (float32, CPU) whose last two dims are ``like``'s spatial
    size. In a tile it is the tile's part of the draw an untiled pass makes (the whole map's noise,
    then cut), so noise does not break exactness."""
    hooks = _where()
    if hooks is None:
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)
    size, where = hooks.extent(like)
    return torch.randn((*shape[:-2], *size), generator=gen, dtype=torch.float32)[where]


def region_origin(like: torch.Tensor) -> tuple[int, int]:
    """Where ``like``'s map (its last two dims) starts in the whole map: (0, 0) but in a tile."""
    hooks = _where()
    if hooks is None:
        return 0, 0
    _, where = hooks.extent(like)
    return where[-2].start, where[-1].start
