"""The TAESD family (taesd, taesdxl, taesd3, taef1, taef2, taeqi2_1): ReLU conv stacks, no attention;
taef2 adds a GroupNorm "pool" branch to the blocks at the lowest resolution; taeqi2_1 (Qwen-Image
2.1's, madebyollin/taesd ``F16Encoder``/``F16Decoder``) is 16x and RGBA: a 2x2 space-to-depth in front
of the encoder, a depth-to-space after the decoder's head, wider low-resolution stages.
Key layouts and what the weights tell: tiny_layout.py.

Latents follow ComfyUI's convention: a raw LATENT is scaled by ``(z - shift) * scale`` before the
decoder (per channel for taeqi2_1: the network works in Qwen-Image 2.1's normalised latent, the
LATENT is the raw one that Qwen-Image 2.1's own VAE encodes and decodes), and taef2 latents travel
packed 2x2 into 128 channels like Flux.2's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

import torch
from torch import nn

from ..nn.norm import GroupNorm
from ..run import boundary
from ..spec import ArchSpec, Capabilities
from . import tiny_layout as layout
from .tiny_layout import DEC, ENC  # noqa: F401  (the loader names the halves of a pair with these)

Number = Union[float, tuple[float, ...]]      # one value, or one per latent channel

# Qwen-Image 2.1's per-channel latent statistics (ComfyUI ``latent_formats.QwenImage21``, v0.38.0):
# its diffusion model, and taeqi2_1, work in (z - mean) / std.
QWEN21_MEAN = (
    0.5126, 0.7721, -0.0631, 1.3506, -0.7855, -2.1025, -0.3458, 1.3722, 1.8873, -1.7177, -0.6510, 0.2732,
    0.7562, -0.6163, -1.0277, 3.8363, 2.0210, 0.0472, 0.9320, 2.0087, 2.4954, -0.1391, -1.4249, 1.8464,
    -0.5236, 1.2826, 3.7046, -1.3035, 2.7286, -1.4518, -1.9036, -1.9955, -0.0342, -1.0265, -0.7636, 3.0555,
    0.0746, -3.0751, -0.1076, 1.7376, -1.0914, -1.9435, -0.2784, -1.3680, 0.4809, -0.4433, 0.3764, 0.5729,
    -2.0595, 1.0960, -1.3260, -2.0211, -5.0179, 0.5275, 4.0162, 1.8505, 0.3026, 1.9373, 1.4937, 0.2632,
    0.5547, -1.7121, -0.1562, 0.0304)
QWEN21_STD = (
    3.2001, 3.2936, 3.4321, 3.0091, 3.1061, 4.0379, 4.0705, 3.7910, 3.0785, 3.6500, 3.9308, 3.0904,
    2.8778, 3.7675, 3.7320, 5.0756, 3.2864, 4.0397, 3.1317, 4.0443, 2.9249, 3.9454, 3.0988, 4.2489,
    3.4896, 3.8513, 3.9323, 3.4719, 3.7498, 4.2830, 3.5694, 4.2467, 3.9037, 3.2947, 5.0770, 3.5075,
    3.2700, 3.4767, 2.8063, 5.1125, 3.5327, 4.7833, 3.1286, 4.1819, 3.8527, 3.8312, 3.5605, 4.3875,
    3.9624, 4.0168, 3.5643, 4.0550, 5.5614, 4.2963, 4.4080, 3.4959, 3.8747, 3.7608, 3.5735, 3.1490,
    3.7662, 3.6746, 3.4563, 3.8161)


class LatentSpace(NamedTuple):
    scale: Number
    shift: Number
    pack: int
    variant: str       # the network it belongs to: "plain", "flux_2" (pool blocks), "f16" (patchified, 16x)


# Per published latent space, as ComfyUI applies them. Which one a 4- or 16-channel file belongs to
# is not in its weights: the file name tells (as in ComfyUI).
LATENT_SPACES = {
    "taesd": LatentSpace(0.18215, 0.0, 1, "plain"),
    "taesdxl": LatentSpace(0.13025, 0.0, 1, "plain"),
    "taesd3": LatentSpace(1.5305, 0.0609, 1, "plain"),
    "taef1": LatentSpace(0.3611, 0.1159, 1, "plain"),
    "taef2": LatentSpace(1.0, 0.0, 2, "flux_2"),
    "taeqi2_1": LatentSpace(tuple(1 / s for s in QWEN21_STD), QWEN21_MEAN, 1, "f16"),
}
DEFAULT_SPACE = {4: "taesd", 16: "taef1", 32: "taef2", 64: "taeqi2_1"}


@dataclass(frozen=True)
class TinyConfig:
    latent_channels: int
    encoder_stages: Optional[tuple[tuple[int, int], ...]]   # (width, blocks) per resolution
    decoder_stages: Optional[tuple[tuple[int, int], ...]]
    midblock_gn: bool = False
    image_channels: int = 3
    scale: Number = 1.0
    shift: Number = 0.0
    pack: int = 1
    latent_space: str = ""
    patch: int = 1           # f16: pixels enter and leave through a patch x patch space-to-depth


def conv3(cin: int, cout: int, **kw) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, padding=1, **kw)


class Clamp(nn.Module):
    """Soft clamp of the decoder input to (-3, 3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class TinyBlock(nn.Module):
    def __init__(self, cin: int, cout: int, pool: bool = False):
        super().__init__()
        self.conv = nn.Sequential(conv3(cin, cout), nn.ReLU(inplace=True), conv3(cout, cout),
                                  nn.ReLU(inplace=True), conv3(cout, cout))
        self.skip = nn.Conv2d(cin, cout, 1, bias=False) if cin != cout else nn.Identity()
        self.fuse = nn.ReLU(inplace=True)
        # taef2: a global-statistics branch (GroupNorm over H*W), the reason tiles of this model
        # need the norm seam in exact mode.
        self.pool = nn.Sequential(nn.Conv2d(cin, 4 * cin, 1, bias=False), GroupNorm(4, 4 * cin),
                                  nn.ReLU(inplace=True), nn.Conv2d(4 * cin, cin, 1, bias=False)) if pool else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pool is not None:
            x = x + self.pool(x)
        return self.fuse(self.conv(x) + self.skip(x))


def _stem(cfg: TinyConfig, width: int) -> list[nn.Module]:
    """The encoder's first layers: a conv from the pixels, or (f16) space-to-depth, conv, ReLU."""
    p = cfg.patch
    if p == 1:
        return [conv3(cfg.image_channels, width)]
    return [boundary(nn.PixelUnshuffle(p)), conv3(cfg.image_channels * p * p, width), nn.ReLU(inplace=True)]


def build_encoder(cfg: TinyConfig) -> nn.Sequential:
    stages = cfg.encoder_stages
    layers: list[nn.Module] = []
    prev = None
    for i, (width, blocks) in enumerate(stages):
        # later stages start with a bias-free stride-2 conv
        layers += _stem(cfg, width) if i == 0 else [boundary(conv3(prev, width, stride=2, bias=False))]
        pool = cfg.midblock_gn and i == len(stages) - 1
        layers += [TinyBlock(width, width, pool) for _ in range(blocks)]
        prev = width
    layers.append(conv3(prev, cfg.latent_channels))
    return nn.Sequential(*layers)


def build_decoder(cfg: TinyConfig) -> nn.Sequential:
    stages, p = cfg.decoder_stages, cfg.patch
    layers: list[nn.Module] = [Clamp(), conv3(cfg.latent_channels, stages[0][0]), nn.ReLU(inplace=True)]
    for i, (width, blocks) in enumerate(stages):
        layers += [TinyBlock(width, width, cfg.midblock_gn and i == 0) for _ in range(blocks)]
        if i < len(stages) - 1:
            layers += [boundary(nn.Upsample(scale_factor=2)), conv3(width, stages[i + 1][0], bias=False)]
        else:
            layers.append(conv3(width, cfg.image_channels * p * p))
    if p > 1:
        layers.append(boundary(nn.PixelShuffle(p)))
    return nn.Sequential(*layers)


class TinyAutoencoder(nn.Module):
    """encode: pixels in [0, 1] -> raw latent; decode: raw latent -> pixels in [0, 1]."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.config = cfg
        if cfg.encoder_stages:
            self.taesd_encoder = build_encoder(cfg)
        if cfg.decoder_stages:
            self.taesd_decoder = build_decoder(cfg)
        # scalars, or one value per latent channel (taeqi2_1)
        self.register_buffer("vae_scale", torch.tensor(cfg.scale, dtype=torch.float32))
        self.register_buffer("vae_shift", torch.tensor(cfg.shift, dtype=torch.float32))

    def _affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        as_map = lambda t: t.view(-1, 1, 1) if t.dim() == 1 else t
        return as_map(self.vae_scale), as_map(self.vae_shift)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        scale, shift = self._affine()
        return self.taesd_encoder(x) / scale + shift

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        scale, shift = self._affine()
        return self.taesd_decoder((z - shift) * scale)


# ---- hyperparameters (key layouts: tiny_layout.py) ---------------------------------------------

def config_from_state_dict(sd, name_hint: Optional[str] = None) -> TinyConfig:
    fields = layout.structure(sd)
    variant = "f16" if fields["patch"] > 1 else "flux_2" if fields["midblock_gn"] else "plain"
    space = _latent_space(name_hint, fields["latent_channels"], variant)
    scale, shift, pack, _ = LATENT_SPACES.get(space, (1.0, 0.0, 1, variant))
    if "vae_scale" in sd or "vae_shift" in sd:     # ComfyUI's combined file states its own scaling (both)
        scale, shift = _number(sd["vae_scale"]), _number(sd["vae_shift"])
    return TinyConfig(**fields, scale=scale, shift=shift, pack=pack, latent_space=space)


def _number(t: torch.Tensor):
    """A scalar scale/shift as a float, a per-channel one as a tuple."""
    return float(t) if t.numel() == 1 and t.dim() == 0 else tuple(float(v) for v in t.flatten())


def _latent_space(name_hint: Optional[str], latent: int, variant: str) -> str:
    """The published latent space these weights decode: named in the file name, else the only one
    with this channel count and variant; '' when unknown (then scale 1, shift 0)."""
    hint = (name_hint or "").lower()
    fits = lambda s: LATENT_SPACES[s].variant == variant
    # longest names first: "taesdxl" and "taesd3" both contain "taesd"
    for space in sorted(LATENT_SPACES, key=len, reverse=True):
        if space in hint and fits(space):
            return space
    default = DEFAULT_SPACE.get(latent, "")
    return default if default and fits(default) else ""


def complete_state_dict(sd: dict, cfg: TinyConfig) -> dict:
    sd.setdefault("vae_scale", torch.tensor(cfg.scale))
    sd.setdefault("vae_shift", torch.tensor(cfg.shift))
    return sd


def capabilities(cfg: TinyConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels,
        spatial_ratio=2 ** (len(cfg.decoder_stages or cfg.encoder_stages) - 1) * cfg.patch,
        image_channels=cfg.image_channels, value_range=(0.0, 1.0), latent_pack=cfg.pack,
        norm="groupnorm" if cfg.midblock_gn else "none",
        can_encode=bool(cfg.encoder_stages), can_decode=bool(cfg.decoder_stages),
        working_dtypes=(torch.float16, torch.bfloat16, torch.float32))


def describe(cfg: TinyConfig) -> str:
    space = cfg.latent_space or f"{cfg.latent_channels}-channel"
    parts = [p for p, on in (("encoder", cfg.encoder_stages), ("decoder", cfg.decoder_stages)) if on]
    notes = [f"{capabilities(cfg).spatial_ratio}x"] if cfg.patch > 1 else []
    notes += ["RGBA"] if cfg.image_channels == 4 else []
    return f"TAESD family ({', '.join([space, f'{cfg.latent_channels} latent channels', *notes, ' + '.join(parts)])})"


SPEC = ArchSpec(id="tiny", name="TAESD family", detect=layout.detect, to_canonical=layout.to_canonical,
                config_from_state_dict=config_from_state_dict, build=TinyAutoencoder,
                capabilities=capabilities, describe=describe, complete_state_dict=complete_state_dict,
                priority=40, latent_hints=((64, 4, "Qwen-Image 2.1"),))
