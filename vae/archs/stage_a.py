"""Stable Cascade's stage A: Paella's VQ-GAN (ComfyUI ``comfy/ldm/cascade/stage_a.py``, diffusers
``PaellaVQModel``). 4x: a 2x2 space-to-depth and one stride-2 level; 4 latent channels; no attention
and no statistics across pixels (LayerNorms over channels, the latent BatchNorm's running statistics),
so tiles with a halo as wide as the convs' reach give the untiled result.
Key layouts and what the weights tell: stage_a_layout.py.

What ComfyUI core and diffusers run, and so do we: encode returns the BatchNorm's output, not snapped
to the codebook (core's ``StageA.encode`` with its default ``quantize=False``; diffusers' ``encode``);
decode reads the latent as it is (core's ``decode``; diffusers' default ``force_not_quantize=True``).
The LATENT is the one core's Stable Cascade graphs hand stage A (stage B's output times 0.43, core's
``latent_formats.SC_B``): no scaling here. ``quantize`` snaps a latent to its nearest codes, for
callers that want the discrete latent; no VAE call applies it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..engine.receptive import COARSE
from ..nn.norm import ChannelLayerNorm
from ..run import Seam, boundary
from ..spec import ArchSpec, Capabilities, describe as describe_vae
from . import stage_a_layout as layout

LN_EPS = 1e-6      # the blocks' LayerNorms (both references); not in the weights


@dataclass(frozen=True)
class StageAConfig:
    widths: tuple[int, ...]          # per level, the highest resolution first
    hidden: int                      # a block's channel-MLP width / its own width (4 as published)
    bottleneck_blocks: int           # blocks at the decoder's lowest resolution (0: no decoder)
    latent_channels: int
    codebook_size: int               # codes in the quantizer (encode/decode never read them)
    patch: int                       # pixels per side of the space-to-depth around the network
    image_channels: int
    has_encoder: bool
    has_decoder: bool


class MixingBlock(Seam, nn.Module):
    """LayerNorm -> depthwise 3x3 (replicate padding) and LayerNorm -> channel MLP, each a residual
    scaled by one of six learned scalars (``gammas``: scale, shift and gate of each half)."""

    exact_boundary = COARSE     # chained at latent resolution: exact tiling may re-cut here

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm1 = ChannelLayerNorm(width, eps=LN_EPS, elementwise_affine=False)
        self.depthwise = nn.Conv2d(width, width, 3, padding=1, padding_mode="replicate", groups=width)
        self.norm2 = ChannelLayerNorm(width, eps=LN_EPS, elementwise_affine=False)
        self.channelwise = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
        self.gammas = nn.Parameter(torch.zeros(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gammas
        x = x + self.depthwise(self.norm1(x) * (1 + g[0]) + g[1]) * g[2]
        h = (self.norm2(x) * (1 + g[3]) + g[4]).movedim(1, -1)
        return x + self.channelwise(h).movedim(-1, 1) * g[5]


def _encoder(cfg: StageAConfig) -> tuple[nn.Sequential, nn.Sequential]:
    w, hidden = cfg.widths, cfg.hidden
    in_block = nn.Sequential(boundary(nn.PixelUnshuffle(cfg.patch)),
                             nn.Conv2d(cfg.image_channels * cfg.patch ** 2, w[0], 1))
    down: list[nn.Module] = []
    for i, width in enumerate(w):
        if i:
            down.append(boundary(nn.Conv2d(w[i - 1], width, 4, stride=2, padding=1)))
        down.append(MixingBlock(width, width * hidden))
    down.append(nn.Sequential(nn.Conv2d(w[-1], cfg.latent_channels, 1, bias=False),
                              nn.BatchNorm2d(cfg.latent_channels)))
    return in_block, nn.Sequential(*down)


def _decoder(cfg: StageAConfig) -> tuple[nn.Sequential, nn.Sequential]:
    w, hidden = cfg.widths[::-1], cfg.hidden        # the lowest resolution first
    up: list[nn.Module] = [nn.Sequential(nn.Conv2d(cfg.latent_channels, w[0], 1))]
    for i, width in enumerate(w):
        up += [MixingBlock(width, width * hidden) for _ in range(cfg.bottleneck_blocks if i == 0 else 1)]
        if i < len(w) - 1:
            up.append(boundary(nn.ConvTranspose2d(width, w[i + 1], 4, stride=2, padding=1)))
    out_block = nn.Sequential(nn.Conv2d(w[-1], cfg.image_channels * cfg.patch ** 2, 1),
                              boundary(nn.PixelShuffle(cfg.patch)))
    return nn.Sequential(*up), out_block


class Codebook(nn.Module):
    """The quantizer's codes (key ``codebook.weight``)."""

    def __init__(self, size: int, channels: int):
        super().__init__()
        self.codebook = nn.Embedding(size, channels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Each latent pixel of ``z`` [B, C, h, w] replaced by its nearest code (Euclidean)."""
        flat = z.movedim(1, -1).reshape(-1, z.shape[1])
        codes = self.codebook.weight.to(flat.dtype)
        nearest = torch.cdist(flat.float(), codes.float()).argmin(dim=1)
        return codes[nearest].view(*z.shape[:1], *z.shape[2:], z.shape[1]).movedim(-1, 1)


class StageA(nn.Module):
    """encode: pixels in [0, 1] -> latent (unquantized); decode: latent -> pixels (about [0, 1])."""

    def __init__(self, cfg: StageAConfig):
        super().__init__()
        self.config = cfg
        if cfg.has_encoder:
            self.in_block, self.down_blocks = _encoder(cfg)
        self.vquantizer = Codebook(cfg.codebook_size, cfg.latent_channels)
        if cfg.has_decoder:
            self.up_blocks, self.out_block = _decoder(cfg)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_blocks(self.in_block(x))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.out_block(self.up_blocks(z))

    def quantize(self, z: torch.Tensor) -> torch.Tensor:
        return self.vquantizer(z)


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> StageAConfig:
    return StageAConfig(**layout.structure(sd))


def complete_state_dict(sd: dict, cfg: StageAConfig) -> dict:
    if cfg.has_encoder:    # a counter some savers drop; never read
        sd.setdefault(f"down_blocks.{2 * len(cfg.widths) - 1}.1.num_batches_tracked", torch.tensor(0))
    return sd


def capabilities(cfg: StageAConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=cfg.patch * 2 ** (len(cfg.widths) - 1),
        image_channels=cfg.image_channels, value_range=(0.0, 1.0), norm="none",
        can_encode=cfg.has_encoder, can_decode=cfg.has_decoder)


def describe(cfg: StageAConfig) -> str:
    ratio = capabilities(cfg).spatial_ratio
    return describe_vae("Stable Cascade stage A", cfg.latent_channels, cfg.has_encoder, cfg.has_decoder,
                        f"{ratio}x", f"codebook {cfg.codebook_size}")


SPEC = ArchSpec(id="stage_a", name="Stable Cascade stage A", detect=layout.detect,
                to_canonical=layout.to_canonical, config_from_state_dict=config_from_state_dict,
                build=StageA, capabilities=capabilities, describe=describe,
                complete_state_dict=complete_state_dict,
                latent_hints=((4, 4, "Stable Cascade stage B"),))
