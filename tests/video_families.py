"""Tiny diffusers video VAEs (random weights) for the tests that run every family the same way:
detection across families, handle-level tiling thresholds, the nodes and the workflows."""
from __future__ import annotations

import pytest
import torch

from helpers import jitter_norms

FAMILIES = ("mochi", "ltx", "ltx2", "hunyuan_video", "magvit", "wan", "hunyuan_video15")
# spatial ratio, temporal ratio of each family
RATIOS = {"mochi": (8, 6), "ltx": (32, 8), "ltx2": (32, 8), "hunyuan_video": (8, 4), "magvit": (8, 4), "wan": (8, 4),
          "hunyuan_video15": (16, 4)}
# LTX-2 extends the LTX-Video family: one spec, its versions told apart by their shapes
SPEC_IDS = {"ltx2": "ltx"}


def tiny_reference(family: str) -> torch.nn.Module:
    """The smallest diffusers model with the family's real structure (all resamplers present)."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    if family == "mochi":
        m = diffusers.AutoencoderKLMochi(encoder_block_out_channels=(32, 32, 32, 64),
                                         decoder_block_out_channels=(32, 32, 32, 64), layers_per_block=(1,) * 5)
    elif family == "ltx":
        m = diffusers.AutoencoderKLLTXVideo(latent_channels=16, block_out_channels=(8, 16, 32, 32),
                                            decoder_block_out_channels=(8, 16, 32, 32), layers_per_block=(1,) * 5,
                                            decoder_layers_per_block=(1,) * 5)
    elif family == "ltx2":        # LTX-2.3's shape (time-only and space-only up-samplers), published flags
        m = diffusers.AutoencoderKLLTX2Video(
            latent_channels=16, block_out_channels=(8, 16, 32, 32), layers_per_block=(1,) * 5,
            decoder_block_out_channels=(16, 32, 32, 64), decoder_layers_per_block=(1,) * 5,
            decoder_spatio_temporal_scaling=(True,) * 4, decoder_inject_noise=(False,) * 5,
            upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"), upsample_residual=(False,) * 4,
            upsample_factor=(2, 2, 1, 2), decoder_causal=False, decoder_spatial_padding_mode="zeros",
            spatial_compression_ratio=32, temporal_compression_ratio=8)
    elif family == "hunyuan_video":
        m = diffusers.AutoencoderKLHunyuanVideo(block_out_channels=(32, 32, 32, 32), layers_per_block=1)
        m.use_framewise_decoding = m.use_framewise_encoding = False
    elif family == "wan":      # Wan 2.1's published structure, narrow
        m = diffusers.AutoencoderKLWan(base_dim=8, z_dim=16)
    elif family == "hunyuan_video15":      # the published structure (5 levels), narrow
        m = diffusers.AutoencoderKLHunyuanVideo15(block_out_channels=(8, 16, 32, 64, 64), layers_per_block=1)
    else:
        m = diffusers.AutoencoderKLMagvit(block_out_channels=(32, 32, 32, 32), layers_per_block=1)
    return jitter_norms(m).eval()


def tiny_state_dict(family: str) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in tiny_reference(family).state_dict().items()}
