"""Stable Video Diffusion VAE key layouts -> the canonical one, detection, and the one hyperparameter
the KL family's reader (kl.py) does not read: the temporal kernel.

Layouts users have:
- the original = ComfyUI core's (Stability-AI generative-models: ``AutoencodingEngine`` with
  ``sgm.modules.autoencoding.temporal_ae.VideoDecoder``): the KL family's LDM names plus, in every decoder
  resnet, ``time_stack.in_layers.{0,2}`` / ``time_stack.out_layers.{0,3}`` (GroupNorm, (k, 1, 1) conv)
  and ``mix_factor``, and ``decoder.conv_out.time_mix_conv``; no quant convs. ``svd.safetensors``,
  ``svd_xt.safetensors`` (and 1.1) keep it under ``first_stage_model.`` (the loader reads only those
  tensors; core's Image Only Checkpoint Loader reads the same). Their ``conditioner.embedders.3.encoder.``
  holds a second, plain SD VAE (the conditioning frame's encoder) that is not this VAE. SV3D checkpoints
  hold only the decoder under ``first_stage_model.``.
- diffusers ``AutoencoderKLTemporalDecoder``: ``decoder.mid_block.resnets.<i>`` and
  ``decoder.up_blocks.<i>.resnets.<j>``, each a ``spatial_res_block`` (norm1 conv1 norm2 conv2
  conv_shortcut), a ``temporal_res_block`` (norm1 conv1 norm2 conv2) and ``time_mixer.mix_factor``;
  ``decoder.time_conv_out``; the encoder in diffusers' KL names with a ``quant_conv`` (diffusers'
  conversion takes the encoder and its quant conv from the checkpoint's conditioner embedder).
Canonical: the original's names (the module tree of vae/archs/svd.py)."""
from __future__ import annotations

import re
from typing import Iterable, Mapping

import torch

from ..errors import LoadError
from ..files.keymap import rename
from . import ldm

# keys only a temporal decoder has, in either layout (the KL family declines files that have them)
TEMPORAL = re.compile(r"^decoder\.(?:.*\.(?:time_stack|temporal_res_block|time_mixer|time_mix_conv)\."
                      r"|.*\.mix_factor$|time_conv_out\.)")

_FROM_DIFFUSERS = [
    (r"\.spatial_res_block\.", "."),
    (r"\.temporal_res_block\.norm1\.", ".time_stack.in_layers.0."),
    (r"\.temporal_res_block\.conv1\.", ".time_stack.in_layers.2."),
    (r"\.temporal_res_block\.norm2\.", ".time_stack.out_layers.0."),
    (r"\.temporal_res_block\.conv2\.", ".time_stack.out_layers.3."),
    (r"\.time_mixer\.mix_factor$", ".mix_factor"),
    (r"^decoder\.time_conv_out\.", "decoder.conv_out.time_mix_conv."),
]


def is_temporal(keys: Iterable[str]) -> bool:
    return any(TEMPORAL.match(k) for k in keys)


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    """A decoder with temporal layers (mix factors, time stacks, the time-mixing output conv), in the
    original's / core's or diffusers' names. An encoder alone is SD's KL encoder (kl.py reads it)."""
    return is_temporal(sd.keys())


def to_canonical(sd: Mapping[str, torch.Tensor]) -> dict:
    if not ldm.is_diffusers(sd.keys()):
        return dict(sd)
    # diffusers' temporal names -> the original's inside each resnet, then the KL family's diffusers rules
    # (blocks, mid block, attention as 1x1 conv2d: the mid attention runs per frame)
    return ldm.from_diffusers(rename(sd, _FROM_DIFFUSERS), ndim=4)


def time_kernel(sd: Mapping[str, torch.Tensor]) -> int:
    """The frames a temporal conv spans (``video_kernel_size`` (k, 1, 1), 3 as published), from the
    output's time-mixing conv or the first time stack (canonical names); the other convs' shapes are
    checked against it when the weights are assigned."""
    if any(".time_mix_block." in k or ".video_time_embed." in k for k in sd):
        raise LoadError("this SVD-style VAE mixes frames in its mid-block attention too (the original's "
                        "time_mode 'all'); no published file does, and neither core nor this pack builds it.",
                        fix="load the published SVD VAE (svd.safetensors / svd_xt.safetensors), or please "
                            "report the file with its key list.")
    for key in ("decoder.conv_out.time_mix_conv.weight", "decoder.mid.block_1.time_stack.in_layers.2.weight"):
        w = sd.get(key)
        if w is not None:
            if w.dim() != 5 or tuple(w.shape[3:]) != (1, 1) or w.shape[2] % 2 == 0:
                raise LoadError(f"'{key}' has shape {list(w.shape)}; SVD's temporal convs span an odd number of "
                                "frames and one pixel (k, 1, 1).",
                                fix="the file may be damaged or another model's: download it again.")
            return int(w.shape[2])
    raise LoadError("this temporal decoder has neither its output's time-mixing conv nor the mid block's time "
                    "stack ('decoder.conv_out.time_mix_conv.weight', 'decoder.mid.block_1.time_stack...').",
                    fix="the file is incomplete: download it again.")
