"""The 3-D Haar wavelet transform of a video (B, C, T, H, W) in 2x2x2 blocks (NVIDIA's Cosmos tokenizer
patches pixels with it and its decoder unpatches with the inverse).

One level turns each 2x2x2 block of a channel into 8 bands, band ``b`` = 4 b_t + 2 b_h + b_w (0: low,
1: high along that axis): the block's samples summed with signs (-1)^(b . p) for sample phase ``p``,
divided by 8 (the reference's filters of 1/sqrt(2), rescaled by 1/(2 sqrt(2)) per level). Output channels
are band-major, ``b * C + c``, so a second level splits every band of the first again. The inverse sums
the bands with the same signs (the 8x8 sign matrix squared is 8 I). Sides must be even at each level:
every block is transformed on its own, so tiles cut on the block grid transform exactly."""
from __future__ import annotations

import torch

from .causal import depth_to_space, space_to_depth


def _signs(x: torch.Tensor) -> torch.Tensor:
    """(-1)^popcount(b & p) for bands b (rows) and phases p (columns), both ordered (t, h, w)."""
    i = torch.arange(8, device=x.device)
    both = i[:, None] & i[None, :]
    parity = (both ^ (both >> 1) ^ (both >> 2)) & 1
    return (1 - 2 * parity).to(x.dtype)


def haar(x: torch.Tensor, levels: int = 1) -> torch.Tensor:
    """(B, C, T, H, W) -> (B, C * 8**levels, T / 2**levels, H / 2**levels, W / 2**levels)."""
    for _ in range(levels):
        c = x.shape[1]
        phases = space_to_depth(x, 2, 2, 2).unflatten(1, (c, 8))          # channels (c, phase)
        x = torch.einsum("bp,ncpthw->nbcthw", _signs(x) / 8, phases).flatten(1, 2)
    return x


def inverse_haar(x: torch.Tensor, levels: int = 1) -> torch.Tensor:
    """Inverse of ``haar``: (B, C * 8**levels, T, H, W) -> (B, C, T * 2**levels, H * 2**levels, W * 2**levels)."""
    for _ in range(levels):
        bands = x.unflatten(1, (8, x.shape[1] // 8))                     # channels (band, c)
        x = depth_to_space(torch.einsum("bp,nbcthw->ncpthw", _signs(x), bands).flatten(1, 2), 2, 2, 2)
    return x
