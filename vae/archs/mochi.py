"""Mochi 1 video VAE (genmo/mochi-1-preview): 12 latent channels, 8x spatial, 6x temporal
(frames = 1 + 6 (t - 1)).

Canonical layout: genmo's original keys as ComfyUI holds them (``encoder.layers...``,
``decoder.blocks...``); genmo's bare ``encoder.safetensors`` / ``decoder.safetensors`` and diffusers'
``AutoencoderKLMochi`` are converted on load (vae/archs/mochi_layout.py).

Semantics are genmo's: every depth-to-space up block drops its ``t_exp - 1`` leading frames.
diffusers keeps them through the later convs and drops 5 at the end, which changes the first
~15 output frames. Everything is causal in time (first-frame replicate padding, per-frame
GroupNorm, causal temporal attention), and spatial padding is replicate."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..nn import posterior as gaussian
from ..nn.causal import CausalConv3d, depth_to_space
from ..nn.norm import FrameGroupNorm
from ..nn.resnet import ResnetBlock
from ..nn.temporal_attention import TemporalAttentionBlock
from ..run import Seam, Streamable, streaming
from ..spec import ArchSpec, Capabilities
from . import mochi_layout as layout

GROUPS, EPS = 32, 1e-5          # nn.GroupNorm's default eps, as genmo builds its norms
FOURIER_OCTAVES = (6, 7)        # sin/cos(2^f * 2 pi * x) per input channel: 3 -> 15 encoder inputs


@dataclass(frozen=True)
class MochiConfig:
    latent_channels: int = 12
    image_channels: int = 3
    # encoder, in order of application: widths per level, resnets (block_in, each down level,
    # block_out), attention per stage (same indexing), reductions per down level
    enc_widths: tuple[int, ...] = (64, 128, 256, 384)
    enc_blocks: tuple[int, ...] = (3, 3, 4, 6, 3)
    enc_attention: tuple[bool, ...] = (False, True, True, True, True)
    # decoder, in order of application: widths (coarse to fine), resnets (block_in, each up block,
    # block_out), expansions per up block
    dec_widths: tuple[int, ...] = (768, 512, 256, 128)
    dec_blocks: tuple[int, ...] = (3, 6, 4, 3, 3)
    temporal: tuple[int, ...] = (1, 2, 3)     # encoder order; the decoder runs them reversed
    spatial: tuple[int, ...] = (2, 2, 2)
    has_encoder: bool = True
    has_decoder: bool = True


def _conv(cin: int, cout: int) -> CausalConv3d:
    return CausalConv3d(cin, cout, 3, time_pad="causal", spatial_pad="replicate")


def _norm(c: int) -> FrameGroupNorm:
    return FrameGroupNorm(GROUPS, c, eps=EPS)


class ChannelLinear(nn.Linear):
    """A 1x1x1 convolution stored as a Linear (genmo's ``Conv1x1``: weight (out, in))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.movedim(1, -1)).movedim(-1, 1)


class ResBlock(ResnetBlock):
    """The shared resnet block under genmo's key names: ``stack.{0,2,3,5}`` are norm1, conv1,
    norm2, conv2 (genmo's Sequential keeps its SiLUs at 1 and 4), then an optional ``attn_block``."""

    def __init__(self, channels: int, attention: bool = False):
        super().__init__(channels, channels, conv=_conv, norm=_norm)
        stack = nn.Module()
        for idx, name in zip("0235", ("norm1", "conv1", "norm2", "conv2")):
            layer = self._modules.pop(name)
            stack.add_module(idx, layer)
            self.__dict__[name] = layer   # forward reaches it by name; the state dict sees stack.N
        self.stack = stack
        self.attn_block = TemporalAttentionBlock(channels, _norm) if attention else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        return x if self.attn_block is None else self.attn_block(x)


class DownBlock(Seam, nn.Module):
    """Strided causal conv (kernel = stride = (t, s, s)) then resnets; keys ``layers.{0, 1..}``."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, cin: int, cout: int, blocks: int, t: int, s: int, attention: bool):
        super().__init__()
        down = CausalConv3d(cin, cout, (t, s, s), stride=(t, s, s), time_pad="causal", spatial_pad="replicate")
        self.layers = nn.Sequential(down, *(ResBlock(cout, attention) for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class UpBlock(Seam, Streamable, nn.Module):
    """Resnets, a per-voxel projection to C_out * t * s * s channels, depth-to-space; the first
    ``t - 1`` frames are dropped so latent frame 0 gives one frame (genmo). In a stream only the
    first chunk holds them."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, cin: int, cout: int, blocks: int, t: int, s: int):
        super().__init__()
        self.t, self.s = t, s
        self.blocks = nn.Sequential(*(ResBlock(cin) for _ in range(blocks)))
        self.proj = ChannelLinear(cin, cout * t * s * s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = depth_to_space(self.proj(self.blocks(x)), self.t, self.s, self.s)
        if not self.first_chunk(starts=x.shape[2] > 0):     # a later chunk of a stream: nothing to drop
            return x
        return x[:, :, self.t - 1:]


def fourier_features(x: torch.Tensor, octaves=FOURIER_OCTAVES) -> torch.Tensor:
    """[x, sin(w x), cos(w x)] with w = 2^f * 2 pi for each f, channels interleaved per input
    channel (c0f0, c0f1, c1f0, ...). In fp32: at 2^7 * 2 pi, half precision would be noise."""
    xf = x.float()
    w = torch.tensor([2.0 ** f * 2 * math.pi for f in octaves], device=x.device).repeat(x.shape[1])
    h = xf.repeat_interleave(len(octaves), dim=1) * w.view(1, -1, 1, 1, 1)
    return torch.cat([xf, h.sin(), h.cos()], dim=1).to(x.dtype)


class Encoder(nn.Module):
    def __init__(self, cfg: MochiConfig):
        super().__init__()
        w, n, att = cfg.enc_widths, cfg.enc_blocks, cfg.enc_attention
        layers: list[nn.Module] = [ChannelLinear(cfg.image_channels * (1 + 2 * len(FOURIER_OCTAVES)), w[0])]
        layers += [ResBlock(w[0], att[0]) for _ in range(n[0])]
        for i, (t, s) in enumerate(zip(cfg.temporal, cfg.spatial)):
            layers.append(DownBlock(w[i], w[i + 1], n[i + 1], t, s, att[i + 1]))
        layers += [ResBlock(w[-1], att[-1]) for _ in range(n[-1])]
        self.layers = nn.Sequential(*layers)
        self.output_norm = _norm(w[-1])
        self.output_proj = ChannelLinear(w[-1], 2 * cfg.latent_channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(fourier_features(x))
        return self.output_proj(F.silu(self.output_norm(h), inplace=True))


class Decoder(nn.Module):
    def __init__(self, cfg: MochiConfig):
        super().__init__()
        w, n = cfg.dec_widths, cfg.dec_blocks
        blocks: list[nn.Module] = [nn.Sequential(nn.Conv3d(cfg.latent_channels, w[0], 1),
                                                 *(ResBlock(w[0]) for _ in range(n[0])))]
        for i, (t, s) in enumerate(zip(reversed(cfg.temporal), reversed(cfg.spatial))):
            blocks.append(UpBlock(w[i], w[i + 1], n[i + 1], t, s))
        blocks.append(nn.Sequential(*(ResBlock(w[-1]) for _ in range(n[-1]))))
        self.blocks = nn.ModuleList(blocks)
        self.output_proj = ChannelLinear(w[-1], cfg.image_channels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            z = block(z)
        return self.output_proj(F.silu(z, inplace=True))


class MochiVAE(nn.Module):
    """encode: pixels in [-1, 1], (B, 3, 1 + 6k, H, W) -> the posterior mode, raw (ComfyUI applies
    Mochi's latent mean/std in its latent format, not in the VAE); decode: raw latent -> pixels."""

    def __init__(self, cfg: MochiConfig):
        super().__init__()
        self.config = cfg
        if cfg.has_encoder:
            self.encoder = Encoder(cfg)
        if cfg.has_decoder:
            self.decoder = Decoder(cfg)

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        r, s = math.prod(self.config.temporal), math.prod(self.config.spatial)
        t, h, w = x.shape[2:]
        if ((t - 1) % r and not streaming()) or h % s or w % s:
            raise InputError(
                f"Mochi encodes clips of 1 + {r}k frames with sides divisible by {s}; got {t} frames of {w}x{h}.",
                input="pixels", fix=f"trim to {(t - 1) // r * r + 1} frames and crop to {w // s * s}x{h // s * s}.")
        # (mean, logvar) in channels: the mode is the mean
        moments = self.encoder(x)
        return gaussian.from_moments(moments) if posterior else moments[:, : self.config.latent_channels]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)


def capabilities(cfg: MochiConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=math.prod(cfg.spatial),
        temporal_ratio=math.prod(cfg.temporal), image_channels=cfg.image_channels,
        has_attention=cfg.has_encoder and any(cfg.enc_attention), norm="groupnorm_frame",
        # causal convs (first-frame padding), per-frame norms, causal attention: latent i sees frames <= 6i
        causal_encoder=True, causal_decoder=True, stream_encode=True, stream_decode=True,
        posterior=True, can_encode=cfg.has_encoder, can_decode=cfg.has_decoder,
        default_tile=256, default_overlap=64, default_tile_frames=48, default_overlap_frames=12,
        working_dtypes=(torch.bfloat16, torch.float32))


def describe(cfg: MochiConfig) -> str:
    part = "" if cfg.has_encoder and cfg.has_decoder else (", encoder only" if cfg.has_encoder else ", decoder only")
    return f"Mochi VAE ({cfg.latent_channels} latent channels{part})"


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> MochiConfig:
    return MochiConfig(**layout.config_fields(sd))


# before TAESD: genmo's encoder keys (`encoder.layers.0.weight`) also match tiny.detect
SPEC = ArchSpec(id="mochi", name="Mochi VAE", detect=layout.detect, to_canonical=layout.to_canonical,
                config_from_state_dict=config_from_state_dict, build=MochiVAE,
                capabilities=capabilities, describe=describe,
                priority=30, latent_hints=((12, 5, "Mochi"),))
