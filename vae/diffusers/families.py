"""Per diffusers class, a declaration the face reads: which of our files it serves, the class's config
keys (its defaults, the values our loader read from the weights, the published latent statistics a file
name tells), how its latents relate to ours, and the instance attributes its pipelines read. The face
(face.py) and the loader (source.py) read only these fields; no code outside this module names a family.

A family's ``normalise(handle)`` gives ``(shift, scale)`` with ``diffusers' latent = (ours - shift) *
scale`` (numbers or per-channel tuples), or None where our handle already gives the class's raw latent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

Number = Union[float, tuple[float, ...]]
MISSING = object()          # a config value only a diffusers folder's config.json (or ``config=``) can give


@dataclass(frozen=True)
class Family:
    class_name: str                         # diffusers' class, as a folder's config.json names it
    arch: str                               # our ArchSpec id whose files it serves
    defaults: Mapping[str, Any]             # the class's config keys and their defaults
    weights: Callable[[Any, Any], dict]     # (our config, capabilities) -> config keys the weights decide
    serves: Callable[[Any], bool] = lambda cfg: True      # which of the arch's files (by our config)
    names: tuple[str, ...] = ()             # file-name words that choose this class among several for one arch
    named: Callable[[Any, str], dict] = lambda cfg, name: {}     # config values a file name tells
    posterior: bool = True                  # encode gives ``latent_dist`` (a Gaussian), else ``latents``
    clamps: bool = False                    # decode clamps to [-1, 1], as the class does
    normalise: Callable[[Any], Optional[tuple[Number, Number]]] = lambda handle: None
    attributes: Callable[[Mapping[str, Any]], dict] = lambda config: {}
    derived: Callable[[Mapping[str, Any]], dict] = lambda config: {}    # config keys the class sets from others


# ---- AutoencoderKL: SD 1.x/2.x, SDXL, SD3, Flux.1 -------------------------------------------------------
# The published latent spaces (the diffusers configs of stabilityai/sd-vae-ft-mse, stabilityai/sdxl-vae,
# stabilityai/stable-diffusion-3-medium-diffusers and black-forest-labs/FLUX.1-dev): by latent channels,
# and a file-name word where one channel count has two.
_KL_SPACES = {
    4: (((), dict(scaling_factor=0.18215, sample_size=512)),
        (("xl",), dict(scaling_factor=0.13025, sample_size=1024))),
    16: (((), dict(scaling_factor=0.3611, shift_factor=0.1159, sample_size=1024)),
         (("sd3", "sd_3", "sd35", "sd3.5", "stable-diffusion-3", "stable_diffusion_3"),
          dict(scaling_factor=1.5305, shift_factor=0.0609, sample_size=1024))),
}


def _by_name(spaces, channels: int, name: str) -> dict:
    chosen: dict = {}
    for words, values in spaces.get(channels, ()):
        if not words or any(w in name.lower() for w in words):
            chosen = values
    return dict(chosen)


def _kl_weights(cfg, caps) -> dict:
    n = len(cfg.ch_mult)
    return dict(in_channels=cfg.in_channels, out_channels=cfg.out_channels,
                down_block_types=["DownEncoderBlock2D"] * n, up_block_types=["UpDecoderBlock2D"] * n,
                block_out_channels=list(cfg.widths), layers_per_block=cfg.num_res_blocks,
                latent_channels=cfg.z_channels, use_quant_conv=cfg.embed_dim is not None,
                use_post_quant_conv=cfg.embed_dim is not None, mid_block_add_attention=cfg.mid_attention)


AUTOENCODER_KL = Family(
    class_name="AutoencoderKL", arch="kl",
    defaults=dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"],
                  up_block_types=["UpDecoderBlock2D"], block_out_channels=[64], layers_per_block=1, act_fn="silu",
                  latent_channels=4, norm_num_groups=32, sample_size=32, scaling_factor=0.18215, shift_factor=None,
                  latents_mean=None, latents_std=None, force_upcast=True, use_quant_conv=True,
                  use_post_quant_conv=True, mid_block_add_attention=True),
    weights=_kl_weights,
    serves=lambda cfg: cfg.decoder_widths is None and cfg.decoder_res_blocks is None,
    named=lambda cfg, name: _by_name(_KL_SPACES, cfg.z_channels, name))


# ---- AutoencoderTiny: taesd, taesdxl, taesd3, taef1 ---------------------------------------------------
def _tiny_weights(cfg, caps) -> dict:
    enc, dec = cfg.encoder_stages or (), cfg.decoder_stages or ()
    out = dict(in_channels=cfg.image_channels, out_channels=cfg.image_channels, latent_channels=cfg.latent_channels)
    if enc:
        out.update(encoder_block_out_channels=[w for w, _ in enc], num_encoder_blocks=[b for _, b in enc])
    if dec:
        out.update(decoder_block_out_channels=[w for w, _ in dec], num_decoder_blocks=[b for _, b in dec])
    return out


AUTOENCODER_TINY = Family(
    class_name="AutoencoderTiny", arch="tiny",
    defaults=dict(in_channels=3, out_channels=3, encoder_block_out_channels=[64, 64, 64, 64],
                  decoder_block_out_channels=[64, 64, 64, 64], act_fn="relu", upsample_fn="nearest",
                  latent_channels=4, upsampling_scaling_factor=2, num_encoder_blocks=[1, 3, 3, 3],
                  num_decoder_blocks=[3, 3, 3, 1], latent_magnitude=3, latent_shift=0.5, force_upcast=False,
                  scaling_factor=1.0, shift_factor=0.0),
    weights=_tiny_weights,
    # the 2x2-packed (taef2) and patchified 16x (taeqi2_1) variants have no diffusers class
    serves=lambda cfg: cfg.pack == 1 and cfg.patch == 1 and not cfg.midblock_gn,
    posterior=False,
    # the network works in the diffusion model's normalised latent, ours is the raw one (ComfyUI's)
    normalise=lambda handle: (handle.config.shift, handle.config.scale),
    attributes=lambda config: dict(latent_magnitude=config["latent_magnitude"], latent_shift=config["latent_shift"],
                                   spatial_scale_factor=2 ** config["out_channels"]),
    derived=lambda config: dict(block_out_channels=config["decoder_block_out_channels"], force_upcast=False))


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


def _wan_weights(cfg, caps) -> dict:
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


def _temporal(config: Mapping[str, Any], spatial: int) -> dict:
    """What the classes set on themselves and their pipelines read (``vae.temperal_downsample``, ...)."""
    down = list(config["temperal_downsample"])
    return dict(z_dim=config["z_dim"], temperal_downsample=down, temperal_upsample=down[::-1],
                spatial_compression_ratio=spatial)


_WAN_DEFAULTS = dict(base_dim=96, decoder_base_dim=None, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                     attn_scales=[], temperal_downsample=[False, True, True], dropout=0.0,
                     latents_mean=list(WAN21_MEAN), latents_std=list(WAN21_STD), is_residual=False, in_channels=3,
                     out_channels=3, patch_size=None, scale_factor_temporal=4, scale_factor_spatial=8)

AUTOENCODER_KL_WAN = Family(
    class_name="AutoencoderKLWan", arch="wan", defaults=_WAN_DEFAULTS, weights=_wan_weights,
    serves=lambda cfg: not cfg.image, clamps=True,
    attributes=lambda config: _temporal(config, config["scale_factor_spatial"]))

AUTOENCODER_KL_QWEN_IMAGE = Family(
    class_name="AutoencoderKLQwenImage", arch="wan",
    defaults=dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                  temperal_downsample=[False, True, True], dropout=0.0, input_channels=3,
                  latents_mean=list(WAN21_MEAN), latents_std=list(WAN21_STD)),
    weights=_qwen_weights, names=("qwen",), clamps=True,
    serves=lambda cfg: not (cfg.image or cfg.residual or cfg.patch > 1),
    attributes=lambda config: _temporal(config, 2 ** len(config["temperal_downsample"])))

# In order: where several serve one file, a folder's config.json or a file-name word chooses, else the first.
FAMILIES = (AUTOENCODER_KL, AUTOENCODER_TINY, AUTOENCODER_KL_WAN, AUTOENCODER_KL_QWEN_IMAGE)
