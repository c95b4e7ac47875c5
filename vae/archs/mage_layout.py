"""Mage-VAE key layouts: detection and conversion to the canonical one.

Canonical = ComfyUI core's module names (``comfy/ldm/mage_flow/vae.py``): ``dconv_encoder.*`` (the
one-step DConv encoder) and ``decoder_model.*`` (the DConv denoiser, its CoD latent decoder under
``decoder_model.y_embedder.decoder.*``). Inside both halves every layout uses the same names.

Layouts read:
- the original file (Microsoft Mage's training checkpoint, and ComfyUI's single file
  ``mage_flow_vae_bf16.safetensors`` that the templates load): ``student.dconv_encoder.*`` and
  ``pipeline.*``. The original checkpoint also carries the Flux.2 VAE encoder the CoD decoder was
  anchored to in training (``pipeline.y_embedder.encoder.*``, ``pipeline.y_embedder.bottleneck.*``):
  never used at inference, dropped (as the original loader and core drop it), like any other
  ``student.*`` part.
- core's in-memory names (what ``comfy.sd.VAE.get_sd()`` returns): canonical.
- the diffusers pull request #14295 (``AutoencoderMageVAE``, not merged): ``encoder.*`` and
  ``decoder.*``.
A file with only one half (``student.dconv_encoder.*`` or ``pipeline.*``) loads as an encoder-only
or decoder-only VAE."""
from __future__ import annotations

from typing import Mapping

import torch

ENC, DEC = "dconv_encoder.", "decoder_model."
COD = DEC + "y_embedder.decoder."              # the CoD decoder: latent -> the denoiser's condition
# (encoder prefix, decoder prefix) per layout: original/ComfyUI file, core's in-memory, diffusers PR
PREFIXES = (("student.dconv_encoder.", "pipeline."), (ENC, DEC), ("encoder.", "decoder."))
ANCHOR = ("y_embedder.encoder.", "y_embedder.bottleneck.")   # relative to the decoder prefix
# one tensor per half that no other family has
ENC_KEY, DEC_KEY = "patch_cond_embed.weight", "dec_net.cond_embed.weight"


def _layout(sd: Mapping[str, torch.Tensor]):
    return next(((e, d) for e, d in PREFIXES if e + ENC_KEY in sd or d + DEC_KEY in sd), None)


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    return _layout(sd) is not None


def to_canonical(sd: Mapping[str, torch.Tensor]) -> dict:
    enc, dec = _layout(sd)
    out = {}
    for k, v in sd.items():
        if k.startswith(enc):
            out[ENC + k[len(enc):]] = v
        elif k.startswith(dec):
            if not k[len(dec):].startswith(ANCHOR):
                out[DEC + k[len(dec):]] = v
        elif not k.startswith("student."):    # the original checkpoint's other parts: never read
            out[k] = v                        # anything else: reported by the loader as unexpected
    return out
