"""AutoencoderKLLTXVideo (LTX-Video 0.9.x) and AutoencoderKLLTX2Video (LTX-2, LTX-2.3): one block list
(vae/archs/ltx_config.py) read back into either class's block parameters."""
from __future__ import annotations

import logging
from typing import Any, Mapping

import torch

from ...archs.ltx import set_decoder_padding
from ...errors import InputError
from .family import Family, Number

log = logging.getLogger("VAEKit")


# ---- AutoencoderKLLTXVideo (LTX-Video 0.9.0, 0.9.1, 0.9.5/0.9.7) ----------------------------------------
# Our block list (vae/archs/ltx_config.py) read back into the class's block parameters: the encoder's down
# blocks are [resnets][down-sampler][widening resnet], the last resnets its mid block; the decoder's up
# blocks [widening resnet][up-sampler][resnets] after its mid block, listed finest first as the class does.
# a resampler's stride -> the classes' down/upsample_type
SAMPLER_TYPES = {(1, 2, 2): "spatial", (2, 1, 1): "temporal", (2, 2, 2): "spatiotemporal"}


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


def _sampler_type(s) -> str:
    """A space-to-depth down-sampler's or an up-sampler's type; "conv" for a strided conv (0.9.0/0.9.1)."""
    return SAMPLER_TYPES.get(s.stride, "conv") if s.kind != "down" else "conv"


def _encoder_groups(cfg) -> tuple[list[list], list, list]:
    """(down groups, the mid group, each down group's sampler or None)."""
    *downs, mid = _groups(cfg.encoder, ends_with_res=False)
    return downs, mid, [next((b for b in g if b.kind in ("down", "s2d")), None) for g in downs]


def _encoder_kwargs(downs, mid, samplers, types: list[str]) -> dict:
    """The encoder parameters both classes share."""
    return dict(layers_per_block=[g[0].layers for g in downs + [mid]],
                spatio_temporal_scaling=[s is not None for s in samplers], downsample_type=types)


def _ltx_encoder(cfg) -> dict:
    downs, mid, samplers = _encoder_groups(cfg)
    s2d = any(b.kind == "s2d" for b in cfg.encoder)
    widths = [g[0].cin for g in downs] + ([mid[0].cin] if s2d else [])
    return dict(block_out_channels=widths,
                down_block_types=["LTXVideo095DownBlock3D" if s2d else "LTXVideoDownBlock3D"] * len(downs),
                **_encoder_kwargs(downs, mid, samplers, [_sampler_type(s) if s2d and s else "conv" for s in samplers]))


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


def _common_weights(cfg, caps, encoder, decoder) -> dict:
    """The config keys both classes share, from the weights; ``encoder`` / ``decoder``: the class's
    block parameters of each side (cfg -> dict)."""
    out = dict(in_channels=cfg.in_channels, out_channels=cfg.out_channels, latent_channels=cfg.latent_channels,
               patch_size=cfg.patch_size, timestep_conditioning=cfg.timestep_conditioning,
               decoder_causal=cfg.causal_decoder)
    if cfg.encoder:
        out.update(encoder(cfg))
    if cfg.decoder:
        out.update(decoder(cfg))
    # set in the config only where the class's own count (patch * 2^scalings) is not the model's
    scalings = sum(out.get("spatio_temporal_scaling") or out.get("decoder_spatio_temporal_scaling") or ())
    counted = cfg.patch_size * 2 ** scalings, 2 ** scalings
    ratios = caps.spatial_ratio, caps.temporal_ratio
    out.update(spatial_compression_ratio=None if counted == ratios else ratios[0],
               temporal_compression_ratio=None if counted == ratios else ratios[1])
    return out


def _ltx_weights(cfg, caps) -> dict:
    return _common_weights(cfg, caps, _ltx_encoder, _ltx_decoder)


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
        raise InputError(f"this {'LTX-2' if handle.config.ltx2 else 'LTX-Video'} decoder is conditioned on a "
                         "timestep: decode(z, temb) needs one.", input="temb",
                         fix="pass the decode timestep, e.g. decode(z, torch.tensor([0.05])), as LTXPipeline and "
                             "LTX2Pipeline do.")
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


# ---- AutoencoderKLLTX2Video (LTX-2, LTX-2.3) -------------------------------------------------------------
# The class's encoder: conv_in to latent_channels wide, then down blocks of [resnets][down-sampler], each
# block's width the down-sampler's output; its decoder lists up-sampler types in execution order.
def _ltx2_encoder(cfg) -> dict:
    downs, mid, samplers = _encoder_groups(cfg)
    return dict(block_out_channels=[g[0].cin for g in downs[1:] + [mid]],
                down_block_types=["LTX2VideoDownBlock3D"] * len(downs),
                **_encoder_kwargs(downs, mid, samplers, [_sampler_type(s) if s else "conv" for s in samplers]))


def _ltx2_decoder(cfg) -> dict:
    ups = [next((b for b in g if b.kind == "up"), None) for g in _groups(cfg.decoder, ends_with_res=True)[1:]]
    return dict(_ltx_decoder(cfg), upsample_type=[_sampler_type(s) if s else "spatiotemporal" for s in ups])


def _ltx2_weights(cfg, caps) -> dict:
    # what our model runs that the weights cannot tell: a causal encoder, the paddings it was loaded with
    # (the file's metadata, else the published values), the shortcut LayerNorm's eps 1e-6, no temporal patches
    return dict(_common_weights(cfg, caps, _ltx2_encoder, _ltx2_decoder), encoder_causal=True, patch_size_t=1,
                resnet_norm_eps=1e-6, encoder_spatial_padding_mode=cfg.encoder_spatial_pad,
                decoder_spatial_padding_mode=cfg.decoder_spatial_pad)


def _ltx2_serves(cfg) -> bool:
    """LTX-2 files whose encoder (if any) the class can hold (its conv_in is latent_channels wide). A
    timestep-conditioned LTX-2.0 VAE has 0.9.5's shapes and computation: without the file's metadata it
    reads as 0.9.5, which this class serves where a folder's config.json or a file-name word names it."""
    return ((cfg.ltx2 or cfg.version == "0.9.5") and cfg.log_var == "uniform"
            and (not cfg.encoder or cfg.encoder[0].cin == cfg.latent_channels))


def _ltx2_decode_options(handle, given: Mapping[str, Any]) -> dict:
    """``causal``: the class runs the decoder causally if it is, or if asked (``causal or is_causal``); ours
    runs as loaded, so ``causal=True`` is refused for a non-causal decoder."""
    if given.get("causal") and not handle.config.causal_decoder:
        raise InputError("decode(causal=True) asks this LTX-2 decoder, which is not causal (as published), to run "
                         "causally; the face runs it as its file says.", input="causal",
                         fix="leave causal unset (None) or False; a causal decoder comes from a file whose metadata "
                             "says causal_decoder.")
    return _ltx_decode_options(handle, given)


AUTOENCODER_KL_LTX2_VIDEO = Family(
    class_name="AutoencoderKLLTX2Video", arch="ltx",
    defaults=dict(
        in_channels=3, out_channels=3, latent_channels=128, block_out_channels=[256, 512, 1024, 2048],
        down_block_types=["LTX2VideoDownBlock3D"] * 4, decoder_block_out_channels=[256, 512, 1024],
        layers_per_block=[4, 6, 6, 2, 2], decoder_layers_per_block=[5, 5, 5, 5],
        spatio_temporal_scaling=[True] * 4, decoder_spatio_temporal_scaling=[True] * 3,
        decoder_inject_noise=[False] * 4, downsample_type=["spatial", "temporal", "spatiotemporal", "spatiotemporal"],
        upsample_type=["spatiotemporal"] * 3, upsample_residual=[True] * 3, upsample_factor=[2] * 3,
        timestep_conditioning=False, patch_size=4, patch_size_t=1, resnet_norm_eps=1e-6, scaling_factor=1.0,
        encoder_causal=True, decoder_causal=True, encoder_spatial_padding_mode="zeros",
        decoder_spatial_padding_mode="reflect", spatial_compression_ratio=None, temporal_compression_ratio=None),
    # the file-name words of LTX-2 files (ltx-2-19b, ltx-2.3-22b, LTX2_...), not LTX-Video's "ltx-2b"
    weights=_ltx2_weights, serves=_ltx2_serves, names=("ltx-2-", "ltx-2.", "ltx-2_", "ltx2", "ltx_2"),
    normalise=_ltx_normalise, attributes=_ltx_ratios,
    # the causal encoder runs causally whatever ``causal`` says (the class: ``causal or is_causal``)
    encode_args=("causal", "return_dict"), decode_args=("temb", "causal", "return_dict"),
    decode_options=_ltx2_decode_options,
    forward_args=("temb", "sample_posterior", "encoder_causal", "decoder_causal", "return_dict", "generator"),
    forward_routes={"encoder_causal": ("encode", "causal"), "decoder_causal": ("decode", "causal")},
    tensors=_ltx_statistics)
