"""LTX-Video and LTX-2 VAE key layouts: detection and conversion to the canonical one.

Canonical = the Lightricks original / ComfyUI names (``encoder.down_blocks.N`` and
``decoder.up_blocks.N`` numbered as the original's block list, ``res_blocks``,
``per_channel_statistics.mean-of-means``, ``decoder.last_time_embedder``) without the wrapper
levels: our causal convs and LayerNorms hold their weights directly, so the original's
``conv1.conv.weight`` / ``norm3.norm.weight`` are ``conv1.weight`` / ``norm3.weight`` here.
One consequence: a canonical ``down_blocks.1.conv.weight`` is a 0.9.5 space-to-depth block's conv,
the original's the 0.9.0 strided conv itself; layouts are told apart by ``conv_in.conv.weight``.

diffusers' ``AutoencoderKLLTXVideo`` and ``AutoencoderKLLTX2Video`` split the original's list into
down/up blocks with ``resnets``, ``downsamplers.0``/``upsamplers.0``, ``conv_out``/``conv_in``
resnets and a ``mid_block``; walking their blocks in execution order gives the original numbering
for every version (facts: diffusers scripts/convert_ltx_to_diffusers.py, convert_ltx2_to_diffusers.py;
LTX-2's original keys are 0.9.5's, with a plain ``conv_shortcut`` and ``norm3``)."""
from __future__ import annotations

import re
from typing import Mapping

import torch

from ..files.keymap import count_indices, rename

STATS = "per_channel_statistics."
MEAN, STD = STATS + "mean-of-means", STATS + "std-of-means"   # the two the VAE uses
WRAPPED = re.compile(r"^(encoder|decoder)\.conv_in\.conv\.weight$")
RES_BLOCKS = re.compile(r"^(encoder\.down_blocks|decoder\.up_blocks)\.\d+\.res_blocks\.\d+\.conv1\.")


def _conv_in(sd: Mapping[str, torch.Tensor]):
    for side in ("decoder", "encoder"):
        for key in (f"{side}.conv_in.conv.weight", f"{side}.conv_in.weight"):
            if key in sd:
                return sd[key]
    return None


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    """LTX-Video 0.9.x and LTX-2 video VAEs in every layout. LTX-2's audio VAE also keeps
    ``per_channel_statistics``, but its convs are 2-D: statistics alone are not enough. LTX-2.5's
    diffusion VAE keeps LTX-2.3's encoder beside a decoder of its own (ltx_diffusion_layout.py)."""
    if "decoder.conv_in_x_t.weight" in sd:
        return False
    if any(RES_BLOCKS.match(k) for k in sd):
        return True                                   # original / ComfyUI / canonical
    conv_in = _conv_in(sd)
    video = conv_in is not None and conv_in.dim() == 5
    if any(k.startswith(STATS) for k in sd):
        return video
    # diffusers: the only diffusers video VAEs with latents_mean/std buffers (LTXVideo and LTX2Video);
    # MiniMax H3's files keep them too, but in the original's names (no resnets / mid_block)
    return "latents_mean" in sd and "latents_std" in sd and video and _is_diffusers(k for k in sd if "latents_" not in k)


def _is_diffusers(keys) -> bool:
    return any(".resnets." in k or ".mid_block." in k or k.startswith("latents_") for k in keys)


def _diffusers_prefixes(keys) -> dict[str, str]:
    """diffusers key prefix -> canonical prefix, numbering the original's blocks in execution order."""
    keys = list(keys)
    has = lambda p: any(k.startswith(p) for k in keys)
    table: dict[str, str] = {}

    def walk(side: str, stages: list[tuple[str, tuple[str, ...]]]) -> None:
        n = 0
        for src, parts in stages:
            for part in parts:
                if not has(src + part):
                    continue
                dst = f"{side}.{n}."
                if part == "resnets.":        # a resnet group, with its timestep embedder if any
                    table[src + "time_embedder."] = dst + "time_embedder."
                    dst += "res_blocks."
                table[src + part] = dst
                n += 1

    down = [(f"encoder.down_blocks.{i}.", ("resnets.", "downsamplers.0.", "conv_out."))
            for i in range(count_indices(keys, "encoder.down_blocks"))]
    walk("encoder.down_blocks", down + [("encoder.mid_block.", ("resnets.",))])
    up = [(f"decoder.up_blocks.{i}.", ("conv_in.", "upsamplers.0.", "resnets."))
          for i in range(count_indices(keys, "decoder.up_blocks"))]
    walk("decoder.up_blocks", [("decoder.mid_block.", ("resnets.",))] + up)
    table.update({"decoder.time_embedder.": "decoder.last_time_embedder.",
                  "decoder.scale_shift_table": "decoder.last_scale_shift_table",
                  "latents_mean": MEAN, "latents_std": STD})
    return table


def _from_diffusers(sd: dict) -> dict:
    table = _diffusers_prefixes(sd.keys())
    # one alternation, applied once per key: a renamed key must not match another source prefix
    pattern = "^(?:" + "|".join(map(re.escape, sorted(table, key=len, reverse=True))) + ")"
    return rename(sd, [(pattern, lambda m: table[m.group(0)])])


def to_canonical(sd: Mapping[str, torch.Tensor]) -> dict:
    sd = dict(sd)
    if any(WRAPPED.match(k) for k in sd):            # original or diffusers (not yet canonical)
        if _is_diffusers(sd.keys()):
            sd = _from_diffusers(sd)
        sd = rename(sd, [(r"\.conv\.(weight|bias)$", r".\1"), (r"\.norm3\.norm\.", ".norm3.")])
    # the original also stores mean-of-stds, channel, ...: statistics the VAE never reads. Some of them
    # without the two it reads is a damaged file (none of them: a file without statistics)
    if any(k.startswith(STATS) for k in sd):
        for key in (MEAN, STD):
            sd[key]        # noqa: B018 - a KeyError names the missing one
    return {k: v for k, v in sd.items() if not k.startswith(STATS) or k in (MEAN, STD)}


def to_original(sd: Mapping[str, torch.Tensor]) -> dict:
    """Canonical -> the Lightricks original / ComfyUI layout (what ComfyUI's VideoVAE loads): every
    3-D conv but the 1x1x1 shortcut gets its ``.conv`` wrapper back, the shortcut LayerNorm its ``.norm``."""
    out = {}
    for k, v in sd.items():
        stem, _, leaf = k.rpartition(".")
        weight = sd.get(f"{stem}.weight")
        if leaf in ("weight", "bias") and weight is not None and weight.dim() == 5 \
                and not stem.endswith("conv_shortcut"):
            k = f"{stem}.conv.{leaf}"
        out[re.sub(r"\.norm3\.", ".norm3.norm.", k)] = v
    return out
