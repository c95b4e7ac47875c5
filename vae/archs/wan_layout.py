"""Wan VAE key layouts -> the canonical one (the LDM names of vae/archs/ldm.py), and the config read
from the weights.

Layouts users have:
- Wan's original = ComfyUI's repackaged single files (``wan_2.1_vae.safetensors``,
  ``qwen_image_vae.safetensors``, ``wan2.2_vae.safetensors``): ``encoder.conv1``,
  ``encoder.downsamples.<k>`` (2.1: one flat list of resnets and resamplers; 2.2: levels
  ``downsamples.<i>.downsamples.<j>``), ``encoder.middle.{0,1,2}``, ``encoder.head.{0,2}``, top-level
  ``conv1``/``conv2`` (quant convs), the decoder likewise with ``upsamples``; resnets
  ``residual.{0,2,3,6}`` + ``shortcut``, resamplers ``resample.1`` + ``time_conv``, attention
  ``norm``/``to_qkv``/``proj``.
- diffusers (``AutoencoderKLWan``, also ``AutoencoderKLQwenImage``): ``conv_in``, ``down_blocks.<k>``
  (2.1 flat; 2.2 ``down_blocks.<i>.resnets.<j>`` + ``downsampler``), ``mid_block``, ``norm_out``,
  ``conv_out``, ``quant_conv``/``post_quant_conv``, ``up_blocks.<i>.resnets.<j>`` + ``upsamplers.0``
  (2.1) / ``upsampler`` (2.2); resnets ``norm1 conv1 norm2 conv2 conv_shortcut``.
diffusers' converter knows 2.1 only; the 2.2 map here follows from the two module trees.

Qwen-Image 2.1's VAE (``qwen_image_2.1_vae_bf16.safetensors``; diffusers ``AutoencoderKLQwenImage21``) is
Wan 2.2's module tree with a temporal kernel of 1, 5 levels, no patches and RGBA. ComfyUI's file keeps
Wan's 5-D causal convs with a time size of 1 (``resample.1`` and the attention 2-D); diffusers' class
stores every conv 2-D. Both become the canonical image layout: every conv weight 2-D (time squeezed),
every ``gamma`` ``(C, 1, 1)``; ``to_original`` writes ComfyUI's shapes back.

Canonical: ``{encoder,decoder}.conv_in``, ``encoder.down.<i>.block.<j>``, ``encoder.down.<i>.downsample``,
``decoder.up.<i>.block.<j>``, ``decoder.up.<i>.upsample`` (level i fine to coarse, as LDM), ``mid.block_1
attn_1 block_2``, ``norm_out``, ``conv_out``, ``quant_conv``, ``post_quant_conv``; resnets ``norm1 conv1
norm2 conv2 nin_shortcut``; resamplers ``conv`` + ``time_conv``; attention ``norm q k v proj_out``
(the fused ``to_qkv`` is split so the shared attention and vae/nn/qkv.py apply)."""
from __future__ import annotations

import re
from typing import Mapping

import torch

from ..errors import LoadError
from ..files.keymap import count_indices, rename

# resnet and resampler internals, attention, and the names outside the level lists
_RULES = [
    (r"\.residual\.0\.", ".norm1."), (r"\.residual\.2\.", ".conv1."),
    (r"\.residual\.3\.", ".norm2."), (r"\.residual\.6\.", ".conv2."),
    (r"\.(?:conv_)?shortcut\.", ".nin_shortcut."),
    (r"\.resample\.1\.", ".conv."),
    (r"^(encoder|decoder)\.conv1\.", r"\1.conv_in."),
    (r"^conv1\.", "quant_conv."), (r"^conv2\.", "post_quant_conv."),
    (r"\.(?:middle\.0|mid_block\.resnets\.0)\.", ".mid.block_1."),
    (r"\.(?:middle\.1|mid_block\.attentions\.0)\.", ".mid.attn_1."),
    (r"\.(?:middle\.2|mid_block\.resnets\.1)\.", ".mid.block_2."),
    (r"\.head\.0\.", ".norm_out."), (r"\.head\.2\.", ".conv_out."),
    (r"\.attn_1\.proj\.", ".attn_1.proj_out."),
]
_ORIGINAL = re.compile(r"^(encoder|decoder)\.(?:middle\.0\.residual|downsamples\.\d+\.(?:downsamples\.\d+\.)?residual)")
_DIFFUSERS = re.compile(r"^(encoder|decoder)\.mid_block\.attentions\.0\.to_qkv\.weight$")
_CANONICAL = re.compile(r"^(encoder|decoder)\.(?:down|up)\.\d+\.(?:down|up)sample\.time_conv\.weight$")
_LIST = re.compile(r"^(encoder|decoder)\.(downsamples|down_blocks|upsamples|up_blocks)\.(\d+)\.(.*)$")
_NESTED = re.compile(r"^(?:downsamples|upsamples|resnets)\.(\d+)\.(.*)$|^(downsampler|upsamplers\.0|upsampler)\.(.*)$")


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    """Wan's RMS ``gamma`` resnets under ``middle`` / ``downsamples`` (original, ComfyUI), the fused
    ``to_qkv`` mid attention of 5-D-conv VAEs or, with 2-D convs, of RMS-normed ones (Qwen-Image 2.1)
    (diffusers), or our own canonical names."""
    keys = list(sd)
    if any(_ORIGINAL.match(k) for k in keys) and any(k.endswith(".gamma") for k in keys):
        return True
    if any(_DIFFUSERS.match(k) for k in keys):
        side = next(_DIFFUSERS.match(k).group(1) for k in keys if _DIFFUSERS.match(k))
        conv = sd.get(f"{side}.conv_in.weight")
        return conv is not None and (conv.dim() == 5 or any(k.endswith(".norm1.gamma") for k in keys))
    return any(_CANONICAL.match(k) for k in keys) and any(k.endswith(".norm1.gamma") for k in keys)


def _is_resampler(tensors: dict) -> bool:
    """A resampler has ``conv`` (renamed from ``resample.1``) and maybe ``time_conv``; resnets ``conv1``."""
    return any(k.startswith(("conv.", "time_conv.")) for k in tensors)


def _levels(sd: dict) -> dict:
    """The lists of resnets and resamplers -> ``down.<i>.block.<j>`` / ``down.<i>.downsample`` (and up)."""
    groups: dict[tuple[str, str], dict[int, dict]] = {}
    out = {}
    for key, v in sd.items():
        m = _LIST.match(key)
        if not m:
            out[key] = v
            continue
        groups.setdefault((m[1], m[2]), {}).setdefault(int(m[3]), {})[m[4]] = v
    for (side, kind), items in groups.items():
        down = side == "encoder"
        name = "downsample" if down else "upsample"
        flat = not any(_NESTED.match(k) for sub in items.values() for k in sub)
        placed: list[tuple[int, str, dict]] = []      # (level in run order, suffix, tensors)
        if flat:      # 2.1: one list; a resampler closes a level
            level, j = 0, 0
            for i in sorted(items):
                if _is_resampler(items[i]):
                    placed.append((level, name, items[i]))
                    level, j = level + 1, 0
                else:
                    placed.append((level, f"block.{j}", items[i]))
                    j += 1
        else:
            for i in sorted(items):
                inner: dict[str, dict] = {}
                for k, v in items[i].items():
                    m = _NESTED.match(k)
                    if not m:
                        raise LoadError(f"unexpected Wan key '{side}.{kind}.{i}.{k}'.",
                                        fix="the file may be damaged or another model; please report it.")
                    inner.setdefault(m[1] if m[1] is not None else m[3], {})[m[2] if m[1] is not None else m[4]] = v
                blocks = sorted((int(s), t) for s, t in inner.items() if s.isdigit())
                j = 0
                for _, t in blocks:
                    if _is_resampler(t):
                        placed.append((i, name, t))
                    else:
                        placed.append((i, f"block.{j}", t))
                        j += 1
                for s, t in inner.items():
                    if not s.isdigit():
                        placed.append((i, name, t))
        n = max(level for level, _, _ in placed) + 1
        for level, suffix, tensors in placed:
            index = level if down else n - 1 - level       # decoder lists run coarse to fine
            part = "down" if down else "up"
            out.update({f"{side}.{part}.{index}.{suffix}.{k}": v for k, v in tensors.items()})
    return out


def _split_qkv(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        m = re.match(r"^(.*\.attn_1\.)to_qkv\.(weight|bias)$", k)
        if m:
            for name, part in zip("qkv", v.chunk(3, dim=0)):
                out[f"{m[1]}{name}.{m[2]}"] = part.contiguous()
        else:
            out[k] = v
    return out


def _conv_in(sd: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return sd.get("encoder.conv_in.weight", sd.get("decoder.conv_in.weight"))


def is_image(sd: Mapping[str, torch.Tensor]) -> bool:
    """A canonical (or renamed) state dict of an image-only variant: ``conv_in`` 2-D, or 5-D with a
    temporal kernel of 1 (Qwen-Image 2.1)."""
    conv = _conv_in(sd)
    return conv is not None and (conv.dim() == 4 or (conv.dim() == 5 and conv.shape[2] == 1))


def _squeeze_time(sd: dict) -> dict:
    """Image variants: conv weights without their time axis of 1, gammas ``(C, 1, 1)``."""
    if not is_image(sd):
        return sd
    out = {}
    for k, v in sd.items():
        if k.endswith(".gamma") and v.dim() == 4:
            v = v.reshape(v.shape[0], 1, 1)
        elif v.dim() == 5 and v.shape[2] == 1:
            v = v.squeeze(2)
        out[k] = v
    return out


def to_canonical(sd: Mapping[str, torch.Tensor]) -> dict:
    return _squeeze_time(_split_qkv(_levels(rename(sd, _RULES))))


def _channels(n: int, what: str) -> tuple[int, int]:
    """(image channels, patch) from a conv's pixel side: 3/4 channels, or their 2x2 patches (12/16)."""
    if n in (3, 4):
        return n, 1
    if n in (12, 16):
        return n // 4, 2
    raise LoadError(f"the Wan VAE's {what} has {n} channels; expected 3 or 4 (RGB/RGBA), or 12/16 (Wan 2.2's "
                    f"2x2 patches).", fix="the file may be another model's; please report it.")


def config(sd: Mapping[str, torch.Tensor], make):
    """Every hyperparameter from tensor shapes (pruned variants load); ``make`` builds the config."""
    keys = sd.keys()
    enc, dec = "encoder.conv_in.weight" in sd, "decoder.conv_in.weight" in sd
    kw: dict = {"image": is_image(sd)}
    if enc:
        n = count_indices(keys, "encoder.down")
        kw.update(enc_base=sd["encoder.conv_in.weight"].shape[0],
                  enc_widths=tuple(sd[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] for i in range(n)),
                  enc_blocks=count_indices(keys, "encoder.down.0.block"),
                  latent_channels=sd["encoder.conv_out.weight"].shape[0] // 2)
        kw["image_channels"], kw["patch"] = _channels(sd["encoder.conv_in.weight"].shape[1], "encoder input")
        temporal = tuple(f"encoder.down.{i}.downsample.time_conv.weight" in sd for i in range(n - 1))
    if dec:
        n = count_indices(keys, "decoder.up")
        up = tuple(sd[f"decoder.up.{i}.upsample.conv.weight"].shape[:2] if i else (0, 0) for i in range(n))
        kw.update(dec_mid=sd["decoder.conv_in.weight"].shape[0],
                  dec_widths=tuple(sd[f"decoder.up.{i}.block.0.conv2.weight"].shape[0] for i in range(n)),
                  dec_up=tuple(o for o, _ in up), dec_blocks=count_indices(keys, "decoder.up.0.block") - 1,
                  latent_channels=sd["decoder.conv_in.weight"].shape[1])
        kw["image_channels"], kw["patch"] = _channels(sd["decoder.conv_out.weight"].shape[0], "decoder output")
        temporal = tuple(f"decoder.up.{i + 1}.upsample.time_conv.weight" in sd for i in range(n - 1))
        # Wan 2.1's up-samplers halve the width, Wan 2.2's keep it (its levels carry shortcuts)
        kw["residual"] = all(o == i for o, i in up[1:])
    if not (enc or dec):
        raise LoadError("this Wan VAE file has neither an encoder nor a decoder (no conv_in weights).",
                        fix="the file is incomplete: download it again.")
    if not dec:     # an encoder alone: Wan 2.2 is the one with patches, Qwen-Image 2.1 the image one
        kw["residual"] = kw["patch"] == 2 or kw["image"]
    if kw["image"] and kw["patch"] != 1:
        raise LoadError("this Wan-family VAE has a temporal kernel of 1 (an image VAE, as Qwen-Image 2.1's) but "
                        "2x2 patches, a combination no published model has.",
                        fix="the file may be damaged or another model's; please report it.")
    return make(temporal=temporal, **kw)



# canonical -> original, in this order: names inside blocks first (the top-level conv_in becomes conv1 last)
_BACK = [(r"\.norm1\.", ".residual.0."), (r"\.conv1\.", ".residual.2."), (r"\.norm2\.", ".residual.3."),
         (r"\.conv2\.", ".residual.6."), (r"\.nin_shortcut\.", ".shortcut."), (r"(\.\d+\.)conv\.", r"\1resample.1."),
         (r"\.mid\.block_1\.", ".middle.0."), (r"\.mid\.attn_1\.proj_out\.", ".middle.1.proj."),
         (r"\.mid\.attn_1\.", ".middle.1."), (r"\.mid\.block_2\.", ".middle.2."),
         (r"\.norm_out\.", ".head.0."), (r"\.conv_out\.", ".head.2."),
         (r"^(encoder|decoder)\.conv_in\.", r"\1.conv1."), (r"^quant_conv\.", "conv1."), (r"^post_quant_conv\.", "conv2.")]
_LEVEL = re.compile(r"^(encoder|decoder)\.(?:down|up)\.(\d+)\.(?:block\.(\d+)|(?:down|up)sample)\.(.*)$")


def to_original(sd: Mapping[str, torch.Tensor], nested: bool) -> dict:
    """Canonical -> Wan's original names, as ComfyUI's files hold them: 2.1's flat level lists, or with
    ``nested`` 2.2's ``downsamples.<i>.downsamples.<j>``; the attention's q/k/v fused back into ``to_qkv``;
    an image variant's causal convs 5-D again (time size 1) and their gammas ``(C, 1, 1, 1)``, the
    ``resample.1`` and attention convs 2-D, as Qwen-Image 2.1's file has them.
    (For files in ComfyUI's layout, e.g. to run core's own VAE on the same weights.)"""
    image = is_image(sd)
    found = [(m[1], int(m[2]), m[3]) for k in sd if (m := _LEVEL.match(k))]
    levels = {side: 1 + max((lv for s_, lv, _ in found if s_ == side), default=-1) for side in ("encoder", "decoder")}
    blocks = {side: 1 + max((int(j) for s_, _, j in found if s_ == side and j is not None), default=-1)
              for side in ("encoder", "decoder")}
    moved = {}
    for key, v in sd.items():
        if m := _LEVEL.match(key):
            side, level, j, rest = m[1], int(m[2]), m[3], m[4]
            lists = "downsamples" if side == "encoder" else "upsamples"
            run = level if side == "encoder" else levels[side] - 1 - level       # decoder lists run coarse first
            idx = blocks[side] if j is None else int(j)                        # the resampler closes a level
            key = (f"{side}.{lists}.{run}.{lists}.{idx}.{rest}" if nested
                   else f"{side}.{lists}.{run * (blocks[side] + 1) + idx}.{rest}")
        moved[key] = v
    for key in [k for k in moved if re.search(r"\.attn_1\.q\.(weight|bias)$", k)]:
        head = key[: -len("q.weight" if key.endswith("weight") else "q.bias")]
        kind = key.rsplit(".", 1)[1]
        moved[f"{head}to_qkv.{kind}"] = torch.cat([moved.pop(f"{head}{n}.{kind}") for n in "qkv"])
    out = rename(moved, _BACK)
    return {k: _as_causal(k, v) for k, v in out.items()} if image else out


def _as_causal(key: str, v: torch.Tensor) -> torch.Tensor:
    """An image variant's tensor in ComfyUI's shape: Wan's causal convs (and their norms) carry a time axis."""
    if ".middle.1." in key or ".resample.1." in key:       # the attention and the spatial resampler are 2-D
        return v
    if key.endswith(".gamma"):
        return v.reshape(v.shape[0], 1, 1, 1)
    return v.unsqueeze(2) if key.endswith(".weight") and v.dim() == 4 else v
