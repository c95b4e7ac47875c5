"""AutoencoderKL: SD 1.x/2.x and SDXL (4 latent channels, quant convs), SD3 and Flux.1 (16 channels,
no quant convs).

Canonical layout: the original LDM / ComfyUI names (``encoder.down.0.block.1.conv1``,
``mid.attn_1.q`` as 1x1 conv, ``decoder.up.3`` = first up level applied). diffusers' layout is
converted on load. Hyperparameters are read from tensor shapes."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..keymap import count_indices, linear_to_conv1x1, rename
from ..nn.attention import SpatialSelfAttention
from ..nn.norm import GroupNorm
from ..nn.resnet import MidBlock, ResnetBlock
from ..nn.sampling import Downsample2x, Upsample2x
from ..spec import ArchSpec, Capabilities

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


def _level(blocks: list[nn.Module], resample: Optional[nn.Module], resample_name: str) -> nn.Module:
    level = nn.Module()
    level.block = nn.ModuleList(blocks)
    if resample is not None:
        setattr(level, resample_name, resample)
    return level


def _attention(cfg: KLConfig, channels: int) -> Optional[nn.Module]:
    return SpatialSelfAttention(channels, GROUPS, EPS) if cfg.mid_attention else None


class Encoder(nn.Module):
    def __init__(self, cfg: KLConfig):
        super().__init__()
        widths = [cfg.ch * m for m in cfg.ch_mult]
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, 3, padding=1)
        self.down = nn.ModuleList()
        cin = cfg.ch
        for i, w in enumerate(widths):
            blocks = []
            for _ in range(cfg.num_res_blocks):
                blocks.append(ResnetBlock(cin, w, GROUPS, EPS))
                cin = w
            last = i == len(widths) - 1
            self.down.append(_level(blocks, None if last else Downsample2x(w), "downsample"))
        self.mid = MidBlock(cin, _attention(cfg, cin), GROUPS, EPS)
        self.norm_out = GroupNorm(GROUPS, cin, eps=EPS)
        self.conv_out = nn.Conv2d(cin, 2 * cfg.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            for block in level.block:
                h = block(h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        h = self.mid(h)
        return self.conv_out(F.silu(self.norm_out(h), inplace=True))


class Decoder(nn.Module):
    def __init__(self, cfg: KLConfig):
        super().__init__()
        widths = [cfg.ch * m for m in cfg.ch_mult]
        cin = widths[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, cin, 3, padding=1)
        self.mid = MidBlock(cin, _attention(cfg, cin), GROUPS, EPS)
        levels = []
        for i in reversed(range(len(widths))):   # built coarse to fine, stored by level index
            blocks = []
            for _ in range(cfg.num_res_blocks + 1):
                blocks.append(ResnetBlock(cin, widths[i], GROUPS, EPS))
                cin = widths[i]
            levels.insert(0, _level(blocks, Upsample2x(cin) if i != 0 else None, "upsample"))
        self.up = nn.ModuleList(levels)
        self.norm_out = GroupNorm(GROUPS, cin, eps=EPS)
        self.conv_out = nn.Conv2d(cin, cfg.out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            for block in level.block:
                h = block(h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h), inplace=True))


class AutoencoderKL(nn.Module):
    """encode: pixels in [-1, 1] -> the posterior mode (raw latent, as ComfyUI's LATENT holds it);
    decode: raw latent -> pixels in [-1, 1]. Latent scaling is the sampler's business, not ours."""

    def __init__(self, cfg: KLConfig):
        super().__init__()
        self.config = cfg
        quant = cfg.embed_dim is not None
        if cfg.has_encoder:
            self.encoder = Encoder(cfg)
            if quant:
                self.quant_conv = nn.Conv2d(2 * cfg.z_channels, 2 * cfg.embed_dim, 1)
        if cfg.has_decoder:
            self.decoder = Decoder(cfg)
            if quant:
                self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if hasattr(self, "quant_conv"):
            h = self.quant_conv(h)
        return h[:, : h.shape[1] // 2]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "post_quant_conv"):
            z = self.post_quant_conv(z)
        return self.decoder(z)


# ---- key layouts -------------------------------------------------------------------------------

def _is_diffusers(keys) -> bool:
    return any(".down_blocks." in k or ".up_blocks." in k or ".mid_block." in k for k in keys)


def _from_diffusers(sd) -> dict:
    n_up = count_indices(sd.keys(), "decoder.up_blocks")
    flip = lambda m: str(n_up - 1 - int(m.group(1)))  # diffusers counts up blocks coarse-to-fine
    rules = [
        (r"\.conv_norm_out\.", ".norm_out."),
        (r"^encoder\.down_blocks\.(\d+)\.resnets\.", r"encoder.down.\1.block."),
        (r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample."),
        (r"^decoder\.up_blocks\.(\d+)\.resnets\.", lambda m: f"decoder.up.{flip(m)}.block."),
        (r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.", lambda m: f"decoder.up.{flip(m)}.upsample."),
        (r"\.mid_block\.resnets\.0\.", ".mid.block_1."),
        (r"\.mid_block\.resnets\.1\.", ".mid.block_2."),
        (r"\.mid_block\.attentions\.0\.group_norm\.", ".mid.attn_1.norm."),
        # current (to_q ...) and legacy (query ...) attention names
        (r"\.mid_block\.attentions\.0\.(?:to_q|query)\.", ".mid.attn_1.q."),
        (r"\.mid_block\.attentions\.0\.(?:to_k|key)\.", ".mid.attn_1.k."),
        (r"\.mid_block\.attentions\.0\.(?:to_v|value)\.", ".mid.attn_1.v."),
        (r"\.mid_block\.attentions\.0\.(?:to_out\.0|proj_attn)\.", ".mid.attn_1.proj_out."),
        (r"\.conv_shortcut\.", ".nin_shortcut."),
    ]
    return linear_to_conv1x1(rename(sd, rules), r"\.mid\.attn_1\.(q|k|v|proj_out)\.weight$")


def to_canonical(sd) -> dict:
    sd = dict(sd)
    if _is_diffusers(sd.keys()):
        sd = _from_diffusers(sd)
    # LDM checkpoints may carry loss/discriminator weights; they are not part of the VAE.
    return {k: v for k, v in sd.items() if not k.startswith("loss.")}


def detect(sd) -> bool:
    for side in ("decoder", "encoder"):
        w = sd.get(f"{side}.conv_in.weight")
        if w is not None and w.dim() == 4 and any(
                re.match(rf"{side}\.(down|up|down_blocks|up_blocks)\.\d+\.", k) for k in sd):
            return True
    return False


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> KLConfig:
    keys = sd.keys()
    has_enc, has_dec = "encoder.conv_in.weight" in sd, "decoder.conv_in.weight" in sd
    side = "encoder" if has_enc else "decoder"
    levels = count_indices(keys, f"{side}.down" if has_enc else "decoder.up")
    if has_enc:
        ch = sd["encoder.conv_in.weight"].shape[0]
        widths = [sd[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] for i in range(levels)]
        n_res = count_indices(keys, "encoder.down.0.block")
        z = sd["encoder.conv_out.weight"].shape[0] // 2
    else:
        widths = [sd[f"decoder.up.{i}.block.0.conv2.weight"].shape[0] for i in range(levels)]
        ch = widths[0]
        n_res = count_indices(keys, "decoder.up.0.block") - 1
    if has_dec:
        z = sd["decoder.conv_in.weight"].shape[1]
    embed = None
    if "post_quant_conv.weight" in sd:
        embed = sd["post_quant_conv.weight"].shape[1]
    elif "quant_conv.weight" in sd:
        embed = sd["quant_conv.weight"].shape[0] // 2
    return KLConfig(
        ch=ch, ch_mult=tuple(w // ch for w in widths), num_res_blocks=n_res, z_channels=z,
        embed_dim=embed,
        in_channels=sd["encoder.conv_in.weight"].shape[1] if has_enc else 3,
        out_channels=sd["decoder.conv_out.weight"].shape[0] if has_dec else 3,
        mid_attention=f"{side}.mid.attn_1.q.weight" in sd,
        has_encoder=has_enc, has_decoder=has_dec)


def capabilities(cfg: KLConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.embed_dim or cfg.z_channels,
        spatial_ratio=2 ** (len(cfg.ch_mult) - 1),
        image_channels=cfg.out_channels,
        has_attention=cfg.mid_attention, norm="groupnorm",
        can_encode=cfg.has_encoder, can_decode=cfg.has_decoder)


def describe(cfg: KLConfig) -> str:
    lat = cfg.embed_dim or cfg.z_channels
    family = {4: "SD1.x/SD2.x/SDXL", 16: "SD3/Flux.1"}.get(lat, f"{lat}-channel")
    return f"AutoencoderKL ({family}, {lat} latent channels)"


SPEC = ArchSpec(id="kl", name="AutoencoderKL", detect=detect, to_canonical=to_canonical,
                config_from_state_dict=config_from_state_dict, build=AutoencoderKL,
                capabilities=capabilities, describe=describe)
