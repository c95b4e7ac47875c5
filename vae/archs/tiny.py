"""The TAESD family (taesd, taesdxl, taesd3, taef1, taef2): ReLU conv stacks, no attention; taef2
adds a GroupNorm "pool" branch to the blocks at the lowest resolution.

Canonical layout: ComfyUI's combined file (``taesd_encoder.<i>``, ``taesd_decoder.<i>`` with the
original nn.Sequential indices, plus scalar ``vae_scale``/``vae_shift``). Also read: the original
encoder/decoder pair (bare indices; combined by the loader), and diffusers' AutoencoderTiny
(``encoder.layers.<i>``, ``decoder.layers.<i-1>``: diffusers has no Clamp module at index 0).

Latents follow ComfyUI's convention: a raw LATENT is scaled by ``(z - shift) * scale`` before the
decoder, and taef2 latents travel packed 2x2 into 128 channels like Flux.2's."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..errors import LoadError
from ..keymap import rename
from ..nn.norm import GroupNorm
from ..run import boundary
from ..spec import ArchSpec, Capabilities

ENC, DEC = "taesd_encoder", "taesd_decoder"

# (scale, shift, pack) per published latent space, as ComfyUI applies them. Which one a 4- or
# 16-channel file belongs to is not in its weights: the file name tells (as in ComfyUI).
LATENT_SPACES = {
    "taesd": (0.18215, 0.0, 1),
    "taesdxl": (0.13025, 0.0, 1),
    "taesd3": (1.5305, 0.0609, 1),
    "taef1": (0.3611, 0.1159, 1),
    "taef2": (1.0, 0.0, 2),
}
DEFAULT_SPACE = {4: "taesd", 16: "taef1", 32: "taef2"}


@dataclass(frozen=True)
class TinyConfig:
    latent_channels: int
    encoder_stages: Optional[tuple[tuple[int, int], ...]]   # (width, blocks) per resolution
    decoder_stages: Optional[tuple[tuple[int, int], ...]]
    midblock_gn: bool = False
    image_channels: int = 3
    scale: float = 1.0
    shift: float = 0.0
    pack: int = 1
    latent_space: str = ""


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


def build_encoder(cfg: TinyConfig) -> nn.Sequential:
    stages = cfg.encoder_stages
    layers: list[nn.Module] = []
    prev = None
    for i, (width, blocks) in enumerate(stages):
        # first stage: plain conv from the image; later ones: bias-free stride-2 conv
        layers.append(conv3(cfg.image_channels, width) if i == 0 else boundary(conv3(prev, width, stride=2, bias=False)))
        pool = cfg.midblock_gn and i == len(stages) - 1
        layers += [TinyBlock(width, width, pool) for _ in range(blocks)]
        prev = width
    layers.append(conv3(prev, cfg.latent_channels))
    return nn.Sequential(*layers)


def build_decoder(cfg: TinyConfig) -> nn.Sequential:
    stages = cfg.decoder_stages
    layers: list[nn.Module] = [Clamp(), conv3(cfg.latent_channels, stages[0][0]), nn.ReLU(inplace=True)]
    for i, (width, blocks) in enumerate(stages):
        layers += [TinyBlock(width, width, cfg.midblock_gn and i == 0) for _ in range(blocks)]
        if i < len(stages) - 1:
            layers += [boundary(nn.Upsample(scale_factor=2)), conv3(width, stages[i + 1][0], bias=False)]
        else:
            layers.append(conv3(width, cfg.image_channels))
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
        self.register_buffer("vae_scale", torch.tensor(float(cfg.scale)))
        self.register_buffer("vae_shift", torch.tensor(float(cfg.shift)))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.taesd_encoder(x) / self.vae_scale + self.vae_shift

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.taesd_decoder((z - self.vae_shift) * self.vae_scale)


# ---- key layouts and hyperparameters -----------------------------------------------------------

def _bump(m: re.Match) -> str:
    return f"{DEC}.{int(m.group(1)) + 1}."


def to_canonical(sd) -> dict:
    keys = list(sd.keys())
    if any(k.startswith("encoder.layers.") or k.startswith("decoder.layers.") for k in keys):
        sd = rename(sd, [(r"^encoder\.layers\.", f"{ENC}."), (r"^decoder\.layers\.(\d+)\.", _bump)])
    elif not any(k.startswith((ENC + ".", DEC + ".")) for k in keys):
        # one bare original file: the decoder's first conv sits at index 1 (index 0 is the clamp)
        prefix = ENC if "0.weight" in sd else DEC
        sd = {f"{prefix}.{k}": v for k, v in sd.items()}
    return dict(sd)


def detect(sd) -> bool:
    keys = sd.keys()
    # 2-D convs only: genmo's Mochi encoder also has `encoder.layers.0.weight` (a Linear)
    conv = lambda k: k in sd and sd[k].dim() == 4
    return (conv(f"{DEC}.1.weight") or conv(f"{ENC}.0.weight")
            or conv("decoder.layers.0.weight") or conv("encoder.layers.0.weight")
            or ((conv("0.weight") or conv("1.weight")) and any(re.match(r"\d+\.conv\.0\.weight$", k) for k in keys)))


def _indices(sd, prefix: str) -> list[int]:
    pat = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    return sorted({int(m.group(1)) for k in sd if (m := pat.match(k))})


def _is_block(sd, prefix: str, i: int) -> bool:
    return f"{prefix}.{i}.conv.0.weight" in sd


def _stages(sd, prefix: str, first: int) -> tuple[tuple[int, int], ...]:
    """Walk the Sequential from index ``first``: a run of blocks after a conv is one stage."""
    stages, blocks, width = [], 0, None
    for i in _indices(sd, prefix):
        if i < first:
            continue
        if _is_block(sd, prefix, i):
            blocks += 1
            width = sd[f"{prefix}.{i}.conv.0.weight"].shape[0]
        elif blocks:
            stages.append((width, blocks))
            blocks = 0
    return tuple(stages)


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> TinyConfig:
    has_enc, has_dec = f"{ENC}.0.weight" in sd, f"{DEC}.1.weight" in sd
    if not (has_enc or has_dec):
        raise LoadError("TAESD-style weights without an encoder conv at index 0 or a decoder conv at index 1.",
                        fix="use an original taesd/taef* .pth/.safetensors file or a diffusers AutoencoderTiny file.")
    if has_dec:
        latent = sd[f"{DEC}.1.weight"].shape[1]
    else:
        last = _indices(sd, ENC)[-1]
        latent = sd[f"{ENC}.{last}.weight"].shape[0]
    enc = _stages(sd, ENC, 1) if has_enc else None
    dec = _stages(sd, DEC, 3) if has_dec else None
    gn = any(".pool." in k for k in sd)
    if has_dec:
        out_ch = sd[f"{DEC}.{_indices(sd, DEC)[-1]}.weight"].shape[0]
    else:
        out_ch = sd[f"{ENC}.0.weight"].shape[1]
    space = _latent_space(name_hint, latent, gn)
    scale, shift, pack = LATENT_SPACES.get(space, (1.0, 0.0, 1))
    if "vae_scale" in sd or "vae_shift" in sd:     # ComfyUI's combined file states its own scaling (both)
        scale, shift = float(sd["vae_scale"]), float(sd["vae_shift"])
    return TinyConfig(latent_channels=latent, encoder_stages=enc, decoder_stages=dec, midblock_gn=gn,
                      image_channels=out_ch, scale=scale, shift=shift, pack=pack, latent_space=space)


def _latent_space(name_hint: Optional[str], latent: int, gn: bool) -> str:
    """The published latent space these weights decode: named in the file name, else the only one
    with this channel count (and taef2's pool blocks); '' when unknown (then scale 1, shift 0)."""
    hint = (name_hint or "").lower()
    fits = lambda s: LATENT_SPACES[s][2] == (2 if gn else 1)
    # longest names first: "taesdxl" and "taesd3" both contain "taesd"
    for space in sorted(LATENT_SPACES, key=len, reverse=True):
        if space in hint and fits(space):
            return space
    default = DEFAULT_SPACE.get(latent, "")
    return default if default and fits(default) else ""


def complete_state_dict(sd: dict, cfg: TinyConfig) -> dict:
    sd.setdefault("vae_scale", torch.tensor(float(cfg.scale)))
    sd.setdefault("vae_shift", torch.tensor(float(cfg.shift)))
    return sd


def capabilities(cfg: TinyConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels,
        spatial_ratio=2 ** (len(cfg.decoder_stages or cfg.encoder_stages) - 1),
        image_channels=cfg.image_channels, value_range=(0.0, 1.0), latent_pack=cfg.pack,
        norm="groupnorm" if cfg.midblock_gn else "none",
        can_encode=bool(cfg.encoder_stages), can_decode=bool(cfg.decoder_stages),
        working_dtypes=(torch.float16, torch.bfloat16, torch.float32))


def describe(cfg: TinyConfig) -> str:
    space = cfg.latent_space or f"{cfg.latent_channels}-channel"
    parts = [p for p, on in (("encoder", cfg.encoder_stages), ("decoder", cfg.decoder_stages)) if on]
    return f"TAESD family ({space}, {cfg.latent_channels} latent channels, {' + '.join(parts)})"


SPEC = ArchSpec(id="tiny", name="TAESD family", detect=detect, to_canonical=to_canonical,
                config_from_state_dict=config_from_state_dict, build=TinyAutoencoder,
                capabilities=capabilities, describe=describe, complete_state_dict=complete_state_dict,
                priority=40, latent_hints=())
