"""EasyAnimate's Magvit video VAE (diffusers ``AutoencoderKLMagvit``): EasyAnimate V5 and V5.1,
16 latent channels, 8x spatial and 4x temporal compression, 1 + 4(t-1) frames.

Definition. The reference runs the clip in chunks with causal caches: encode = frame 0 alone, then
groups of 4 frames; decode = latent frame 0 alone, then one latent frame at a time. Every norm is
per frame and every conv causal, so one pass over the whole clip gives the same numbers, provided
each temporal up-sampler keeps the rule the chunking implies: the first frame once, every later
frame twice (the first chunk is never doubled in time).

Layouts. EasyAnimate's own repo and diffusers ship the same keys (both load
``alibaba-pai/EasyAnimateV5.1-12b-zh/vae``). V5 additionally has one single-head attention per mid
block (``mid_block.attentions.0.{group_norm,to_q,to_k,to_v,to_out}``, Linear weights), which
diffusers' class lacks and drops on load; here it is kept. Canonical layout: diffusers' names, with
the shared blocks' names where those fix them (``nin_shortcut``; attention ``norm q k v proj_out``
as 1x1 convs).

Not readable from the weights, so fixed to the published values: 32 groups, eps 1e-6,
``spatial_group_norm=True`` (per-frame GroupNorm everywhere), one attention head, block types
(level 0 spatial-only, levels 1..n-2 spatial+temporal), EasyAnimate's chunk sizes (so V5's
mid-block attention sees one latent frame at a time: its "3d" and "spatial" types coincide)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError, LoadError
from ..files.keymap import count_indices, linear_to_conv1x1, rename
from ..nn.attention import FrameSelfAttention
from ..nn.causal import CausalConv3d
from ..nn.norm import FrameGroupNorm
from ..nn.resnet import ResnetBlock
from ..run import Seam, Streamable, streaming
from ..spec import ArchSpec, Capabilities
from . import ldm

GROUPS, EPS = 32, 1e-6
LATENT_CHANNELS = 16          # V5/V5.1; EasyAnimate V2-V4 (4 channels) ran other chunk rules


@dataclass(frozen=True)
class MagvitConfig:
    widths: tuple[int, ...]           # block_out_channels, fine to coarse
    layers_per_block: int
    latent_channels: int = LATENT_CHANNELS
    in_channels: int = 3
    out_channels: int = 3
    mid_attention: bool = False       # V5: True, V5.1: False
    has_encoder: bool = True
    has_decoder: bool = True


def _temporal(level: int, n: int) -> bool:
    """Levels 1..n-2 resample time too (down_block_types / up_block_types as published)."""
    return 1 <= level <= n - 2


def _norm(c: int) -> nn.Module:
    return FrameGroupNorm(GROUPS, c, eps=EPS)


def _conv(cin: int, cout: int) -> nn.Module:
    return CausalConv3d(cin, cout, 3)


def _resnet(cin: int, cout: int) -> nn.Module:
    return ResnetBlock(cin, cout, GROUPS, EPS, conv=_conv, shortcut=lambda i, o: nn.Conv3d(i, o, 1), norm=_norm)


class Downsampler(Seam, nn.Module):
    """Zero pad right/bottom, then a causal 3^3 conv of stride 2 in space (and time)."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        self.conv = CausalConv3d(channels, channels, 3, stride=(2 if temporal else 1, 2, 2), spatial_padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsampler(Seam, Streamable, nn.Module):
    """Nearest 2x in space, causal 3^3 conv, then (temporal levels) every frame but the clip's first
    repeated twice in time: the reference decodes the first latent frame alone and never doubles it."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        self.temporal = temporal
        self.conv = CausalConv3d(channels, channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(F.interpolate(x, scale_factor=(1, 2, 2), mode="nearest"))
        if not self.temporal or h.shape[2] == 0:
            return h
        keep = 1 if self.first_chunk() else 0       # in a stream, only the first chunk keeps one
        return torch.cat([h[:, :, :keep], h[:, :, keep:].repeat_interleave(2, dim=2)], dim=2)


class MidBlock(nn.Module):
    """``layers`` resnets; V5 puts a per-frame attention before each resnet after the first."""

    def __init__(self, channels: int, layers: int, attention: bool):
        super().__init__()
        self.convs = nn.ModuleList(_resnet(channels, channels) for _ in range(layers))
        if attention:
            # V5: over the H*W tokens of each frame, statistics per frame
            self.attentions = nn.ModuleList(FrameSelfAttention(channels, GROUPS, EPS) for _ in range(layers - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.convs[0](x)
        for i, conv in enumerate(self.convs[1:]):
            if hasattr(self, "attentions"):
                x = self.attentions[i](x)
            x = conv(x)
        return x


def _level(convs: list[nn.Module], name: str, resampler: Optional[nn.Module]) -> nn.Module:
    level = nn.Module()
    level.convs = nn.ModuleList(convs)
    if resampler is not None:
        setattr(level, name, resampler)
    return level


def _run_level(level: nn.Module, x: torch.Tensor, name: str) -> torch.Tensor:
    for conv in level.convs:
        x = conv(x)
    resampler = getattr(level, name, None)
    return x if resampler is None else resampler(x)


def _out(norm: nn.Module, conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return conv(F.silu(norm(x), inplace=True))


class Encoder(nn.Module):
    def __init__(self, cfg: MagvitConfig):
        super().__init__()
        w, n, layers = cfg.widths, len(cfg.widths), cfg.layers_per_block
        self.conv_in = CausalConv3d(cfg.in_channels, w[0], 3)
        self.down_blocks = nn.ModuleList()
        cin = w[0]
        for i, c in enumerate(w):
            convs = [_resnet(cin if j == 0 else c, c) for j in range(layers)]
            down = Downsampler(c, _temporal(i, n)) if i < n - 1 else None
            self.down_blocks.append(_level(convs, "downsampler", down))
            cin = c
        self.mid_block = MidBlock(w[-1], layers, cfg.mid_attention)
        self.conv_norm_out = _norm(w[-1])
        self.conv_out = CausalConv3d(w[-1], 2 * cfg.latent_channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down_blocks:
            h = _run_level(level, h, "downsampler")
        return _out(self.conv_norm_out, self.conv_out, self.mid_block(h))


class Decoder(nn.Module):
    def __init__(self, cfg: MagvitConfig):
        super().__init__()
        rev, n, layers = cfg.widths[::-1], len(cfg.widths), cfg.layers_per_block
        self.conv_in = CausalConv3d(cfg.latent_channels, rev[0], 3)
        self.mid_block = MidBlock(rev[0], layers, cfg.mid_attention)
        self.up_blocks = nn.ModuleList()
        cin = rev[0]
        for i, c in enumerate(rev):
            convs = [_resnet(cin if j == 0 else c, c) for j in range(layers + 1)]
            up = Upsampler(c, _temporal(i, n)) if i < n - 1 else None
            self.up_blocks.append(_level(convs, "upsampler", up))
            cin = c
        self.conv_norm_out = _norm(rev[-1])
        self.conv_out = CausalConv3d(rev[-1], cfg.out_channels, 3)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid_block(self.conv_in(z))
        for level in self.up_blocks:
            h = _run_level(level, h, "upsampler")
        return _out(self.conv_norm_out, self.conv_out, h)


class AutoencoderKLMagvit(ldm.Autoencoder):
    """encode: clip in [-1, 1] with 1 + 4k frames -> posterior mode (raw latent; the pipeline's
    0.7125 scaling is the sampler's business); decode: raw latent -> 1 + 4(t-1) frames."""

    def __init__(self, cfg: MagvitConfig):
        c, enc, dec = cfg.latent_channels, cfg.has_encoder, cfg.has_decoder
        super().__init__(Encoder(cfg) if enc else None, Decoder(cfg) if dec else None,
                         nn.Conv3d(2 * c, 2 * c, 1) if enc else None, nn.Conv3d(c, c, 1) if dec else None)
        self.config = cfg
        self.temporal_ratio = 2 ** (len(cfg.widths) - 2)

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        t, r = x.shape[2], self.temporal_ratio
        if (t - 1) % r and not streaming():   # a stream's later chunks are r*k frames
            raise InputError(f"Magvit encodes 1 + {r}*k frames, got {t}.", input="pixels")
        return super().encode(x, posterior)


# ---- key layouts -------------------------------------------------------------------------------

_ATTN = r"(\.mid_block\.attentions\.\d+\.)"
_RULES = [
    (r"\.shortcut\.", ".nin_shortcut."),
    (_ATTN + r"group_norm\.", r"\1norm."),
    (_ATTN + r"to_(q|k|v)\.", r"\1\2."),
    (_ATTN + r"to_out\.(?:0\.)?", r"\1proj_out."),
]
_DETECT = re.compile(r"^(encoder|decoder)\.(down_blocks\.\d+\.|up_blocks\.\d+\.|mid_block\.)convs\.\d+\.conv1\.weight$")


def detect(sd) -> bool:
    """diffusers/EasyAnimate resnets sit in ``convs`` lists (other video VAEs name them ``resnets``)."""
    return any(_DETECT.match(k) and sd[k].dim() == 5 for k in sd)


def to_canonical(sd) -> dict:
    # training checkpoints may carry loss/discriminator weights; they are not part of the VAE
    sd = rename({k: v for k, v in sd.items() if not k.startswith("loss.")}, _RULES)
    return linear_to_conv1x1(sd, _ATTN + r"(q|k|v|proj_out)\.weight$")


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> MagvitConfig:
    keys = sd.keys()
    has_enc, has_dec = "encoder.conv_in.weight" in sd, "decoder.conv_in.weight" in sd
    if has_enc:
        n = count_indices(keys, "encoder.down_blocks")
        widths = tuple(sd[f"encoder.down_blocks.{i}.convs.0.conv1.weight"].shape[0] for i in range(n))
        layers = count_indices(keys, "encoder.down_blocks.0.convs")
        latent = sd["encoder.conv_out.weight"].shape[0] // 2
    else:
        n = count_indices(keys, "decoder.up_blocks")
        widths = tuple(sd[f"decoder.up_blocks.{i}.convs.0.conv2.weight"].shape[0] for i in reversed(range(n)))
        layers = count_indices(keys, "decoder.up_blocks.0.convs") - 1
    if has_dec:
        latent = sd["decoder.conv_in.weight"].shape[1]
    if latent != LATENT_CHANNELS or n < 2:
        raise LoadError(f"this EasyAnimate/Magvit VAE has {latent} latent channels and {n} levels; only the "
                        f"{LATENT_CHANNELS}-channel V5/V5.1 VAEs are supported (V2-V4 VAEs chunk time differently).",
                        fix="use the VAE of EasyAnimate V5 or V5.1.")
    return MagvitConfig(
        widths=widths, layers_per_block=layers, latent_channels=latent,
        in_channels=sd["encoder.conv_in.weight"].shape[1] if has_enc else 3,
        out_channels=sd["decoder.conv_out.weight"].shape[0] if has_dec else 3,
        mid_attention=any(".mid_block.attentions." in k for k in keys),
        has_encoder=has_enc, has_decoder=has_dec)


def capabilities(cfg: MagvitConfig) -> Capabilities:
    n = len(cfg.widths)
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=2 ** (n - 1), temporal_ratio=2 ** (n - 2),
        image_channels=cfg.out_channels, has_attention=cfg.mid_attention, norm="groupnorm_frame",
        causal_encoder=True, causal_decoder=True, stream_encode=True, stream_decode=True,
        posterior=True, can_encode=cfg.has_encoder, can_decode=cfg.has_decoder,
        default_tile=512, default_overlap=64, default_tile_frames=64, default_overlap_frames=8,
        working_dtypes=(torch.bfloat16, torch.float32))


def describe(cfg: MagvitConfig) -> str:
    version = "V5, mid-block attention" if cfg.mid_attention else "V5.1"
    return f"EasyAnimate Magvit VAE ({version}, {cfg.latent_channels} latent channels)"


SPEC = ArchSpec(id="magvit", name="EasyAnimate Magvit VAE", detect=detect, to_canonical=to_canonical,
                config_from_state_dict=config_from_state_dict, build=AutoencoderKLMagvit,
                capabilities=capabilities, describe=describe,
                priority=80, latent_hints=((16, 5, "EasyAnimate"),))
