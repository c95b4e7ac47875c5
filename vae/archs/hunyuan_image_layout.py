"""HunyuanImage 2.1 and 3.0 VAE key layouts -> the canonical one, detection, and the config read from the weights.

Layouts users have:
- Tencent's original = ComfyUI's single files: the LDM names (``{encoder,decoder}.conv_in``,
  ``encoder.down.<i>.block.<j>.{norm1,conv1,norm2,conv2,nin_shortcut}``, ``encoder.down.<i>.downsample.conv``,
  ``{encoder,decoder}.mid.{block_1,attn_1,block_2}`` with the attention's ``norm q k v proj_out`` as 1x1
  convs, ``norm_out``, ``conv_out``), plain convs (no ``.conv.`` wrapper), GroupNorm ``weight``/``bias``;
  the decoder's ``up.<i>`` in the order they run (``up.0`` first, coarsest), ``up.<i>.upsample.conv``.
  HunyuanImage 2.1 (``hyimage/models/vae/hunyuanimage_vae.py``: ``ckpts/vae/vae_2_1/pytorch_model.ckpt``,
  a ``state_dict`` of ``vae.`` keys) has 2-D convs; diffusers' converter also squeezes 5-D kernels of
  time size 1 from it, so such files are read as 2-D. HunyuanImage 3.0 (``hunyuan_image_3/autoencoder_kl_3d.py``,
  the ``vae.`` part of the full checkpoint) has 3-D convs.
- diffusers ``AutoencoderKLHunyuanImage`` (2.1 only): flat block lists, each level's resnets and then
  its resampler in running order: ``encoder.down_blocks.<k>`` (``norm1 conv1 norm2 conv2 conv_shortcut``,
  or a resampler's ``conv``), ``decoder.up_blocks.<k>``, ``{encoder,decoder}.mid_block.{resnets.0,
  attentions.0,resnets.1}`` with ``norm to_q to_k to_v proj``, ``norm_out``, ``conv_out``.
- ComfyUI in memory (``comfy.sd.VAE.get_sd()``, a core-loaded VAE handed to our nodes): 3.0's as the file plus
  the mid-block resnets' ``temb_proj`` (a timestep projection core builds and never uses), dropped on load.
- full checkpoints: the VAE under ``vae.`` (vae/loading.py strips it).
Canonical: the LDM names, the decoder's ``up.<i>`` indexed fine to coarse (``up.<n-1>`` runs first),
2-D convs for 2.1, 3-D for 3.0.

Detection: the LDM parts only (no quant convs), GroupNorm resnets (``norm1.weight``; HunyuanVideo
1.5's L2 norm has ``gamma``), and DC-AE resamplers: one 3x3 (3x3x3) conv each, of the same rank as
``conv_in``, at least one of which changes the width (the KL family's and HunyuanVideo 1.0's keep it).
"""
from __future__ import annotations

import re
from functools import partial
from typing import Callable, Mapping

import torch

from ..errors import LoadError
from ..files.keymap import count_indices, rename
from . import hunyuan_video15_layout as dcae_layout
from .hunyuan_video import conv_in, detect_video_ldm

# diffusers' flat lists: level <k> of ``down_blocks``/``up_blocks`` is a resnet or a resampler (``conv``)
_FLAT = re.compile(r"^(encoder|decoder)\.(down|up)_blocks\.(\d+)\.(?!resnets\.|downsamplers\.|upsamplers\.)")
_MID = [
    (r"\.mid_block\.resnets\.0\.", ".mid.block_1."),
    (r"\.mid_block\.resnets\.1\.", ".mid.block_2."),
    (r"\.mid_block\.attentions\.0\.to_([qkv])\.", r".mid.attn_1.\1."),
    (r"\.mid_block\.attentions\.0\.proj\.", ".mid.attn_1.proj_out."),
    (r"\.mid_block\.attentions\.0\.norm\.", ".mid.attn_1.norm."),
    (r"\.conv_shortcut\.", ".nin_shortcut."),
]
# core's 3.0 mid-block resnets are built with a timestep projection they never use (``temb_channels`` left at
# its default; no timestep reaches them): its model's state dict (``VAE.get_sd()``) carries these
_UNUSED = re.compile(r"^(encoder|decoder)\.mid\.block_[12]\.temb_proj\.(weight|bias)$")
_PARTS = re.compile(r"^(encoder|decoder)\.(conv_in|down|up|mid|norm_out|conv_out)\.")
_RESNET_NORM = re.compile(r"^(encoder|decoder)\.(down|up)\.\d+\.block\.\d+\.norm1\.weight$")
_RESAMPLER = re.compile(r"^(encoder|decoder)\.(down|up)\.\d+\.(downsample|upsample)\.conv\.weight$")


def _from_flat(sd: Mapping[str, torch.Tensor]) -> dict:
    """diffusers' flat block lists -> LDM levels (the decoder's still in running order)."""
    blocks: dict[tuple[str, int], bool] = {}      # (side, k) -> is a resampler
    for key in sd:
        if m := _FLAT.match(key):
            rest = key[m.end():]
            blocks[(m[1], int(m[3]))] = blocks.get((m[1], int(m[3])), False) or rest.startswith("conv.")
    where = {}
    for side, kind, resampler in (("encoder", "down", "downsample"), ("decoder", "up", "upsample")):
        level = j = 0
        for k in sorted(i for s, i in blocks if s == side):
            if blocks[(side, k)]:
                where[(side, k)] = f"{side}.{kind}.{level}.{resampler}."
                level, j = level + 1, 0
            else:
                where[(side, k)] = f"{side}.{kind}.{level}.block.{j}."
                j += 1
    out = {}
    for key, v in sd.items():
        m = _FLAT.match(key)
        out[where[(m[1], int(m[3]))] + key[m.end():] if m else key] = v
    return rename(out, _MID)


def _flat_time(sd: Mapping[str, torch.Tensor]) -> dict:
    """A 2-D network stored with 5-D kernels of time size 1 (``conv_in`` tells): every such kernel squeezed."""
    w = conv_in(sd)
    if w is None or w.dim() != 5 or w.shape[2] != 1:
        return dict(sd)
    return {k: v.squeeze(2) if v.dim() == 5 and v.shape[2] == 1 else v for k, v in sd.items()}


def to_canonical(sd: Mapping[str, torch.Tensor]) -> dict:
    sd = {k: v for k, v in sd.items() if not _UNUSED.match(k)}
    if any(_FLAT.match(k) for k in sd):
        sd = _from_flat(sd)
    return dcae_layout.fine_to_coarse(_flat_time(sd))


def to_original(sd: Mapping[str, torch.Tensor]) -> dict:
    """Canonical -> Tencent's = ComfyUI's names (the decoder's levels in running order), as their files hold them."""
    n = count_indices(sd.keys(), "decoder.up")
    return rename(sd, [(r"^decoder\.up\.(\d+)\.", lambda m: f"decoder.up.{n - 1 - int(m[1])}.")])


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    sd = to_canonical(sd)
    w = conv_in(sd)
    if w is None or not detect_video_ldm(sd, dict, _PARTS, _RESNET_NORM, ranks=(4, 5),
                                         resampler_ok=lambda v: v.dim() == w.dim() and v.shape[-1] == 3):
        return False
    return any(v.shape[0] != v.shape[1] for k, v in sd.items() if _RESAMPLER.match(k))


def config(sd: Mapping[str, torch.Tensor], make: Callable, resample: Callable):
    """Widths, depth, channels and resamplers from the weights (dcae_layout.config), and the conv rank:
    2 (HunyuanImage 2.1), 3 (3.0). A 2-D network has no temporal resampler."""
    dims = conv_in(sd).dim() - 2
    cfg = dcae_layout.config(sd, partial(make, dims=dims), resample, family="HunyuanImage")
    if dims == 2 and cfg.ratios[1] != 1:
        raise LoadError("a 2-D HunyuanImage VAE file has resamplers of a temporal level (out/8 or out*8 channels).",
                        fix="the file may be damaged or another model; please report it with the key list.")
    return cfg
