"""Consistency decoder key layouts: detection and conversion to the canonical one.

Canonical = the encoder half in kl's canonical (LDM) names (``encoder.down.0.block.0``,
``quant_conv``) and the decoder UNet in diffusers' ``ConsistencyDecoderVAE.decoder_unet`` names
(``decoder_unet.down_blocks.0.resnets.0.time_emb_proj``). Why diffusers' names for the UNet: the
only complete published file (encoder + decoder, ``openai/consistency-decoder``) is diffusers';
OpenAI's own ``decoder.pt`` is a TorchScript archive that the safe loader does not execute, so its
names only reach us in converted state dicts; and diffusers' names say what each tensor is
(``downsamplers.0``) where OpenAI's flat indices (``down.0.3``) need the block count to read.

OpenAI's names (facts: diffusers ``scripts/convert_consistency_decoder.py``), decoder only:
- module form (its ``ConvUNetVAE``): ``embed_image.f``, ``embed_time.{emb,f_1,f_2}``,
  ``down.<i>.<j>`` (j = resnets, then the down-sampler), ``mid.<k>``, ``up.<i>.<j>`` (resnets,
  then the up-sampler; ``up.<n-1>`` runs first), ``output.{gn,f}``; inside a block
  ``gn_1 f_1 gn_2 f_2 f_t f_s``;
- TorchScript form (the archive's own state dict): ``blocks.`` prefixes, ``down_<i>_conv_<j>``,
  ``down_<i>_downsamp``, ``mid_<k>``, ``up_<i>_conv_<j>``, ``up_<i>_upsamp``, and tensor names
  ``w``/``b``/``g`` (g: a GroupNorm's weight)."""
from __future__ import annotations

import re
from typing import Mapping

import torch

from ..files.keymap import count_indices, rename
from . import kl

UNET = "decoder_unet."
ENCODER_PREFIXES = ("encoder.", "quant_conv.")
OPENAI_TIME = re.compile(r"^(blocks\.)?embed_time\.f_1\.(w|weight)$")

_PARTS = {"gn_1": "norm1", "f_1": "conv1", "gn_2": "norm2", "f_2": "conv2", "f_t": "time_emb_proj",
          "f_s": "conv_shortcut"}
_TOP = {"embed_image.f": "conv_in", "embed_time.emb": "time_proj", "embed_time.f_1": "time_embedding.linear_1",
        "embed_time.f_2": "time_embedding.linear_2", "output.gn": "conv_norm_out", "output.f": "conv_out"}


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    return any(k.startswith(UNET) or OPENAI_TIME.match(k) for k in sd)


def _torchscript_to_module_names(sd: dict) -> dict:
    """OpenAI's TorchScript names -> its module names, with the resamplers named ``downsamp`` /
    ``upsamp`` (their index is resolved with the module form's)."""
    rules = [
        (r"^blocks\.", ""),
        (r"^(down|up)_(\d+)_conv_(\d+)\.", r"\1.\2.\3."),
        (r"^(down|up)_(\d+)_(downsamp|upsamp)\.", r"\1.\2.\3."),
        (r"^mid_(\d+)\.", r"mid.\1."),
        (r"\.(w|g)$", ".weight"),
        (r"\.b$", ".bias"),
    ]
    return rename(sd, rules)


def _openai_to_canonical(sd: dict) -> dict:
    sd = _torchscript_to_module_names(sd)
    keys = sd.keys()
    n = count_indices(keys, "down")
    # the coarsest down level and the finest up level have no resampler: their block counts
    down_res, up_res = count_indices(keys, f"down.{n - 1}"), count_indices(keys, "up.0")
    part = lambda m: _PARTS.get(m.group("p"), m.group("p"))

    def block(side: str, m: re.Match, n_res: int, resampler: str) -> str:
        level = int(m.group("i")) if side == "down" else n - 1 - int(m.group("i"))  # up: coarse first
        j = m.group("j")
        inner = f"resnets.{j}" if j.isdigit() and int(j) < n_res else f"{resampler}.0"
        return f"{side}_blocks.{level}.{inner}.{part(m)}."

    inner = r"\.(?P<i>\d+)\.(?P<j>\d+|downsamp|upsamp)\.(?P<p>\w+?)\."
    rules = [
        (rf"^down{inner}", lambda m: block("down", m, down_res, "downsamplers")),
        (rf"^up{inner}", lambda m: block("up", m, up_res, "upsamplers")),
        (r"^mid\.(\d+)\.(?P<p>\w+?)\.", lambda m: f"mid_block.resnets.{m.group(1)}.{part(m)}."),
        (r"^(" + "|".join(re.escape(k) for k in _TOP) + r")\.", lambda m: _TOP[m.group(1)] + "."),
    ]
    return {UNET + k: v for k, v in rename(sd, rules).items()}


def to_canonical(sd) -> dict:
    """Encoder keys through kl's conversion (any KL layout), UNet keys from diffusers or OpenAI."""
    enc = {k: v for k, v in sd.items() if k.startswith(ENCODER_PREFIXES)}
    dec = {k: v for k, v in sd.items() if not k.startswith(ENCODER_PREFIXES)}
    if not any(k.startswith(UNET) for k in dec):
        dec = _openai_to_canonical(dec)
    return {**(kl.to_canonical(enc) if enc else {}), **dec}
