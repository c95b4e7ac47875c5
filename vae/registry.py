"""The ordered list of architectures and the one detection entry point."""
from __future__ import annotations

from typing import Mapping

import torch

from . import loadcheck
from .archs import consistency, flux2, hunyuan_video, hunyuan_video15, kl, ltx, magvit, mochi, tiny, wan
from .errors import LoadError
from .spec import ArchSpec

# Order settles overlaps: the most specific key patterns first.
# Mochi before TAESD: genmo's encoder keys (`encoder.layers.0.weight`) also match tiny.detect.
# Consistency before KL: its encoder is SD's KL encoder (`decoder_unet.` / OpenAI names tell it apart).
# Flux.2 before KL: it is a KL layout plus the latent BatchNorm's `bn.*` (kl.detect alone would claim it).
REGISTRY: tuple[ArchSpec, ...] = (consistency.SPEC, wan.SPEC, mochi.SPEC, tiny.SPEC, flux2.SPEC, kl.SPEC, ltx.SPEC,
                                  magvit.SPEC, hunyuan_video.SPEC, hunyuan_video15.SPEC)


def detect(sd: Mapping[str, torch.Tensor], source: str = "state dict") -> ArchSpec:
    for spec in REGISTRY:
        with loadcheck.family_step(spec.name, source):   # a detect that trips on an odd tensor names it
            if spec.detect(sd):
                return spec
    first = ", ".join(sorted(sd.keys())[:8]) or "(no tensors)"
    tried = ", ".join(s.name for s in REGISTRY)
    raise LoadError(
        f"{source} is not a VAE this pack knows. Families tried: {tried}. First keys seen: {first}.",
        fix="load a VAE file (not a UNet/diffusion model or LoRA); full checkpoints work when their VAE keys "
            "carry the 'first_stage_model.' or 'vae.' prefix.")
