"""Noise a model draws inside its network, seeded, and exact under tiling.

A decoder that injects noise (LTX-Video 0.9.1+, the Consistency Decoder, diffusion decoders) draws it
with a ``torch.Generator`` the call seeded, so a decode repeats. Under exact tiling (vae/exact.py) a
tile must see its own part of the field an untiled pass draws, not a field of its own: the run state's
exact hooks say where the tile lies in the whole map (``extent``), and the whole field is drawn and cut.
"""
from __future__ import annotations

from typing import Sequence

import torch

from . import run as runstate


def region_randn(shape: Sequence[int], gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """``torch.randn(shape, generator=gen)`` (float32, CPU) whose last two dims are ``like``'s spatial
    size. In an exact tile it is the tile's part of the draw an untiled pass makes (the whole map's
    noise, then cut), so noise does not break exactness."""
    hooks = runstate.current().exact
    if hooks is None:
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)
    size, where = hooks.extent(like)
    return torch.randn((*shape[:-2], *size), generator=gen, dtype=torch.float32)[where]
