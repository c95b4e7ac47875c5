"""Fused q/k/v projections: the three 1x1 convs of every ``SpatialSelfAttention`` (KL and
ConsistencyDecoder encoder mid blocks, HunyuanVideo's mid blocks, Magvit V5's per-frame attention)
become one conv of 3C outputs, so attention reads its input once and launches one kernel instead of
three (what diffusers' ``fuse_qkv_projections`` does for its processors).

Exact and reversible: the fused weight is the concatenation of q, k, v (no arithmetic), each output
channel is the same dot product as before, and ``unfuse_qkv`` slices the originals back bit for bit.
While fused, ``state_dict()`` still shows the canonical ``q/k/v`` keys (and ``load_state_dict``
takes them), so saving or reloading a fused model gives the files every loader knows.

Mochi's temporal attention already keeps one ``qkv`` Linear in its canonical layout, as does every
module whose class says so (``fused_qkv = True``: LTX-2.5's neighbourhood attention, MiniMax H3's ViT
blocks); TAESD, LTX-Video and Magvit V5.1 have no attention at all: both are reported, never an error."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .attention import SpatialSelfAttention
from .temporal_attention import TemporalAttention

PARTS = ("q", "k", "v")


@dataclass(frozen=True)
class QKVReport:
    fused: int        # attention modules fused by this call
    already: int      # modules whose q/k/v already are one projection (fused earlier, or Mochi's)
    message: str      # one line for the node


def fuse_qkv(model: nn.Module, name: str = "") -> QKVReport:
    """Fuse q/k/v of every ``SpatialSelfAttention`` below ``model`` IN PLACE; idempotent.

    Apply it only to a model the caller owns (e.g. the compile node's own copy): the fused model
    gives the same outputs, but its modules change, and other nodes may be running the original.
    ``name`` (e.g. the handle's ``vae.name``) only words the message."""
    fused = already = 0
    for m in model.modules():
        if isinstance(m, SpatialSelfAttention):
            if m.qkv is None:
                _fuse(m)
                fused += 1
            else:
                already += 1
        elif isinstance(m, TemporalAttention) or getattr(m, "fused_qkv", False):
            already += 1
    return QKVReport(fused, already, _message(fused, already, name))


def unfuse_qkv(model: nn.Module) -> None:
    """Undo ``fuse_qkv``: the separate q/k/v convs come back with the original tensors, bit for bit."""
    for m in model.modules():
        if isinstance(m, SpatialSelfAttention) and m.qkv is not None:
            _unfuse(m)


def _message(fused: int, already: int, name: str) -> str:
    if fused:
        return f"fused q/k/v in {fused} attention block(s)" + (
            f"; {already} already one projection" if already else "")
    if already:
        return f"q/k/v already one projection in {already} attention block(s): nothing to fuse"
    who = f"this VAE ({name})" if name else "this VAE"
    return f"{who} has no attention blocks: nothing to fuse; continuing unfused"


def _fuse(attn: SpatialSelfAttention) -> None:
    q, k, v = (getattr(attn, p) for p in PARTS)
    with torch.device("meta"):
        conv = type(q)(q.in_channels, 3 * q.out_channels, 1, bias=q.bias is not None)
    with torch.no_grad():
        conv.weight = nn.Parameter(torch.cat([p.weight for p in (q, k, v)]), q.weight.requires_grad)
        if q.bias is not None:
            conv.bias = nn.Parameter(torch.cat([p.bias for p in (q, k, v)]), q.bias.requires_grad)
    # keep the registration order (norm, qkv, proj_out), so module listings read as before
    _replace(attn, {"q": [("qkv", conv)], "k": [], "v": []})
    attn._vaekit_hooks = (attn._register_state_dict_hook(_split_keys),
                          attn._register_load_state_dict_pre_hook(_merge_keys, with_module=True))


def _unfuse(attn: SpatialSelfAttention) -> None:
    conv, c = attn.qkv, attn.qkv.out_channels // 3
    convs = {}
    for i, p in enumerate(PARTS):
        with torch.device("meta"):
            part = type(conv)(c, c, 1, bias=conv.bias is not None)
        with torch.no_grad():
            part.weight = nn.Parameter(conv.weight[i * c:(i + 1) * c].clone(), conv.weight.requires_grad)
            if conv.bias is not None:
                part.bias = nn.Parameter(conv.bias[i * c:(i + 1) * c].clone(), conv.bias.requires_grad)
        convs[p] = part
    _replace(attn, {"qkv": list(convs.items())})
    attn.__dict__["qkv"] = None
    for hook in attn._vaekit_hooks:
        hook.remove()
    del attn._vaekit_hooks


def _replace(module: nn.Module, swap: dict[str, list]) -> None:
    """Rebuild ``module._modules`` in order, each child named in ``swap`` replaced by its list of
    (name, module) pairs (empty: dropped)."""
    old = dict(module._modules)
    module._modules.clear()
    for name, child in old.items():
        for new_name, new in swap.get(name, [(name, child)]):
            module.__dict__.pop(new_name, None)      # e.g. the plain ``qkv = None`` attribute
            module._modules[new_name] = new


def _split_keys(module: nn.Module, state_dict: dict, prefix: str, _meta) -> None:
    """state_dict hook of a fused module: canonical q/k/v entries (in their canonical order) instead
    of qkv; the parts are views of the fused tensors."""
    mine = [(k, state_dict.pop(k)) for k in list(state_dict) if k.startswith(prefix)]
    fused = {k[len(prefix) + 4:]: t.chunk(3) for k, t in mine if k.startswith(prefix + "qkv.")}
    for k, t in mine:
        if not k.startswith(prefix + "qkv."):
            state_dict[k] = t
        elif k == prefix + "qkv.weight":         # where q.weight stood: q.weight, q.bias, k.weight, ...
            for i, p in enumerate(PARTS):
                for kind, parts in fused.items():
                    state_dict[f"{prefix}{p}.{kind}"] = parts[i]


def _merge_keys(module: nn.Module, state_dict: dict, prefix: str, *_args) -> None:
    """load_state_dict pre-hook of a fused module: canonical q/k/v entries load into qkv."""
    for kind in ("weight", "bias"):
        names = [f"{prefix}{p}.{kind}" for p in PARTS]
        if all(n in state_dict for n in names):
            state_dict[f"{prefix}qkv.{kind}"] = torch.cat([state_dict.pop(n) for n in names])
