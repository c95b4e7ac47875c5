"""Key layouts of the TAESD family and its hyperparameters, read from the weights.

Canonical layout: ComfyUI's combined file (``taesd_encoder.<i>``, ``taesd_decoder.<i>`` with the
original nn.Sequential indices, plus scalar or per-channel ``vae_scale``/``vae_shift``). Also read:
the original encoder/decoder pair (bare indices; combined by the loader, or one half alone), and
diffusers' layout (``encoder.layers.<i>``, ``decoder.layers.<i-1>``: diffusers has no Clamp module at
index 0), which is also the layout of the single ``taeqi2_1.safetensors``.

Variants told apart by structure and shapes only (never by a file name):
- plain: the encoder's first conv at index 0, the decoder's head writes the image channels;
- taef2: GroupNorm "pool" branches in the lowest-resolution blocks (``.pool.`` keys);
- f16 (taeqi2_1): a 2x2 space-to-depth in front of the encoder (index 0 holds no weights, its
  first conv is at index 1 and takes ``image_channels * 4``; then a ReLU), and a decoder head that
  writes ``image_channels * 4`` channels for a 2x2 depth-to-space. Read from madebyollin/taesd
  ``taesd.py`` at 401ce45e (``F16Encoder``/``F16Decoder``)."""
from __future__ import annotations

import re
from typing import Optional

from ..errors import LoadError
from ..files.keymap import rename

ENC, DEC = "taesd_encoder", "taesd_decoder"
IMAGE_CHANNELS = (3, 4)      # RGB, or RGBA (straight alpha): what a patchified head may carry


def _bump(m: re.Match) -> str:
    return f"{DEC}.{int(m.group(1)) + 1}."


def _bare_is_encoder(sd) -> bool:
    """One bare original file: an encoder has its first conv at 0 (plain) or at 1 with a strided conv
    at 4 (f16); every decoder has its first conv at 1 (0 is the clamp) and blocks at 3, 4 and 5."""
    return "0.weight" in sd or ("1.weight" in sd and "4.weight" in sd)


def to_canonical(sd) -> dict:
    keys = list(sd.keys())
    if any(k.startswith(("encoder.layers.", "decoder.layers.")) for k in keys):
        sd = rename(sd, [(r"^encoder\.layers\.", f"{ENC}."), (r"^decoder\.layers\.(\d+)\.", _bump)])
    elif not any(k.startswith((ENC + ".", DEC + ".")) for k in keys):
        prefix = ENC if _bare_is_encoder(sd) else DEC
        sd = {f"{prefix}.{k}": v for k, v in sd.items()}
    return dict(sd)


def detect(sd) -> bool:
    keys = sd.keys()
    # 2-D convs only: genmo's Mochi encoder also has `encoder.layers.0.weight` (a Linear)
    conv = lambda k: k in sd and sd[k].dim() == 4
    block = lambda prefix: any(re.match(re.escape(prefix) + r"\d+\.conv\.0\.weight$", k) for k in keys)
    f16_encoder = lambda prefix: conv(f"{prefix}1.weight") and conv(f"{prefix}3.conv.0.weight")
    return (conv(f"{DEC}.1.weight") or conv(f"{ENC}.0.weight") or f16_encoder(f"{ENC}.")
            or conv("decoder.layers.0.weight") or conv("encoder.layers.0.weight") or f16_encoder("encoder.layers.")
            or ((conv("0.weight") or conv("1.weight")) and block("")))


def indices(sd, prefix: str) -> list[int]:
    pat = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    return sorted({int(m.group(1)) for k in sd if (m := pat.match(k))})


def _stages(sd, prefix: str, first: int) -> tuple[tuple[int, int], ...]:
    """Walk the Sequential from index ``first``: a run of blocks after a conv is one stage."""
    stages, blocks, width = [], 0, None
    for i in indices(sd, prefix):
        if i < first:
            continue
        if f"{prefix}.{i}.conv.0.weight" in sd:
            blocks += 1
            width = sd[f"{prefix}.{i}.conv.0.weight"].shape[0]
        elif blocks:
            stages.append((width, blocks))
            blocks = 0
    return tuple(stages)


def _split(channels: int, patched: Optional[bool]) -> tuple[int, int]:
    """(image channels, patch) of a conv that reads or writes ``channels``: ``image * patch**2``. An
    unpatched file may have any channel count; a patched one carries RGB or RGBA (3p^2 and 4p^2
    never coincide). ``patched`` None: decide from the count (a decoder head, which has no other sign)."""
    if not patched and (patched is False or channels <= max(IMAGE_CHANNELS)):
        return channels, 1
    for c in IMAGE_CHANNELS:
        p = round((channels / c) ** 0.5)
        if p >= 2 and c * p * p == channels:
            return c, p
    raise LoadError(f"a TAESD-style {'encoder' if patched else 'decoder'} with a space-to-depth "
                    f"step has {channels} pixel channels, which is not RGB or RGBA times a square.",
                    fix="use an original taesd/taef*/taeqi* file or a diffusers AutoencoderTiny file.")


def structure(sd) -> dict:
    """The hyperparameters the weights tell (canonical keys): latent and image channels, the stages
    of each half, the taef2 pool, the f16 patch."""
    enc_stem = 0 if f"{ENC}.0.weight" in sd else 1 if f"{ENC}.1.weight" in sd else None
    has_dec = f"{DEC}.1.weight" in sd
    if enc_stem is None and not has_dec:
        raise LoadError("TAESD-style weights without an encoder conv at index 0 or 1 or a decoder conv at index 1.",
                        fix="use an original taesd/taef*/taeqi* .pth/.safetensors file or a diffusers "
                            "AutoencoderTiny file.")
    if has_dec:
        latent = sd[f"{DEC}.1.weight"].shape[1]
        image, patch = _split(sd[f"{DEC}.{indices(sd, DEC)[-1]}.weight"].shape[0], None)
    else:
        latent = sd[f"{ENC}.{indices(sd, ENC)[-1]}.weight"].shape[0]
    if enc_stem is not None:
        enc_image, enc_patch = _split(sd[f"{ENC}.{enc_stem}.weight"].shape[1], enc_stem == 1)
        if has_dec and (enc_image, enc_patch) != (image, patch):
            raise LoadError(f"the TAESD-style encoder reads {enc_image} image channels in {enc_patch}x{enc_patch} "
                            f"patches but the decoder writes {image} in {patch}x{patch}: two halves of different "
                            "models.", fix="load an encoder and a decoder published together (same name stem).")
        image, patch = enc_image, enc_patch
    return dict(latent_channels=latent, image_channels=image, patch=patch,
                encoder_stages=_stages(sd, ENC, 1) if enc_stem is not None else None,
                decoder_stages=_stages(sd, DEC, 3) if has_dec else None,
                midblock_gn=any(".pool." in k for k in sd))
