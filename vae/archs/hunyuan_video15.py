"""HunyuanVideo 1.5 VAE (32 latent channels, 16x spatial, 4x temporal: 1 + 4(t-1) frames).

The LDM skeleton (``ldm.py``) with HunyuanVideo 1.0's causal 3-D convolution (time padded with
first-frame copies, space by replication), and what 1.5 changes:
- every norm is the channel L2 norm (``x / ||x|| * sqrt(C) * gamma`` per voxel, no GroupNorm);
- resamplers are pixel shuffles (DC-AE style) that also change the width: a conv to ``out / f``
  channels and space-to-depth by f (down), or a conv to ``out * f`` and depth-to-space (up), with
  f = 2x2 in space, x2 in time on the temporal levels, plus a parameter-free shortcut (the input
  folded the same way with channel groups averaged / its channels repeated and unfolded). On a
  temporal level the clip's first frame is folded in space only;
- the encoder's head adds the mid block's output, channel groups averaged down to the moments; the
  decoder's ``conv_in`` adds the latent, its channels repeated up to the mid width;
- the mid-block attention (one head, all T*H*W tokens) is causal over frames: a token of frame f
  sees every token of frames <= f (Tencent's original and diffusers build the (THW)^2 mask; here it
  is one attention call per frame, vae/nn/attention.py).

Definition. Tencent's original and diffusers run one pass over the clip. Every part is causal in
time and every norm per voxel, so a clip run chunk by chunk gives the same numbers, given the
first-frame rule of the temporal resamplers (in a stream: the first chunk's first frame) and the
attention's keys and values of the earlier chunks (kept in the stream's memory). ComfyUI runs the
convolutions in chunks of two latent frames (its "temporal rolling VAE"), which is ``stream_chunk``
here, but its mid-block attention has no mask: for clips of more than one latent frame ComfyUI's
numbers differ from the original's; these follow the original.

Latents are raw: the 1.03682 scaling is the sampler's latent format (ComfyUI's), not the VAE's.
Every width, the resampling levels and which of them are temporal are read from the weights (a
resampler's conv has out / 4 channels, or out / 8 on a temporal level). Key layouts (Tencent's =
ComfyUI's, diffusers'; the HunyuanImage 2.1 refiner's identical tensors): hunyuan_video15_layout.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..nn.attention import SpatialSelfAttention
from ..nn.causal import CausalConv3d
from ..nn.norm import ChannelL2Norm
from ..run import Seam, Streamable, streaming
from .. import spec
from ..spec import ArchSpec, Capabilities
from . import hunyuan_video15_layout as layout
from . import ldm
from .hunyuan_video import _conv as conv     # HunyuanVideo 1.0's: causal (first-frame copies), replicate


@dataclass(frozen=True)
class Resample:
    out: int              # output width (the next level's)
    temporal: bool        # also halves (down) / doubles (up) time


@dataclass(frozen=True)
class HunyuanVideo15Config:
    widths: tuple[int, ...]                     # per level, fine to coarse (block_out_channels)
    layers_per_block: int                       # encoder resnets per level (the decoder has one more)
    latent_channels: int
    down: tuple[Optional[Resample], ...] = ()   # encoder levels
    up: tuple[Optional[Resample], ...] = ()     # decoder levels, LDM index (up[-1] runs first)
    in_channels: int = 3
    out_channels: int = 3

    @property
    def has_encoder(self) -> bool:
        return bool(self.down)

    @property
    def has_decoder(self) -> bool:
        return bool(self.up)

    @property
    def ratios(self) -> tuple[int, int]:
        """(spatial, temporal) compression."""
        levels = [r for r in (self.down or self.up) if r]
        return 2 ** len(levels), 2 ** sum(r.temporal for r in levels)


def _fold(x: torch.Tensor, ft: int) -> torch.Tensor:
    """Space-to-depth (B, C, T*ft, 2H, 2W) -> (B, ft*2*2*C, T, H, W), channels ordered (ft, 2, 2, C)."""
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t // ft, ft, h // 2, 2, w // 2, 2).permute(0, 3, 5, 7, 1, 2, 4, 6)
    return x.reshape(b, ft * 4 * c, t // ft, h // 2, w // 2)


def _unfold(x: torch.Tensor, ft: int) -> torch.Tensor:
    """Inverse of ``_fold``: (B, ft*2*2*C, T, H, W) -> (B, C, T*ft, 2H, 2W)."""
    b, c, t, h, w = x.shape
    c //= ft * 4
    x = x.reshape(b, ft, 2, 2, c, t, h, w).permute(0, 4, 5, 1, 6, 2, 7, 3)
    return x.reshape(b, c, t * ft, h * 2, w * 2)


class _Shuffle(Seam, Streamable, nn.Module):
    """A resampler: causal conv, pixel (un)shuffle, shortcut. On a temporal level the clip's first
    frame is resampled in space only and the others in pairs (down) / doubled (up); in a stream the
    first frame is the first chunk's."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, conv_out: int, cin: int, cout: int, temporal: bool):
        super().__init__()
        self.conv = conv(cin, conv_out)
        self.out_channels, self.ft = cout, 2 if temporal else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        if self.ft == 1:
            return self._part(h, x, 1)
        started = self.recall(False)
        self.remember(True)
        if started:
            return self._part(h, x, 2)
        first = self._part(h[:, :, :1], x[:, :, :1], 1)
        return first if x.shape[2] == 1 else torch.cat([first, self._part(h[:, :, 1:], x[:, :, 1:], 2)], dim=2)

    def _part(self, h: torch.Tensor, x: torch.Tensor, ft: int) -> torch.Tensor:
        raise NotImplementedError


class Downsample(_Shuffle):
    """conv to out / f channels, space-to-depth by f; shortcut: the input space-to-depth, groups of
    channels averaged to ``out``. The first frame gives out / 2 channels, taken twice."""

    def __init__(self, cin: int, cout: int, temporal: bool):
        super().__init__(cout // (8 if temporal else 4), cin, cout, temporal)

    def _part(self, h: torch.Tensor, x: torch.Tensor, ft: int) -> torch.Tensor:
        y = _fold(h, ft)
        if y.shape[1] != self.out_channels:          # the first frame of a temporal level
            y = y.repeat(1, 2, 1, 1, 1)
        return y + _fold(x, ft).unflatten(1, (self.out_channels, -1)).mean(2)


class Upsample(_Shuffle):
    """conv to out * f channels, depth-to-space by f; shortcut: the input's channels repeated to
    out * f, depth-to-space. The first frame keeps the first ``out`` of its 2 * out channels."""

    def __init__(self, cin: int, cout: int, temporal: bool):
        super().__init__(cout * (8 if temporal else 4), cin, cout, temporal)

    def _part(self, h: torch.Tensor, x: torch.Tensor, ft: int) -> torch.Tensor:
        n = self.out_channels
        skip = x.repeat_interleave(n * ft * 4 // x.shape[1], dim=1)
        return _unfold(h, ft)[:, :n] + _unfold(skip, ft)


class Encoder(ldm.Encoder):
    """The head adds a shortcut: the mid block's output, groups of channels averaged to the moments."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
        h = self.mid(h)
        moments = self.conv_out(F.silu(self.norm_out(h), inplace=True))
        return moments + h.unflatten(1, (moments.shape[1], -1)).mean(2)


class LatentIn(CausalConv3d):
    """The decoder's ``conv_in`` plus a shortcut: the latent, each channel repeated to the width."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return super().forward(z) + z.repeat_interleave(self.out_channels // z.shape[1], dim=1)


def _ops() -> ldm.Ops:
    def attention(c: int) -> nn.Module:
        return SpatialSelfAttention(c, dims=3, frame_causal=True, norm=ChannelL2Norm(c))
    return ldm.Ops(conv=conv, shortcut=lambda cin, cout: nn.Conv3d(cin, cout, 1), norm=ChannelL2Norm,
                   attention=attention)


class HunyuanVideo15VAE(ldm.Autoencoder):
    """encode: (B, 3, 1+4k, H, W) in [-1, 1] -> raw latent mode (B, 32, 1+k, H/16, W/16);
    decode: raw latent (B, 32, t, h, w) -> (B, 3, 1+4(t-1), 16h, 16w) in [-1, 1] (not clamped)."""

    def __init__(self, cfg: HunyuanVideo15Config):
        w, n, z, ops = cfg.widths, cfg.layers_per_block, cfg.latent_channels, _ops()
        encoder = decoder = None
        if cfg.has_encoder:
            encoder = Encoder(w[0], w, n, cfg.in_channels, 2 * z, ops, downsample=lambda i, c: (
                Downsample(c, cfg.down[i].out, cfg.down[i].temporal) if cfg.down[i] else None))
        if cfg.has_decoder:
            decoder = ldm.Decoder(w, n, z, cfg.out_channels, ops, upsample=lambda i, c: (
                Upsample(c, cfg.up[i].out, cfg.up[i].temporal) if cfg.up[i] else None))
            # the skeleton's conv_in, with the latent shortcut (same parameters and keys)
            decoder.conv_in = LatentIn(z, w[-1], 3, time_pad="causal", spatial_pad="replicate")
        super().__init__(encoder, decoder)
        self.config = cfg
        self.temporal_ratio = cfg.ratios[1]

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        t, r = x.shape[2], self.temporal_ratio
        if (t - 1) % r and not streaming():      # a stream's later chunks are r*k frames
            raise InputError(f"HunyuanVideo 1.5 encodes 1 + {r}*k frames, got {t}.", input="pixels")
        return super().encode(x, posterior)


def capabilities(cfg: HunyuanVideo15Config) -> Capabilities:
    spatial, temporal = cfg.ratios
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=spatial, temporal_ratio=temporal,
        image_channels=cfg.out_channels, has_attention=True, norm="rms",
        causal_encoder=True, causal_decoder=True, stream_encode=True, stream_decode=True,
        stream_chunk=2, posterior=True, can_encode=cfg.has_encoder, can_decode=cfg.has_decoder,
        default_tile=512, default_overlap=64, default_tile_frames=32, default_overlap_frames=8,
        working_dtypes=(torch.float16, torch.bfloat16, torch.float32))


def describe(cfg: HunyuanVideo15Config) -> str:
    return spec.describe("HunyuanVideo 1.5 VAE", cfg.latent_channels, cfg.has_encoder, cfg.has_decoder)


SPEC = ArchSpec(id="hunyuan_video15", name="HunyuanVideo 1.5 VAE", detect=layout.detect,
                to_canonical=layout.to_canonical,
                config_from_state_dict=lambda sd, hint=None: layout.config(sd, hint, HunyuanVideo15Config, Resample),
                build=HunyuanVideo15VAE, capabilities=capabilities, describe=describe,
                priority=100, latent_hints=((32, 5, "HunyuanVideo 1.5"),))
