"""OpenAI's consistency decoder (DALL-E 3): SD's KL encoder with a diffusion UNet as decoder.

encode: the SD AutoencoderKL encoder + quant_conv (built by kl, on the shared LDM wiring), the
posterior mean, raw as ComfyUI's LATENT holds it. decode: a UNet conditioned on the latent
(scaled by 0.18215, normalised by the published per-channel means/stds, nearest-upsampled to the
image size and concatenated with the noisy image) and on a learned timestep embedding, run by the
2-step consistency sampler at timesteps 1008 and 512 (sigma_data 0.5, cosine schedule of 1024
steps): x0 = c_out(t) * unet(c_in(t) * x_t, t) + c_skip(t) * x_t, re-noised to the next timestep.

Noise comes from a CPU ``torch.Generator`` seeded with ``seed``, drawn in the order diffusers
draws it (the initial image, then the re-noise), so ``decode(z, seed=s)`` equals diffusers'
``decode(z, generator=torch.Generator().manual_seed(s))`` and repeats across devices.
``clip_denoised`` (default on, as OpenAI's sampler) clamps each x0 to [-1, 1]; diffusers does not
clamp, which changes the second step wherever the first x0 leaves that range.

Layouts and the canonical one: consistency_layout.py. Every size is read from the weights; the
GroupNorm (32 groups, eps 1e-5) and the sampler constants are not in them."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import LoadError
from ..nn.noise import region_randn
from ..files.keymap import count_indices
from ..nn.norm import GroupNorm
from ..nn.resnet import conv2d_1x1, conv2d_3x3
from ..spec import ArchSpec, Capabilities, KnownConfigs
from . import consistency_layout, kl, ldm
from .consistency_layout import ENCODER_PREFIXES, UNET

GROUPS, EPS = 32, 1e-5
IMAGE_CHANNELS = 3                 # the noisy image; the UNet's other output channels are unused
OPENAI_UPSCALE = 8                 # latent -> pixels when no encoder tells (OpenAI's decoder file)
SCALING = 0.18215
LATENT_MEANS = (0.38862467, 0.02253063, 0.07381133, -0.0171294)
LATENT_STDS = (0.9654121, 1.0440036, 0.76147926, 0.77022034)
TIMESTEPS = (1008, 512)
TRAIN_STEPS, SIGMA_DATA = 1024, 0.5


@dataclass(frozen=True)
class ConsistencyConfig:
    encoder: Optional[kl.KLConfig]     # None: a decoder-only file
    widths: tuple[int, ...]            # UNet level widths
    down_layers: int                   # resnets per down level (plus a down-sampler but the last)
    up_layers: int                     # resnets per up level
    mid_layers: int
    latent_channels: int
    out_channels: int                  # UNet output channels (the first IMAGE_CHANNELS are used)
    time_steps: int                    # rows of the learned timestep embedding
    time_dim: int

    @property
    def upscale(self) -> int:
        return 2 ** (len(self.encoder.ch_mult) - 1) if self.encoder else OPENAI_UPSCALE


# ---- the decoder UNet ------------------------------------------------------------------------

class TimeResnet(nn.Module):
    """GroupNorm-SiLU-conv, then GroupNorm scaled and shifted by the timestep embedding, SiLU-conv;
    ``resample`` ("down": 2x2 average pool, "up": nearest 2x) acts on both paths after the first
    norm. The shared ResnetBlock has no embedding input, hence this block."""

    def __init__(self, cin: int, cout: int, time_dim: int, resample: Optional[str] = None):
        super().__init__()
        self.norm1 = GroupNorm(GROUPS, cin, eps=EPS)
        self.conv1 = conv2d_3x3(cin, cout)
        self.time_emb_proj = nn.Linear(time_dim, 2 * cout)
        self.norm2 = GroupNorm(GROUPS, cout, eps=EPS)
        self.conv2 = conv2d_3x3(cout, cout)
        self.conv_shortcut = conv2d_1x1(cin, cout) if cin != cout else None
        self.resample = resample

    def _resample(self, x: torch.Tensor) -> torch.Tensor:
        if self.resample == "down":
            return F.avg_pool2d(x, 2)
        if self.resample == "up":
            return F.interpolate(x, scale_factor=2.0, mode="nearest")
        return x

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(self._resample(F.silu(self.norm1(x), inplace=True)))
        x = self._resample(x)
        scale, shift = self.time_emb_proj(temb)[:, :, None, None].chunk(2, dim=1)
        h = F.silu(self.norm2(h).mul_(1 + scale).add_(shift), inplace=True)     # conv1's output goes
        h = self.conv2(h)
        skip = x if self.conv_shortcut is None else self.conv_shortcut(x)
        return h.add_(skip)


def _level(resnets: list[nn.Module], resampler: Optional[nn.Module], name: str) -> nn.Module:
    level = nn.Module()
    level.resnets = nn.ModuleList(resnets)
    if resampler is not None:
        setattr(level, name, nn.ModuleList([resampler]))
    return level


class TimeEmbedding(nn.Module):
    def __init__(self, cin: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(cin, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class DecoderUNet(nn.Module):
    """Down levels keep every resnet's and down-sampler's output as a skip; up levels (coarse to
    fine) concatenate one skip before each resnet."""

    def __init__(self, cfg: ConsistencyConfig):
        super().__init__()
        w, td, last = cfg.widths, cfg.time_dim, len(cfg.widths) - 1
        self.conv_in = conv2d_3x3(IMAGE_CHANNELS + cfg.latent_channels, w[0])
        self.time_proj = nn.Embedding(cfg.time_steps, w[0])
        self.time_embedding = TimeEmbedding(w[0], td)
        self.down_blocks = nn.ModuleList()
        skips, cin = [w[0]], w[0]
        for i, c in enumerate(w):
            resnets = []
            for _ in range(cfg.down_layers):
                resnets.append(TimeResnet(cin, c, td))
                cin = c
                skips.append(c)
            down = TimeResnet(c, c, td, "down") if i != last else None
            skips += [c] if down is not None else []
            self.down_blocks.append(_level(resnets, down, "downsamplers"))
        self.mid_block = _level([TimeResnet(cin, cin, td) for _ in range(cfg.mid_layers)], None, "")
        self.up_blocks = nn.ModuleList()
        for i, c in enumerate(reversed(w)):
            resnets = []
            for _ in range(cfg.up_layers):
                resnets.append(TimeResnet(cin + skips.pop(), c, td))
                cin = c
            up = TimeResnet(c, c, td, "up") if i != last else None
            self.up_blocks.append(_level(resnets, up, "upsamplers"))
        self.conv_norm_out = GroupNorm(GROUPS, w[0], eps=EPS)
        self.conv_out = conv2d_3x3(w[0], cfg.out_channels)

    def forward(self, x: torch.Tensor, t: int) -> torch.Tensor:
        emb = self.time_embedding(self.time_proj.weight[t:t + 1])
        temb = F.silu(emb)            # every block projects SiLU(embedding)
        h = self.conv_in(x)
        skips = [h]
        for level in self.down_blocks:
            for block in list(level.resnets) + list(getattr(level, "downsamplers", ())):
                h = block(h, temb)
                skips.append(h)
        for block in self.mid_block.resnets:
            h = block(h, temb)
        for level in self.up_blocks:
            for block in level.resnets:
                h = block(torch.cat([h, skips.pop()], dim=1), temb)
            for block in getattr(level, "upsamplers", ()):
                h = block(h, temb)
        return self.conv_out(F.silu(self.conv_norm_out(h), inplace=True))


# ---- the sampler -----------------------------------------------------------------------------

@lru_cache(maxsize=None)
def coefficients(t: int) -> dict[str, float]:
    """Consistency-model scalings at train step ``t``, from the cosine schedule in fp32 as the
    reference samplers tabulate it (so products with fp32 images round as theirs do)."""
    alpha_bar = lambda s: math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2
    betas = torch.tensor([min(1 - alpha_bar((i + 1) / TRAIN_STEPS) / alpha_bar(i / TRAIN_STEPS), 0.999)
                          for i in range(TRAIN_STEPS)], dtype=torch.float32, device="cpu")
    ac = torch.cumprod(1.0 - betas, dim=0)[t]
    sigma2, d2 = 1.0 / ac - 1, SIGMA_DATA ** 2
    table = {"signal": torch.sqrt(ac), "noise": torch.sqrt(1.0 - ac),
             "c_in": torch.sqrt(1.0 / ac) / (sigma2 + d2) ** 0.5,
             "c_out": torch.sqrt(sigma2) * SIGMA_DATA / (sigma2 + d2) ** 0.5,
             "c_skip": torch.sqrt(1.0 / ac) * d2 / (sigma2 + d2)}
    return {k: float(v) for k, v in table.items()}


class ConsistencyDecoderVAE(ldm.Autoencoder):
    def __init__(self, cfg: ConsistencyConfig):
        encoder = quant_conv = None
        if cfg.encoder is not None:
            half = kl.AutoencoderKL(cfg.encoder)          # encoder-only KL config: no decoder built
            encoder, quant_conv = half.encoder, getattr(half, "quant_conv", None)
        super().__init__(encoder, None, quant_conv)
        self.decoder_unet = DecoderUNet(cfg)
        self.config = cfg
        self.clip_denoised = True

    def condition(self, z: torch.Tensor) -> torch.Tensor:
        """Raw latent -> the UNet's conditioning image (normalised, nearest-upsampled)."""
        mean = torch.tensor(LATENT_MEANS, device=z.device, dtype=z.dtype).reshape(1, -1, 1, 1)
        std = torch.tensor(LATENT_STDS, device=z.device, dtype=z.dtype).reshape(1, -1, 1, 1)
        return F.interpolate((z * SCALING - mean) / std, scale_factor=self.config.upscale, mode="nearest")

    def decode(self, z: torch.Tensor, seed: int = 0) -> torch.Tensor:
        cond = self.condition(z)
        gen = torch.Generator().manual_seed(int(seed) % 2 ** 64)
        shape = (z.shape[0], IMAGE_CHANNELS, *cond.shape[2:])
        x0 = torch.zeros(shape, device=z.device, dtype=z.dtype)
        for t in TIMESTEPS:
            c = coefficients(t)
            noise = region_randn(shape, gen, cond).to(z.device, z.dtype)   # exact tiles: their part
            x_t = x0.mul_(c["signal"]).add_(noise.mul_(c["noise"]))
            out = self.decoder_unet(torch.cat([x_t * c["c_in"], cond], dim=1), t)[:, :IMAGE_CHANNELS]
            x0 = out.mul_(c["c_out"]).add_(x_t.mul_(c["c_skip"]))
            if self.clip_denoised:
                x0 = x0.clamp_(-1.0, 1.0)
        return x0


# ---- configuration from the weights ----------------------------------------------------------

def config_from_state_dict(sd, name_hint: Optional[str] = None) -> ConsistencyConfig:
    keys = sd.keys()
    enc = {k: v for k, v in sd.items() if k.startswith(ENCODER_PREFIXES)}
    u = lambda name: sd[UNET + name]
    n = count_indices(keys, UNET + "down_blocks")
    if not n or UNET + "conv_in.weight" not in sd:
        raise LoadError("the consistency decoder's UNet is missing or incomplete in this file.",
                        fix="load the whole ConsistencyDecoderVAE (or OpenAI's decoder) state dict.")
    if UNET + "time_proj.weight" not in sd:
        raise LoadError(f"the decoder's timestep table ('{UNET}time_proj.weight'; OpenAI: `embed_time.emb.weight`, "
                        "which OpenAI's decoder.pt keeps outside its state dict) is missing.",
                        fix="add that tensor to the file, or load diffusers' ConsistencyDecoderVAE weights.")
    steps = u("time_proj.weight").shape[0]
    cfg = ConsistencyConfig(
        encoder=kl.config_from_state_dict(enc) if "encoder.conv_in.weight" in enc else None,
        widths=tuple(u(f"down_blocks.{i}.resnets.0.conv1.weight").shape[0] for i in range(n)),
        down_layers=count_indices(keys, UNET + "down_blocks.0.resnets"),
        up_layers=count_indices(keys, UNET + "up_blocks.0.resnets"),
        mid_layers=count_indices(keys, UNET + "mid_block.resnets"),
        latent_channels=u("conv_in.weight").shape[1] - IMAGE_CHANNELS,
        out_channels=u("conv_out.weight").shape[0], time_steps=steps,
        time_dim=u("time_embedding.linear_1.weight").shape[0])
    if cfg.up_layers != cfg.down_layers + 1:
        raise LoadError(f"the consistency decoder's UNet has {cfg.down_layers} resnets per down level and "
                        f"{cfg.up_layers} per up level; its skips need one more up than down.",
                        fix="the file may be damaged; please report it with the key list.")
    if cfg.latent_channels != len(LATENT_MEANS) or cfg.time_steps <= max(TIMESTEPS):
        raise LoadError(f"this consistency decoder takes {cfg.latent_channels} latent channels and "
                        f"{cfg.time_steps} timesteps; the sampler's constants are published for 4 and 1024.",
                        fix="this variant is not supported; please report it with the key list.")
    return cfg


def capabilities(cfg: ConsistencyConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=cfg.upscale, image_channels=IMAGE_CHANNELS,
        has_attention=bool(cfg.encoder and cfg.encoder.mid_attention), norm="groupnorm",
        posterior=True, can_encode=cfg.encoder is not None, decode_options=("seed",))


def describe(cfg: ConsistencyConfig) -> str:
    part = "" if cfg.encoder else ", decoder only"
    return f"Consistency Decoder (OpenAI, DALL-E 3; SD1.x/SD2.x latents{part})"


# OpenAI's one published decoder (diffusers' ConsistencyDecoderVAE, OpenAI's decoder.pt): its mid block has two
# resnets, its levels 3 down and 4 up, all counted from the keys (a file without the last one loads otherwise)
KNOWN = KnownConfigs(
    parts={"OpenAI's decoder": dict(widths=(320, 640, 1024, 1024), down_layers=3, up_layers=4, mid_layers=2,
                                    latent_channels=4, out_channels=6, time_steps=1024, time_dim=1280)},
    blocks={"mid_layers": ("mid-block resnet(s)", UNET + "mid_block.resnets.{i}"),
            "down_layers": ("resnet(s) per down level", UNET + "down_blocks.0.resnets.{i}"),
            "up_layers": ("resnet(s) per up level", UNET + "up_blocks.0.resnets.{i}")})

# before KL: its encoder is SD's KL encoder (`decoder_unet.` / OpenAI names tell it apart)
SPEC = ArchSpec(id="consistency", name="Consistency Decoder", detect=consistency_layout.detect,
                to_canonical=consistency_layout.to_canonical, config_from_state_dict=config_from_state_dict,
                build=ConsistencyDecoderVAE, capabilities=capabilities, describe=describe,
                priority=10, latent_hints=(), known_configs=KNOWN)
