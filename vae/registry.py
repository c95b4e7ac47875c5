"""The architectures (every ``SPEC`` in ``vae/archs``), ordered by their declared ``priority``, and
the one detection entry point. Adding a family adds no line here."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Mapping

import torch

from . import archs
from .files import loadcheck
from .errors import LoadError
from .spec import ArchSpec


def _collect() -> tuple[ArchSpec, ...]:
    specs = []
    for info in pkgutil.iter_modules(archs.__path__):
        spec = getattr(importlib.import_module(f"{archs.__name__}.{info.name}"), "SPEC", None)
        if isinstance(spec, ArchSpec):
            specs.append(spec)
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise RuntimeError(f"two architectures share an id: {sorted(ids)}")
    return tuple(sorted(specs, key=lambda s: (s.priority, s.id)))


# Order settles overlaps: the most specific key patterns first (each family's ``priority`` says why).
REGISTRY: tuple[ArchSpec, ...] = _collect()

# Latents of models no family here decodes, for the same error messages (channels, rank, text).
OTHER_HINTS: tuple[tuple[int, int, str], ...] = ((64, 5, "HunyuanImage 2.1 refiner (two frames packed)"),)


def channel_hint(channels: int, rank: int) -> str:
    """The models whose latents have ``channels`` channels at this rank (else at any rank)."""
    hints = [h for s in REGISTRY for h in s.latent_hints] + list(OTHER_HINTS)
    same = [text for c, r, text in hints if c == channels and r == rank]
    names = same or [text for c, _, text in hints if c == channels]
    names = list(dict.fromkeys(names))
    if not names:
        return f"a {channels}-channel model"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]

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
