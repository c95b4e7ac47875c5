"""MiniMax H3 video VAE key layouts -> the canonical one, and the config read from the weights.

Layouts users have:
- MiniMax's original (``video_vae/source/model.safetensors``) = ComfyUI's (``minimax_h3_video_vae_fp16``
  and ``..._int8_convrot.safetensors``, which add ``latents_mean`` / ``latents_std``): ``encoder.conv_in``,
  ``encoder.down.<i>.block.<j>.{norm1,conv1,norm2,conv2,nin_shortcut}``, ``encoder.down.<i>.downsample.conv``,
  ``encoder.{norm_out,conv_out}``, ``quant_conv``, ``post_quant_conv``, ``decoder.{x_embedder,register_tokens,
  mask_token,norm_out,proj_out}``, ``decoder.transformer_blocks.<i>.{norm1,attn.to_qkv,attn.to_out,scale1,norm2,
  ff.w1,ff.w2,scale2}``. ``mask_token`` (a training-only buffer, all zeros) is dropped.
- ComfyUI's int8 file: the blocks' Linears as int8 ``weight`` + per-row ``weight_scale`` + ``comfy_quant``
  (JSON bytes: format, rotation); read into the config and run as core runs them (vae/nn/quant.py).
- diffusers ``AutoencoderKLMiniMaxH3``: ``encoder.down_blocks.<i>.resnets.<j>`` (``conv_shortcut``),
  ``encoder.down_blocks.<i>.downsamplers.0``, ``decoder.proj_in``, ``attn.to_{q,k,v}`` (split from the
  per-head interleave), ``attn.to_out.0``, ``ff.net.0.proj`` (halves swapped to [value; gate]),
  ``ff.net.2``; its latent statistics live in its config, not in the weights.
Canonical = the original's names (ComfyUI's), without ``mask_token`` and ``comfy_quant``; a file with no
latent statistics gets the published ones (as ComfyUI's defaults; MiniMax's ``video_vae/config.json``)."""
from __future__ import annotations

import re
from typing import Mapping

import torch

from ..errors import LoadError
from ..files.keymap import count_indices, rename
from ..nn import quant

HEAD = 64
# MiniMax's video_vae/config.json (ComfyUI's defaults)
LATENTS_MEAN = (0.858090341091156, -0.9606591463088989, 1.0661640167236328, -0.5090325474739075,
                -0.2727581858634949, -1.3675414323806763, -0.2553254961967468, -0.26907554268836975,
                -0.5376840829849243, -0.0464097298681736, 0.6657370328903198, 0.19690127670764923,
                -0.5460608005523682, -0.4035342037677765, -0.23683024942874908, 0.25928452610969543,
                -0.30133944749832153, 0.211341992020607, -1.1206848621368408, 0.3581933379173279,
                -0.04225143790245056, 0.2604829967021942, 0.22864092886447906, 0.7056031823158264)
LATENTS_STD = (1.2223774194717407, 1.2767263650894165, 1.68317747116088865, 1.7549455165863037,
               1.5636216402053833, 2.194143533706665, 0.96531379222869875, 1.05698859691619875,
               0.841948926448822, 0.7729952931404114, 1.8955937623977661, 0.946841835975647,
               0.7996809482574463, 0.44988900423049925, 0.7197399735450745, 0.69362932443618775,
               2.961095094680786, 2.7694199085235595, 3.0496184825897215, 2.1088054180145265,
               3.276226282119751, 3.1627357006073, 2.28168129920959475, 2.6127843856811525)

_BLOCK = re.compile(r"^decoder\.transformer_blocks\.\d+\.")
_ENC_RESNET = re.compile(r"^encoder\.(?:down\.\d+\.block|down_blocks\.\d+\.resnets)\.0\.conv1\.weight$")
_DIFFUSERS = [
    (r"^encoder\.down_blocks\.(\d+)\.resnets\.", r"encoder.down.\1.block."),
    (r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample."),
    (r"\.conv_shortcut\.", ".nin_shortcut."),
    (r"^decoder\.proj_in\.", "decoder.x_embedder."),
    (r"\.attn\.to_out\.0\.", ".attn.to_out."),
    (r"\.ff\.net\.2\.", ".ff.w2."),
]


def _decoder_keys(sd) -> bool:
    return any(_BLOCK.match(k) and k.endswith(".scale1") for k in sd) and (
        "decoder.x_embedder.weight" in sd or "decoder.proj_in.weight" in sd)


def _encoder_keys(sd) -> bool:
    """An encoder of 3-D convs with GroupNorm resnets, no mid block, and a 1x1x1 ``quant_conv`` that
    keeps its width (the LDM-style video encoders all have a mid block)."""
    conv_in, quant_conv = sd.get("encoder.conv_in.weight"), sd.get("quant_conv.weight")
    if conv_in is None or quant_conv is None or conv_in.dim() != 5 or quant_conv.dim() != 5:
        return False
    if quant_conv.shape[0] != quant_conv.shape[1] or any(k.startswith(("encoder.mid.", "encoder.mid_block.")) for k in sd):
        return False
    return any(_ENC_RESNET.match(k) for k in sd) and any(k.endswith(".norm1.weight") for k in sd if k.startswith("encoder."))


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    """The ViT decoder's blocks with layer scales (every layout), or the encoder alone."""
    return _decoder_keys(sd) or _encoder_keys(sd)


def _interleave(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """diffusers' separate q, k, v (rows head by head) -> the fused rows [q_h, k_h, v_h] per head."""
    parts = [t.reshape(t.shape[0] // HEAD, HEAD, *t.shape[1:]) for t in (q, k, v)]
    return torch.cat(parts, dim=1).reshape(3 * q.shape[0], *q.shape[1:])


def _from_diffusers(sd) -> dict:
    out = rename({k: v for k, v in sd.items() if not re.search(r"\.attn\.to_[qkv]\.|\.ff\.net\.0\.proj\.", k)},
                 _DIFFUSERS)
    for key in sd:
        if m := re.match(r"^(decoder\.transformer_blocks\.\d+\.attn)\.to_q\.(weight|bias)$", key):
            pre, what = m.groups()
            out[f"{pre}.to_qkv.{what}"] = _interleave(*(sd[f"{pre}.to_{p}.{what}"] for p in "qkv"))
        elif m := re.match(r"^(decoder\.transformer_blocks\.\d+\.ff)\.net\.0\.proj\.(weight|bias)$", key):
            value, gate = sd[key].chunk(2, dim=0)       # diffusers' SwiGLU reads [value; gate]
            out[f"{m[1]}.w1.{m[2]}"] = torch.cat([gate, value], dim=0)
    return out


def to_canonical(sd: Mapping[str, torch.Tensor]) -> dict:
    keys = list(sd)
    if "decoder.proj_in.weight" in sd or any(k.startswith("encoder.down_blocks.") for k in keys):
        sd = _from_diffusers(sd)
    out = {k: v for k, v in sd.items() if k != "decoder.mask_token"}
    for k, v in list(out.items()):
        if k.endswith(".weight_scale") and v.dim() == 1:
            out[k] = v.reshape(-1, 1)
    return out


def complete(sd: dict, cfg) -> dict:
    """The published latent statistics where the file has none; the ``comfy_quant`` entries (read into
    the config) are not tensors the model takes."""
    sd = {k: v for k, v in sd.items() if not k.endswith(".comfy_quant")}
    sd.setdefault("latents_mean", torch.tensor(LATENTS_MEAN))
    sd.setdefault("latents_std", torch.tensor(LATENTS_STD))
    return sd


def _quantized(sd) -> tuple[tuple[str, int], ...]:
    """(layer, rotation group) of every int8 Linear, from its ``comfy_quant`` entry."""
    layers = []
    for key, v in sd.items():
        if v.dtype == torch.int8 and key.endswith(".weight"):
            name = key[: -len(".weight")]
            raw = sd.get(f"{name}.comfy_quant")
            if raw is None or f"{name}.weight_scale" not in sd:
                raise LoadError(f"'{key}' is int8 without its 'comfy_quant' and 'weight_scale' entries.",
                                fix="load the quantized file as ComfyUI writes it, or the fp16/fp32 file.")
            try:
                layers.append((name, quant.rotation_group(quant.parse(raw))))
            except (ValueError, UnicodeDecodeError) as e:
                raise LoadError(f"'{name}.comfy_quant': {e}.", fix="use ComfyUI's int8 file, or the fp16/fp32 file.")
    for key in sd:
        if key.endswith(".comfy_quant") and key[: -len(".comfy_quant")] not in dict(layers):
            raise LoadError(f"'{key}' marks a layer this pack cannot run quantized (its weight is "
                            f"{sd.get(key[: -len('.comfy_quant')] + '.weight', torch.empty(0)).dtype}).",
                            fix="use ComfyUI's int8 file (int8_tensorwise), or the fp16/fp32 file.")
    return tuple(sorted(layers))


def config_fields(sd) -> dict:
    """Every size from the weights: encoder widths, blocks and down-sampling levels; decoder width,
    depth, MLP width, registers and patch (from ``proj_out``: 3 x 4 x patch^2)."""
    fields: dict = {"quantized": _quantized(sd)}
    levels = count_indices(sd.keys(), "encoder.down")
    if levels:
        blocks = count_indices(sd.keys(), "encoder.down.0.block")
        fields.update(
            enc_widths=tuple(sd[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] for i in range(levels)),
            enc_blocks=blocks, enc_down=tuple(f"encoder.down.{i}.downsample.conv.weight" in sd for i in range(levels)),
            latent_channels=sd["quant_conv.weight"].shape[0] // 2)
        if levels < 3 or not all(fields["enc_down"][1:3]):
            raise LoadError(f"the encoder has down-samplers at levels {[i for i, d in enumerate(fields['enc_down']) if d]}; "
                            "MiniMax H3's halve time at levels 1 and 2.", fix="this variant is not supported.")
    if "decoder.x_embedder.weight" in sd:
        dim, z = sd["decoder.x_embedder.weight"].shape
        px = sd["decoder.proj_out.weight"].shape[0]
        patch = round((px / 12) ** 0.5)
        if 12 * patch * patch != px or dim % HEAD:
            raise LoadError(f"'decoder.proj_out.weight' makes {px} values per token and the width is {dim}; MiniMax "
                            f"H3's make 3 x 4 x p x p and are multiples of {HEAD}.", fix="this variant is not supported.")
        fields.update(dec_dim=dim, latent_channels=z, patch=patch,
                      dec_depth=count_indices(sd.keys(), "decoder.transformer_blocks"),
                      dec_ff=sd["decoder.transformer_blocks.0.ff.w2.weight"].shape[1],
                      registers=sd["decoder.register_tokens"].shape[1])
        if levels and 2 ** sum(fields["enc_down"]) != patch:
            raise LoadError(f"the encoder is {2 ** sum(fields['enc_down'])}x, the decoder {patch}x.",
                            fix="the file mixes two VAEs: load one MiniMax H3 VAE file.")
    return fields
