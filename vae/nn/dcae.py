"""DC-AE style resamplers: a pixel (un)shuffle that also changes the width, plus a parameter-free
shortcut (HunyuanVideo 1.5, HunyuanImage 2.1 and 3.0).

- Down: a conv to ``out / f`` channels, space-to-depth by f; shortcut: the input space-to-depth the
  same way, groups of channels averaged down to ``out``.
- Up: a conv to ``out * f`` channels, depth-to-space by f; shortcut: the input's channels repeated up
  to ``out * f``, depth-to-space.
f is 2x2 in space, times 2 in time on a temporal level; channels fold in the order (time phase, row
phase, column phase, channel). Images (4-D) fold in space only.

On a temporal level the clip's first frame may be resampled in space only (``first_frame``:
HunyuanVideo 1.5's causal 1 + 4k frames; down, its out / 2 channels are taken twice; up, it keeps the
first ``out`` of its 2 * out) and the other frames in pairs; in a stream the first frame is the first
chunk's. Without it every frame pairs (HunyuanImage 3.0's 4k frames).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..run import Seam, Streamable

ConvFactory = Callable[[int, int], nn.Module]      # (in, out) -> a size-keeping 3x3 (3x3x3) conv


def fold(x: torch.Tensor, ft: int = 1) -> torch.Tensor:
    """Space-to-depth (B, C, T*ft, 2H, 2W) -> (B, ft*2*2*C, T, H, W); an image (B, C, 2H, 2W) -> (B, 4C, H, W)."""
    if x.dim() == 4:
        return fold(x.unsqueeze(2)).squeeze(2)
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t // ft, ft, h // 2, 2, w // 2, 2).permute(0, 3, 5, 7, 1, 2, 4, 6)
    return x.reshape(b, ft * 4 * c, t // ft, h // 2, w // 2)


def unfold(x: torch.Tensor, ft: int = 1) -> torch.Tensor:
    """Inverse of ``fold``: (B, ft*2*2*C, T, H, W) -> (B, C, T*ft, 2H, 2W); images likewise."""
    if x.dim() == 4:
        return unfold(x.unsqueeze(2)).squeeze(2)
    b, c, t, h, w = x.shape
    c //= ft * 4
    x = x.reshape(b, ft, 2, 2, c, t, h, w).permute(0, 4, 5, 1, 6, 2, 7, 3)
    return x.reshape(b, c, t * ft, h * 2, w * 2)


class _Shuffle(Seam, Streamable, nn.Module):
    """A resampler: conv, pixel (un)shuffle, shortcut (canonical key: ``conv``)."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, conv: ConvFactory, conv_out: int, cin: int, cout: int, temporal: bool, first_frame: bool):
        super().__init__()
        self.conv = conv(cin, conv_out)
        self.out_channels, self.ft, self.first_frame = cout, 2 if temporal else 1, first_frame

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        if self.ft == 1 or not self.first_frame:
            return self._part(h, x, self.ft)
        started = self.recall(False)
        self.remember(True)
        if started:
            return self._part(h, x, 2)
        first = self._part(h[:, :, :1], x[:, :, :1], 1)
        return first if x.shape[2] == 1 else torch.cat([first, self._part(h[:, :, 1:], x[:, :, 1:], 2)], dim=2)

    def _part(self, h: torch.Tensor, x: torch.Tensor, ft: int) -> torch.Tensor:
        raise NotImplementedError


class Downsample(_Shuffle):
    def __init__(self, conv: ConvFactory, cin: int, cout: int, temporal: bool = False, first_frame: bool = False):
        super().__init__(conv, cout // (8 if temporal else 4), cin, cout, temporal, first_frame)

    def _part(self, h: torch.Tensor, x: torch.Tensor, ft: int) -> torch.Tensor:
        y = fold(h, ft)
        if y.shape[1] != self.out_channels:          # the first frame of a temporal level
            y = y.repeat(1, 2, 1, 1, 1)
        return y + fold(x, ft).unflatten(1, (self.out_channels, -1)).mean(2)


class Upsample(_Shuffle):
    def __init__(self, conv: ConvFactory, cin: int, cout: int, temporal: bool = False, first_frame: bool = False):
        super().__init__(conv, cout * (8 if temporal else 4), cin, cout, temporal, first_frame)

    def _part(self, h: torch.Tensor, x: torch.Tensor, ft: int) -> torch.Tensor:
        n = self.out_channels
        skip = x.repeat_interleave(n * ft * 4 // x.shape[1], dim=1)
        return unfold(h, ft)[:, :n] + unfold(skip, ft)
