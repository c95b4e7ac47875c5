"""HunyuanImage 2.1's 32x VAE and HunyuanImage 3.0's VAE (Tencent's ``HunyuanVAE2D`` and ``AutoencoderKLConv3D``).

Both are the DC-AE style LDM that HunyuanVideo 1.5 is (``hunyuan_video15.halves``: DC-AE resamplers that
change the width, the encoder head's and the decoder input's parameter-free shortcuts), with the LDM's
own parts where 1.5 has its own: GroupNorm (32 groups, eps 1e-6) instead of the channel L2 norm, plain
zero-padded convs instead of causal ones, one-head attention over every position without a mask. One
model file, two variants, told apart by the rank of the convs (``dims``):
- 2.1 (``dims`` 2): a 2-D network: images in, 64 latent channels, 32x (6 levels, widths 128..1024);
- 3.0 (``dims`` 3): a 3-D network over a clip, and only images go in: the image is repeated to four
  frames, two temporal down-samplers bring them to one latent frame, and of the four frames the decoder
  makes only the last is kept (Tencent's ``encode``/``decode`` for a one-frame input; ComfyUI's
  ``refiner_vae=False`` branch of ``vae_refiner.py``). 32 latent channels, 16x. Its GroupNorm takes its
  statistics over the four frames (T*H*W), and its temporal resamplers pair every frame (no first-frame
  rule). Longer clips are not an input: neither reference has a model that makes them.
Why one file: the networks differ only in the conv rank and the four-frame wrap, which the config
declares; the blocks, the key layouts, the detection and the config reading are the same code.

Latents are raw (the posterior mean): the scaling (2.1: 0.75289, core's latent format; 3.0: 0.562679,
Tencent's pipeline) is the sampler's. LATENTs are as core gives them: 2.1 ``[B, 64, h, w]``, 3.0
``[B, 32, 1, h, w]`` (core builds 3.0 as a 3-D VAE whose images are one-frame clips); 3.0 also takes
``[B, 32, h, w]``. Key layouts and what the weights tell: hunyuan_image_layout.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..nn.attention import SpatialSelfAttention
from ..nn.norm import GroupNorm
from .. import spec
from ..spec import ArchSpec, Capabilities
from . import hunyuan_image_layout as layout
from . import ldm
from .hunyuan_video15 import HunyuanVideo15Config, Resample, halves

GROUPS, EPS = 32, 1e-6      # both references; not in the weights


@dataclass(frozen=True)
class HunyuanImageConfig(HunyuanVideo15Config):
    dims: int = 2           # conv rank: 2 (HunyuanImage 2.1), 3 (3.0: an image runs as a clip of ``frames``)

    @property
    def frames(self) -> int:
        """Frames an image runs as: one per temporal doubling (3.0: 4, one latent frame)."""
        return self.ratios[1]

    @property
    def version(self) -> str:
        return "2.1" if self.dims == 2 else "3.0"


def _ops(dims: int) -> ldm.Ops:
    conv = {2: nn.Conv2d, 3: nn.Conv3d}[dims]
    return ldm.Ops(conv=lambda cin, cout: conv(cin, cout, 3, padding=1), shortcut=lambda cin, cout: conv(cin, cout, 1),
                   norm=lambda c: GroupNorm(GROUPS, c, eps=EPS),
                   attention=lambda c: SpatialSelfAttention(c, GROUPS, EPS, dims=dims))


class HunyuanImageVAE(ldm.Autoencoder):
    """encode: images (B, 3, H, W) in [-1, 1] -> raw latent mode (B, C, H/r, W/r);
    decode: raw latent (B, C, h, w) -> images (B, 3, r*h, r*w) in [-1, 1] (not clamped)."""

    def __init__(self, cfg: HunyuanImageConfig):
        super().__init__(*halves(cfg, _ops(cfg.dims), first_frame=False))
        self.config = cfg

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        if self.config.dims == 2:
            return super().encode(x, posterior)
        return super().encode(x.unsqueeze(2).expand(-1, -1, self.config.frames, -1, -1), posterior)[:, :, 0]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        if self.config.dims == 2:
            return super().decode(z)
        return super().decode(z.unsqueeze(2))[:, :, -1]


def capabilities(cfg: HunyuanImageConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=cfg.ratios[0], image_channels=cfg.out_channels,
        has_attention=True, norm="groupnorm", latent_frame_axis=cfg.dims == 3,
        posterior=True, can_encode=cfg.has_encoder, can_decode=cfg.has_decoder,
        default_tile=1024 if cfg.dims == 2 else 512, default_overlap=64,
        working_dtypes=(torch.float16, torch.bfloat16, torch.float32))     # core's order for both


def describe(cfg: HunyuanImageConfig) -> str:
    return spec.describe(f"HunyuanImage {cfg.version} VAE", cfg.latent_channels, cfg.has_encoder, cfg.has_decoder)


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> HunyuanImageConfig:
    return layout.config(sd, HunyuanImageConfig, Resample)


# before KL (60): a KL-like layout (4-D conv_in, GroupNorm, down/up levels) that kl.detect would claim
SPEC = ArchSpec(id="hunyuan_image", name="HunyuanImage VAE", detect=layout.detect, to_canonical=layout.to_canonical,
                config_from_state_dict=config_from_state_dict, build=HunyuanImageVAE,
                capabilities=capabilities, describe=describe,
                priority=55, latent_hints=((64, 4, "HunyuanImage 2.1"), (32, 5, "HunyuanImage 3.0")))
