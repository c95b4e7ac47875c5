"""SeedVR2's video VAE (ByteDance-Seed/SeedVR ``models/video_vae_v3``, config
``s8_c16_t4_inflation_sd3``; ComfyUI core ``comfy/ldm/seedvr/vae.py``): 16 latent channels, 8x spatial,
4x temporal: t latent frames decode to 1 + 4(t-1) frames.

The LDM skeleton (``ldm.py``) inflated to 3-D ("pad" inflation): every conv is causal in time (the
first frame copied in front), zero-padded in space, 3x3x3 also inside the resnets (the "full" temporal
receptive field); GroupNorm (32 groups, eps 1e-6) and the one-head mid-block attention run per frame;
no quant convs. Its own resamplers:
- down: zero pad right/bottom, then a causal conv of stride 2 in space, a (1, 3, 3) kernel on the
  spatial-only level and a 3^3 kernel of stride 2 also in time on the two temporal levels;
- up: a 1x1x1 ``upscale_conv`` to C * 4 (x 2 on temporal levels) channels, unfolded to space (and
  time) with channels ordered (h-phase, w-phase, t-phase, C) as MAGVIT-v2; on a temporal level the
  clip's second frame (the first frame's copy) is dropped, then a causal 3^3 conv.
Which levels are temporal is read from the weights (the kernels and the upscale widths).

Definition. The original and core run a clip in chunks through causal caches: decode = latent frames
0 and 1, then one at a time; encode = frames 0..4, then 4 at a time. Every norm and the attention are
per frame and every conv causal, so the chunks equal one pass; the only rule chunking implies is the
up-samplers' dropped frame, which belongs to the clip's first chunk (``Streamable.first_chunk``).
Core's convs and GroupNorms also split along H / W / channel groups above 0.5 GiB: exact too.

Conventions (as core's VAE): the latent is scaled inside the VAE: decode takes ``z / 0.9152`` (shift
0), encode gives the posterior mean x 0.9152 (the original pipeline samples the posterior; core and
this take its mean). Core crops decoded frames to even sides: 8x outputs always are. Key layouts
(the original's = core's): seedvr2_layout.py."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..nn import posterior as gaussian
from ..nn.attention import FrameSelfAttention
from ..nn.causal import CausalConv3d
from ..nn.norm import FrameGroupNorm
from ..run import Seam, Streamable, streaming
from .. import spec
from ..spec import ArchSpec, Capabilities
from . import ldm
from . import seedvr2_layout as layout

GROUPS, EPS = 32, 1e-6        # not in the weights: the published config (and core) use these
SCALE, SHIFT = 0.9152, 0.0    # configs_3b/main.yaml ``vae.scaling_factor``


@dataclass(frozen=True)
class SeedVR2Config:
    widths: tuple[int, ...]             # block_out_channels, fine to coarse
    layers_per_block: int               # encoder resnets per level (the decoder has one more)
    latent_channels: int = 16
    temporal: tuple[bool, ...] = ()     # per encoder level with a down-sampler: it also halves time
    in_channels: int = 3
    out_channels: int = 3
    mid_attention: bool = True
    has_encoder: bool = True
    has_decoder: bool = True


def _ops(cfg: SeedVR2Config) -> ldm.Ops:
    return ldm.Ops(conv=lambda i, o: CausalConv3d(i, o, 3), shortcut=lambda i, o: nn.Conv3d(i, o, 1),
                   norm=lambda c: FrameGroupNorm(GROUPS, c, eps=EPS),
                   attention=lambda c: FrameSelfAttention(c, GROUPS, EPS) if cfg.mid_attention else None)


class Downsample(Seam, nn.Module):
    """Zero pad right/bottom, causal conv of stride 2 in space (and in time on temporal levels)."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        kt, st = (3, 2) if temporal else (1, 1)
        self.conv = CausalConv3d(channels, channels, (kt, 3, 3), stride=(st, 2, 2), spatial_padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


def _unfold(x: torch.Tensor, st: int) -> torch.Tensor:
    """(B, 2*2*st*C, T, H, W) -> (B, C, T*st, 2H, 2W); channels ordered (h-phase, w-phase, t-phase, C)."""
    b, n, t, h, w = x.shape
    x = x.reshape(b, 2, 2, st, n // (4 * st), t, h, w).permute(0, 4, 5, 3, 6, 1, 7, 2)
    return x.reshape(b, n // (4 * st), t * st, 2 * h, 2 * w)


class Upsample(Seam, Streamable, nn.Module):
    """1x1x1 conv to 4 (8) x C channels unfolded to 2x space (and 2x time), then a causal 3^3 conv.
    On a temporal level the clip's frame 1 (frame 0's twin) is dropped: T latents -> 2T - 1 frames;
    in a stream only in the first chunk."""

    exact_boundary = True

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        self.st = 2 if temporal else 1
        self.upscale_conv = nn.Conv3d(channels, channels * 4 * self.st, 1)
        self.conv = CausalConv3d(channels, channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _unfold(self.upscale_conv(x), self.st)
        if self.st == 2 and self.first_chunk():
            h = torch.cat([h[:, :, :1], h[:, :, 2:]], dim=2)
        return self.conv(h)


class SeedVR2VAE(ldm.Autoencoder):
    """encode: clip in [-1, 1] with 1 + 4k frames -> posterior mean x 0.9152 (core's LATENT);
    decode: that latent -> 1 + 4(t-1) frames in [-1, 1] (not clamped)."""

    def __init__(self, cfg: SeedVR2Config):
        w, n, z, ops = cfg.widths, cfg.layers_per_block, cfg.latent_channels, _ops(cfg)
        last = len(w) - 1
        encoder = decoder = None
        if cfg.has_encoder:
            encoder = ldm.Encoder(w[0], w, n, cfg.in_channels, 2 * z, ops,
                                  downsample=lambda i, c: Downsample(c, cfg.temporal[i]) if i < last else None)
        if cfg.has_decoder:
            # the up-sampler closing decoder level i mirrors the encoder's level i - 1
            decoder = ldm.Decoder(w, n, z, cfg.out_channels, ops,
                                  upsample=lambda i, c: Upsample(c, cfg.temporal[i - 1]) if i else None)
        super().__init__(encoder, decoder)
        self.config = cfg
        self.temporal_ratio = 2 ** sum(cfg.temporal)

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        t, r = x.shape[2], self.temporal_ratio
        if (t - 1) % r and not streaming():      # a stream's later chunks are r*k frames
            raise InputError(f"SeedVR2's VAE encodes 1 + {r}*k frames, got {t}.", input="pixels")
        normalise = lambda z: (z - SHIFT) * SCALE      # noqa: E731
        if posterior:
            return gaussian.normalised(super().encode(x, True), normalise, SCALE)
        return normalise(super().encode(x))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return super().decode(z / SCALE + SHIFT)


def capabilities(cfg: SeedVR2Config) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=2 ** (len(cfg.widths) - 1),
        temporal_ratio=2 ** sum(cfg.temporal), image_channels=cfg.out_channels, has_attention=cfg.mid_attention,
        norm="groupnorm_frame", causal_encoder=True, causal_decoder=True, stream_encode=True,
        stream_decode=True, stream_chunk=1, posterior=True, can_encode=cfg.has_encoder, can_decode=cfg.has_decoder,
        default_tile=512, default_overlap=64, default_tile_frames=64, default_overlap_frames=8,
        working_dtypes=(torch.float16, torch.bfloat16, torch.float32))


def describe(cfg: SeedVR2Config) -> str:
    return spec.describe("SeedVR2 VAE", cfg.latent_channels, cfg.has_encoder, cfg.has_decoder)


# before HunyuanVideo 1.0 (90): the same LDM-shaped names, whose test refuses SeedVR2's resamplers anyway
SPEC = ArchSpec(id="seedvr2", name="SeedVR2 VAE", detect=layout.detect, to_canonical=layout.to_canonical,
                config_from_state_dict=lambda sd, hint=None: layout.config(sd, SeedVR2Config),
                build=SeedVR2VAE, capabilities=capabilities, describe=describe,
                priority=85, latent_hints=((16, 5, "SeedVR2"),))
