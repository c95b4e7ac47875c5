"""Spatial 2x down/up samplers of the KL family (canonical key: ``conv``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..run import Seam


class Downsample2x(Seam, nn.Module):
    """3x3 stride-2 conv after zero padding one row/column at the bottom/right (the reference's
    asymmetric padding; symmetric padding would shift the latent grid by half a pixel)."""

    exact_boundary = True     # exact tiling may re-cut tiles at its input (vae/engine/exact.py)

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample2x(Seam, nn.Module):
    """Nearest-neighbour 2x then a 3x3 conv."""

    exact_boundary = True

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
