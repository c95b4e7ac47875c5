"""AutoencoderKLQwenImage21 (Qwen-Image 2.1)."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ...archs.tiny import QWEN21_MEAN, QWEN21_STD
from .family import MISSING, Family, one_frame
from .wan import temporal_attributes, wan_weights


# ---- AutoencoderKLQwenImage21 ---------------------------------------------------------------------------
# Our loader reads the file as the Wan family's image variant (4-D images and latents); the class takes and
# gives one-frame clips [B, C, 1, H, W], as its pipelines pass them. Its latent statistics, which its
# pipelines normalise with, are the published ones (diffusers' class defaults, ComfyUI's QwenImage21 format).
def _qwen21_weights(cfg, caps) -> dict:
    out = wan_weights(cfg, caps)
    del out["latents_mean"], out["latents_std"]       # not in the weights: the published ones are the defaults
    if cfg.latent_channels != len(QWEN21_MEAN):       # for other widths only a config.json has them
        out.update(latents_mean=MISSING, latents_std=MISSING)
    base, dec = out["base_dim"], out["decoder_base_dim"]
    return dict(out, decoder_base_dim=dec or base, scale_factor_temporal=2 ** sum(cfg.temporal))


def _frame_out(handle, what: str, t: torch.Tensor, given: Mapping[str, Any]) -> torch.Tensor:
    return t.unsqueeze(2)


def _frame_in(handle, what: str, t: torch.Tensor, given: Mapping[str, Any]) -> torch.Tensor:
    """An image VAE to us: the class's one-frame clips as images."""
    return one_frame("AutoencoderKLQwenImage21", "QwenImage21Pipeline", what, t)[:, :, 0]


AUTOENCODER_KL_QWEN_IMAGE21 = Family(
    class_name="AutoencoderKLQwenImage21", arch="wan",
    defaults=dict(base_dim=96, decoder_base_dim=144, z_dim=64, dim_mult=[1, 2, 4, 8, 8], num_res_blocks=2,
                  attn_scales=[], temperal_downsample=[False, True, True, True], dropout=0.0,
                  latents_mean=list(QWEN21_MEAN), latents_std=list(QWEN21_STD), is_residual=True, in_channels=4,
                  out_channels=4, patch_size=None, scale_factor_temporal=8, scale_factor_spatial=16),
    weights=_qwen21_weights, serves=lambda cfg: cfg.image, clamps=True, into=_frame_in, out_of=_frame_out,
    attributes=lambda config: temporal_attributes(config, config["scale_factor_spatial"]))
