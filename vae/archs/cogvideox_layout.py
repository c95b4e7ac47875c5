"""CogVideoX VAE key layouts: detection, conversion to the canonical keys, and the hyperparameters read
back from them.

Layouts users have:
- diffusers ``AutoencoderKLCogVideoX`` (``vae/diffusion_pytorch_model.safetensors`` of every THUDM repo,
  kijai's CogVideoX wrapper, CogVideoX-Fun): ``down_blocks / up_blocks / mid_block.resnets`` (up blocks
  counted coarse to fine), ``conv_shortcut``. ComfyUI's ``cogvideox_vae.safetensors`` has these names
  too (core's module tree is diffusers'); full checkpoints carry them under ``vae.``.
- the original's (THUDM's SAT ``3d-vae.pt``): LDM names (``down.<i>.block.<j>``, ``mid.block_1``,
  ``up.<i>`` indexed like the encoder, ``nin_shortcut``), with the training loss's weights (``loss.``:
  discriminator, LPIPS) beside them, which are not part of the VAE and are dropped.
Both wrap every causal conv (``conv1.conv.weight``) and name a SpatialNorm's parts ``norm_layer``,
``conv_y``, ``conv_b``. Canonical: the original's names without the causal convs' ``.conv.`` wrapper."""
from __future__ import annotations

import re

from ..files.keymap import count_indices, rename
from . import ldm
from .hunyuan_video import detect_video_ldm

_CAUSAL = r"(conv_in|conv_out|conv1|conv2|conv_y|conv_b)"
_UNWRAP = [(rf"\.{_CAUSAL}\.conv\.(weight|bias)$", r".\1.\2")]
_WRAP = [(rf"\.{_CAUSAL}\.(weight|bias)$", r".\1.conv.\2")]

# every canonical key is in these parts; resnets have GroupNorm (encoder) or SpatialNorm (decoder) norms
_PARTS = re.compile(r"^(encoder|decoder)\.(conv_in|down|up|mid|norm_out|conv_out)\.")
_RESNET_NORM = re.compile(r"^(encoder|decoder)\.(down|up)\.\d+\.block\.\d+\.norm1\.(norm_layer\.)?weight$")


def to_canonical(sd) -> dict:
    sd = {k: v for k, v in sd.items() if not k.startswith("loss.")}
    if ldm.is_diffusers(sd.keys()):
        sd = ldm.from_diffusers(sd, ndim=5)
    return rename(sd, _UNWRAP)


def to_original(sd) -> dict:
    """Canonical -> the original's (SAT) names, as its ``3d-vae.pt`` holds them."""
    return rename(sd, _WRAP)


def detect(sd) -> bool:
    """The video LDM skeleton with 3x3 resamplers that are 2-D convs (applied per frame; HunyuanVideo's
    are 3-D) and no attention."""
    if not detect_video_ldm(sd, to_canonical, _PARTS, _RESNET_NORM,
                            lambda v: v.dim() == 4 and v.shape[0] == v.shape[1] and tuple(v.shape[2:]) == (3, 3)):
        return False
    return not any(".attn_1." in k for k in to_canonical(sd))


def config_fields(sd) -> dict:
    """Widths, resnets per level and channels from the canonical keys (the encoder's where both halves
    are here; the loader checks that the decoder matches)."""
    keys = list(sd.keys())
    f: dict = {"has_encoder": "encoder.conv_in.weight" in sd, "has_decoder": "decoder.conv_in.weight" in sd}
    if f["has_decoder"]:
        levels = count_indices(keys, "decoder.up")
        f["widths"] = tuple(sd[f"decoder.up.{i}.block.0.conv2.weight"].shape[0] for i in range(levels))
        f["layers_per_block"] = count_indices(keys, "decoder.up.0.block") - 1
        f["latent_channels"] = sd["decoder.conv_in.weight"].shape[1]
        f["out_channels"] = sd["decoder.conv_out.weight"].shape[0]
    if f["has_encoder"]:
        levels = count_indices(keys, "encoder.down")
        f["widths"] = tuple(sd[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] for i in range(levels))
        f["layers_per_block"] = count_indices(keys, "encoder.down.0.block")
        f["latent_channels"] = sd["encoder.conv_out.weight"].shape[0] // 2
        f["in_channels"] = sd["encoder.conv_in.weight"].shape[1]
    return f
