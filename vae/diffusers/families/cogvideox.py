"""AutoencoderKLCogVideoX."""
from __future__ import annotations

import logging


from .family import Family

log = logging.getLogger("VAEKit")


# ---- AutoencoderKLCogVideoX ---------------------------------------------------------------------------
# (AutoencoderKLMochi is not declared: our Mochi decoder is Genmo's, and diffusers' class departs from it on
# a clip's first frames (tests/vae/test_mochi.py), so the face could not decode as the class does.)
def _cogvideox_weights(cfg, caps) -> dict:
    n = len(cfg.widths)
    return dict(in_channels=cfg.in_channels, out_channels=cfg.out_channels, latent_channels=cfg.latent_channels,
                down_block_types=["CogVideoXDownBlock3D"] * n, up_block_types=["CogVideoXUpBlock3D"] * n,
                block_out_channels=list(cfg.widths), layers_per_block=cfg.layers_per_block,
                temporal_compression_ratio=caps.temporal_ratio)


AUTOENCODER_KL_COGVIDEOX = Family(
    class_name="AutoencoderKLCogVideoX", arch="cogvideox",
    defaults=dict(in_channels=3, out_channels=3, down_block_types=["CogVideoXDownBlock3D"] * 4,
                  up_block_types=["CogVideoXUpBlock3D"] * 4, block_out_channels=[128, 256, 256, 512],
                  latent_channels=16, layers_per_block=3, act_fn="silu", norm_eps=1e-6, norm_num_groups=32,
                  temporal_compression_ratio=4, sample_height=480, sample_width=720, scaling_factor=1.15258426,
                  shift_factor=None, latents_mean=None, latents_std=None, force_upcast=True, use_quant_conv=False,
                  use_post_quant_conv=False, invert_scale_latents=False),
    weights=_cogvideox_weights)
