"""AutoencoderKL and AutoencoderTiny: the image classes."""
from __future__ import annotations

import logging


from .family import Family

log = logging.getLogger("VAEKit")


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


def kl_weights(cfg, caps) -> dict:
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
    weights=kl_weights,
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
