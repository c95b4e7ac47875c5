"""AutoencoderKLCosmos (Cosmos-1's CV8x8x8 tokenizer): ``encode`` gives the tokenizer's raw latent as an
``IdentityDistribution`` and ``decode`` takes it; the pipelines normalise per channel and latent frame with
``config.latents_mean`` / ``latents_std`` themselves. Our handle's LATENT carries that normalisation
(ComfyUI's, vae/archs/cosmos.py), so the face switches it off in our model: its calls give and take z itself."""
from __future__ import annotations

import logging

import torch

from ...archs import cosmos
from ...archs import cosmos_layout as layout
from ...errors import InputError
from .family import MISSING, Family

log = logging.getLogger("VAEKit")

# NVIDIA's CV8x8x8-1.0 statistics as diffusers' default config lists them: channel by channel, 16 latent frames each
_PUBLISHED = dict(latents_mean=[v for row in layout.PUBLISHED_MEAN for v in row],
                  latents_std=[v for row in layout.PUBLISHED_STD for v in row])


def _cosmos_weights(cfg, caps) -> dict:
    """The class's encoder widths are conv_in's then each level's; its decoder's each up level's, finest
    first, then the mid block's (the class reverses them)."""
    out = dict(in_channels=3, out_channels=3, latent_channels=cfg.latent_channels, num_layers=cfg.layers_per_block,
               patch_size=cfg.patch, patch_type="haar", spatial_compression_ratio=cfg.ratio,
               temporal_compression_ratio=cfg.ratio)
    if cfg.has_encoder:
        out["encoder_block_out_channels"] = [cfg.base, *cfg.widths]
    if cfg.has_decoder:
        out["decode_block_out_channels"] = [*cfg.decoder_widths, cfg.decoder_widths[-1]]
    return out


def _held_statistics(handle) -> dict:
    """The file's latent statistics (ComfyUI's file holds NVIDIA's mean_std.pt): listed as diffusers lists the
    published ones where they are those (float32-equal), else as the file has them. A file without any gets
    the class's default (the published ones) for 16 channels; other widths need a folder or ``config=``."""
    cfg = handle.config
    if cfg.statistics == "none":
        return dict(latents_mean=MISSING, latents_std=MISSING)
    if cfg.statistics != "file":
        return {}
    out = {}
    for key, buffer in (("latents_mean", "latent_mean"), ("latents_std", "latent_std")):
        held = handle.model.get_buffer(buffer).detach().cpu()
        # our model holds them in its dtype: compare the published ones rounded alike
        published = torch.tensor(_PUBLISHED[key], dtype=torch.float32).to(held.dtype)
        if torch.equal(held, published):
            out[key] = list(_PUBLISHED[key])
            continue
        out[key] = held.float().tolist()
        if held.dtype != torch.float32:
            log.warning("VAEKit: %s's latent statistics are not the published ones; the face's config.%s has them "
                        "rounded to %s, the dtype it was loaded in (load it in float32, or pass its folder or "
                        "config=, for the file's values).", handle.name, key, held.dtype)
    return out


def _class_latent_frames(cfg, frames: int) -> int:
    """The latent frames the class gives a clip of ``frames``: its wavelet patch takes the first frame alone
    and the rest in groups of ``patch`` (the last one partial), each level then halves them (the first alone)."""
    n = 1 + -(-(frames - 1) // cfg.patch)
    for _ in range(cfg.resample_levels):
        n = (n + 1) // 2
    return n


def _check_frames(handle, what: str, t, given):
    """A clip whose frames past the last group of ``ratio`` the class turns into a latent frame more (5-7 past
    it, at 8x), which our encoder, as ComfyUI's, drops: refused. Other counts agree with the class."""
    cfg = handle.config
    if what == "pixels" and t.dim() == 5:
        frames = t.shape[2]
        ours = 1 + (frames - 1) // cfg.ratio
        if _class_latent_frames(cfg, frames) != ours:
            keep = 1 + (ours - 1) * cfg.ratio
            raise InputError(f"a clip of {frames} frames: AutoencoderKLCosmos encodes its last {frames - keep} frames "
                             "into a latent frame of their own, which the face does not compute (it encodes 1 + "
                             f"{cfg.ratio}k frames, the rest dropped, as ComfyUI does).", input="x",
                             fix=f"pass 1 + {cfg.ratio}k frames (e.g. the first {keep}), as the Cosmos pipelines do.")
    return t


AUTOENCODER_KL_COSMOS = Family(
    class_name="AutoencoderKLCosmos", arch="cosmos",
    defaults=dict(in_channels=3, out_channels=3, latent_channels=16, encoder_block_out_channels=[128, 256, 512, 512],
                  decode_block_out_channels=[256, 512, 512, 512], attention_resolutions=[32], resolution=1024,
                  num_layers=2, patch_size=4, patch_type="haar", scaling_factor=1.0, spatial_compression_ratio=8,
                  temporal_compression_ratio=8, **_PUBLISHED),
    weights=_cosmos_weights, held=_held_statistics, posterior=False, identity=True, decode_args=("return_dict",),
    into=_check_frames, prepare=lambda handle: cosmos.set_raw_latents(handle.model))
