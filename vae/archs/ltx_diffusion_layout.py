"""LTX-2.5's video VAE (LTX-2.3's encoder, a diffusion decoder) key layouts: detection and conversion.

Canonical = the shipped checkpoint's names (Lightricks' original, which ComfyUI loads as they are):
``decoder.det_stages.S.B`` blocks with a fused ``attn.qkv``, ``attn.proj``, ``attn.q_norm`` /
``k_norm``, ``mlp.w_up`` / ``w_gate`` / ``w_down``; ``decoder.upsamples.S.proj``; ``conv_in_x_t``,
``shared_adaln.proj``, ``decoder.diff_blocks.B`` (plus ``context_proj``, ``scale_shift_table``);
``per_channel_statistics.mean-of-means`` / ``std-of-means``. Two departures: the timestep embedder
is under diffusers' names (``t_embedder.timestep_embedder.linear_1/2``; the original's ``mlp.0/2``),
as LTX-Video's decoders name the same module, and the encoder is in LTX's canonical layout
(ltx_layout.py), which also reads diffusers' encoder keys.

diffusers (``LTX2VideoDiffusionDecoderModel``, decoder only; facts from its conversion script
scripts/convert_ltx2_diffusion_vae_to_diffusers.py): ``qkv`` split into ``to_q`` / ``to_k`` / ``to_v``,
``proj`` -> ``to_out.0``, ``q_norm`` / ``k_norm`` -> ``norm_q`` / ``norm_k``, statistics ->
``latents_mean`` / ``latents_std``. The script drops the bundled preview heads (``coarse_*``) and folds
static adaLN gates (``gate_msa`` / ``gate_mlp`` / ``gate_ctx``, none in the published file) into the
linear they gate; so do we (ComfyUI's model has no gates and would ignore them)."""
from __future__ import annotations

import re
from typing import Mapping

import torch

from . import ltx_layout
from .ltx_layout import MEAN, STATS, STD

MARK = "decoder.conv_in_x_t.weight"          # the noisy-pixel input: only this decoder has one
RENAMES = (("t_embedder.mlp.0.", "t_embedder.timestep_embedder.linear_1."),
           ("t_embedder.mlp.2.", "t_embedder.timestep_embedder.linear_2."),
           (".attn.to_out.0.", ".attn.proj."), (".attn.norm_q.", ".attn.q_norm."), (".attn.norm_k.", ".attn.k_norm."))
# gate -> the parameters it scales (siblings in the same block)
GATES = {"gate_msa": ("attn.proj.weight", "attn.proj.bias"), "gate_mlp": ("mlp.w_down.weight",),
         "gate_ctx": ("context_proj.weight", "context_proj.bias")}
SPLIT_QKV = re.compile(r"^(?P<p>.*\.attn\.)to_(?P<which>[qkv])\.(?P<leaf>weight|bias)$")


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    return MARK in sd


def _decoder(sd: dict) -> dict:
    sd = {k: v for k, v in sd.items() if not (k.startswith("decoder.coarse_") or ".coarse_" in k)}
    for key in [k for k in sd if k.rpartition(".")[2] in GATES]:
        block, _, gate = key.rpartition(".")
        g = sd.pop(key).float()
        for leaf in GATES[gate]:
            name = f"{block}.{leaf}"
            w = sd[name]
            sd[name] = ((g[:, None] if w.dim() == 2 else g) * w.float()).to(w.dtype)
    out = {}
    for k, v in sd.items():
        for a, b in RENAMES:
            k = k.replace(a, b)
        out[k] = v
    parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for k in [k for k in out if SPLIT_QKV.match(k)]:
        m = SPLIT_QKV.match(k)
        parts.setdefault((m["p"], m["leaf"]), {})[m["which"]] = out.pop(k)
    for (prefix, leaf), qkv in parts.items():
        out[f"{prefix}qkv.{leaf}"] = torch.cat([qkv[c] for c in "qkv"])
    return out


def to_canonical(sd: Mapping[str, torch.Tensor]) -> dict:
    decoder = {k: v for k, v in sd.items() if k.startswith("decoder.")}
    encoder = {k: v for k, v in sd.items() if k.startswith("encoder.")}
    out = _decoder(decoder)
    if encoder:
        out.update(ltx_layout.to_canonical(encoder))
    stats = {"latents_mean": MEAN, "latents_std": STD, MEAN: MEAN, STD: STD}
    out.update({stats[k]: v for k, v in sd.items() if k in stats})
    # anything else (the original's other statistics, a diffusers config's leftovers) is left out only
    # when it is a statistic the VAE never reads; unknown keys stay, so the loader names them
    out.update({k: v for k, v in sd.items() if not k.startswith(("decoder.", "encoder.", STATS))
                and k not in stats})
    return out


def to_original(sd: Mapping[str, torch.Tensor]) -> dict:
    """Canonical -> the shipped checkpoint's layout (what ComfyUI's CausalDiffusionVAE loads)."""
    out = {}
    encoder = {k: v for k, v in sd.items() if k.startswith("encoder.")}
    out.update(ltx_layout.to_original(encoder))
    for k, v in sd.items():
        if not k.startswith("encoder."):
            for a, b in RENAMES[:2]:
                k = k.replace(b, a)
            out[k] = v
    return out
