"""AutoencoderKLFlux2 (Flux.2 and its small decoders)."""
from __future__ import annotations

import torch

from ...archs.flux2 import BN_EPS
from ...files import latents
from .family import Family, Number
from .image import kl_weights


# ---- AutoencoderKLFlux2 ---------------------------------------------------------------------------------
# Our LATENT is the latent packed 2x2 and normalised by the BatchNorm's running statistics (ComfyUI's);
# the class's encode/decode work on the raw, unpacked latent, and its pipelines pack and normalise with
# ``vae.bn`` themselves. The normalisation is per packed channel, so it is declared in the packed layout.
def _flux2_weights(cfg, caps) -> dict:
    return dict(kl_weights(cfg, caps), decoder_block_out_channels=list(cfg.decoder_widths) if cfg.decoder_widths else None,
                patch_size=[cfg.pack, cfg.pack], batch_norm_eps=BN_EPS)


def _flux2_normalise(handle) -> tuple[Number, Number]:
    """Ours is (raw - mean) / std per packed channel: raw = (ours - (-mean / std)) * std."""
    bn = handle.model.bn
    mean, std = bn.running_mean.float(), (bn.running_var.float() + bn.eps).sqrt()
    return tuple((-mean / std).tolist()), tuple(std.tolist())


def _pack(handle, what: str, t: torch.Tensor, given) -> torch.Tensor:
    return latents.pack(t, handle.config.pack) if what == "latent" else t


def _unpack(handle, what: str, t: torch.Tensor, given) -> torch.Tensor:
    return latents.unpack(t, handle.config.pack) if what == "latent" else t


_FLUX2_DEFAULTS = dict(
    in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
    block_out_channels=[128, 256, 512, 512], decoder_block_out_channels=None, layers_per_block=2, act_fn="silu",
    latent_channels=32, norm_num_groups=32, sample_size=1024, use_quant_conv=True, use_post_quant_conv=True,
    mid_block_add_attention=True, batch_norm_eps=1e-4, batch_norm_momentum=0.1, patch_size=[2, 2])

AUTOENCODER_KL_FLUX2 = Family(
    class_name="AutoencoderKLFlux2", arch="flux2", defaults=_FLUX2_DEFAULTS, weights=_flux2_weights,
    # the class has one resnet count for both halves
    serves=lambda cfg: cfg.decoder_res_blocks in (None, cfg.num_res_blocks),
    normalise=_flux2_normalise, into=_pack, out_of=_unpack, modules=("bn",))
