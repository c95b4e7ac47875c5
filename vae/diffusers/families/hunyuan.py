"""AutoencoderKLHunyuanVideo and AutoencoderKLHunyuanVideo15."""
from __future__ import annotations

import logging
from typing import Any, Mapping


from .family import Family

log = logging.getLogger("VAEKit")


# ---- AutoencoderKLHunyuanVideo (HunyuanVideo 1.0) and AutoencoderKLHunyuanVideo15 -----------------------
def _ratios_of(caps) -> dict:
    return dict(spatial_compression_ratio=caps.spatial_ratio, temporal_compression_ratio=caps.temporal_ratio)


def _hunyuan_video_weights(cfg, caps) -> dict:
    n = len(cfg.widths)
    return dict(in_channels=cfg.in_channels, out_channels=cfg.out_channels, latent_channels=cfg.latent_channels,
                down_block_types=["HunyuanVideoDownBlock3D"] * n, up_block_types=["HunyuanVideoUpBlock3D"] * n,
                block_out_channels=list(cfg.widths), layers_per_block=cfg.layers_per_block,
                mid_block_add_attention=cfg.mid_attention, **_ratios_of(caps))


def ratio_attributes(config: Mapping[str, Any]) -> dict:
    """The compression ratios the classes set on themselves from their config (pipelines read them)."""
    return dict(spatial_compression_ratio=config["spatial_compression_ratio"],
                temporal_compression_ratio=config["temporal_compression_ratio"])


AUTOENCODER_KL_HUNYUAN_VIDEO = Family(
    class_name="AutoencoderKLHunyuanVideo", arch="hunyuan_video",
    defaults=dict(in_channels=3, out_channels=3, latent_channels=16,
                  down_block_types=["HunyuanVideoDownBlock3D"] * 4, up_block_types=["HunyuanVideoUpBlock3D"] * 4,
                  block_out_channels=[128, 256, 512, 512], layers_per_block=2, act_fn="silu", norm_num_groups=32,
                  scaling_factor=0.476986, spatial_compression_ratio=8, temporal_compression_ratio=4,
                  mid_block_add_attention=True),
    weights=_hunyuan_video_weights,
    attributes=lambda config: {**ratio_attributes(config), "time_compression_ratio": config["temporal_compression_ratio"]})


def hunyuan_video15_weights(cfg, caps) -> dict:
    widths = list(cfg.widths)
    # a resampler "matches channels" where it moves to the next level's width (as published)
    down = [r.out != w for r, w in zip(cfg.down, widths) if r]
    up = [r.out != w for r, w in zip(cfg.up, widths) if r]
    return dict(in_channels=cfg.in_channels, out_channels=cfg.out_channels, latent_channels=cfg.latent_channels,
                block_out_channels=widths, layers_per_block=cfg.layers_per_block,
                downsample_match_channel=any(down) if down else True, upsample_match_channel=any(up) if up else True,
                **_ratios_of(caps))


AUTOENCODER_KL_HUNYUAN_VIDEO15 = Family(
    class_name="AutoencoderKLHunyuanVideo15", arch="hunyuan_video15",
    defaults=dict(in_channels=3, out_channels=3, latent_channels=32, block_out_channels=[128, 256, 512, 1024, 1024],
                  layers_per_block=2, spatial_compression_ratio=16, temporal_compression_ratio=4,
                  downsample_match_channel=True, upsample_match_channel=True, scaling_factor=1.03682),
    weights=hunyuan_video15_weights, attributes=ratio_attributes)
