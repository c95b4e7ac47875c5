"""Multi-head self-attention along time, one sequence per pixel (Mochi's encoder).

Each pixel's frames form a sequence of T tokens with C channels: cheap (T is small) and local in
space, so spatial tiles are exact. Causal attention with per-frame norms keeps the whole encoder
causal; a key/value cache makes it stream chunk by chunk like the causal convs."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..run import Streamable, current

# Sequences per attention call: CUDA kernels fail ("invalid configuration argument") past 2**16,
# and chunking also bounds the q/k/v working set for large frames.
CHUNK = 2 ** 15


class TemporalAttention(Streamable, nn.Module):
    """(B, C, T, H, W) -> (B, C, T, H, W), no residual. Keys: ``qkv`` (one Linear, C -> 3C, order
    q, k, v), ``out``. Heads of ``head_dim`` channels; ``qk_norm`` L2-normalises q and k per head."""

    def __init__(self, channels: int, head_dim: int = 32, qkv_bias: bool = False, out_bias: bool = True,
                 qk_norm: bool = True, causal: bool = True):
        super().__init__()
        self.heads, self.head_dim = channels // head_dim, head_dim
        self.qk_norm, self.causal = qk_norm, causal
        self.qkv = nn.Linear(channels, 3 * channels, bias=qkv_bias)
        self.out = nn.Linear(channels, channels, bias=out_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        memory = current().memory          # this call's stream state, or None
        streaming = memory is not None
        if streaming and not self.causal:
            raise RuntimeError("non-causal temporal attention cannot run chunk by chunk")
        if t == 1 and not streaming:
            # one key: softmax weight 1, so the output is the value projection (as the reference does)
            v = F.linear(x.movedim(1, -1), self.qkv.weight[2 * c:],
                         None if self.qkv.bias is None else self.qkv.bias[2 * c:])
            return self.out(v).movedim(-1, 1)
        # contiguous: a strided view sends the projections to a batched matmul ~100x slower on CPU
        seq = x.permute(0, 3, 4, 2, 1).reshape(b * h * w, t, c).contiguous()
        past = memory.get(self) if streaming else None      # this stream's keys and values so far
        chunks, keep = [], []
        for i in range(0, seq.shape[0], CHUNK):
            q, k, v = self._project(seq[i:i + CHUNK])
            if streaming:
                keep.append((k, v))
            if past is not None:
                k = torch.cat([past[0][i:i + CHUNK], k], dim=2)
                v = torch.cat([past[1][i:i + CHUNK], v], dim=2)
            chunks.append(self._attend(q, k, v))
        if streaming:
            k_new = torch.cat([kv[0] for kv in keep])
            v_new = torch.cat([kv[1] for kv in keep])
            memory[self] = (k_new, v_new) if past is None else (torch.cat([past[0], k_new], 2),
                                                                torch.cat([past[1], v_new], 2))
        y = torch.cat(chunks).transpose(1, 2).reshape(b * h * w, t, c)
        return self.out(y).reshape(b, h, w, t, c).permute(0, 4, 3, 1, 2)

    def _project(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, t, _ = seq.shape
        q, k, v = self.qkv(seq).view(n, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.qk_norm:
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        return q, k, v.contiguous()

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        tq, tk = q.shape[2], k.shape[2]
        if not self.causal or tq == 1 and tk == 1:
            return F.scaled_dot_product_attention(q, k, v)
        if tq == tk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # queries are the last tq of tk frames (a stream chunk): query i sees keys <= tk - tq + i
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class TemporalAttentionBlock(nn.Module):
    """x + attn(norm(x)); keys ``norm``, ``attn.qkv``, ``attn.out`` (genmo's AttentionBlock)."""

    def __init__(self, channels: int, norm: Callable[[int], nn.Module], **attn_kwargs):
        super().__init__()
        self.norm = norm(channels)
        self.attn = TemporalAttention(channels, **attn_kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))
