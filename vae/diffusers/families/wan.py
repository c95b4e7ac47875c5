"""AutoencoderKLWan and AutoencoderKLQwenImage."""
from __future__ import annotations

import logging
from typing import Any, Mapping


from .family import MISSING, Family

log = logging.getLogger("VAEKit")


# ---- AutoencoderKLWan (Wan 2.1, Wan 2.2) and AutoencoderKLQwenImage --------------------------------------
# Wan 2.1's latent statistics (Wan-AI's diffusers configs; Qwen-Image's are the same values).
WAN21_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
              0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
WAN21_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
             3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]


def _wan_dims(cfg) -> tuple[int, list[int], int]:
    """(base_dim, dim_mult, decoder_base_dim) of diffusers' config: the encoder's level widths are
    base_dim * dim_mult, the decoder's (finest first) decoder_base_dim * dim_mult."""
    if cfg.has_encoder:
        base = cfg.enc_base
        mult = [w // base for w in cfg.enc_widths]
        return base, mult, (cfg.dec_widths[0] // mult[0] if cfg.has_decoder else base)
    base = cfg.dec_widths[0]
    return base, [w // base for w in cfg.dec_widths], base


def _statistics(cfg) -> dict:
    """The latent statistics the pipelines normalise with: Wan 2.1's for 16 channels; for others
    (Wan 2.2's 48) only a folder's config.json has them."""
    if cfg.latent_channels == len(WAN21_MEAN):
        return dict(latents_mean=list(WAN21_MEAN), latents_std=list(WAN21_STD))
    return dict(latents_mean=MISSING, latents_std=MISSING)


def wan_weights(cfg, caps) -> dict:
    base, mult, dec_base = _wan_dims(cfg)
    px = cfg.image_channels * cfg.patch ** 2
    return dict(base_dim=base, decoder_base_dim=None if dec_base == base else dec_base, z_dim=cfg.latent_channels,
                dim_mult=mult, num_res_blocks=cfg.enc_blocks if cfg.has_encoder else cfg.dec_blocks,
                temperal_downsample=list(cfg.temporal), is_residual=cfg.residual, in_channels=px, out_channels=px,
                patch_size=cfg.patch if cfg.patch > 1 else None, scale_factor_temporal=caps.temporal_ratio,
                scale_factor_spatial=caps.spatial_ratio, **_statistics(cfg))


def _qwen_weights(cfg, caps) -> dict:
    base, mult, _ = _wan_dims(cfg)
    return dict(base_dim=base, z_dim=cfg.latent_channels, dim_mult=mult,
                num_res_blocks=cfg.enc_blocks if cfg.has_encoder else cfg.dec_blocks,
                temperal_downsample=list(cfg.temporal), input_channels=cfg.image_channels, **_statistics(cfg))


def temporal_attributes(config: Mapping[str, Any], spatial: int) -> dict:
    """What the classes set on themselves and their pipelines read (``vae.temperal_downsample``, ...)."""
    down = list(config["temperal_downsample"])
    return dict(z_dim=config["z_dim"], temperal_downsample=down, temperal_upsample=down[::-1],
                spatial_compression_ratio=spatial)


_WAN_DEFAULTS = dict(base_dim=96, decoder_base_dim=None, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                     attn_scales=[], temperal_downsample=[False, True, True], dropout=0.0,
                     latents_mean=list(WAN21_MEAN), latents_std=list(WAN21_STD), is_residual=False, in_channels=3,
                     out_channels=3, patch_size=None, scale_factor_temporal=4, scale_factor_spatial=8)

AUTOENCODER_KL_WAN = Family(
    class_name="AutoencoderKLWan", arch="wan", defaults=_WAN_DEFAULTS, weights=wan_weights,
    serves=lambda cfg: not cfg.image, clamps=True,
    attributes=lambda config: temporal_attributes(config, config["scale_factor_spatial"]))

AUTOENCODER_KL_QWEN_IMAGE = Family(
    class_name="AutoencoderKLQwenImage", arch="wan",
    defaults=dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                  temperal_downsample=[False, True, True], dropout=0.0, input_channels=3,
                  latents_mean=list(WAN21_MEAN), latents_std=list(WAN21_STD)),
    weights=_qwen_weights, names=("qwen",), clamps=True,
    serves=lambda cfg: not (cfg.image or cfg.residual or cfg.patch > 1),
    attributes=lambda config: temporal_attributes(config, 2 ** len(config["temperal_downsample"])))
