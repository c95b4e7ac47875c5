"""GroupNorm with one seam for statistics computed outside the tensor it normalises.

Fast tiling normalises each tile with its own statistics. Exact tiling needs the statistics of the
whole tensor: the tile's run state (``vae.run``, owned by the call, never set on the module) has a
``stats(norm, x)`` hook that returns ``(mean, var)`` per (batch, group), or None to fall back to the
tile's own statistics. Nothing else in the library computes GroupNorm statistics.

``ChannelMean`` (global average pooling, e.g. a squeeze-and-excitation gate) asks the same hook: its
mean per (batch, channel) is a GroupNorm statistic with one channel per group. ``STATISTICS`` lists
the modules whose statistics exact tiling shares across tiles.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from ..run import current

def group_moments(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Sum of x and of x^2 per (batch, group), and the element count per group.

    Sums (not means) so that tiles can be accumulated and the exact variance recovered as
    E[x^2] - E[x]^2 over the whole tensor. Each part's mean and variance are reduced in fp32
    straight from ``x`` (a strided view is fine: no copy of the tile) and returned as float64 sums,
    so the cancellation in E[x^2] - E[x]^2 happens in float64."""
    v = x.unflatten(1, (groups, -1))
    v = v if v.dtype == torch.float32 else v.float()
    var, mean = torch.var_mean(v, dim=tuple(range(2, v.dim())), correction=0)
    n = v[0, 0].numel()
    mean = mean.double()
    return mean * n, (var.double() + mean.square()) * n, n


def normalize_with_stats(x: torch.Tensor, norm: nn.GroupNorm, mean: torch.Tensor,
                         var: torch.Tensor) -> torch.Tensor:
    """Apply ``norm`` (groups, eps, affine) to ``x`` with given per-(batch, group) statistics."""
    b, c = x.shape[:2]
    g = norm.num_groups
    inv = torch.rsqrt(var.float() + norm.eps)
    scale = inv.reshape(b, g, 1).expand(b, g, c // g).reshape(b, c)
    shift = (-mean.float() * inv).reshape(b, g, 1).expand(b, g, c // g).reshape(b, c)
    if norm.weight is not None:
        w = norm.weight.float()
        scale = scale * w
        shift = shift * w + norm.bias.float()
    view = (b, c) + (1,) * (x.dim() - 2)
    # one output allocation (a tile's working set is what exact tiling keeps small)
    return torch.addcmul(shift.reshape(view), x.float(), scale.reshape(view)).to(x.dtype)


class GroupNorm(nn.GroupNorm):
    """``nn.GroupNorm`` (same parameters and state-dict keys) plus the statistics seam."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        exact = None if torch.compiler.is_compiling() else current().exact    # exact runs are eager
        if exact is not None:
            stats = exact.stats(self, x)
            if stats is not None:
                return normalize_with_stats(x, self, *stats)
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class ChannelMean(nn.Module):
    """Mean over every position per (batch, channel), keeping the spatial axes as 1 (global average
    pooling: ``nn.AdaptiveAvgPool2d(1)`` for images). Under exact tiling the mean is the whole
    tensor's, from the run state's ``stats`` hook (``num_groups`` = channels: one channel per group)."""

    def __init__(self, channels: int):
        super().__init__()
        self.num_groups = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(2, x.dim()))
        exact = None if torch.compiler.is_compiling() else current().exact    # exact runs are eager
        if exact is not None:
            stats = exact.stats(self, x)
            if stats is not None:
                return stats[0].reshape(*x.shape[:2], *(1,) * len(dims)).to(x.dtype)
        return x.mean(dims, keepdim=True)


# the modules whose statistics exact tiling shares across tiles (the ``stats`` hook)
STATISTICS = (GroupNorm, ChannelMean)


class FrameGroupNorm(GroupNorm):
    """GroupNorm whose statistics are per frame: (C/G, H, W) of each frame of (B, C, T, H, W)
    (Mochi, Magvit). A 4-D input is one frame per batch item. The stats hook sees the frames folded
    into the batch, so exact tiling accumulates per-frame sums with the same code as for images."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 5:
            return super().forward(x)
        b, c, t, h, w = x.shape
        y = super().forward(x.transpose(1, 2).reshape(b * t, c, h, w))
        return y.reshape(b, t, c, h, w).transpose(1, 2)


class ChannelRMSNorm(nn.Module):
    """x / sqrt(mean over channels of x^2 + eps), per pixel/voxel, optionally scaled (LTX's
    PixelNorm / RMSNorm with no affine). Statistics are local, so it tiles exactly."""

    def __init__(self, channels: int, eps: float = 1e-8, affine: bool = False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * torch.rsqrt(x.float().square().mean(1, keepdim=True) + self.eps).to(x.dtype)
        if self.weight is not None:
            y = y.mul_(self.weight.reshape(1, -1, *([1] * (x.dim() - 2))))
        return y


class ChannelL2Norm(nn.Module):
    """x / ||x|| over channels * sqrt(C) * gamma, per pixel/voxel (Wan's RMS_norm: ``F.normalize``, so
    eps 1e-12 bounds the norm, not the mean square). Key ``gamma`` of shape (C, 1, ...) with one 1 per
    spatial/time axis (``dims``), as the files store it. Half inputs are normalised in fp32."""

    def __init__(self, channels: int, dims: int = 3):
        super().__init__()
        self.scale = channels ** 0.5
        self.gamma = nn.Parameter(torch.ones(channels, *([1] * dims)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.normalize(x.float() if x.dtype != torch.float64 else x, dim=1).to(x.dtype)
        return y.mul_(self.gamma * self.scale)      # y is normalize's own: one map, not two


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channel axis of (B, C, ...) (keys ``weight``, ``bias``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.movedim(1, -1)).movedim(-1, 1)
