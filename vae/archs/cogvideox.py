"""CogVideoX VAE (THUDM/CogVideo's ``sat/vae_modules``; diffusers ``AutoencoderKLCogVideoX``; ComfyUI
``comfy/ldm/cogvideo/vae.py``): 16 latent channels, 8x spatial, 4x temporal. CogVideoX 2B, 5B, 5B-I2V and
1.5-5B ship the same structure; only the latent scale differs, which is the sampler's latent format.

The LDM skeleton (``ldm.py``) with causal 3-D convolutions (time padded with first-frame copies, space
with zeros), GroupNorm (32 groups, eps 1e-6) over every frame of a pass, 2-D resamplers applied frame by
frame (a zero-padded stride-2 conv down, nearest x2 and a conv up) that also halve / double time on the
two outer levels: frame pairs are averaged (down) or frames repeated (up), and in a pass of an odd
count of frames the first frame is kept alone. The decoder's norms are conditioned on the latent
(``SpatialNorm``: GroupNorm(f) * conv_y(z) + conv_b(z), z nearest-upsampled to f's frames and pixels).
Here the latent travels with the decoder's activations as their last channels and is upsampled with
them, so each norm finds it at its own resolution and extent (a stream chunk, an exact tile's halo)
with no side input.

Definition: the original's, which depends on how frames are grouped into passes, since GroupNorm takes
statistics over a pass and the resamplers' first-frame rule applies per pass.
- Decode: passes ("batches") of two latent frames, the first taking the t % 2 left over (an odd t:
  3, then 2, 2, ...), causal caches carried from batch to batch; THUDM's sample script decodes so and
  diffusers' port too. ``decode`` batches a whole latent itself; the engines stream exactly these batches
  (``Capabilities.stream_batches``). An even t has no lone first frame: it decodes to 4t frames.
- Encode: one pass over the clip, as the original encodes (``encode_first_stage``): GroupNorm over the
  whole clip.
ComfyUI groups otherwise (its decode runs the low-resolution half over the whole clip and the rest in
4-frame chunks; its encode runs the T % 8 leftover frames first, then 8 at a time), and diffusers encodes
8-frame batches (the first with T % 8 more): where their passes differ from the original's, so do their
numbers (docs/families/cogvideox.md).

Latents are raw (the 1.15258426 / 0.7 scaling is ComfyUI's latent format, not the VAE's). Widths, depth
and channels come from the weights; the two time levels and the norm's 32 groups are the published
config's (they leave no trace in the weights). Key layouts: cogvideox_layout.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import spec
from ..nn.causal import CausalConv3d, frames, unframes
from ..nn.norm import GroupNorm
from ..nn.resnet import ResnetBlock
from ..nn.sampling import Downsample2x, Upsample2x
from ..run import Streamable, stream, streaming
from ..spec import ArchSpec, Capabilities
from . import cogvideox_layout as layout
from . import ldm
from .hunyuan_video import _nearest

GROUPS, EPS = 32, 1e-6
TIME_LEVELS = 2     # the outer levels that also resample time (log2 of the published ratio 4)
BATCH = 2           # latent frames a decode pass takes after the first


@dataclass(frozen=True)
class CogVideoXConfig:
    widths: tuple[int, ...] = (128, 256, 256, 512)    # block_out_channels, finest level first
    layers_per_block: int = 3                         # encoder resnets per level (the decoder has one more)
    latent_channels: int = 16
    in_channels: int = 3
    out_channels: int = 3
    has_encoder: bool = True
    has_decoder: bool = True

    @property
    def ratios(self) -> tuple[int, int]:
        """(spatial, temporal) compression: every level but the last resamples."""
        levels = len(self.widths) - 1
        return 2 ** levels, 2 ** min(TIME_LEVELS, levels)


def _conv(cin: int, cout: int) -> CausalConv3d:
    return CausalConv3d(cin, cout, 3, time_pad="causal", spatial_pad="zeros")


def _join(h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The decoder's activations with the latent as their last channels."""
    return torch.cat([h, z], dim=1)


def _lone(t: int) -> int:
    """Frames kept alone at the start of a pass of ``t`` frames: the first one when ``t`` is odd."""
    return t % 2


class Downsample(Downsample2x):
    """Per frame: pad right and bottom, 3x3 stride-2 conv (the KL down-sampler); on a time level first
    the mean of each pair of frames, an odd pass's first frame kept alone."""

    def __init__(self, channels: int, temporal: bool):
        super().__init__(channels)
        self.temporal = temporal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.temporal:
            k = _lone(x.shape[2])
            x = torch.cat([x[:, :, :k], x[:, :, k:].unflatten(2, (-1, 2)).mean(3)], dim=2)
        return unframes(super().forward(frames(x)), x.shape[0])


class Upsample(Upsample2x):
    """Nearest x2 in space (and in time on a time level, an odd pass's first frame kept alone), then a
    3x3 conv per frame on the activations; the latent channels are upsampled alike and passed on."""

    def __init__(self, channels: int, temporal: bool):
        super().__init__(channels)
        self.temporal = temporal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = _lone(x.shape[2]) if self.temporal else x.shape[2]
        x = torch.cat([_nearest(x[:, :, :k], 1, 2, 2), _nearest(x[:, :, k:], 2, 2, 2)], dim=2)
        c = self.conv.in_channels
        return _join(unframes(self.conv(frames(x[:, :c])), x.shape[0]), x[:, c:])


class SpatialNorm(nn.Module):
    """GroupNorm of ``f`` scaled and shifted per voxel by 1x1x1 convs of the latent ``z`` at f's size
    (keys ``norm_layer``, ``conv_y``, ``conv_b``). Called with one tensor, its last channels are z."""

    def __init__(self, channels: int, latent: int):
        super().__init__()
        self.norm_layer = GroupNorm(GROUPS, channels, eps=EPS)
        self.conv_y = nn.Conv3d(latent, channels, 1)
        self.conv_b = nn.Conv3d(latent, channels, 1)

    def forward(self, f: torch.Tensor, z: Optional[torch.Tensor] = None) -> torch.Tensor:
        if z is None:
            f, z = f[:, : self.norm_layer.num_channels], f[:, self.norm_layer.num_channels:]
        return self.norm_layer(f).mul_(self.conv_y(z)).add_(self.conv_b(z))


class ConditionedResnet(ResnetBlock):
    """The shared resnet block on the decoder's activations-plus-latent: its norms are ``SpatialNorm``s
    of the latent channels, which it passes on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.norm1.norm_layer.num_channels
        x, z = x[:, :c], x[:, c:]
        h = self.conv1(F.silu(self.norm1(x, z), inplace=True))
        h = F.silu(self.norm2(h, z), inplace=True)      # conv1's output goes before conv2 runs
        h = self.conv2(h)
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return _join(h.add_(skip), z)


class LatentIn(CausalConv3d):
    """The decoder's ``conv_in``, with the latent joined to its output (what the norms read)."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return _join(super().forward(z), z)


class CogVideoXVAE(Streamable, ldm.Autoencoder):
    """encode: (B, 3, 1+4k, H, W) in [-1, 1] -> raw latent mode (B, 16, 1+k, H/8, W/8), one pass;
    decode: raw latent (B, 16, t, h, w) -> (B, 3, 1+4(t-1) (t odd) or 4t (t even), 8h, 8w) in [-1, 1]
    (not clamped), in the reference's batches."""

    def __init__(self, cfg: CogVideoXConfig):
        w, n, z = cfg.widths, cfg.layers_per_block, cfg.latent_channels
        last = len(w) - 1
        shortcut = lambda cin, cout: nn.Conv3d(cin, cout, 1)                                    # noqa: E731
        encoder = decoder = None
        if cfg.has_encoder:
            ops = ldm.Ops(conv=_conv, shortcut=shortcut, norm=lambda c: GroupNorm(GROUPS, c, eps=EPS),
                          attention=lambda c: None)
            encoder = ldm.Encoder(w[0], w, n, cfg.in_channels, 2 * z, ops, downsample=lambda i, c: (
                Downsample(c, i < TIME_LEVELS) if i < last else None))
        if cfg.has_decoder:
            ops = ldm.Ops(conv=_conv, shortcut=shortcut, norm=lambda c: SpatialNorm(c, z),
                          attention=lambda c: None, block=ConditionedResnet)
            decoder = ldm.Decoder(w, n, z, cfg.out_channels, ops, upsample=lambda i, c: (
                Upsample(c, i > last - TIME_LEVELS) if i > 0 else None))
            decoder.conv_in = LatentIn(z, w[-1], 3, time_pad="causal", spatial_pad="zeros")   # same keys
        super().__init__(encoder, decoder)
        self.config = cfg

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """The latent in the reference's batches (the first of 2 + t % 2 frames, then 2), caches carried
        from one to the next. In a stream (the engines send exactly these batches) this call continues the
        clip: its first batch is the clip's only in the stream's first call."""
        if not streaming():
            with stream():
                return self._batches(z, first=True)
        return self._batches(z, first=self.first_chunk())

    def _batches(self, z: torch.Tensor, first: bool) -> torch.Tensor:
        t = z.shape[2]
        size = BATCH + t % BATCH if first else BATCH
        out, a = [], 0
        while a < t:
            b = min(t, a + size)
            out.append(self.decoder(z[:, :, a:b]))
            a, size = b, BATCH
        return out[0] if len(out) == 1 else torch.cat(out, dim=2)


def capabilities(cfg: CogVideoXConfig) -> Capabilities:
    spatial, temporal = cfg.ratios
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=spatial, temporal_ratio=temporal,
        image_channels=cfg.out_channels, norm="groupnorm_clip",
        # a decode batch's GroupNorm sees all its frames, so frames of a batch depend on each other: not
        # causal, but streamed in the reference's own batches; encode is one pass over the clip
        causal_encoder=False, causal_decoder=False, stream_decode=True, stream_chunk=BATCH, stream_batches=True,
        first_frame_odd_only=True, posterior=True, can_encode=cfg.has_encoder, can_decode=cfg.has_decoder,
        default_tile=256, default_overlap=64, default_tile_frames=16, default_overlap_frames=4,
        working_dtypes=(torch.bfloat16, torch.float16, torch.float32))


def describe(cfg: CogVideoXConfig) -> str:
    return spec.describe("CogVideoX VAE", cfg.latent_channels, cfg.has_encoder, cfg.has_decoder)


SPEC = ArchSpec(id="cogvideox", name="CogVideoX VAE", detect=layout.detect, to_canonical=layout.to_canonical,
                config_from_state_dict=lambda sd, hint=None: CogVideoXConfig(**layout.config_fields(sd)),
                build=CogVideoXVAE, capabilities=capabilities, describe=describe,
                priority=90, latent_hints=((16, 5, "CogVideoX"),))
