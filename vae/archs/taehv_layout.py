"""Key layouts of the TAEHV family and the hyperparameters its weights tell.

Canonical layout: the original's (madebyollin/taehv ``taehv.py``), ``encoder.<i>.*`` and
``decoder.<i>.*`` with the indices of its two ``nn.Sequential``s. ComfyUI core's ``comfy/taesd/taehv.py``
and LightX2V's ``tae.py`` (the ``lighttae*`` files) build the same Sequentials, so the published
``.pth`` files, their ``safetensors/`` copies, the ``lighttae*`` files and ComfyUI's own all use it.
Also read: a wrapper's ``taehv.`` prefix (LightX2V's and the original's wrappers hold the model as
``self.taehv``); ``first_stage_model.`` / ``vae.`` prefixes are stripped by the loader; encoder-only
and decoder-only files.

Sequential indices (published; the widths here are whatever the weights say):
- encoder: 0 conv (3 * p^2 -> w), 1 act, then three levels of [TPool, stride-2 conv, 3 MemBlocks]
  at 2..6, 7..11, 12..16, and 17 conv (w -> latent);
- decoder: 0 Clamp, 1 conv (latent -> n0), 2 act, then three levels of [3 MemBlocks, Upsample x2,
  TGrow, conv] at 3..8, 9..14, 15..20, 21 act, 22 conv (n3 -> 3 * p^2);
- the "super" decoder (``taehv1_5_super``, ``taew2_2_super``): 0 1x1 conv (latent -> n0), then three
  levels of [3 SuperMemBlocks, conv (n_k -> n_{k+1} * u^2), ReLU, PixelShuffle(u), TGrow] at 1..7,
  8..14, 15..21, and 22 conv (n3 -> 3 * p^2).

Read from shapes: latent channels, the patch p (the pixel convs carry 3 * p^2 channels), every width,
each TPool's and TGrow's stride (a TPool's 1x1 conv reads ``stride`` frames stacked in channels, a
TGrow's writes them), the super decoder's spatial up-sampling (its PixelShuffle convs). Not in the
weights: the base decoder's spatial up-sampling (``nn.Upsample``, always 2 in published files) and
the activation (LightX2V's ``lighttaehy1_5`` uses LeakyReLU(0.2), every other file ReLU): taehv.py
reads those from the file's name."""
from __future__ import annotations

import re

from ..errors import LoadError

ENCODER_LEVELS = ((2, 3), (7, 8), (12, 13))          # (TPool, strided conv) per level
ENCODER_BLOCKS = ((4, 5, 6), (9, 10, 11), (14, 15, 16))
ENCODER_OUT = 17
DECODER_BLOCKS = ((3, 4, 5), (9, 10, 11), (15, 16, 17))
DECODER_TGROW = (7, 13, 19)
DECODER_CONV = (1, 8, 14, 20)                        # the convs whose outputs are the level widths
SUPER_BLOCKS = ((1, 2, 3), (8, 9, 10), (15, 16, 17))
SUPER_UP = (4, 11, 18)                               # convs feeding a PixelShuffle
SUPER_TGROW = (7, 14, 21)
DECODER_OUT = 22
IMAGE_CHANNELS = 3
PREFIX = "taehv."
FIX = ("load a TAEHV-family file as published (madebyollin/taehv .pth or safetensors/, LightX2V's "
       "lighttae*.safetensors, or the copy ComfyUI loads from models/vae_approx).")

_MEMBLOCK = re.compile(r"^(encoder|decoder)\.\d+\.conv\.0\.weight$")


def to_canonical(sd) -> dict:
    """Strip a wrapper's ``taehv.`` prefix; the rest is the canonical layout already."""
    if sd and all(k.startswith(PREFIX) for k in sd):
        return {k[len(PREFIX):]: v for k, v in sd.items()}
    return dict(sd)


def _is_memory_conv(w) -> bool:
    """A MemBlock's first conv reads the frame and its past stacked (2n -> n, 3x3); a SuperMemBlock's is
    a depthwise 7x7 over the same stack (2n -> 2n, one input channel per group)."""
    if w.dim() != 4:
        return False
    return (w.shape[1] == 2 * w.shape[0] and tuple(w.shape[2:]) == (3, 3)) or \
        (w.shape[1] == 1 and tuple(w.shape[2:]) == (7, 7) and w.shape[0] % 2 == 0)


def detect(sd) -> bool:
    keys = [k[len(PREFIX):] if k.startswith(PREFIX) else k for k in sd]
    raw = {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in sd.items()}
    return any(_MEMBLOCK.match(k) and _is_memory_conv(raw[k]) for k in keys)


def _stride(w, grows: bool) -> int:
    """A TPool's (n * s -> n) or a TGrow's (n -> n * s) 1x1 conv: its stride s."""
    out, inp = w.shape[:2]
    big, small = (out, inp) if grows else (inp, out)
    if w.dim() != 4 or big % small:
        raise LoadError(f"a TAEHV {'TGrow' if grows else 'TPool'} conv has shape {list(w.shape)}, which is not "
                        f"a 1x1 conv between n and n * stride channels.", fix=FIX)
    return big // small


def _patch(channels: int, what: str) -> int:
    p = round((channels / IMAGE_CHANNELS) ** 0.5)
    if p < 1 or IMAGE_CHANNELS * p * p != channels:
        raise LoadError(f"the TAEHV {what} has {channels} pixel channels, which is not 3 (RGB) times a square "
                        f"(the 2x2 or 4x4 patches of the published files).", fix=FIX)
    return p


def _get(sd, key: str, what: str):
    if key not in sd:
        raise LoadError(f"a TAEHV {what} without '{key}' (the published Sequential has it at this index).", fix=FIX)
    return sd[key]


def encoder_fields(sd) -> dict:
    w0 = _get(sd, "encoder.0.weight", "encoder")
    width = w0.shape[0]
    return dict(patch=_patch(w0.shape[1], "encoder's first conv"), encoder_width=width,
                encoder_time=tuple(_stride(_get(sd, f"encoder.{pool}.conv.weight", "encoder"), False)
                                   for pool, _ in ENCODER_LEVELS),
                latent_channels=_get(sd, f"encoder.{ENCODER_OUT}.weight", "encoder").shape[0])


def decoder_fields(sd) -> dict:
    if "decoder.0.weight" in sd:                 # the super decoder starts with a 1x1 conv (no Clamp)
        first = sd["decoder.0.weight"]
        tgrows = [_get(sd, f"decoder.{i}.conv.weight", "super decoder") for i in SUPER_TGROW]
        widths = (first.shape[0], *(t.shape[1] for t in tgrows))
        ups = []
        for i, width in zip(SUPER_UP, widths[1:]):
            out = _get(sd, f"decoder.{i}.weight", "super decoder").shape[0]
            u = round((out / width) ** 0.5)
            if u * u * width != out:
                raise LoadError(f"the TAEHV super decoder's conv {i} writes {out} channels for {width}-channel "
                                "frames: not a PixelShuffle of a square factor.", fix=FIX)
            ups.append(u)
        kind, space = "super", tuple(ups)
    else:
        first = _get(sd, "decoder.1.weight", "decoder")
        widths = tuple(_get(sd, f"decoder.{i}.weight", "decoder").shape[0] for i in DECODER_CONV)
        tgrows = [_get(sd, f"decoder.{i}.conv.weight", "decoder") for i in DECODER_TGROW]
        kind, space = "base", (2, 2, 2)
    out = _get(sd, f"decoder.{DECODER_OUT}.weight", "decoder").shape[0]
    return dict(latent_channels=first.shape[1], patch=_patch(out, "decoder's last conv"), decoder=kind,
                decoder_widths=widths, decoder_space=space,
                decoder_time=tuple(_stride(t, True) for t in tgrows))


def structure(sd) -> dict:
    """The hyperparameters the weights tell (canonical keys), of either half or both."""
    has_enc = any(k.startswith("encoder.") for k in sd)
    has_dec = any(k.startswith("decoder.") for k in sd)
    enc = encoder_fields(sd) if has_enc else {}
    dec = decoder_fields(sd) if has_dec else {}
    if enc and dec:
        for field, what in (("latent_channels", "latent channels"), ("patch", "pixel patch")):
            if enc[field] != dec[field]:
                raise LoadError(f"the TAEHV encoder and decoder differ in {what} ({enc[field]} vs {dec[field]}): "
                                "two halves of different models.", fix=FIX)
        t_enc, t_dec = _product(enc["encoder_time"]), _product(dec["decoder_time"])
        if t_enc != t_dec:
            raise LoadError(f"the TAEHV encoder pools {t_enc} frames into a latent frame but the decoder grows "
                            f"{t_dec}: two halves of different models.", fix=FIX)
    fields = {**enc, **dec}
    if not has_enc:
        fields["encoder_width"] = None
    if not has_dec:
        fields["decoder"] = ""
    return fields


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out
