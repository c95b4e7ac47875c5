"""Mochi key layouts: detection, conversion to the canonical (genmo / ComfyUI) keys, and the
hyperparameters read back from them.

Layouts users have:
- genmo's two files, bare: ``encoder.safetensors`` (``layers.*``, ``output_norm``, ``output_proj``)
  and ``decoder.safetensors`` (``blocks.*``, ``output_proj``); ComfyUI prefixes them ``encoder.`` /
  ``decoder.`` (either alone, or both in one file). Canonical = the prefixed form.
- diffusers ``AutoencoderKLMochi``: ``proj_in / block_in / down_blocks / block_out / norm_out /
  proj_out`` and ``conv_in / block_in / up_blocks / block_out / proj_out``, with ``.norm_layer.``
  and ``.conv.`` wrapper levels and separate ``to_q/to_k/to_v`` (genmo has one fused ``qkv``)."""
from __future__ import annotations


import torch

from ..files.keymap import count_indices, rename
from .tiny import DEC as PAIR_DEC, ENC as PAIR_ENC

# diffusers resnet internals -> genmo's ResBlock.stack indices
_RESNET = [(r"\.norm1\.norm_layer\.", ".stack.0."), (r"\.conv1\.conv\.", ".stack.2."),
           (r"\.norm2\.norm_layer\.", ".stack.3."), (r"\.conv2\.conv\.", ".stack.5.")]


def _is_diffusers(sd) -> bool:
    return ("decoder.up_blocks.0.proj.weight" in sd or "encoder.proj_in.weight" in sd) and any(
        ".norm_layer." in k for k in sd)


def _bare_side(sd, pre: str) -> str | None:
    """Which genmo half the keys under ``pre`` are, if any."""
    w = sd.get(f"{pre}blocks.0.0.weight")
    if w is not None and w.dim() == 5 and f"{pre}output_proj.weight" in sd and f"{pre}blocks.0.1.stack.0.weight" in sd:
        return "decoder"
    w = sd.get(f"{pre}layers.0.weight")
    if (w is not None and w.dim() == 2 and f"{pre}output_proj.weight" in sd and f"{pre}output_norm.weight" in sd
            and f"{pre}layers.1.stack.0.weight" in sd):
        return "encoder"
    return None


# prefixes a genmo half may carry: none (genmo's own files), ComfyUI's, or the loader's pair names
_PREFIXES = ("", "encoder.", "decoder.", f"{PAIR_ENC}.", f"{PAIR_DEC}.")


def detect(sd) -> bool:
    return _is_diffusers(sd) or any(_bare_side(sd, p) for p in _PREFIXES)


def _from_diffusers(sd) -> dict:
    keys = sd.keys()
    n_in = count_indices(keys, "encoder.block_in.resnets")
    n_down = count_indices(keys, "encoder.down_blocks")
    n_up = count_indices(keys, "decoder.up_blocks")
    rules = [
        # encoder: one flat Sequential: proj_in, block_in resnets, down blocks, block_out resnets
        (r"^encoder\.proj_in\.", "encoder.layers.0."),
        (r"^encoder\.block_in\.(resnets|norms|attentions)\.(\d+)\.",
         lambda m: f"encoder.layers.{int(m[2]) + 1}.{m[1]}."),
        (r"^encoder\.down_blocks\.(\d+)\.conv_in\.conv\.", lambda m: f"encoder.layers.{n_in + 1 + int(m[1])}.layers.0."),
        (r"^encoder\.down_blocks\.(\d+)\.(resnets|norms|attentions)\.(\d+)\.",
         lambda m: f"encoder.layers.{n_in + 1 + int(m[1])}.layers.{int(m[3]) + 1}.{m[2]}."),
        (r"^encoder\.block_out\.(resnets|norms|attentions)\.(\d+)\.",
         lambda m: f"encoder.layers.{n_in + 1 + n_down + int(m[2])}.{m[1]}."),
        (r"^encoder\.norm_out\.norm_layer\.", "encoder.output_norm."),
        (r"^encoder\.proj_out\.", "encoder.output_proj."),
        # the attention of resnet i follows it inside genmo's ResBlock i
        (r"\.norms\.", ".attn_block.norm."),
        (r"\.attentions\.to_out\.0\.", ".attn_block.attn.out."),
        (r"\.attentions\.to_([qkv])\.", r".attn_block.attn.to_\1."),
        (r"\.resnets\.", "."),
        (r"\.norm_layer\.", "."),
        # decoder: blocks.0 = conv_in + block_in, blocks.1..n_up = up blocks, then block_out
        (r"^decoder\.conv_in\.", "decoder.blocks.0.0."),
        (r"^decoder\.block_in\.(\d+)\.", lambda m: f"decoder.blocks.0.{int(m[1]) + 1}."),
        (r"^decoder\.up_blocks\.(\d+)\.proj\.", lambda m: f"decoder.blocks.{int(m[1]) + 1}.proj."),
        (r"^decoder\.up_blocks\.(\d+)\.(\d+)\.", lambda m: f"decoder.blocks.{int(m[1]) + 1}.blocks.{m[2]}."),
        (r"^decoder\.block_out\.(\d+)\.", rf"decoder.blocks.{n_up + 1}.\1."),
        (r"^decoder\.proj_out\.", "decoder.output_proj."),
    ]
    # the ResBlock internals first, while the wrapper names still mark them
    out = rename(sd, _RESNET + rules)
    fused = {}
    for key in [k for k in out if k.endswith(".attn.to_q.weight")]:
        stem = key[: -len("to_q.weight")]
        parts = [out.pop(stem + f"to_{p}.weight") for p in "qkv"]
        if len({(p.dtype, p.shape[1:]) for p in parts}) > 1 or parts[0].dim() != 2:
            # torch.cat would promote a stray integer tensor or fail with no key named
            raise ValueError(f"cannot fuse {stem}to_q/to_k/to_v.weight: their shapes "
                             f"{[list(p.shape) for p in parts]} or dtypes {[str(p.dtype) for p in parts]} differ")
        fused[stem + "qkv.weight"] = torch.cat(parts)
    out.update(fused)
    return out


def to_canonical(sd) -> dict:
    sd = dict(sd)
    if _is_diffusers(sd):
        return _from_diffusers(sd)
    out, placed = {}, set()
    for pre in _PREFIXES:
        side = _bare_side(sd, pre)
        if side is None:
            continue
        # a bare genmo half's keys are all its own; a prefixed one keeps only its prefix's keys
        for k, v in sd.items():
            if k.startswith(pre) and not (pre == "" and k.startswith(("encoder.", "decoder."))):
                out[f"{side}.{k[len(pre):]}"] = v
                placed.add(k)
    # keys of a half whose first tensors are missing stay as they are: the loader then names what is
    # missing, instead of loading the other half alone
    out.update({k: v for k, v in sd.items() if k not in placed})
    return out


def _resblocks(keys, prefix: str) -> int:
    """How many consecutive ResBlocks ``prefix.<i>`` (i from 0) there are."""
    return count_indices([k for k in keys if ".stack." in k], prefix)


def config_fields(sd) -> dict:
    """Every hyperparameter from the canonical keys and shapes. Not in the weights: the Fourier
    octaves (6, 7) and, for a decoder alone, how t * s * s splits (s = 2, the published value)."""
    keys = list(sd.keys())
    f: dict = {"has_encoder": "encoder.output_proj.weight" in sd, "has_decoder": "decoder.output_proj.weight" in sd}
    if f["has_encoder"]:
        f["image_channels"] = sd["encoder.layers.0.weight"].shape[1] // 5   # x, sin and cos at 2 octaves
        f["latent_channels"] = sd["encoder.output_proj.weight"].shape[0] // 2
        n = count_indices(keys, "encoder.layers")
        stages = [i for i in range(1, n) if f"encoder.layers.{i}.layers.0.weight" in sd]   # down blocks
        widths, blocks, attention, temporal, spatial = [sd["encoder.layers.0.weight"].shape[0]], [], [], [], []
        blocks.append(stages[0] - 1)
        attention.append("encoder.layers.1.attn_block.attn.qkv.weight" in sd)
        for i in stages:
            w = sd[f"encoder.layers.{i}.layers.0.weight"]
            widths.append(w.shape[0])
            temporal.append(w.shape[2])
            spatial.append(w.shape[3])
            blocks.append(_resblocks(keys, f"encoder.layers.{i}.layers") - 1)
            attention.append(f"encoder.layers.{i}.layers.1.attn_block.attn.qkv.weight" in sd)
        blocks.append(n - 1 - stages[-1])
        attention.append(f"encoder.layers.{n - 1}.attn_block.attn.qkv.weight" in sd)
        f.update(enc_widths=tuple(widths), enc_blocks=tuple(blocks), enc_attention=tuple(attention),
                 temporal=tuple(temporal), spatial=tuple(spatial))
    if f["has_decoder"]:
        f["latent_channels"] = sd["decoder.blocks.0.0.weight"].shape[1]
        f["image_channels"] = sd["decoder.output_proj.weight"].shape[0]
        n = count_indices(keys, "decoder.blocks")
        widths = [sd["decoder.blocks.0.0.weight"].shape[0]]
        blocks = [_resblocks(keys, "decoder.blocks.0") - 1]
        expand = []
        for i in range(1, n - 1):
            after = f"decoder.blocks.{i + 1}.blocks.0" if i + 1 < n - 1 else f"decoder.blocks.{i + 1}.0"
            widths.append(sd[f"{after}.stack.0.weight"].shape[0])          # the next block's width
            blocks.append(_resblocks(keys, f"decoder.blocks.{i}.blocks"))
            expand.append(sd[f"decoder.blocks.{i}.proj.weight"].shape[0] // widths[-1])
        blocks.append(_resblocks(keys, f"decoder.blocks.{n - 1}"))
        f.update(dec_widths=tuple(widths), dec_blocks=tuple(blocks))
        # decoder order is coarse to fine: reversed, these are the encoder's reductions
        s = f.get("spatial", (2,) * len(expand))[::-1]
        f.setdefault("temporal", tuple(e // (si * si) for e, si in zip(expand, s))[::-1])
        f.setdefault("spatial", s[::-1])
    return f
