"""HunyuanVideo 1.5 VAE (32 latent channels, 16x spatial, 4x temporal: 1 + 4(t-1) frames).

The LDM skeleton (``ldm.py``) with HunyuanVideo 1.0's causal 3-D convolution (time padded with
first-frame copies, space by replication), and what 1.5 changes:
- every norm is the channel L2 norm (``x / ||x|| * sqrt(C) * gamma`` per voxel, no GroupNorm);
- resamplers are DC-AE pixel shuffles that also change the width, with a parameter-free shortcut
  (vae/nn/dcae.py); on a temporal level the clip's first frame is resampled in space only;
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
ComfyUI's, diffusers'; the HunyuanImage 2.1 refiner VAE, the same model): hunyuan_video15_layout.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..errors import InputError
from ..nn import dcae
from ..nn.attention import SpatialSelfAttention
from ..nn.norm import ChannelL2Norm
from ..run import streaming
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


def halves(cfg: HunyuanVideo15Config, ops: ldm.Ops, first_frame: bool) -> tuple[Optional[nn.Module], ...]:
    """The encoder and decoder (None for a half the file lacks) of the DC-AE style LDM that HunyuanVideo
    1.5 and HunyuanImage share: ``ops`` (their convs, norm, attention), the DC-AE resamplers of ``cfg``
    (on temporal levels with or without the ``first_frame`` rule), the head and latent shortcuts."""
    w, n, z = cfg.widths, cfg.layers_per_block, cfg.latent_channels
    encoder = decoder = None
    if cfg.has_encoder:
        encoder = ldm.Encoder(w[0], w, n, cfg.in_channels, 2 * z, ops, head_shortcut=True, downsample=lambda i, c: (
            dcae.Downsample(ops.conv, c, cfg.down[i].out, cfg.down[i].temporal, first_frame) if cfg.down[i] else None))
    if cfg.has_decoder:
        decoder = ldm.Decoder(w, n, z, cfg.out_channels, ops, latent_shortcut=True, upsample=lambda i, c: (
            dcae.Upsample(ops.conv, c, cfg.up[i].out, cfg.up[i].temporal, first_frame) if cfg.up[i] else None))
    return encoder, decoder


def _ops() -> ldm.Ops:
    def attention(c: int) -> nn.Module:
        return SpatialSelfAttention(c, dims=3, frame_causal=True, norm=ChannelL2Norm(c))
    return ldm.Ops(conv=conv, shortcut=lambda cin, cout: nn.Conv3d(cin, cout, 1), norm=ChannelL2Norm,
                   attention=attention)


class HunyuanVideo15VAE(ldm.Autoencoder):
    """encode: (B, 3, 1+4k, H, W) in [-1, 1] -> raw latent mode (B, 32, 1+k, H/16, W/16);
    decode: raw latent (B, 32, t, h, w) -> (B, 3, 1+4(t-1), 16h, 16w) in [-1, 1] (not clamped)."""

    def __init__(self, cfg: HunyuanVideo15Config):
        super().__init__(*halves(cfg, _ops(), first_frame=True))
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


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> HunyuanVideo15Config:
    return layout.config(sd, HunyuanVideo15Config, Resample)


SPEC = ArchSpec(id="hunyuan_video15", name="HunyuanVideo 1.5 VAE", detect=layout.detect,
                to_canonical=layout.to_canonical, config_from_state_dict=config_from_state_dict,
                build=HunyuanVideo15VAE, capabilities=capabilities, describe=describe,
                priority=100, latent_hints=((32, 5, "HunyuanVideo 1.5"),))
