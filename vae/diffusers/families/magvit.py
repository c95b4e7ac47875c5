"""AutoencoderKLMagvit (EasyAnimate V5.1)."""
from __future__ import annotations

from ...errors import LoadError
from .family import Family


# ---- AutoencoderKLMagvit -------------------------------------------------------------------------------
def _magvit_weights(cfg, caps) -> dict:
    n = len(cfg.widths)
    # level 0 resamples space only, the others space and time (the last none): fixed in our model as
    # published, as are the per-frame GroupNorms of 32 groups; a config.json saying otherwise is refused
    return dict(in_channels=cfg.in_channels, out_channels=cfg.out_channels, latent_channels=cfg.latent_channels,
                block_out_channels=list(cfg.widths), layers_per_block=cfg.layers_per_block,
                down_block_types=["SpatialDownBlock3D"] + ["SpatialTemporalDownBlock3D"] * (n - 1),
                up_block_types=["SpatialUpBlock3D"] + ["SpatialTemporalUpBlock3D"] * (n - 1),
                act_fn="silu", norm_num_groups=32, spatial_group_norm=True)


def _magvit_prepare(handle) -> None:
    """V5's mid blocks hold an attention that diffusers' class does not have (it drops those weights on
    load and decodes without them): no face can both answer as the class and compute as the file."""
    if handle.config.mid_attention:
        raise LoadError(f"{handle.name}: EasyAnimate V5's mid-block attention is not in diffusers' "
                        "AutoencoderKLMagvit, which drops those weights on load; the face does not serve V5 files.",
                        fix="use our handle (vae.load) for V5, which keeps the attention, or the V5.1 VAE.")


AUTOENCODER_KL_MAGVIT = Family(
    class_name="AutoencoderKLMagvit", arch="magvit",
    defaults=dict(in_channels=3, latent_channels=16, out_channels=3, block_out_channels=[128, 256, 512, 512],
                  down_block_types=["SpatialDownBlock3D"] + ["SpatialTemporalDownBlock3D"] * 3,
                  up_block_types=["SpatialUpBlock3D"] + ["SpatialTemporalUpBlock3D"] * 3, layers_per_block=2,
                  act_fn="silu", norm_num_groups=32, scaling_factor=0.7125, spatial_group_norm=True),
    weights=_magvit_weights, decode_args=("return_dict",), prepare=_magvit_prepare,
    attributes=lambda config: dict(spatial_compression_ratio=2 ** (len(config["block_out_channels"]) - 1),
                                   temporal_compression_ratio=2 ** (len(config["block_out_channels"]) - 2)))
