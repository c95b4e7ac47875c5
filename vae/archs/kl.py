"""AutoencoderKL: SD 1.x/2.x and SDXL (4 latent channels, quant convs), SD3 and Flux.1 (16 channels,
no quant convs).

Canonical layout: the original LDM / ComfyUI names (``encoder.down.0.block.1.conv1``,
``mid.attn_1.q`` as 1x1 conv, ``decoder.up.3`` = first up level applied). diffusers' layout is
converted on load. Hyperparameters are read from tensor shapes."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from torch import nn

from ..errors import LoadError
from ..files.keymap import count_indices
from ..nn.attention import SpatialSelfAttention
from ..nn.norm import GroupNorm
from ..nn.resnet import conv2d_1x1, conv2d_3x3
from ..nn.sampling import Downsample2x, Upsample2x
from ..spec import ArchSpec, Capabilities
from . import ldm, svd_layout

GROUPS, EPS = 32, 1e-6   # every published KL VAE; not recoverable from the weights


@dataclass(frozen=True)
class KLConfig:
    ch: int
    ch_mult: tuple[int, ...]
    num_res_blocks: int
    z_channels: int
    embed_dim: Optional[int]          # None: no quant convs (SD3, Flux)
    in_channels: int = 3
    out_channels: int = 3
    mid_attention: bool = True
    has_encoder: bool = True
    has_decoder: bool = True
    # a decoder narrower than the encoder (Flux.2's small decoders): its own widths, read from its
    # weights; None: ch * ch_mult, as the encoder
    decoder_widths: Optional[tuple[int, ...]] = None
    decoder_res_blocks: Optional[int] = None

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(self.ch * m for m in self.ch_mult)


def _ops(cfg: KLConfig) -> ldm.Ops:
    norm = lambda c: GroupNorm(GROUPS, c, eps=EPS)
    attention = lambda c: SpatialSelfAttention(c, GROUPS, EPS) if cfg.mid_attention else None
    return ldm.Ops(conv=conv2d_3x3, shortcut=conv2d_1x1, norm=norm, attention=attention)


def encoder_half(cfg: KLConfig) -> tuple[ldm.Encoder, Optional[nn.Conv2d]]:
    """The KL encoder and, where the file has one (``embed_dim``), its quant conv. SVD's VAE has the
    same encoder (vae/archs/svd.py)."""
    last = len(cfg.widths) - 1
    encoder = ldm.Encoder(cfg.ch, cfg.widths, cfg.num_res_blocks, cfg.in_channels, 2 * cfg.z_channels, _ops(cfg),
                          downsample=lambda i, c: Downsample2x(c) if i != last else None)
    quant = cfg.embed_dim is not None
    return encoder, nn.Conv2d(2 * cfg.z_channels, 2 * cfg.embed_dim, 1) if quant else None


class AutoencoderKL(ldm.Autoencoder):
    """encode: pixels in [-1, 1] -> the posterior mode (raw latent, as ComfyUI's LATENT holds it);
    decode: raw latent -> pixels in [-1, 1]. Latent scaling is the sampler's business, not ours."""

    def __init__(self, cfg: KLConfig):
        widths = cfg.widths
        ops = _ops(cfg)
        quant = cfg.embed_dim is not None
        encoder = decoder = quant_conv = post_quant_conv = None
        if cfg.has_encoder:
            encoder, quant_conv = encoder_half(cfg)
        if cfg.has_decoder:
            n_res = cfg.num_res_blocks if cfg.decoder_res_blocks is None else cfg.decoder_res_blocks
            decoder = ldm.Decoder(cfg.decoder_widths or widths, n_res, cfg.z_channels, cfg.out_channels, ops,
                                  upsample=lambda i, c: Upsample2x(c) if i != 0 else None)
            if quant:
                post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)
        super().__init__(encoder, decoder, quant_conv, post_quant_conv)
        self.config = cfg


# ---- key layouts -------------------------------------------------------------------------------

def to_canonical(sd) -> dict:
    sd = dict(sd)
    if ldm.is_diffusers(sd.keys()):
        sd = ldm.from_diffusers(sd, ndim=4)
    # LDM checkpoints may carry loss/discriminator weights; they are not part of the VAE.
    return {k: v for k, v in sd.items() if not k.startswith("loss.")}


def detect(sd) -> bool:
    if any(k.endswith(".gamma") for k in sd):      # RMS-normed (Wan-family image VAEs), not GroupNorm
        return False
    if svd_layout.is_temporal(sd.keys()):         # SVD's decoder: KL-shaped, with temporal layers (svd.py)
        return False
    for side in ("decoder", "encoder"):
        w = sd.get(f"{side}.conv_in.weight")
        if w is not None and w.dim() == 4 and any(
                re.match(rf"{side}\.(down|up|down_blocks|up_blocks)\.\d+\.", k) for k in sd):
            return True
    return False


def _levels(keys, prefix: str) -> int:
    """Resolution levels under ``prefix``; none (conv_in and conv_out with nothing between) means the
    levels' tensors are missing: named as the first one the model would read."""
    n = count_indices(keys, prefix)
    if not n:
        raise KeyError(f"{prefix}.0.block.0.conv1.weight")
    return n


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> KLConfig:
    keys = sd.keys()
    has_enc, has_dec = "encoder.conv_in.weight" in sd, "decoder.conv_in.weight" in sd
    side = "encoder" if has_enc else "decoder"
    dec_widths = dec_res = None
    if has_dec:     # read on its own: a decoder may be narrower than its encoder
        levels = _levels(keys, "decoder.up")
        dec_widths = tuple(sd[f"decoder.up.{i}.block.0.conv2.weight"].shape[0] for i in range(levels))
        dec_res = count_indices(keys, "decoder.up.0.block") - 1
    if has_enc:
        levels = _levels(keys, "encoder.down")
        ch = sd["encoder.conv_in.weight"].shape[0]
        widths = tuple(sd[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] for i in range(levels))
        n_res = count_indices(keys, "encoder.down.0.block")
        z = sd["encoder.conv_out.weight"].shape[0] // 2
        if dec_widths is not None and len(dec_widths) != len(widths):
            raise LoadError(f"the encoder has {len(widths)} resolution levels but the decoder {len(dec_widths)}: "
                            "their compression ratios differ, so they are not one VAE.",
                            fix="load a VAE whose encoder and decoder belong together.")
    else:
        widths, n_res, ch = dec_widths, dec_res, dec_widths[0]
    if has_dec:
        z = sd["decoder.conv_in.weight"].shape[1]
    embed = None
    if "post_quant_conv.weight" in sd:
        embed = sd["post_quant_conv.weight"].shape[1]
    elif "quant_conv.weight" in sd:
        embed = sd["quant_conv.weight"].shape[0] // 2
    ch_mult = tuple(w // ch for w in widths)
    if tuple(ch * m for m in ch_mult) != widths:        # widths that are not multiples of the first
        raise LoadError(f"{side} widths {widths} are not multiples of the first level's {ch}.",
                        fix="this VAE's layout is not an AutoencoderKL's; please report it with the key list.")
    return KLConfig(
        ch=ch, ch_mult=ch_mult, num_res_blocks=n_res, z_channels=z,
        embed_dim=embed,
        in_channels=sd["encoder.conv_in.weight"].shape[1] if has_enc else 3,
        out_channels=sd["decoder.conv_out.weight"].shape[0] if has_dec else 3,
        mid_attention=f"{side}.mid.attn_1.q.weight" in sd,
        has_encoder=has_enc, has_decoder=has_dec,
        decoder_widths=dec_widths if has_dec and dec_widths != widths else None,
        decoder_res_blocks=dec_res if has_dec and dec_res != n_res else None)


def capabilities(cfg: KLConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.embed_dim or cfg.z_channels,
        spatial_ratio=2 ** (len(cfg.ch_mult) - 1),
        image_channels=cfg.out_channels,
        has_attention=cfg.mid_attention, norm="groupnorm",
        posterior=True, can_encode=cfg.has_encoder, can_decode=cfg.has_decoder)


def describe(cfg: KLConfig) -> str:
    lat = cfg.embed_dim or cfg.z_channels
    family = {4: "SD1.x/SD2.x/SDXL", 16: "SD3/Flux.1"}.get(lat, f"{lat}-channel")
    return f"AutoencoderKL ({family}, {lat} latent channels)"


SPEC = ArchSpec(id="kl", name="AutoencoderKL", detect=detect, to_canonical=to_canonical,
                config_from_state_dict=config_from_state_dict, build=AutoencoderKL,
                capabilities=capabilities, describe=describe,
                priority=60, latent_hints=((4, 4, "SD1.x/SD2.x/SDXL"), (16, 4, "SD3/Flux.1")))
