"""HunyuanVideo 1.0 VAE (16 latent channels, 8x spatial, 4x temporal: 1 + 4(t-1) frames).

The LDM skeleton (``ldm.py``) with causal 3-D convolutions: time padded with first-frame copies,
space padded by replication. GroupNorm (32 groups, eps 1e-6) takes its statistics over the whole
clip (C/G, T, H, W), and the mid blocks attend over all T*H*W tokens with a block-causal mask over
frames, so neither half is causal end to end: a clip cannot be streamed or time-tiled exactly.

Canonical layout: ComfyUI's (``encoder.down.0.block.1.conv2``, ``encoder.mid.attn_1.q`` as 1x1x1
conv, ``decoder.up.3`` = first up level applied, ``quant_conv``, ``post_quant_conv``) without the
``.conv.`` wrapper ComfyUI and diffusers put around each causal conv. diffusers' and Tencent's
layout (they are the same) is converted on load.

Conventions: ``encode`` gives the posterior mode as the raw latent and ``decode`` takes the raw
latent (ComfyUI's latent format applies the 0.476986 scale). The mid-block attention is
frame-causal as in Tencent's model and diffusers; ComfyUI's port attends over all frames without
the mask, so it differs from both for latents of more than one frame."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..files.keymap import count_indices, rename
from ..nn.attention import SpatialSelfAttention
from ..nn.causal import CausalConv3d
from ..nn.norm import GroupNorm
from ..run import Seam
from ..spec import ArchSpec, Capabilities
from . import ldm

# Not recoverable from the weights: the published config (and every port) uses these.
GROUPS, EPS = 32, 1e-6
TIME_STAGES = 2          # temporal x2 stages of the published model (ratio 4); strides are not stored

Stride = Optional[tuple[int, int, int]]     # (t, h, w) factor of a level's resampler; None: no resampler


@dataclass(frozen=True)
class HunyuanVideoConfig:
    widths: tuple[int, ...]           # block_out_channels, level 0 first
    layers_per_block: int
    latent_channels: int
    down: tuple[Stride, ...] = ()     # encoder levels
    up: tuple[Stride, ...] = ()       # decoder levels, LDM index (up[-1] runs first)
    in_channels: int = 3
    out_channels: int = 3
    mid_attention: bool = True
    has_encoder: bool = True
    has_decoder: bool = True

    @property
    def ratios(self) -> tuple[int, int]:
        """(spatial, temporal) compression."""
        strides = [s for s in (self.down if self.has_encoder else self.up) if s]
        return 2 ** len(strides), 2 ** sum(s[0] == 2 for s in strides)


def _conv(cin: int, cout: int, kernel: int = 3, stride=1) -> CausalConv3d:
    return CausalConv3d(cin, cout, kernel, stride, time_pad="causal", spatial_pad="replicate")


def _nearest(x: torch.Tensor, st: int, sh: int, sw: int) -> torch.Tensor:
    """Nearest-neighbour upsampling by whole factors as one broadcast copy (any dtype)."""
    b, c, t, h, w = x.shape
    x = x[:, :, :, None, :, None, :, None].expand(b, c, t, st, h, sh, w, sw)
    return x.reshape(b, c, t * st, h * sh, w * sw)


class Downsample(Seam, nn.Module):
    """Causal 3x3x3 conv with stride (t, 2, 2): T -> (T - 1) // t + 1 frames."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, channels: int, stride: tuple[int, int, int]):
        super().__init__()
        self.conv = _conv(channels, channels, 3, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample(Seam, nn.Module):
    """Nearest upsampling, then a causal 3x3x3 conv. The first frame stands for one pixel frame
    and is only upsampled in space; the others by (t, h, w): T -> 1 + t(T - 1) frames."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, channels: int, scale: tuple[int, int, int]):
        super().__init__()
        self.scale = scale
        self.conv = _conv(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        st, sh, sw = self.scale
        x = torch.cat([_nearest(x[:, :, :1], 1, sh, sw), _nearest(x[:, :, 1:], st, sh, sw)], dim=2)
        return self.conv(x)


def _ops(cfg: HunyuanVideoConfig) -> ldm.Ops:
    def attention(c: int) -> Optional[nn.Module]:
        return SpatialSelfAttention(c, GROUPS, EPS, dims=3, frame_causal=True) if cfg.mid_attention else None
    # GroupNorm on the 5-D activations: statistics over the whole clip, as the reference
    return ldm.Ops(conv=_conv, shortcut=lambda cin, cout: _conv(cin, cout, 1),
                   norm=lambda c: GroupNorm(GROUPS, c, eps=EPS), attention=attention)


class HunyuanVideoVAE(ldm.Autoencoder):
    """encode: (B, 3, 1+4k, H, W) in [-1, 1] -> raw latent mode (B, 16, 1+k, H/8, W/8);
    decode: raw latent (B, 16, t, h, w) -> (B, 3, 1+4(t-1), 8h, 8w) in [-1, 1] (not clamped)."""

    def __init__(self, cfg: HunyuanVideoConfig):
        w, n, lat = cfg.widths, cfg.layers_per_block, cfg.latent_channels
        ops = _ops(cfg)
        encoder = decoder = quant_conv = post_quant_conv = None
        if cfg.has_encoder:
            encoder = ldm.Encoder(w[0], w, n, cfg.in_channels, 2 * lat, ops,
                                  downsample=lambda i, c: Downsample(c, cfg.down[i]) if cfg.down[i] else None)
            quant_conv = nn.Conv3d(2 * lat, 2 * lat, 1)
        if cfg.has_decoder:
            decoder = ldm.Decoder(w, n, lat, cfg.out_channels, ops,
                                  upsample=lambda i, c: Upsample(c, cfg.up[i]) if cfg.up[i] else None)
            post_quant_conv = nn.Conv3d(lat, lat, 1)
        super().__init__(encoder, decoder, quant_conv, post_quant_conv)
        self.config = cfg


# ---- key layouts -------------------------------------------------------------------------------

# ComfyUI and diffusers wrap every causal conv: ``conv1.conv.weight``, ``downsample.conv.conv.weight``.
_UNWRAP = [(r"\.(conv_in|conv_out|conv1|conv2|nin_shortcut|conv)\.conv\.(weight|bias)$", r".\1.\2")]


def to_canonical(sd) -> dict:
    if ldm.is_diffusers(sd.keys()):
        sd = ldm.from_diffusers(sd, ndim=5)
    return rename(sd, _UNWRAP)


def conv_in(sd) -> Optional[torch.Tensor]:
    for side in ("decoder", "encoder"):
        for key in (f"{side}.conv_in.weight", f"{side}.conv_in.conv.weight"):
            if key in sd:
                return sd[key]
    return None


# every key of the family, canonical: the LDM parts and the quant convs (rejects look-alike encoders
# paired with other decoders, e.g. MiniMax-H3's transformer decoder)
_PARTS = re.compile(r"^((encoder|decoder)\.(conv_in|down|up|mid|norm_out|conv_out)|quant_conv|post_quant_conv)\.")
_RESNET_NORM = re.compile(r"^(encoder|decoder)\.(down|up)\.\d+\.block\.\d+\.norm1\.weight$")
_RESAMPLER = re.compile(r"^(encoder|decoder)\.(down|up)\.\d+\.(downsample|upsample)\.conv\.weight$")
_RESAMPLER_PART = re.compile(r"^(encoder|decoder)\.(down|up)\.\d+\.(downsample|upsample)\.(?!conv\.)")


def detect_video_ldm(sd, to_canonical, parts: re.Pattern, resnet_norm: re.Pattern, resampler_ok,
                     ranks: tuple[int, ...] = (5,)) -> bool:
    """The LDM skeleton's test (HunyuanVideo 1.0 and 1.5, HunyuanImage): a ``conv_in`` of one of the
    ``ranks`` (5: 3-D convs), in the canonical
    names every key under ``parts``, some resnet norm key matching ``resnet_norm``, a mid block (MiniMax
    H3's encoder is otherwise alike and has none), and resampler convs, every one of which
    ``resampler_ok`` accepts."""
    w = conv_in(sd)
    if w is None or w.dim() not in ranks:
        return False
    sd = to_canonical(sd)
    if not all(parts.match(k) for k in sd) or not any(resnet_norm.match(k) for k in sd):
        return False
    if not any(k.startswith(("encoder.mid.", "decoder.mid.")) for k in sd):
        return False
    resamplers = [v for k, v in sd.items() if _RESAMPLER.match(k)]
    if any(_RESAMPLER_PART.match(k) for k in sd):     # a resampler here is one conv (SeedVR2's add more)
        return False
    return bool(resamplers) and all(resampler_ok(v) for v in resamplers)


def detect(sd) -> bool:
    """5-D convs in the LDM parts only, GroupNorm resnets (``norm1.weight``; HunyuanVideo 1.5 has RMS
    ``gamma``), width-keeping 3^3 resamplers (HunyuanImage 3.0's DC-AE ones change width, CogVideoX's are 2-D,
    SeedVR2's spatial-only one is 1x3x3)."""
    return detect_video_ldm(sd, to_canonical, _PARTS, _RESNET_NORM,
                            lambda v: v.dim() == 5 and v.shape[0] == v.shape[1] and v.shape[2] == 3)


def _strides(present: list[bool], temporal: list[int]) -> tuple[Stride, ...]:
    return tuple(((2 if i in temporal else 1), 2, 2) if p else None for i, p in enumerate(present))


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> HunyuanVideoConfig:
    """Widths, depth, channels and which levels resample come from the keys. Every resampler
    halves H and W; which of them also halve time is not in the weights: as in the published model,
    the encoder's two deepest and the decoder's two last applied (ratio 4)."""
    keys = sd.keys()
    has_enc, has_dec = "encoder.conv_in.weight" in sd, "decoder.conv_in.weight" in sd
    down = up = ()
    if has_enc:
        levels = count_indices(keys, "encoder.down")
        widths = [sd[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] for i in range(levels)]
        layers = count_indices(keys, "encoder.down.0.block")
        latent = sd["encoder.conv_out.weight"].shape[0] // 2
        present = [f"encoder.down.{i}.downsample.conv.weight" in sd for i in range(levels)]
        down = _strides(present, [i for i, p in enumerate(present) if p][-TIME_STAGES:])
    else:
        levels = count_indices(keys, "decoder.up")
        widths = [sd[f"decoder.up.{i}.block.0.conv2.weight"].shape[0] for i in range(levels)]
        layers = count_indices(keys, "decoder.up.0.block") - 1
    if has_dec:
        latent = sd["decoder.conv_in.weight"].shape[1]
        present = [f"decoder.up.{i}.upsample.conv.weight" in sd for i in range(levels)]
        up = _strides(present, [i for i, p in enumerate(present) if p][:TIME_STAGES])
    side = "encoder" if has_enc else "decoder"
    return HunyuanVideoConfig(
        widths=tuple(widths), layers_per_block=layers, latent_channels=latent, down=down, up=up,
        in_channels=sd["encoder.conv_in.weight"].shape[1] if has_enc else 3,
        out_channels=sd["decoder.conv_out.weight"].shape[0] if has_dec else 3,
        mid_attention=f"{side}.mid.attn_1.q.weight" in sd, has_encoder=has_enc, has_decoder=has_dec)


def capabilities(cfg: HunyuanVideoConfig) -> Capabilities:
    spatial, temporal = cfg.ratios
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=spatial, temporal_ratio=temporal,
        image_channels=cfg.out_channels, has_attention=cfg.mid_attention, norm="groupnorm_clip",
        causal_encoder=False, causal_decoder=False, posterior=True, can_encode=cfg.has_encoder,
        can_decode=cfg.has_decoder,
        default_tile=256, default_overlap=64, default_tile_frames=16, default_overlap_frames=4,
        working_dtypes=(torch.bfloat16, torch.float16, torch.float32))


def describe(cfg: HunyuanVideoConfig) -> str:
    return f"HunyuanVideo VAE ({cfg.latent_channels} latent channels)"


SPEC = ArchSpec(id="hunyuan_video", name="HunyuanVideo VAE", detect=detect, to_canonical=to_canonical,
                config_from_state_dict=config_from_state_dict, build=HunyuanVideoVAE,
                capabilities=capabilities, describe=describe,
                priority=90, latent_hints=((16, 5, "HunyuanVideo"),))
