"""SeedVR2 VAE key layouts -> the canonical one (the LDM names of vae/archs/ldm.py), detection, and the
config read from the weights.

Layouts users have:
- the original (ByteDance-Seed/SeedVR ``ema_vae.pth``) = ComfyUI's single file
  (``seedvr2_ema_vae_fp16.safetensors``, which core's module tree loads as is): diffusers-style names
  ``{encoder,decoder}.conv_in``, ``encoder.down_blocks.<i>.resnets.<j>`` + ``downsamplers.0.conv``,
  ``decoder.up_blocks.<i>`` counted in running order (coarse first) + ``upsamplers.0.{upscale_conv,conv}``,
  ``mid_block.{resnets.0,attentions.0,resnets.1}`` (attention ``group_norm``, ``to_q/to_k/to_v``,
  ``to_out.0`` as Linear), ``conv_norm_out``, ``conv_out``; resnets ``norm1 conv1 norm2 conv2`` and
  ``conv_shortcut``. No quant convs. Full checkpoints: under ``vae.`` (vae/loading.py strips it).
- a decoder-only file (core loads it, warning that the encoder's keys are missing) and an
  encoder-only file (core does not detect it; it is detected here).
diffusers has no SeedVR2 class. Canonical: the LDM names (``down.<i>.block.<j>``, ``up.<i>`` indexed
fine to coarse, ``mid.{block_1,attn_1,block_2}``, attention ``norm q k v proj_out`` as 1x1 convs,
``norm_out``, ``nin_shortcut``), resamplers ``downsample.conv``, ``upsample.{upscale_conv,conv}``."""
from __future__ import annotations

import re
from typing import Callable, Mapping

import torch

from ..errors import LoadError
from ..files.keymap import count_indices, rename
from . import ldm

# the decoder's own key (the name core detects the family by; canonical: ``decoder.up.<i>.upsample.``)
_UPSCALE = re.compile(r"^decoder\.(?:up_blocks\.\d+\.upsamplers\.0|up\.\d+\.upsample)\.upscale_conv\.weight$")
_PARTS = re.compile(r"^(encoder|decoder)\.(conv_in|down|up|mid|norm_out|conv_out)\.")
_DOWN = re.compile(r"^encoder\.down\.\d+\.downsample\.conv\.weight$")


def to_canonical(sd: Mapping[str, torch.Tensor]) -> dict:
    # the mid attention's Linear weights become 1x1 conv2d weights (per-frame attention)
    return ldm.from_diffusers(sd, ndim=4) if ldm.is_diffusers(sd.keys()) else dict(sd)


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    """A decoder's ``upscale_conv`` (no other family has one), or an encoder alone: 5-D convs in the
    LDM parts only, GroupNorm resnets, and a spatial-only (1, 3, 3) down-sampler (HunyuanVideo 1.0's
    and Magvit's are 3^3), in the original's / ComfyUI's or the canonical names."""
    if any(_UPSCALE.match(k) and sd[k].dim() == 5 for k in sd):
        return True
    conv_in = sd.get("encoder.conv_in.weight")
    if conv_in is None or conv_in.dim() != 5 or any(k.startswith("decoder.") for k in sd):
        return False
    sd = to_canonical(sd)
    downs = [v for k, v in sd.items() if _DOWN.match(k)]
    return (all(_PARTS.match(k) for k in sd) and "encoder.down.0.block.0.norm1.weight" in sd
            and any(v.dim() == 5 and tuple(v.shape[2:]) == (1, 3, 3) for v in downs))


def _widths(sd, side: str, n: int) -> tuple[int, ...]:
    key = "encoder.down.{}.block.0.conv1.weight" if side == "encoder" else "decoder.up.{}.block.0.conv2.weight"
    return tuple(sd[key.format(i)].shape[0] for i in range(n))


def _full_time(sd, side: str, level: str) -> None:
    """The published "full" temporal receptive field (3^3 convs in the resnets); the "half" variant
    (1x3x3 ``conv1``) was never released and core cannot build it either."""
    w = sd[f"{side}.{level}.0.block.0.conv1.weight"]
    if w.dim() != 5 or w.shape[2] != 3:
        raise LoadError(f"{side}.{level}.0.block.0.conv1 is a {tuple(w.shape[2:])} conv; SeedVR2's published VAE "
                        "has 3x3x3 convs there (the original's 'half' temporal receptive field is not supported).",
                        fix="the file may be another model's or damaged; please report it with the key list.")


def config(sd: Mapping[str, torch.Tensor], make: Callable):
    """Widths, depth, latent and image channels, which levels resample time (a down-sampler's kernel
    is 3 frames deep / an up-sampler's ``upscale_conv`` has 8 x C outputs) and the mid attention,
    from the canonical weights; ``make`` builds the config."""
    keys = sd.keys()
    enc, dec = "encoder.conv_in.weight" in sd, "decoder.conv_in.weight" in sd
    if not (enc or dec):
        raise LoadError("this SeedVR2 VAE file has neither an encoder nor a decoder (no conv_in weights).",
                        fix="the file is incomplete: download it again.")
    kw: dict = dict(has_encoder=enc, has_decoder=dec, mid_attention=any(".mid.attn_1." in k for k in keys))
    found = {}
    if enc:
        _full_time(sd, "encoder", "down")
        n = count_indices(keys, "encoder.down")
        found["encoder"] = (_widths(sd, "encoder", n), count_indices(keys, "encoder.down.0.block"),
                            tuple(sd[f"encoder.down.{i}.downsample.conv.weight"].shape[2] == 3 for i in range(n - 1)))
        kw.update(latent_channels=sd["encoder.conv_out.weight"].shape[0] // 2,
                  in_channels=sd["encoder.conv_in.weight"].shape[1])
    if dec:
        _full_time(sd, "decoder", "up")
        n = count_indices(keys, "decoder.up")
        widths = _widths(sd, "decoder", n)
        found["decoder"] = (widths, count_indices(keys, "decoder.up.0.block") - 1,
                            tuple(sd[f"decoder.up.{i}.upsample.upscale_conv.weight"].shape[0] == 8 * widths[i]
                                  for i in range(1, n)))
        kw.update(latent_channels=sd["decoder.conv_in.weight"].shape[1],
                  out_channels=sd["decoder.conv_out.weight"].shape[0])
    shapes = set(found.values())
    if len(shapes) > 1:
        raise LoadError(f"this SeedVR2 VAE's encoder and decoder differ in shape (widths, resnets per level, "
                        f"temporal levels: {found['encoder']} vs {found['decoder']}); the two halves are mirrors.",
                        fix="the halves come from different files: load a matching pair.")
    widths, layers, temporal = shapes.pop()
    return make(widths=widths, layers_per_block=layers, temporal=temporal, **kw)


# canonical -> the original's / ComfyUI's names (for files in core's layout, e.g. to run core's own VAE
# on the same weights); names inside blocks first
_BACK = [(r"\.nin_shortcut\.", ".conv_shortcut."), (r"\.norm_out\.", ".conv_norm_out."),
         (r"\.mid\.block_1\.", ".mid_block.resnets.0."), (r"\.mid\.block_2\.", ".mid_block.resnets.1."),
         (r"\.mid\.attn_1\.norm\.", ".mid_block.attentions.0.group_norm."),
         (r"\.mid\.attn_1\.(q|k|v)\.", r".mid_block.attentions.0.to_\1."),
         (r"\.mid\.attn_1\.proj_out\.", ".mid_block.attentions.0.to_out.0."),
         (r"^encoder\.down\.(\d+)\.block\.", r"encoder.down_blocks.\1.resnets."),
         (r"^encoder\.down\.(\d+)\.downsample\.", r"encoder.down_blocks.\1.downsamplers.0.")]


def to_original(sd: Mapping[str, torch.Tensor]) -> dict:
    """Canonical -> the original's / ComfyUI's names; the attention's 1x1 convs back to Linear weights."""
    n = count_indices(sd.keys(), "decoder.up")
    flip = [(r"^decoder\.up\.(\d+)\.block\.", lambda m: f"decoder.up_blocks.{n - 1 - int(m[1])}.resnets."),
            (r"^decoder\.up\.(\d+)\.upsample\.", lambda m: f"decoder.up_blocks.{n - 1 - int(m[1])}.upsamplers.0.")]
    out = rename(sd, _BACK + flip)
    attn = re.compile(r"\.mid_block\.attentions\.0\.(to_q|to_k|to_v|to_out\.0)\.weight$")
    return {k: v.flatten(1) if attn.search(k) else v for k, v in out.items()}
