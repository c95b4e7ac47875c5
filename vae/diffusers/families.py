"""Per diffusers class, a declaration the face reads: which of our files it serves, the class's config
keys (its defaults, the values our loader read from the weights, the published latent statistics a file
name tells), how its latents relate to ours, and the instance attributes its pipelines read. The face
(face.py) and the loader (source.py) read only these fields; no code outside this module names a family.

A family's ``normalise(handle)`` gives ``(shift, scale)`` with ``diffusers' latent = (ours - shift) *
scale`` (numbers or per-channel tuples), or None where our handle already gives the class's raw latent.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

import torch

from ..archs.ltx import set_decoder_padding
from ..errors import InputError

log = logging.getLogger("VAEKit")

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
    # the class's decode parameters after ``z``, in order (pipelines pass some by position); besides
    # ``return_dict`` and ``generator`` (accepted, unused) each is the class's own input, which
    # ``decode_options(handle, given)`` turns into our handle's decode options, or refuses
    decode_args: tuple[str, ...] = ("return_dict", "generator")
    decode_options: Callable[[Any, Mapping[str, Any]], dict] = lambda handle, given: {}
    forward_args: tuple[str, ...] = ("sample_posterior", "return_dict", "generator")    # forward's, after sample
    tensors: Callable[[Any], dict] = lambda handle: {}      # buffers the class holds that pipelines read
    prepare: Callable[[Any], None] = lambda handle: None    # set our model to compute as the class does


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

# ---- AutoencoderKLLTXVideo (LTX-Video 0.9.0, 0.9.1, 0.9.5/0.9.7) ----------------------------------------
# Our block list (vae/archs/ltx_config.py) read back into the class's block parameters: the encoder's down
# blocks are [resnets][down-sampler][widening resnet], the last resnets its mid block; the decoder's up
# blocks [widening resnet][up-sampler][resnets] after its mid block, listed finest first as the class does.
_S2D_TYPES = {(1, 2, 2): "spatial", (2, 1, 1): "temporal", (2, 2, 2): "spatiotemporal"}


def _groups(blocks, ends_with_res: bool) -> list[list]:
    """The blocks cut into the class's blocks: each ends at (``ends_with_res``) or starts with a resnet group."""
    groups: list[list] = []
    for b in blocks:
        if ends_with_res:
            if not groups or groups[-1][-1].kind == "res":
                groups.append([])
            groups[-1].append(b)
        elif b.kind == "res" or not groups:
            groups.append([b])
        else:
            groups[-1].append(b)
    return groups


def _ltx_encoder(cfg) -> dict:
    *downs, mid = _groups(cfg.encoder, ends_with_res=False)
    s2d = any(b.kind == "s2d" for b in cfg.encoder)
    samplers = [next((b for b in g if b.kind in ("down", "s2d")), None) for g in downs]
    widths = [g[0].cin for g in downs] + ([mid[0].cin] if s2d else [])
    return dict(block_out_channels=widths, layers_per_block=[g[0].layers for g in downs + [mid]],
                down_block_types=["LTXVideo095DownBlock3D" if s2d else "LTXVideoDownBlock3D"] * len(downs),
                spatio_temporal_scaling=[s is not None for s in samplers],
                downsample_type=[_S2D_TYPES.get(s.stride, "conv") if s2d and s else "conv" for s in samplers])


def _ltx_decoder(cfg) -> dict:
    mid, *ups = _groups(cfg.decoder, ends_with_res=True)
    samplers = [next((b for b in g if b.kind == "up"), None) for g in ups]
    # an up-sampler that narrows its input by f is the class's upsample_factor f: its block width is then f times
    factors = [s.cin // s.cout if s else 1 for s in samplers]
    rev = lambda values: list(reversed(values))      # noqa: E731 - the class lists the decoder finest first
    return dict(decoder_block_out_channels=rev([g[-1].cin * f for g, f in zip(ups, factors)]),
                decoder_layers_per_block=rev([g[-1].layers for g in [mid] + ups]),
                decoder_spatio_temporal_scaling=rev([s is not None for s in samplers]),
                decoder_inject_noise=rev([g[-1].noise for g in [mid] + ups]),
                upsample_residual=rev([bool(s and s.residual) for s in samplers]), upsample_factor=rev(factors))


def _ltx_weights(cfg, caps) -> dict:
    out = dict(in_channels=cfg.in_channels, out_channels=cfg.out_channels, latent_channels=cfg.latent_channels,
               patch_size=cfg.patch_size, timestep_conditioning=cfg.timestep_conditioning,
               decoder_causal=cfg.causal_decoder)
    if cfg.encoder:
        out.update(_ltx_encoder(cfg))
    if cfg.decoder:
        out.update(_ltx_decoder(cfg))
    # set in the config only where the class's own count (patch * 2^scalings) is not the model's
    scalings = sum(out.get("spatio_temporal_scaling") or out.get("decoder_spatio_temporal_scaling") or ())
    counted = cfg.patch_size * 2 ** scalings, 2 ** scalings
    ratios = caps.spatial_ratio, caps.temporal_ratio
    out.update(spatial_compression_ratio=None if counted == ratios else ratios[0],
               temporal_compression_ratio=None if counted == ratios else ratios[1])
    return out


def _ltx_statistics(handle) -> dict:
    stats = handle.model.per_channel_statistics
    return dict(latents_mean=stats.get_buffer("mean-of-means").float().clone(),
                latents_std=stats.get_buffer("std-of-means").float().clone())


def _ltx_normalise(handle) -> tuple[Number, Number]:
    """Ours is (raw - mean) / std, the class's the raw mean: raw = (ours - (-mean / std)) * std."""
    stats = _ltx_statistics(handle)
    mean, std = stats["latents_mean"], stats["latents_std"]
    return tuple((-mean / std).tolist()), tuple(std.tolist())


def _ltx_decode_options(handle, given: Mapping[str, Any]) -> dict:
    """``temb``: the decode timestep of a timestep-conditioned decoder (one, or one per batch item); the
    pipeline has mixed its noise into the latent already, so ours mixes none. A decoder without timestep
    conditioning ignores it, as the class does."""
    temb = given.get("temb")
    if not handle.config.timestep_conditioning:
        return {}
    if temb is None:
        raise InputError("this LTX-Video decoder is conditioned on a timestep: decode(z, temb) needs one.",
                         input="temb", fix="pass the decode timestep, e.g. decode(z, torch.tensor([0.05])), as "
                                           "LTXPipeline does.")
    t = torch.as_tensor(temb, dtype=torch.float32).flatten().cpu()
    return dict(timestep=float(t[0]) if bool((t == t[0]).all()) else t, noise_scale=0.0)


def _ltx_prepare(handle) -> None:
    """The class pads its decoder with zeros (our loader's default for 0.9.x files is ComfyUI's reflect);
    0.9.1's injected noise comes from a seeded generator here, from the global RNG in the class."""
    set_decoder_padding(handle.model, "zeros")
    if handle.config.injects_noise:
        log.warning("VAEKit: this LTX-Video 0.9.1 decoder injects noise; the face draws it from a generator "
                    "seeded with 0 (decodes repeat), AutoencoderKLLTXVideo from torch's global RNG.")


def _ltx_ratios(config: Mapping[str, Any]) -> dict:
    """The compression ratios the class sets on itself (pipelines read ``vae.spatial_compression_ratio``)."""
    scalings = sum(config["spatio_temporal_scaling"])
    return dict(spatial_compression_ratio=config["spatial_compression_ratio"] or config["patch_size"] * 2 ** scalings,
                temporal_compression_ratio=config["temporal_compression_ratio"] or config["patch_size_t"] * 2 ** scalings)


_LTX_DEFAULTS = dict(
    in_channels=3, out_channels=3, latent_channels=128, block_out_channels=[128, 256, 512, 512],
    down_block_types=["LTXVideoDownBlock3D"] * 4, decoder_block_out_channels=[128, 256, 512, 512],
    layers_per_block=[4, 3, 3, 3, 4], decoder_layers_per_block=[4, 3, 3, 3, 4],
    spatio_temporal_scaling=[True, True, True, False], decoder_spatio_temporal_scaling=[True, True, True, False],
    decoder_inject_noise=[False] * 5, downsample_type=["conv"] * 4, upsample_residual=[False] * 4,
    upsample_factor=[1] * 4, timestep_conditioning=False, patch_size=4, patch_size_t=1, resnet_norm_eps=1e-6,
    scaling_factor=1.0, encoder_causal=True, decoder_causal=False, spatial_compression_ratio=None,
    temporal_compression_ratio=None)

AUTOENCODER_KL_LTX_VIDEO = Family(
    class_name="AutoencoderKLLTXVideo", arch="ltx", defaults=_LTX_DEFAULTS, weights=_ltx_weights,
    serves=lambda cfg: not cfg.ltx2 and cfg.log_var == "uniform", normalise=_ltx_normalise,
    attributes=lambda config: _ltx_ratios(config), decode_args=("temb", "return_dict"),
    forward_args=("temb", "sample_posterior", "return_dict", "generator"), decode_options=_ltx_decode_options,
    tensors=_ltx_statistics, prepare=_ltx_prepare)

# ---- AutoencoderKLHunyuanVideo (HunyuanVideo 1.0) and AutoencoderKLHunyuanVideo15 -----------------------
def _ratios_of(caps) -> dict:
    return dict(spatial_compression_ratio=caps.spatial_ratio, temporal_compression_ratio=caps.temporal_ratio)


def _hunyuan_video_weights(cfg, caps) -> dict:
    n = len(cfg.widths)
    return dict(in_channels=cfg.in_channels, out_channels=cfg.out_channels, latent_channels=cfg.latent_channels,
                down_block_types=["HunyuanVideoDownBlock3D"] * n, up_block_types=["HunyuanVideoUpBlock3D"] * n,
                block_out_channels=list(cfg.widths), layers_per_block=cfg.layers_per_block,
                mid_block_add_attention=cfg.mid_attention, **_ratios_of(caps))


def _ratio_attributes(config: Mapping[str, Any]) -> dict:
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
    attributes=lambda config: {**_ratio_attributes(config), "time_compression_ratio": config["temporal_compression_ratio"]})


def _hunyuan_video15_weights(cfg, caps) -> dict:
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
    weights=_hunyuan_video15_weights, attributes=_ratio_attributes)

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

# In order: where several serve one file, a folder's config.json or a file-name word chooses, else the first.
FAMILIES = (AUTOENCODER_KL, AUTOENCODER_TINY, AUTOENCODER_KL_WAN, AUTOENCODER_KL_QWEN_IMAGE, AUTOENCODER_KL_LTX_VIDEO,
            AUTOENCODER_KL_HUNYUAN_VIDEO, AUTOENCODER_KL_HUNYUAN_VIDEO15,
            AUTOENCODER_KL_COGVIDEOX)
