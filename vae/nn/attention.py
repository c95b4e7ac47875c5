"""Single-head self-attention of the LDM/SD VAE mid blocks (canonical keys ``norm, q, k, v,
proj_out`` as 1x1 convolutions, as in the original and ComfyUI checkpoints), for images and, with
``dims=3``, for video clips (HunyuanVideo's mid blocks: all T*H*W tokens, block-causal over frames)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..run import Seam, Streamable
from .causal import frames, unframes
from .norm import GroupNorm


class SpatialSelfAttention(Seam, Streamable, nn.Module):
    """One head as wide as the channels, over all positions, with a residual connection.

    q/k/v are kept as separate 1x1 convs so state dicts round-trip unchanged; fusing them into
    one projection ``qkv`` (3C outputs, one conv instead of three) is a separate, reversible
    transform (vae/nn/qkv.py); ``qkv`` is None while unfused.

    ``frame_causal`` (video): a token of frame f attends to every token of frames <= f. Run as one
    attention call per frame over the keys of frames 0..f, so no (THW)^2 mask is ever built. In a
    stream (``vae.run``: a clip chunk by chunk) the keys and values of the earlier chunks are kept in
    the stream's memory, so each chunk attends as it would in one pass (HunyuanVideo 1.5)."""

    exact_whole = True        # mixes every position: exact tiling runs it on the whole tensor (vae/engine/exact.py)

    def __init__(self, channels: int, groups: int = 32, eps: float = 1e-6, dims: int = 2,
                 frame_causal: bool = False, norm: Optional[nn.Module] = None):
        super().__init__()
        conv = {2: nn.Conv2d, 3: nn.Conv3d}[dims]
        self.frame_causal = frame_causal
        self.norm = GroupNorm(groups, channels, eps=eps) if norm is None else norm
        self.q = conv(channels, channels, 1)
        self.k = conv(channels, channels, 1)
        self.v = conv(channels, channels, 1)
        self.proj_out = conv(channels, channels, 1)
        self.qkv: Optional[nn.Module] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[:2]
        hn = self.norm(x)
        # (B, 1, N, C): SDPA with one head; its default scale is 1/sqrt(C) as in the reference.
        # Contiguous: on CPU, transposed views send SDPA to the math kernel, which materialises the
        # N^2 attention matrix (2.5 GB vs 0.27 GB for a 128x128 latent).
        parts = self.qkv(hn).chunk(3, dim=1) if self.qkv is not None else (self.q(hn), self.k(hn), self.v(hn))
        q, k, v = (p.reshape(b, 1, c, -1).transpose(-1, -2).contiguous() for p in parts)
        if self.frame_causal and x.dim() == 5:
            out = self._frame_causal(q, k, v, x.shape[2])
        else:
            out = F.scaled_dot_product_attention(q, k, v)
        out = out.transpose(-1, -2).reshape(x.shape)
        return x + self.proj_out(out)

    def _frame_causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t: int) -> torch.Tensor:
        """(B, 1, t*n, C) tokens of ``t`` frames; keys and values of a stream's earlier chunks come first."""
        past = self.recall()
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        self.remember((k, v))                  # only in a stream
        n, before = q.shape[2] // t, k.shape[2] - q.shape[2]
        if t == 1:
            return F.scaled_dot_product_attention(q, k, v)
        return torch.cat([F.scaled_dot_product_attention(q[:, :, f * n:(f + 1) * n], k[:, :, :before + (f + 1) * n],
                                                         v[:, :, :before + (f + 1) * n]) for f in range(t)], dim=2)


class FrameSelfAttention(SpatialSelfAttention):
    """Attention over the H*W tokens of each frame of (B, C, T, H, W), statistics per frame (Magvit
    V5, Wan): local in time, so a clip streams through it chunk by chunk unchanged."""

    def __init__(self, channels: int, groups: int = 32, eps: float = 1e-6, norm: Optional[nn.Module] = None):
        super().__init__(channels, groups, eps, dims=2, norm=norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return unframes(super().forward(frames(x)), x.shape[0])
