"""Flux.2 VAE (BFL FLUX.2; diffusers AutoencoderKLFlux2; ComfyUI's ``batch_norm_latent`` AutoencoderKL):
an AutoencoderKL with 32 latent channels, quant convs and mid-block attention, whose LATENT is the
latent packed 2x2 into 128 channels and normalised by a BatchNorm's running statistics.

Latent convention (ComfyUI's and BFL's): encode returns ``(pack(z) - running_mean) / sqrt(running_var
+ eps)``, decode takes it back. diffusers' ``AutoencoderKLFlux2.decode`` takes the raw ``z`` instead and
leaves the BatchNorm and the packing to its pipeline. A 32-channel latent is read as the normalised
latent unpacked (taef2's space, what core's TAESD path makes and takes), never as a raw ``z``.

The model works on the unpacked grid (8x, 32 channels), like every KL VAE, so the engines tile it as
one. The normalisation depends on where a latent pixel sits in its 2x2 cell, which a tile does not
know; it runs on the whole latent: ``prepare_decode`` before tiling, ``finish_encode`` after.

Canonical layout: ComfyUI's (LDM names, ``quant_conv``/``post_quant_conv`` at the top, ``bn.*``). BFL's
original file nests them as ``encoder.quant_conv``/``decoder.post_quant_conv``; diffusers' names go
through the KL rules. Every width is read from the weights: the small-decoder files have a narrower
decoder than their encoder."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..errors import LoadError
from ..files.keymap import rename
from ..nn import posterior as gaussian
from ..spec import ArchSpec, Capabilities
from . import kl

BN_EPS = 1e-4    # BFL's, diffusers' published config and ComfyUI's; not in the weights


@dataclass(frozen=True)
class Flux2Config(kl.KLConfig):
    pack: int = 2      # latent pixels per LATENT pixel, each axis (BatchNorm channels / latent channels)


class Flux2VAE(kl.AutoencoderKL):
    """encode: pixels in [-1, 1] -> raw latent (the posterior mode), per tile; ``finish_encode``
    normalises the assembled latent. ``prepare_decode`` un-normalises the whole latent; decode: raw
    latent -> pixels in [-1, 1], per tile. Latents here are unpacked [B, C, h, w]."""

    def __init__(self, cfg: Flux2Config):
        super().__init__(cfg)
        latent = cfg.embed_dim or cfg.z_channels
        # holds the running statistics only (the file's bn.* keys); never run as a layer
        self.bn = nn.BatchNorm2d(latent * cfg.pack ** 2, eps=BN_EPS, affine=False)

    def _affine(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std per unpacked latent pixel of ``z`` (float32, on z's device): packed channel
        c*p*p + py*p + px is channel c at (y % p, x % p) of the grid, as ComfyUI and diffusers pack."""
        p, (h, w) = self.config.pack, z.shape[-2:]

        def grid(v: torch.Tensor) -> torch.Tensor:
            cell = v.to(z.device, torch.float32).view(1, -1, p, p)
            return cell.repeat(1, 1, -(-h // p), -(-w // p))[..., :h, :w]
        return grid(self.bn.running_mean), grid(self.bn.running_var).add_(self.bn.eps).sqrt_()

    def prepare_decode(self, z: torch.Tensor) -> torch.Tensor:
        mean, std = self._affine(z)
        return torch.addcmul(mean, z.float(), std).to(z.dtype)

    def finish_encode(self, z: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        """The assembled latent normalised; ``posterior``: [mean; log-variance] (vae/nn/posterior.py)."""
        if posterior:
            mean, std = self._affine(gaussian.split(z)[0])
            return gaussian.normalised(z, lambda m: (m.float() - mean).div_(std).to(m.dtype), 1 / std)
        mean, std = self._affine(z)
        return (z.float() - mean).div_(std).to(z.dtype)


# ---- key layouts -------------------------------------------------------------------------------

def to_canonical(sd) -> dict:
    # BFL's original file keeps the quant convs inside encoder/decoder (ComfyUI moves them out)
    sd = rename(sd, [(r"^encoder\.quant_conv\.", "quant_conv."), (r"^decoder\.post_quant_conv\.", "post_quant_conv.")])
    return kl.to_canonical(sd)


def detect(sd) -> bool:
    # ComfyUI's own test ('bn.running_mean' in sd) on a KL layout; SD/Flux.1 KL files have no bn.*
    return "bn.running_mean" in sd and kl.detect(sd)


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> Flux2Config:
    base = kl.config_from_state_dict(sd, name_hint)
    latent = base.embed_dim or base.z_channels
    stats = sd["bn.running_mean"].numel()
    pack = round((stats / latent) ** 0.5)
    if pack * pack * latent != stats:
        raise LoadError(f"the latent BatchNorm has {stats} channels, not a square multiple of the "
                        f"{latent} latent channels.",
                        fix="this is not a Flux.2 VAE file as published; please report it with the key list.")
    return Flux2Config(**vars(base), pack=pack)


def complete_state_dict(sd: dict, cfg: Flux2Config) -> dict:
    sd.setdefault("bn.num_batches_tracked", torch.tensor(0))     # a counter some savers drop; never read
    return sd


def capabilities(cfg: Flux2Config) -> Capabilities:
    # the KL family's, packed; its working dtypes leave out fp16, as the published force_upcast asks
    return dataclasses.replace(kl.capabilities(cfg), latent_pack=cfg.pack)


def describe(cfg: Flux2Config) -> str:
    latent = cfg.embed_dim or cfg.z_channels
    parts = [f"{latent} latent channels packed {cfg.pack}x{cfg.pack} into {latent * cfg.pack ** 2}"]
    if cfg.decoder_widths:
        parts.append(f"decoder widths {'/'.join(map(str, cfg.decoder_widths))}")
    if not (cfg.has_encoder and cfg.has_decoder):
        parts.append("decoder only" if cfg.has_decoder else "encoder only")
    return f"Flux.2 VAE ({', '.join(parts)})"


# before KL: a KL layout plus the latent BatchNorm's `bn.*` (kl.detect alone would claim it)
SPEC = ArchSpec(id="flux2", name="Flux.2 VAE", detect=detect, to_canonical=to_canonical,
                config_from_state_dict=config_from_state_dict, build=Flux2VAE, capabilities=capabilities,
                describe=describe, complete_state_dict=complete_state_dict,
                priority=50, latent_hints=((32, 4, "Flux.2 (unpacked)"), (128, 4, "Flux.2 (packed)")))
