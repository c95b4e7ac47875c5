"""Wan's video VAEs: Wan 2.1 (also Wan 2.2-14B, Qwen-Image, Cosmos-Predict2; 16 latent channels,
8x spatial) and Wan 2.2 (48 channels, 16x: a 2x2 patchify around residual up/down levels). Both are
4x temporal, 1 + 4(t-1) frames. And one image VAE built the same way: Qwen-Image 2.1's (below).

Definition. The reference (Wan's repo, ComfyUI, diffusers) always runs the clip in chunks through
per-conv caches: encode = the first frame alone, then 4 frames at a time; decode = one latent frame
at a time. Every norm is per voxel (an L2 norm over channels) and every conv causal with zero time
padding, so one pass equals the chunked result as long as the temporal resamplers keep the rules the
chunking implies, which is how they are written here:
- down (encoder): the first frame passes on alone; a stride-2 time conv with no padding runs over the
  whole clip, first frame included (windows [0, 1, 2], [2, 3, 4], ...);
- up (decoder): the first frame passes on alone; every later frame goes through a causal time conv
  (zero padding, the first frame excluded) to 2C channels that become two frames (the first C
  channels the earlier one);
- Wan 2.2's level shortcuts: space-to-depth averages (time padded with zeros in front to even) and
  channel-repeat depth-to-space whose first frame is dropped in the clip's first chunk.
In a stream these rules hold per stream (vae/run.py): the first chunk is the clip's start.

Blocks shared with the other families: the LDM skeleton (vae/archs/ldm.py: levels, mid block with
attention, head), the residual block (vae/nn/resnet.py), causal convs (vae/nn/causal.py), per-frame
attention (vae/nn/attention.py), the channel L2 norm (vae/nn/norm.py). Key layouts: wan_layout.py.
Every width is read from the weights, so narrower (pruned) variants and encoder- or decoder-only
files load; RGBA variants (Qwen-Image-Layered, Wan-Alpha) have 4 image channels.

Qwen-Image 2.1 is Wan 2.2's network (level shortcuts; 5 levels, 64 latent channels, 16x, RGBA, no
patches) with a temporal kernel of 1, run on one frame only: ComfyUI builds it with its Wan 2.2 class
(``temporal_kernel=1``) and gives it 4-D image batches, diffusers' ``AutoencoderKLQwenImage21`` folds
the frame away. So here it is the same family with 2-D modules (``WanConfig.image``): 3x3 convs, the
channel L2 norm per pixel, attention over the image, the level shortcuts of a one-frame clip. On one
frame the references never run a temporal resampler's time conv (the first frame passes on alone), so
its weights are held but not used; a temporal level's shortcut still counts the zero frame its time
padding adds (down: half the average; up: the second of the two frames a latent frame becomes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..nn.attention import FrameSelfAttention, SpatialSelfAttention
from ..nn.causal import CausalConv3d, depth_to_space, frames, patchify, space_to_depth, unframes, unpatchify
from ..nn.norm import ChannelL2Norm
from ..nn.resnet import conv2d_1x1, conv2d_3x3
from ..run import Seam, Streamable, streaming
from .. import spec
from ..spec import ArchSpec, Capabilities
from . import ldm
from . import wan_layout as layout


@dataclass(frozen=True)
class WanConfig:
    latent_channels: int
    image_channels: int = 3
    patch: int = 1                         # Wan 2.2: 2x2 patches of pixels in channels
    residual: bool = False                 # Wan 2.2: level shortcuts (space-to-depth / depth-to-space)
    enc_base: int = 96                     # encoder conv_in width
    enc_widths: tuple[int, ...] = ()       # per level, fine to coarse
    enc_blocks: int = 2
    dec_mid: int = 384                     # decoder conv_in / mid width
    dec_widths: tuple[int, ...] = ()       # per level, fine to coarse
    dec_up: tuple[int, ...] = ()           # per level: the up-sampler's output width (0: none)
    dec_blocks: int = 2                    # resnets per decoder level - 1 (as ldm counts them)
    temporal: tuple[bool, ...] = ()        # per level: its down-sampler (and the mirrored up-sampler) is 3-D
    image: bool = False                    # a temporal kernel of 1, images only (Qwen-Image 2.1): 2-D modules

    @property
    def has_encoder(self) -> bool:
        return bool(self.enc_widths)

    @property
    def has_decoder(self) -> bool:
        return bool(self.dec_widths)

    @property
    def levels(self) -> int:
        return len(self.enc_widths or self.dec_widths)


def _conv(cin: int, cout: int) -> nn.Module:
    return CausalConv3d(cin, cout, 3, time_pad="causal_zeros")


def _ops(image: bool) -> ldm.Ops:
    if image:
        return ldm.Ops(conv=conv2d_3x3, shortcut=conv2d_1x1, norm=lambda c: ChannelL2Norm(c, dims=2),
                       attention=lambda c: SpatialSelfAttention(c, norm=ChannelL2Norm(c, dims=2)))
    return ldm.Ops(conv=_conv, shortcut=lambda i, o: nn.Conv3d(i, o, 1), norm=ChannelL2Norm,
                   attention=lambda c: FrameSelfAttention(c, norm=ChannelL2Norm(c, dims=2)))


def _time_conv(cin: int, cout: int, image: bool, **kw) -> nn.Module:
    """A temporal resampler's (3, 1, 1) conv; an image variant's (1, 1, 1) one held as the 1x1 it is
    (its weights load; one frame never runs it)."""
    return nn.Conv2d(cin, cout, 1) if image else CausalConv3d(cin, cout, (3, 1, 1), **kw)


class Downsample(Seam, Streamable, nn.Module):
    """Per frame: zero pad right/bottom, 3x3 conv of stride 2. Temporal levels then halve time: the
    clip's first frame passes on, a (3, 1, 1) conv of stride 2 runs over every frame (no padding).
    An image (4-D) is a first frame: the conv alone."""

    exact_boundary = True     # nothing else is live across it (but see ResidualLevel)

    def __init__(self, channels: int, temporal: bool, image: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)
        self.time_conv = _time_conv(channels, channels, image, stride=(2, 1, 1), time_pad="valid") \
            if temporal else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4:
            return self.conv(F.pad(x, (0, 1, 0, 1)))
        x = unframes(self.conv(F.pad(frames(x), (0, 1, 0, 1))), x.shape[0])
        if self.time_conv is None:
            return x
        first = x[:, :, :1] if self.first_chunk() else x[:, :, :0]     # in a stream: the first chunk's
        return torch.cat([first, self.time_conv(x)], dim=2)


class Upsample(Seam, Streamable, nn.Module):
    """Temporal levels first double time: the clip's first frame passes on, every later frame goes
    through a causal (3, 1, 1) conv to 2C channels, i.e. two frames. Then per frame: nearest 2x and a
    3x3 conv to ``out_channels`` (Wan 2.1 halves the width here). An image (4-D) is a first frame."""

    exact_boundary = True

    def __init__(self, channels: int, out_channels: int, temporal: bool, image: bool = False):
        super().__init__()
        self.out_channels = out_channels
        self.time_conv = _time_conv(channels, 2 * channels, image, time_pad="causal_zeros") if temporal else None
        self.conv = nn.Conv2d(channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4:
            return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        if self.time_conv is not None:
            first, rest = (x[:, :, :1], x[:, :, 1:]) if self.first_chunk() else (x[:, :, :0], x)
            y = self.time_conv(rest)
            b, c2, t, h, w = y.shape
            y = y.unflatten(1, (2, c2 // 2)).permute(0, 2, 3, 1, 4, 5).reshape(b, c2 // 2, 2 * t, h, w)
            x = torch.cat([first, y], dim=2)
        y = self.conv(F.interpolate(frames(x), scale_factor=2.0, mode="nearest"))
        return unframes(y, x.shape[0])


class ResidualLevel(Seam, Streamable, ldm.Level):
    """Wan 2.2's level: resnets and resampler plus a parameter-free shortcut from the level's input.
    Down: space-to-depth of the input (time zero-padded in front to a multiple of the factor), channel
    groups averaged. Up: channels repeated, depth-to-space, the first ``ft - 1`` frames dropped in the
    clip's first chunk. The input is live across the inner blocks, so only the level is a re-cut point.
    An image (4-D) takes the shortcut of a one-frame clip."""

    exact_boundary = True

    def __init__(self, index: int, blocks: list, resample: Optional[nn.Module], name: str, cin: int, cout: int,
                 ft: int, fs: int):
        super().__init__(index, blocks, resample, name)
        for m in [*blocks, resample]:
            if m is not None:
                m.exact_boundary = False
        self.cin, self.cout, self.ft, self.fs = cin, cout, ft, fs
        self.up = name == "upsample"

    def steps(self) -> list[nn.Module]:
        return [self]       # the shortcut reads the level's input after its blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        if x.dim() == 4:
            return y.add_(self._skip(x.unsqueeze(2)).squeeze(2))
        return y.add_(self._skip(x))

    def _skip(self, x: torch.Tensor) -> torch.Tensor:
        ft, fs = self.ft, self.fs
        if self.up:
            skip = depth_to_space(x.repeat_interleave(self.cout * ft * fs * fs // self.cin, dim=1), ft, fs, fs)
            return skip[:, :, ft - 1:] if self.first_chunk() else skip
        pad = -x.shape[2] % ft
        x = F.pad(x, (0, 0, 0, 0, pad, 0)) if pad else x
        return space_to_depth(x, ft, fs, fs).unflatten(1, (self.cout, -1)).mean(2)


def _residual(encoder: bool, cfg: WanConfig) -> ldm.LevelFactory:
    def level(i: int, blocks: list, resample: Optional[nn.Module], name: str) -> nn.Module:
        if not cfg.residual or (not encoder and resample is None):   # the finest decoder level has none
            return ldm.Level(i, blocks, resample, name)
        cin, cout = blocks[0].conv1.in_channels, blocks[-1].conv2.out_channels
        ft = 2 if resample is not None and resample.time_conv is not None else 1
        return ResidualLevel(i, blocks, resample, name, cin, cout, ft, 2 if resample is not None else 1)
    return level


class WanVAE(ldm.Autoencoder):
    """encode: clip in [-1, 1], 1 + 4k frames -> the posterior mean (raw latent; Wan's per-channel
    mean/std are ComfyUI's latent format's business); decode: raw latent -> 1 + 4(t-1) frames.
    An image variant (``cfg.image``) takes and gives 4-D images and latents."""

    def __init__(self, cfg: WanConfig):
        ops, n, z, image = _ops(cfg.image), cfg.levels, cfg.latent_channels, cfg.image
        px = cfg.image_channels * cfg.patch ** 2
        encoder = decoder = None
        if cfg.has_encoder:
            encoder = ldm.Encoder(cfg.enc_base, cfg.enc_widths, cfg.enc_blocks, px, 2 * z, ops,
                                  downsample=lambda i, c: Downsample(c, cfg.temporal[i], image) if i < n - 1 else None,
                                  level=_residual(True, cfg))
        if cfg.has_decoder:
            decoder = ldm.Decoder(cfg.dec_widths, cfg.dec_blocks, z, px, ops, mid_width=cfg.dec_mid,
                                  upsample=lambda i, c: Upsample(c, cfg.dec_up[i], cfg.temporal[i - 1], image) if i else None,
                                  level=_residual(False, cfg))
        quant = nn.Conv2d if image else nn.Conv3d
        super().__init__(encoder, decoder, quant(2 * z, 2 * z, 1) if encoder else None,
                         quant(z, z, 1) if decoder else None)
        self.config = cfg
        self.temporal_ratio = 2 ** sum(cfg.temporal)

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        if self.config.image:
            return super().encode(x, posterior)
        t, r = x.shape[2], self.temporal_ratio
        if (t - 1) % r and not streaming():      # a stream's later chunks are r*k frames
            raise InputError(f"Wan encodes 1 + {r}*k frames, got {t}.", input="pixels")
        return super().encode(patchify(x, self.config.patch), posterior)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return unpatchify(super().decode(z), self.config.patch)


def capabilities(cfg: WanConfig) -> Capabilities:
    if cfg.image:       # an image VAE to users, as to core (latent_dim 2): no time axis, nothing to stream
        return Capabilities(
            latent_channels=cfg.latent_channels, spatial_ratio=2 ** (cfg.levels - 1) * cfg.patch,
            image_channels=cfg.image_channels, has_attention=True, norm="rms", posterior=True,
            can_encode=cfg.has_encoder, can_decode=cfg.has_decoder, default_tile=512, default_overlap=64,
            working_dtypes=(torch.bfloat16, torch.float16, torch.float32))
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=2 ** (cfg.levels - 1) * cfg.patch,
        temporal_ratio=2 ** sum(cfg.temporal), image_channels=cfg.image_channels, has_attention=True,
        norm="rms", causal_encoder=True, causal_decoder=True, stream_encode=True, stream_decode=True,
        stream_chunk=1, posterior=True, can_encode=cfg.has_encoder, can_decode=cfg.has_decoder,
        default_tile=512, default_overlap=64, default_tile_frames=64, default_overlap_frames=8,
        working_dtypes=(torch.bfloat16, torch.float32))


def describe(cfg: WanConfig) -> str:
    name = "Qwen-Image 2.1 VAE" if cfg.image else "Wan 2.2 VAE" if cfg.residual else "Wan 2.1 VAE"
    notes = [f"{cfg.image_channels} image channels"] if cfg.image_channels != 3 else []
    return spec.describe(name, cfg.latent_channels, cfg.has_encoder, cfg.has_decoder, *notes)


SPEC = ArchSpec(id="wan", name="Wan VAE", detect=layout.detect, to_canonical=layout.to_canonical,
                config_from_state_dict=lambda sd, hint=None: layout.config(sd, WanConfig), build=WanVAE,
                capabilities=capabilities, describe=describe,
                priority=20, latent_hints=((16, 5, "Wan 2.1/Qwen-Image"), (48, 5, "Wan 2.2"),
                                           (64, 4, "Qwen-Image 2.1")))
