"""Cosmos-1's continuous video tokenizer (NVIDIA Cosmos-Tokenizer CV8x8x8, the VAE of ComfyUI's Cosmos-1
models; ComfyUI ``comfy/ldm/cosmos/vae.py``; diffusers ``AutoencoderKLCosmos``): 16 latent channels, 8x in
space and in time, 1 + 8(t-1) frames. Cosmos-Predict2 and later use the Wan 2.1 VAE (vae/archs/wan.py).

The LDM skeleton (``ldm.py``) between a 3-D Haar wavelet patch (vae/nn/wavelet.py: 4x4x4 pixels -> 192
channels, the clip's first frame repeated to a group of 4 first) and its inverse (which drops the 3 copies
again). Every conv is causal in time (first-frame copies in front, zeros around space) and most are
factorized: a 1x3x3 conv in space, then a 3x1x1 conv in time. Norms are GroupNorm with one group per
frame (a LayerNorm over C, H, W of each frame, eps 1e-6). The mid blocks' attention is two blocks: one
head over the pixels of each frame, then one head over time, per pixel, causal (a frame sees itself and
the frames before it). One level halves space and time (encoder) and its mirror doubles them (decoder):
a stride-2 conv plus a 2x average pool in space, then in time (the clip's first frame alone, the others
in pairs); nearest-neighbour repeats plus convs up (the first frame once, the others twice).

Every part is causal in time and normalised per frame, and the time attention keeps its keys and values
from earlier chunks, so a clip streams chunk by chunk with the one-pass result (encode: the first frame,
then groups of 8; decode: any latent chunks). Spatial tiles meet at every norm (per-frame statistics)
and at the frame attention (latent resolution); the time attention is per pixel.

LATENTs are ComfyUI's (and diffusers' pipelines'): the tokenizer's latent z normalised per channel and
latent frame, ``(z - mean[c, t % 16]) / std[c, t % 16] * 0.5`` (``sigma_data``), from the file's
``latent_mean`` / ``latent_std`` (ComfyUI's file; others get the published ones, cosmos_layout.py). The
table depends on the frame's index in the clip, so it runs on the whole latent: ``prepare_decode`` before
tiling, ``finish_encode`` after. Key layouts: cosmos_layout.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import spec
from ..errors import InputError
from ..nn.attention import FrameSelfAttention
from ..nn.causal import CausalConv3d
from ..nn.norm import FrameGroupNorm, GroupNorm
from ..nn.temporal_attention import TemporalAttentionBlock
from ..nn.wavelet import haar, inverse_haar
from ..run import Seam, Streamable, streaming
from ..spec import ArchSpec, Capabilities
from . import cosmos_layout as layout
from . import ldm

EPS = 1e-6
SIGMA_DATA = 0.5      # ComfyUI's and diffusers' LATENT scale (the Cosmos-1 diffusion models' sigma_data)


@dataclass(frozen=True)
class CosmosConfig:
    widths: tuple[int, ...] = (256, 512, 512)           # encoder levels, finest first
    decoder_widths: tuple[int, ...] = (256, 512, 512)   # decoder levels, finest first (the mid block: the last)
    base: int = 128                  # the encoder's conv_in width
    layers_per_block: int = 2        # encoder resnets per level (the decoder has one more)
    latent_channels: int = 16
    patch: int = 4                   # wavelet patch: pixels per side and frames per group
    resample_levels: int = 1         # levels that halve space and time (the first of the encoder)
    statistics: str = "published"    # the latent statistics: "file", "published" (CV8x8x8-1.0's) or "none"
    stat_frames: int = 16            # latent frames the statistics table covers (then it repeats)
    has_encoder: bool = True
    has_decoder: bool = True

    @property
    def ratio(self) -> int:
        """Compression in space and in time alike."""
        return self.patch * 2 ** self.resample_levels


def _conv(cin: int, cout: int) -> nn.Sequential:
    """The factorized conv: 1x3x3 in space, then 3x1x1 in time (keys ``0``, ``1``)."""
    return nn.Sequential(CausalConv3d(cin, cout, (1, 3, 3)), CausalConv3d(cout, cout, (3, 1, 1)))


def _norm(c: int) -> nn.Module:
    return FrameGroupNorm(1, c, eps=EPS)


def _attention(c: int) -> nn.Sequential:
    """Over the pixels of each frame, then over time (per pixel, causal), one head each."""
    return nn.Sequential(FrameSelfAttention(c, norm=GroupNorm(1, c, eps=EPS)),
                         TemporalAttentionBlock(c, _norm, head_dim=c, qkv_bias=True, qk_norm=False, causal=True))


class Downsample(Seam, Streamable, nn.Module):
    """Halves space (a stride-2 1x3x3 conv after zero padding right and bottom, plus a 2x2 average), then
    time (a stride-2 causal 3x1x1 conv, plus the mean of each pair of frames, the clip's first frame alone),
    then a 1x1x1 conv. In a stream only the first chunk has the lone first frame."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = CausalConv3d(channels, channels, (1, 3, 3), stride=(1, 2, 2), spatial_padding=0)
        self.conv2 = CausalConv3d(channels, channels, (3, 1, 1), stride=(2, 1, 1))
        self.conv3 = nn.Conv3d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (0, 1, 0, 1))
        x = self.conv1(x) + F.avg_pool3d(x, (1, 2, 2), (1, 2, 2))
        pairs = torch.cat([x[:, :, :1], x], dim=2) if self.first_chunk() else x
        if pairs.shape[2] % 2:
            raise RuntimeError(f"a clip chunk of {x.shape[2]} frames does not split into the pairs time is halved in")
        return self.conv3(self.conv2(x) + pairs.unflatten(2, (-1, 2)).mean(3))


class Upsample(Seam, Streamable, nn.Module):
    """Doubles time (every frame repeated but the clip's first, plus a causal 3x1x1 conv), then space
    (nearest neighbour, plus a 1x3x3 conv), then a 1x1x1 conv. In a stream only the first chunk keeps one."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = CausalConv3d(channels, channels, (3, 1, 1))
        self.conv2 = CausalConv3d(channels, channels, (1, 3, 3))
        self.conv3 = nn.Conv3d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = 1 if self.first_chunk() else 0
        x = torch.cat([x[:, :, :keep], x[:, :, keep:].repeat_interleave(2, dim=2)], dim=2)
        x = self.conv1(x) + x
        x = F.interpolate(x, scale_factor=(1, 2, 2), mode="nearest")
        return self.conv3(self.conv2(x) + x)


class Patcher(Streamable, nn.Module):
    """Pixels -> wavelet coefficients: the clip's first frame repeated ``p`` times (a stream's first chunk
    only), then log2(p) levels of the 3-D Haar transform."""

    def __init__(self, patch: int):
        super().__init__()
        self.patch, self.levels = patch, patch.bit_length() - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first_chunk():
            x = torch.cat([x[:, :, :1].expand(-1, -1, self.patch - 1, -1, -1), x], dim=2)
        return haar(x, self.levels)


class Unpatcher(Patcher):
    """Wavelet coefficients -> pixels: the inverse transform, less the first frame's ``p - 1`` copies."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = inverse_haar(x, self.levels)
        return x[:, :, self.patch - 1:] if self.first_chunk() else x


class CosmosVAE(ldm.Autoencoder):
    """encode: (B, 3, 1+8k, H, W) in [-1, 1] -> the tokenizer's latent z (B, 16, 1+k, H/8, W/8); decode: z ->
    (B, 3, 1+8(t-1), 8h, 8w) in [-1, 1] (not clamped). ``finish_encode`` / ``prepare_decode``: z <-> the LATENT,
    or z unchanged where ``raw_latents`` (set_raw_latents)."""

    raw_latents = False

    def __init__(self, cfg: CosmosConfig):
        z, pixels, n = cfg.latent_channels, 3 * cfg.patch ** 3, cfg.resample_levels
        ops = ldm.Ops(conv=_conv, shortcut=lambda cin, cout: nn.Conv3d(cin, cout, 1), norm=_norm, attention=_attention)
        encoder = decoder = quant = post = None
        if cfg.has_encoder:
            encoder = ldm.Encoder(cfg.base, cfg.widths, cfg.layers_per_block, pixels, z, ops,
                                  downsample=lambda i, c: Downsample(c) if i < n else None)
            quant = nn.Conv3d(z, z, 1)
        if cfg.has_decoder:
            last = len(cfg.decoder_widths) - 1
            decoder = ldm.Decoder(cfg.decoder_widths, cfg.layers_per_block, z, pixels, ops,
                                  upsample=lambda i, c: Upsample(c) if last - n <= i < last else None)
            post = nn.Conv3d(z, z, 1)
        super().__init__(encoder, decoder, quant, post)
        self.config = cfg
        self.patcher, self.unpatcher = Patcher(cfg.patch), Unpatcher(cfg.patch)
        self.register_buffer("latent_mean", torch.zeros(z * cfg.stat_frames))
        self.register_buffer("latent_std", torch.ones(z * cfg.stat_frames))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        r, (t, h, w) = self.config.ratio, x.shape[2:]
        if ((t - 1) % r and not streaming()) or h % r or w % r:
            raise InputError(f"the Cosmos tokenizer encodes clips of 1 + {r}k frames with sides divisible by {r}; "
                             f"got {t} frames of {w}x{h}.", input="pixels",
                             fix=f"trim to {(t - 1) // r * r + 1} frames and crop to {w // r * r}x{h // r * r}.")
        return self.quant_conv(self.encoder(self.patcher(x)))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.unpatcher(self.decoder(self.post_quant_conv(z)))

    def _statistics(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std per channel and latent frame of ``z`` (float32): frame i takes column i % stat_frames."""
        c, t = z.shape[1], z.shape[2]
        column = torch.arange(t, device=z.device) % self.config.stat_frames

        def table(v: torch.Tensor) -> torch.Tensor:
            return v.to(z.device, torch.float32).view(c, -1)[:, column].view(1, c, t, 1, 1)
        return table(self.latent_mean), table(self.latent_std)

    def prepare_decode(self, z: torch.Tensor) -> torch.Tensor:
        if self.raw_latents:
            return z
        mean, std = self._statistics(z)
        return torch.addcmul(mean, z.float() / SIGMA_DATA, std).to(z.dtype)

    def finish_encode(self, z: torch.Tensor) -> torch.Tensor:
        if self.raw_latents:
            return z
        mean, std = self._statistics(z)
        return (z.float() - mean).div_(std).mul_(SIGMA_DATA).to(z.dtype)


def set_raw_latents(model: CosmosVAE, raw: bool = True) -> None:
    """encode gives and decode takes the tokenizer's latent z itself, not the LATENT: diffusers'
    AutoencoderKLCosmos does, and its pipelines normalise per channel and frame themselves."""
    model.raw_latents = raw


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> CosmosConfig:
    f = layout.config_fields(sd)
    f.setdefault("statistics", "published" if f["latent_channels"] == len(layout.PUBLISHED_MEAN) else "none")
    return CosmosConfig(**f)


def complete_state_dict(sd: dict, cfg: CosmosConfig) -> dict:
    """A file without latent statistics gets the published ones (16 channels) or none (mean 0, std 1)."""
    if cfg.statistics == "published":
        sd["latent_mean"] = torch.tensor(layout.PUBLISHED_MEAN).flatten()
        sd["latent_std"] = torch.tensor(layout.PUBLISHED_STD).flatten()
    elif cfg.statistics == "none":
        sd["latent_mean"] = torch.zeros(cfg.latent_channels * cfg.stat_frames)
        sd["latent_std"] = torch.ones(cfg.latent_channels * cfg.stat_frames)
    return sd


def capabilities(cfg: CosmosConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=cfg.ratio, temporal_ratio=cfg.ratio,
        has_attention=True, norm="groupnorm_frame",
        # causal convs, per-frame norms, causal time attention with a key/value cache: latent i sees frames
        # <= 8i, and a clip streams chunk by chunk with the one-pass result
        causal_encoder=True, causal_decoder=True, stream_encode=True, stream_decode=True,
        can_encode=cfg.has_encoder, can_decode=cfg.has_decoder,
        default_tile=256, default_overlap=64, default_tile_frames=32, default_overlap_frames=8,
        working_dtypes=(torch.bfloat16, torch.float32))


def describe(cfg: CosmosConfig) -> str:
    notes = {"published": "the published CV8x8x8-1.0 latent statistics (none in the file)",
             "none": "no latent statistics"}.get(cfg.statistics)
    return spec.describe(f"Cosmos-1 video tokenizer CV{cfg.ratio}x{cfg.ratio}x{cfg.ratio}", cfg.latent_channels,
                         cfg.has_encoder, cfg.has_decoder, *([notes] if notes else []))


SPEC = ArchSpec(id="cosmos", name="Cosmos-1 video tokenizer", detect=layout.detect, to_canonical=layout.to_canonical,
                config_from_state_dict=config_from_state_dict, build=CosmosVAE, capabilities=capabilities,
                describe=describe, complete_state_dict=complete_state_dict,
                priority=80, latent_hints=((16, 5, "Cosmos-1"),))
