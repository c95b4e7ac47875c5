"""Tiny diffusers video VAEs (random weights) for the tests that run every family the same way:
detection across families, handle-level tiling thresholds, the nodes and the workflows."""
from __future__ import annotations

import pytest
import torch

from helpers import jitter_norms

FAMILIES = ("mochi", "ltx", "hunyuan_video", "magvit", "hunyuan_video15")
# spatial ratio, temporal ratio of each family
RATIOS = {"mochi": (8, 6), "ltx": (32, 8), "hunyuan_video": (8, 4), "magvit": (8, 4), "hunyuan_video15": (16, 4)}


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
    elif family == "hunyuan_video":
        m = diffusers.AutoencoderKLHunyuanVideo(block_out_channels=(32, 32, 32, 32), layers_per_block=1)
        m.use_framewise_decoding = m.use_framewise_encoding = False
    elif family == "hunyuan_video15":
        m = diffusers.AutoencoderKLHunyuanVideo15(block_out_channels=(8, 16, 32, 64, 64), layers_per_block=1)
    else:
        m = diffusers.AutoencoderKLMagvit(block_out_channels=(32, 32, 32, 32), layers_per_block=1)
    return jitter_norms(m).eval()


def tiny_state_dict(family: str) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in tiny_reference(family).state_dict().items()}
