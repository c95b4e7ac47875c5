"""AutoencoderKLHunyuanImage (HunyuanImage 2.1) and AutoencoderKLHunyuanImageRefiner (its refiner)."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from .family import Family, one_frame
from .hunyuan import hunyuan_video15_weights, ratio_attributes


# ---- AutoencoderKLHunyuanImage (HunyuanImage 2.1's 32x VAE; 3.0's has no diffusers class) ------------
def _hunyuan_image_weights(cfg, caps) -> dict:
    out = hunyuan_video15_weights(cfg, caps)
    del out["temporal_compression_ratio"]
    return out


# sample_size and scaling_factor have no class default: diffusers' converter's values (the published folder's)
AUTOENCODER_KL_HUNYUAN_IMAGE = Family(
    class_name="AutoencoderKLHunyuanImage", arch="hunyuan_image",
    defaults=dict(in_channels=3, out_channels=3, latent_channels=64, block_out_channels=[128, 256, 512, 512, 1024, 1024],
                  layers_per_block=2, spatial_compression_ratio=32, sample_size=384, scaling_factor=0.75289,
                  downsample_match_channel=True, upsample_match_channel=True),
    weights=_hunyuan_image_weights, serves=lambda cfg: cfg.dims == 2)


# ---- AutoencoderKLHunyuanImageRefiner: our loader reads its file as HunyuanVideo 1.5's VAE (the same model).
# The class agrees with it on one latent frame (the refiner's use), not on more (it never resamples time).
def _one_frame(handle, what: str, t: torch.Tensor, given: Mapping[str, Any]) -> torch.Tensor:
    return one_frame("AutoencoderKLHunyuanImageRefiner", "HunyuanImageRefinerPipeline", what, t)


AUTOENCODER_KL_HUNYUAN_IMAGE_REFINER = Family(
    class_name="AutoencoderKLHunyuanImageRefiner", arch="hunyuan_video15", names=("refiner",),
    defaults=dict(in_channels=3, out_channels=3, latent_channels=32, block_out_channels=[128, 256, 512, 1024, 1024],
                  layers_per_block=2, spatial_compression_ratio=16, temporal_compression_ratio=4,
                  downsample_match_channel=True, upsample_match_channel=True, scaling_factor=1.03682),
    weights=hunyuan_video15_weights, attributes=ratio_attributes, into=_one_frame)
