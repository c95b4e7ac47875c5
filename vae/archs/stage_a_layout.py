"""Key layouts of Stable Cascade's stage A (Paella's VQ-GAN) and its hyperparameters, read from the
weights.

Two layouts are published, with the same module tree (``in_block``, ``down_blocks``, ``vquantizer``,
``up_blocks``, ``out_block``; Sequential indices as the original ``StageA``):
- the original / ComfyUI's single file (``stage_a.safetensors``): the codebook is
  ``vquantizer.codebook.weight``;
- diffusers' ``PaellaVQModel`` (the ``vqgan`` folder of the Würstchen / Stable Cascade pipelines): the
  codebook is ``vquantizer.embedding.weight``.
Canonical: the original's, except that a residual block's depthwise conv is ``depthwise.weight`` (the
original's ``depthwise.1``: a ReplicationPad2d at index 0 that we fold into the conv's padding mode).

The structure, as every published file has it (L levels, B bottleneck blocks):
- ``down_blocks``: block, then per further level a 4x4 stride-2 conv and a block, then a Sequential of
  a bias-free 1x1 conv to the latent channels and a BatchNorm (``down_blocks.{2L-1}.0`` / ``.1``);
- ``up_blocks``: a Sequential holding a 1x1 conv from the latent (``up_blocks.0.0``), B blocks at the
  widest level, then per further level a 4x4 stride-2 transposed conv and one block;
- ``in_block.1`` / ``out_block.0``: 1x1 convs around a 2x2 space-to-depth / depth-to-space."""
from __future__ import annotations

import re

from ..errors import LoadError
from ..files.keymap import count_indices, rename

FIX = "this is not a Stable Cascade stage A file as published; please report it with the key list."


def to_canonical(sd) -> dict:
    sd = rename(sd, [(r"^vquantizer\.embedding\.", "vquantizer.codebook."), (r"\.depthwise\.1\.", ".depthwise.")])
    # the quantizer's EMA counters are training state (the original's ema_loss=True); the VAE never reads them
    return {k: v for k, v in sd.items() if not k.startswith("vquantizer.ema_")}


def detect(sd) -> bool:
    def conv(k):
        return k in sd and sd[k].dim() == 4

    def block(prefix):     # a residual block's depthwise conv, in either layout
        return conv(f"{prefix}.depthwise.1.weight") or conv(f"{prefix}.depthwise.weight")
    codebook = any(f"vquantizer.{n}.weight" in sd for n in ("codebook", "embedding"))
    encoder = conv("in_block.1.weight") and block("down_blocks.0")
    decoder = conv("out_block.0.weight") and conv("up_blocks.0.0.weight") and block("up_blocks.1")
    return encoder or decoder or (codebook and (conv("in_block.1.weight") or conv("up_blocks.0.0.weight")))


def _is_block(sd, prefix: str) -> bool:
    return f"{prefix}.depthwise.weight" in sd


def _split(channels: int) -> tuple[int, int]:
    """(image channels, patch) of a 1x1 conv that reads or writes ``channels`` = image * patch**2."""
    for image in (3, 4, 1):
        patch = round((channels / image) ** 0.5)
        if patch >= 1 and image * patch * patch == channels:
            return image, patch
    raise LoadError(f"the outer 1x1 conv has {channels} channels: not 3 image channels times a square patch.",
                    fix=FIX)


def _encoder(sd) -> tuple[tuple[int, ...], int]:
    """The encoder's widths and latent channels, checking the index pattern described above."""
    n = count_indices(sd.keys(), "down_blocks")
    if n < 2 or n % 2:
        raise KeyError(f"down_blocks.{max(n, 2) - 1}.0.weight")
    widths = []
    for i in range(0, n - 1, 2):
        if not _is_block(sd, f"down_blocks.{i}"):
            raise KeyError(f"down_blocks.{i}.depthwise.1.weight")
        widths.append(sd[f"down_blocks.{i}.depthwise.weight"].shape[0])
        if i and sd[f"down_blocks.{i - 1}.weight"].shape[-1] != 4:
            raise LoadError(f"down_blocks.{i - 1} is not a 4x4 stride-2 conv.", fix=FIX)
    return tuple(widths), sd[f"down_blocks.{n - 1}.0.weight"].shape[0]


def _decoder(sd) -> tuple[tuple[int, ...], int, int]:
    """The decoder's widths (highest resolution first), bottleneck blocks and latent channels."""
    n = count_indices(sd.keys(), "up_blocks")
    ups = [i for i in range(1, n) if not _is_block(sd, f"up_blocks.{i}")]
    for i in ups:
        if f"up_blocks.{i}.weight" not in sd:
            raise KeyError(f"up_blocks.{i}.depthwise.1.weight")
    bottleneck = (ups[0] if ups else n) - 1
    if bottleneck < 1 or [b - a for a, b in zip(ups, ups[1:] + [n])] != [2] * len(ups):
        raise LoadError(f"up_blocks has {bottleneck} bottleneck block(s) and transposed convs at {ups}: not "
                        "the published pattern (blocks, then a transposed conv and one block per level).", fix=FIX)
    widths = [sd[f"up_blocks.{i}.depthwise.weight"].shape[0] for i in [1] + [u + 1 for u in ups]]
    return tuple(reversed(widths)), bottleneck, sd["up_blocks.0.0.weight"].shape[1]


def structure(sd) -> dict:
    """Every hyperparameter of a canonical state dict, from its shapes (stage_a.StageAConfig's fields)."""
    has_enc, has_dec = "in_block.1.weight" in sd, "out_block.0.weight" in sd
    if not (has_enc or has_dec):
        raise KeyError("out_block.0.weight")
    widths = bottleneck = latent = None
    if has_dec:
        widths, bottleneck, latent = _decoder(sd)
        image, patch = _split(sd["out_block.0.weight"].shape[0])
    if has_enc:
        enc_widths, enc_latent = _encoder(sd)
        if widths is not None and (enc_widths, enc_latent) != (widths, latent):
            raise LoadError(f"the encoder's widths {enc_widths} and {enc_latent} latent channels differ from the "
                            f"decoder's {widths} and {latent}: they are not one VAE.",
                            fix="load a stage A file whose encoder and decoder belong together.")
        widths, latent = enc_widths, enc_latent
        image, patch = _split(sd["in_block.1.weight"].shape[1])
    first = next(k for k in sd if re.search(r"\.channelwise\.0\.weight$", k))
    hidden, width = sd[first].shape
    codebook = sd["vquantizer.codebook.weight"]     # in every published file; core detects stage A by it
    if codebook.shape[-1] != latent:
        raise LoadError(f"the codebook holds {codebook.shape[-1]}-channel codes for a {latent}-channel latent.",
                        fix=FIX)
    return dict(widths=widths, hidden=hidden // width, bottleneck_blocks=bottleneck or 0,
                     latent_channels=latent, codebook_size=codebook.shape[0],
                     patch=patch, image_channels=image, has_encoder=has_enc, has_decoder=has_dec)
