"""Convolutions along time, with the frame cache that lets a clip run chunk by chunk.

Every video family pads time itself (the conv is built with no time padding), in one of these ways:
- causal: ``(k_t - 1) * dilation`` copies of the first frame in front (Mochi, HunyuanVideo, Magvit,
  LTX's encoder);
- causal_zeros: as many zero frames in front (Wan);
- valid: no padding (Wan's temporal down-sampler, which passes the first frame on by itself);
- symmetric: half of the span in front (first frame) and half behind (last frame) (LTX's default,
  non-causal decoder).
Spatial padding is ``zeros`` (LTX, Magvit, Wan) or ``replicate`` (Mochi, HunyuanVideo).

Streaming (``vae.run.stream``): a causal conv keeps, in the call's stream memory, the tail of its
padded input that later output frames still need (every frame from the first window it has not yet
produced), so feeding a clip in chunks gives exactly the frames of one pass, for any stride. Modules
with other temporal state (up-samplers that treat the first frame differently) keep theirs the same way
(``Streamable.first_chunk``, ``recall`` / ``remember``); nothing is stored on the module.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..run import FINAL, Streamable, current

Size3 = Union[int, tuple[int, int, int]]
TIME_PADS = ("causal", "causal_zeros", "valid", "symmetric")


def _triple(v: Size3) -> tuple[int, int, int]:
    return (v, v, v) if isinstance(v, int) else tuple(v)


class CausalConv3d(Streamable, nn.Conv3d):
    """``nn.Conv3d`` (same parameters and keys) that pads time itself.

    ``time_pad``: one of ``TIME_PADS``; ``spatial_pad``: "zeros", "replicate" or "reflect". The spatial
    padding is ``(k - 1) // 2`` per side unless ``spatial_padding`` gives it (0 for convs whose
    caller pads, e.g. Magvit's stride-2 down-samplers)."""

    def __init__(self, cin: int, cout: int, kernel: Size3, stride: Size3 = 1, dilation: Size3 = 1,
                 time_pad: str = "causal", spatial_pad: str = "zeros", spatial_padding: Optional[int] = None,
                 bias: bool = True):
        kt, kh, kw = _triple(kernel)
        if time_pad not in TIME_PADS:
            raise ValueError(f"time_pad={time_pad!r}")
        super().__init__(cin, cout, (kt, kh, kw), stride=stride, dilation=dilation, bias=bias)
        self.time_pad = time_pad
        self._hw_pad = ((kh - 1) // 2 if spatial_padding is None else spatial_padding,
                        (kw - 1) // 2 if spatial_padding is None else spatial_padding)
        self.set_spatial_pad(spatial_pad)

    def set_spatial_pad(self, mode: str) -> None:
        """zeros: the conv's own (fused) padding; replicate / reflect: explicit, before the conv."""
        if mode not in ("zeros", "replicate", "reflect"):
            raise ValueError(f"spatial_pad={mode!r}")
        ph, pw = self._hw_pad
        self.spatial_pad = mode
        self.padding = (0, ph, pw) if mode == "zeros" else (0, 0, 0)
        self._replicate = (pw, pw, ph, ph, 0, 0) if mode != "zeros" and (ph or pw) else None

    @property
    def hw_padding(self) -> tuple[int, int]:
        """Spatial padding per side, whether the conv applies it (zeros) or pads first."""
        return self._hw_pad

    @property
    def time_span(self) -> int:
        """Frames one output frame looks back over beyond its own: (k_t - 1) * dilation."""
        return (self.kernel_size[0] - 1) * self.dilation[0]

    def _front(self, x: torch.Tensor) -> torch.Tensor:
        """What a causal clip is padded with in front (the first frame's copies, zeros, or nothing)."""
        p = 0 if self.time_pad == "valid" else self.time_span
        if self.time_pad == "causal_zeros":
            return x.new_zeros(*x.shape[:2], p, *x.shape[3:])
        return x[:, :, :1].expand(-1, -1, p, -1, -1)

    def pad_time(self, x: torch.Tensor, memory: Optional[dict] = None, space: bool = False) -> torch.Tensor:
        """``x`` padded (or, in a stream whose state is ``memory``, preceded by the frames kept from
        the chunks before) so that the conv gives exactly the frames of one pass. ``space`` (a stream
        only): padded in space too, in the same copy."""
        if memory is not None:
            if self.time_pad == "symmetric":
                raise RuntimeError("a non-causal (symmetric) conv cannot run chunk by chunk")
            final = memory.get(FINAL, False)        # nothing reads the cache again: it goes now
            head = memory.pop(self, None) if final else memory.get(self)
            head = self._front(x) if head is None else head
            n = head.shape[2] + x.shape[2]
            # keep every frame from the first window not produced yet
            keep = max(0, (n - self.time_span - 1) // self.stride[0] + 1) * self.stride[0]
            if space:
                x = self._joined(head, x)
                ph, pw = self._hw_pad
                if not final:
                    memory[self] = x[:, :, keep:, ph:x.shape[3] - ph, pw:x.shape[4] - pw].clone()
                return x
            x = torch.cat([head, x], dim=2) if head.shape[2] else x
            if not final:
                memory[self] = x[:, :, keep:].clone()
            return x
        p = self.time_span
        if p == 0 or self.time_pad == "valid":
            return x
        if self.time_pad != "symmetric":
            return torch.cat([self._front(x), x], dim=2)
        front, back = p // 2, p - p // 2
        return torch.cat([x[:, :, :1].expand(-1, -1, front, -1, -1), x,
                          x[:, :, -1:].expand(-1, -1, back, -1, -1)], dim=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memory = current().memory           # this call's stream state, or None
        if self._replicate is not None and self.spatial_pad == "replicate" and self.time_pad == "causal" \
                and memory is None:
            # first-frame copies are replicate padding in time: one pad for all three axes
            # (measured 3x faster than a concatenation followed by a spatial pad)
            return super().forward(F.pad(x, self._replicate[:4] + (self.time_span, 0), mode="replicate"))
        hw = x.shape[-2:]
        joined = memory is not None and self._replicate is not None and min(hw) > max(self._hw_pad)
        x = self.pad_time(x, memory, space=joined)
        if x.shape[2] < self.time_span + 1:      # a stream chunk too short to complete a window
            return x.new_empty(x.shape[0], self.out_channels, 0, *self._spatial_out(hw))
        if self._replicate is not None and not joined:
            mode = self.spatial_pad
            if mode == "reflect" and min(x.shape[-2:]) <= max(self._hw_pad):
                mode = "replicate"      # a 1-pixel side has nothing to reflect
            x = F.pad(x, self._replicate, mode=mode)
        return super().forward(x)

    def _joined(self, head: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``head`` and ``x`` one after the other in time, padded in space (replicate or reflect): one
        tensor written once, where a concatenation and then ``F.pad`` would hold two copies (the
        peak of a stream through HunyuanVideo's and Mochi's convolutions)."""
        (ph, pw), (h, w), t = self._hw_pad, x.shape[-2:], head.shape[2]
        out = x.new_empty(*x.shape[:2], t + x.shape[2], h + 2 * ph, w + 2 * pw)
        out[:, :, :t, ph:ph + h, pw:pw + w] = head
        out[:, :, t:, ph:ph + h, pw:pw + w] = x
        rows, cols = slice(pw, pw + w), slice(None)
        if self.spatial_pad == "replicate":       # edges copied outwards: rows first, then whole columns
            out[:, :, :, :ph, rows] = out[:, :, :, ph:ph + 1, rows]
            out[:, :, :, ph + h:, rows] = out[:, :, :, ph + h - 1:ph + h, rows]
            out[:, :, :, cols, :pw] = out[:, :, :, cols, pw:pw + 1]
            out[:, :, :, cols, pw + w:] = out[:, :, :, cols, pw + w - 1:pw + w]
        else:                                     # reflect: mirrored about the edge, the edge not repeated
            out[:, :, :, :ph, rows] = out[:, :, :, ph + 1:2 * ph + 1, rows].flip(3)
            out[:, :, :, ph + h:, rows] = out[:, :, :, h - 1:ph + h - 1, rows].flip(3)
            out[:, :, :, cols, :pw] = out[:, :, :, cols, pw + 1:2 * pw + 1].flip(4)
            out[:, :, :, cols, pw + w:] = out[:, :, :, cols, w - 1:pw + w - 1].flip(4)
        return out

    def _spatial_out(self, hw) -> tuple[int, int]:
        rep = self._replicate or (0,) * 6
        pads = (rep[2] + self.padding[1], rep[0] + self.padding[2])
        return tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, k, s, d in
                     zip(hw, pads, self.kernel_size[1:], self.stride[1:], self.dilation[1:]))


def depth_to_space(x: torch.Tensor, st: int, sh: int, sw: int) -> torch.Tensor:
    """(B, C*st*sh*sw, T, H, W) -> (B, C, T*st, H*sh, W*sw); channel order (C, st, sh, sw)."""
    b, c, t, h, w = x.shape
    c //= st * sh * sw
    x = x.reshape(b, c, st, sh, sw, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
    return x.reshape(b, c, t * st, h * sh, w * sw)


def space_to_depth(x: torch.Tensor, st: int, sh: int, sw: int) -> torch.Tensor:
    """Inverse of ``depth_to_space``: (B, C, T*st, H*sh, W*sw) -> (B, C*st*sh*sw, T, H, W)."""
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t // st, st, h // sh, sh, w // sw, sw).permute(0, 1, 3, 5, 7, 2, 4, 6)
    return x.reshape(b, c * st * sh * sw, t // st, h // sh, w // sw)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C, T, H*p, W*p) -> (B, C*p*p, T, H, W) with channels ordered (c, w-phase, h-phase): width
    before height, as LTX-Video's and Wan 2.2's patches are (hence the transposes)."""
    return x if p == 1 else space_to_depth(x.transpose(3, 4), 1, p, p).transpose(3, 4)


def unpatchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """Inverse of ``patchify``."""
    return x if p == 1 else depth_to_space(x.transpose(3, 4), 1, p, p).transpose(3, 4)


def frames(x: torch.Tensor) -> torch.Tensor:
    """(B, C, T, H, W) -> (B*T, C, H, W): per-frame ops (2-D convs, per-frame norms) on video."""
    b, c, t, h, w = x.shape
    return x.transpose(1, 2).reshape(b * t, c, h, w)


def unframes(x: torch.Tensor, b: int) -> torch.Tensor:
    """Inverse of ``frames``."""
    bt, c, h, w = x.shape
    return x.reshape(b, bt // b, c, h, w).transpose(1, 2)
