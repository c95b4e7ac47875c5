"""The norm-act-conv residual block shared by the KL family (and, with a 3-D conv, the video VAEs)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..run import Seam
from .norm import GroupNorm

ConvFactory = Callable[..., nn.Module]
NormFactory = Callable[[int], nn.Module]


def conv2d_3x3(cin: int, cout: int) -> nn.Module:
    return nn.Conv2d(cin, cout, 3, padding=1)


def conv2d_1x1(cin: int, cout: int) -> nn.Module:
    return nn.Conv2d(cin, cout, 1)


class ResnetBlock(Seam, nn.Module):
    """GroupNorm -> SiLU -> conv -> GroupNorm -> SiLU -> conv, plus a 1x1 shortcut when the width
    changes. Canonical keys: ``norm1 conv1 norm2 conv2 nin_shortcut``.

    Video families pass their own ``conv`` (a causal 3-D conv), ``shortcut`` and ``norm`` (a
    per-frame or whole-clip GroupNorm): the block itself is written once."""

    # every caller chains blocks (h = block(h)): exact tiling may re-cut at the input (vae/engine/exact.py)
    exact_boundary = "coarse"

    def __init__(self, cin: int, cout: int, groups: int = 32, eps: float = 1e-6,
                 conv: ConvFactory = conv2d_3x3, shortcut: ConvFactory = conv2d_1x1,
                 norm: NormFactory | None = None):
        super().__init__()
        norm = norm or (lambda c: GroupNorm(groups, c, eps=eps))
        self.norm1 = norm(cin)
        self.conv1 = conv(cin, cout)
        self.norm2 = norm(cout)
        self.conv2 = conv(cout, cout)
        self.nin_shortcut = shortcut(cin, cout) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # SiLU in place on the fresh norm outputs: saves one activation map per block; h rebound to
        # norm2's output before conv2 runs, so conv1's output is gone while conv2 works.
        h = self.conv1(F.silu(self.norm1(x), inplace=True))
        h = F.silu(self.norm2(h), inplace=True)
        h = self.conv2(h)
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return h.add_(skip)


class MidBlock(nn.Module):
    """resnet -> (attention) -> resnet at the lowest resolution (keys ``block_1 attn_1 block_2``)."""

    def __init__(self, channels: int, attention: nn.Module | None, groups: int = 32, eps: float = 1e-6,
                 conv: ConvFactory = conv2d_3x3, norm: NormFactory | None = None,
                 block: type[ResnetBlock] = ResnetBlock):
        super().__init__()
        self.block_1 = block(channels, channels, groups, eps, conv, norm=norm)
        self.attn_1 = attention
        self.block_2 = block(channels, channels, groups, eps, conv, norm=norm)

    def steps(self) -> list[nn.Module]:
        """What it runs, in order (``vae/nn/steps.py``)."""
        return [m for m in (self.block_1, self.attn_1, self.block_2) if m is not None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps():
            x = step(x)
        return x
