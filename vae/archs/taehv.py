"""The TAEHV family (madebyollin/taehv, MIT): tiny video autoencoders for the latent spaces of
HunyuanVideo 1 and 1.5, Wan 2.1 and 2.2, LTX-2, MiniMax H3 and CogVideoX, and LightX2V's ``lighttae*``
distillations of the same design. 2-D ReLU conv stacks run on every frame; time enters through three
kinds of layers: ``MemBlock`` (a residual block that also reads its input's previous frame), ``TPool``
(the encoder stacks ``s`` frames in channels, a 1x1 conv folds them into one) and ``TGrow`` (the decoder's
1x1 conv writes ``s`` frames). The decoder's first ``s - 1`` frames (s: the time ratio) are dropped, so
``t`` latent frames give ``1 + s * (t - 1)`` frames. The "super" decoders (``taehv1_5_super``,
``taew2_2_super``) replace the MemBlocks with ConvNeXt-style ones and up-sample by PixelShuffle.

Streaming (``vae.run.stream``): a MemBlock keeps its input's last frame in the call's stream memory, so
a clip decoded chunk by chunk equals one pass (the original's ``parallel=False``, ComfyUI core's
default); the first chunk drops the leading frames. The receptive field is bounded in space (a few
3x3 convs a level) and in time (each MemBlock looks one frame back at its level's frame rate), so
exact tiles (halo >= the convs' reach, measured by the engine) equal one pass.

Latent spaces: the network of madebyollin's files reads the diffusion model's latent (the README:
"TAEHV encodes / decodes exactly what diffusion models use"), LightX2V's ``lighttae*`` files the VAE's
raw latent; a ComfyUI LATENT is the VAE's raw latent. Which space a file belongs to is not in its
weights (taehv and lighttaew2_1 have the same tensors): it comes from the file's metadata
(``taehv_model``), else its name, else the default for its shapes (``_latent_space``). ComfyUI core
tells taehv from lighttaew2_1 by the file's dtype (fp16: HunyuanVideo), which a conversion changes.

MiniMax H3's ``taeh3`` (24 latent channels, the only published file with that count) follows H3's clip
rule as its reference does: encode in independent 17-frame clips, each after three black frames, the
last three latent frames dropped; decode drops the first three frames of every 20 and the last twelve.
Its units are the definition's (vae/engine/defined.py, ``Clips``). Key layouts: taehv_layout.py."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, NamedTuple, Optional, Union

import torch
from torch import nn

from .. import spec
from ..engine.defined import Chunk, Plan, spatial_tiles
from ..errors import LoadError
from ..run import Streamable, boundary
from ..spec import ArchSpec, Capabilities
from . import taehv_layout as layout
from .tiny import Clamp, conv3

Number = Union[float, tuple[float, ...]]      # one value, or one per latent channel

# The per-channel statistics of Wan's latents (ComfyUI ``latent_formats.Wan21`` / ``Wan22``): the
# diffusion model works in (z - mean) / std.
WAN21_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
              0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
WAN21_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
             3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)
WAN22_MEAN = (-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
              -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
              -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
              -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
              -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
              0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667)
WAN22_STD = (0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
             0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
             0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
             0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
             0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
             0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744)


class LatentSpace(NamedTuple):
    model: str                       # the diffusion model whose latents the file decodes
    channels: int                    # the shapes it must have (latent channels, pixel patch)
    patch: int
    scale: Number                    # the network reads (LATENT - shift) * scale
    shift: Number
    act: str = "relu"                # "relu", or "leaky" (LeakyReLU 0.2)
    value_range: tuple[float, float] = (0.0, 1.0)


_RAW = dict(scale=1.0, shift=0.0)
# Per published file name. The network's latent is the diffusion model's for madebyollin's files
# (README; its notebooks hand the pipelines' latents over unchanged: HunyuanVideo's scaled by
# 0.476986, Wan's normalised by its mean/std) and the VAE's raw latent for LightX2V's (its
# ``need_scaled`` for "lighttae" paths un-normalises Wan's; ``LightTaeHy15`` divides by 1.03682 first),
# for taecvx (its notebook undoes CogVideoX 1.5's 0.7) and for LTX-2 and H3, whose ComfyUI LATENT is
# the normalised one already. LightX2V's HunyuanVideo 1.5 file also has LeakyReLU(0.2) activations
# and works in [-1, 1] pixels (its ``model_type="hy15"``).
LATENT_SPACES: dict[str, LatentSpace] = {
    "taehv": LatentSpace("HunyuanVideo 1 / Kandinsky 5", 16, 1, 0.476986, 0.0),
    "taehv1_5": LatentSpace("HunyuanVideo 1.5", 32, 2, 1.03682, 0.0),
    "lighttaehy1_5": LatentSpace("HunyuanVideo 1.5 (LightX2V)", 32, 2, **_RAW, act="leaky", value_range=(-1.0, 1.0)),
    "taew2_1": LatentSpace("Wan 2.1 / Wan 2.2 14B / Qwen-Image", 16, 1, tuple(1 / s for s in WAN21_STD), WAN21_MEAN),
    "lighttaew2_1": LatentSpace("Wan 2.1 (LightX2V)", 16, 1, **_RAW),
    "taew2_2": LatentSpace("Wan 2.2 5B", 48, 2, tuple(1 / s for s in WAN22_STD), WAN22_MEAN),
    "lighttaew2_2": LatentSpace("Wan 2.2 5B (LightX2V)", 48, 2, **_RAW),
    "taeltx_2": LatentSpace("LTX-2", 128, 4, **_RAW),
    "taeltx2_3": LatentSpace("LTX-2.3", 128, 4, **_RAW),
    "taeh3": LatentSpace("MiniMax H3", 24, 2, **_RAW),
    "taecvx": LatentSpace("CogVideoX 1.5", 16, 1, **_RAW),
}
# Files whose name (and metadata) names none: the space ComfyUI core gives these shapes (for 16
# channels, core's choice for any file that is not fp16).
DEFAULT_SPACE = {(16, 1): "lighttaew2_1", (32, 2): "lighttaehy1_5", (48, 2): "lighttaew2_2", (128, 4): "taeltx_2",
                 (24, 2): "taeh3"}
METADATA_KEY = "taehv_model"
BLOCKS = 3                     # memory blocks per level (published)
# Latent frames a decode runs at a time when the call asks for none: ComfyUI core runs one frame at a
# time (the original's ``parallel=False``), the original's default is the whole clip; 4 (16 frames,
# Wan's) keeps the working set flat in the clip's length at nearly one pass's speed.
STREAM_CHUNK = 4


@dataclass(frozen=True)
class TAEHVConfig:
    latent_channels: int
    patch: int = 1                                       # pixels enter and leave as patch x patch in channels
    encoder_width: Optional[int] = 64                    # None: no encoder
    encoder_time: tuple[int, ...] = (2, 2, 1)            # TPool strides
    decoder: str = "base"                                # "base", "super" or "" (no decoder)
    decoder_widths: tuple[int, ...] = (256, 128, 64, 64)
    decoder_space: tuple[int, ...] = (2, 2, 2)
    decoder_time: tuple[int, ...] = (1, 2, 2)            # TGrow strides
    act: str = "relu"
    scale: Number = 1.0
    shift: Number = 0.0
    value_range: tuple[float, float] = (0.0, 1.0)
    space: str = ""                                      # the published file it is, "" unknown
    space_source: str = ""                               # how that was decided
    image_channels: int = layout.IMAGE_CHANNELS

    @property
    def has_encoder(self) -> bool:
        return self.encoder_width is not None

    @property
    def has_decoder(self) -> bool:
        return bool(self.decoder)

    @property
    def spatial_ratio(self) -> int:
        up = math.prod(self.decoder_space) if self.has_decoder else 2 ** len(self.encoder_time)
        return up * self.patch

    @property
    def temporal_ratio(self) -> int:
        return math.prod(self.decoder_time if self.has_decoder else self.encoder_time)

    @property
    def clips(self) -> bool:
        """MiniMax H3's clip rule (taeh3: the one published 24-channel file; core tells it the same way)."""
        return self.latent_channels == H3_CHANNELS

    def memory_reach(self) -> Fraction:
        """How many latent frames back the decoder's memory reaches: each block looks one frame back at
        its level's frame rate (level k runs at the product of the TGrow strides before it)."""
        rate, reach = 1, Fraction(0)
        for stride in self.decoder_time:
            reach += Fraction(BLOCKS, rate)
            rate *= stride
        return reach


# ---- the network --------------------------------------------------------------------------------

def activation(kind: str) -> nn.Module:
    return nn.LeakyReLU(0.2, inplace=True) if kind == "leaky" else nn.ReLU(inplace=True)


class _Frames:
    """A layer that sees time: called as ``layer(x, batch)`` with the frames of ``batch`` clips stacked,
    x [batch * frames, C, H, W] (clip-major)."""


class _Memory(_Frames, Streamable):
    def past(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        """Each frame's previous frame (zeros before the clip's first): in a stream, the previous
        chunk's last frame, kept in the call's stream memory."""
        frames = x.unflatten(0, (batch, -1))
        before = self.recall()
        if before is None:
            before = torch.zeros_like(frames[:, :1])
        if self.streaming:
            self.remember(frames[:, -1:].clone())
        return torch.cat([before, frames[:, :-1]], 1).flatten(0, 1)


class MemBlock(_Memory, nn.Module):
    def __init__(self, cin: int, cout: int, act: nn.Module):
        super().__init__()
        self.conv = nn.Sequential(conv3(2 * cin, cout), act, conv3(cout, cout), act, conv3(cout, cout))
        self.skip = nn.Conv2d(cin, cout, 1, bias=False) if cin != cout else nn.Identity()
        self.act = act

    def forward(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        return self.act(self.conv(torch.cat([x, self.past(x, batch)], 1)) + self.skip(x))


class SuperMemBlock(_Memory, nn.Module):
    """The super decoders' block: a 7x7 depthwise conv over the frame and its past, an inverted
    bottleneck, a residual."""

    def __init__(self, width: int):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(2 * width, 2 * width, 7, padding=3, groups=2 * width, bias=False),
                                  nn.Conv2d(2 * width, 4 * width, 1), nn.ReLU(inplace=True),
                                  nn.Conv2d(4 * width, width, 1, bias=False))

    def forward(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        return self.conv(torch.cat([x, self.past(x, batch)], 1)) + x


class TPool(_Frames, nn.Module):
    """``stride`` consecutive frames stacked in channels, folded into one by a 1x1 conv."""

    def __init__(self, width: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(width * stride, width, 1, bias=False)

    def forward(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        n, c, h, w = x.shape
        return self.conv(x.reshape(n // self.stride, self.stride * c, h, w))


class TGrow(_Frames, nn.Module):
    """A 1x1 conv writes ``stride`` frames per frame, stacked in channels, then unstacked in order."""

    def __init__(self, width: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(width, width * stride, 1, bias=False)

    def forward(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        n, c, h, w = x.shape
        return self.conv(x).reshape(n * self.stride, c, h, w)


def run(layers: nn.Sequential, x: torch.Tensor, batch: int) -> torch.Tensor:
    for layer in layers:
        x = layer(x, batch) if isinstance(layer, _Frames) else layer(x)
    return x


def build_encoder(cfg: TAEHVConfig, act: nn.Module) -> nn.Sequential:
    w = cfg.encoder_width
    layers: list[nn.Module] = [conv3(cfg.image_channels * cfg.patch ** 2, w), act]
    for stride in cfg.encoder_time:
        layers += [TPool(w, stride), boundary(conv3(w, w, stride=2, bias=False))]
        layers += [MemBlock(w, w, act) for _ in range(BLOCKS)]
    layers.append(conv3(w, cfg.latent_channels))
    return nn.Sequential(*layers)


def build_decoder(cfg: TAEHVConfig, act: nn.Module) -> nn.Sequential:
    n, out = cfg.decoder_widths, cfg.image_channels * cfg.patch ** 2
    if cfg.decoder == "super":
        layers: list[nn.Module] = [nn.Conv2d(cfg.latent_channels, n[0], 1, bias=False)]
        for k, (up, stride) in enumerate(zip(cfg.decoder_space, cfg.decoder_time)):
            layers += [SuperMemBlock(n[k]) for _ in range(BLOCKS)]
            layers += [conv3(n[k], n[k + 1] * up * up), nn.ReLU(inplace=True), boundary(nn.PixelShuffle(up)),
                       TGrow(n[k + 1], stride)]
        layers.append(conv3(n[-1], out))
        return nn.Sequential(*layers)
    layers = [Clamp(), conv3(cfg.latent_channels, n[0]), act]
    for k, (up, stride) in enumerate(zip(cfg.decoder_space, cfg.decoder_time)):
        layers += [MemBlock(n[k], n[k], act) for _ in range(BLOCKS)]
        layers += [boundary(nn.Upsample(scale_factor=up)), TGrow(n[k], stride), conv3(n[k], n[k + 1], bias=False)]
    layers += [act, conv3(n[-1], out)]
    return nn.Sequential(*layers)


class TAEHV(Streamable, nn.Module):
    """encode: clips [B, 3, T, H, W] in the model's value range -> LATENT [B, C, t, h, w];
    decode: LATENT -> clips. Raw LATENTs in and out (the latent space's scale and shift inside)."""

    def __init__(self, cfg: TAEHVConfig):
        super().__init__()
        self.config = cfg
        act = activation(cfg.act)
        p = cfg.patch
        if cfg.has_encoder:
            self.encoder = build_encoder(cfg, act)
        if cfg.has_decoder:
            self.decoder = build_decoder(cfg, act)
        self.to_patches = boundary(nn.PixelUnshuffle(p)) if p > 1 else nn.Identity()
        self.from_patches = boundary(nn.PixelShuffle(p)) if p > 1 else nn.Identity()

    def _affine(self, like: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.config
        if cfg.scale == 1.0 and cfg.shift == 0.0:
            return None
        as_map = lambda v: torch.as_tensor(v, dtype=like.dtype, device=like.device).reshape(1, -1, 1, 1, 1)
        return as_map(cfg.scale), as_map(cfg.shift)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        cfg, b = self.config, x.shape[0]
        if cfg.clips:                 # H3: each clip is encoded after three black frames
            x = torch.cat([x.new_zeros(*x.shape[:2], H3_LEAD, *x.shape[3:]), x], 2)
        pad = -x.shape[2] % math.prod(cfg.encoder_time)
        if pad:                       # the last frame repeated to a whole group
            x = torch.cat([x, x[:, :, -1:].expand(-1, -1, pad, -1, -1)], 2)
        z = run(self.encoder, self.to_patches(x.transpose(1, 2).flatten(0, 1)), b)
        z = z.unflatten(0, (b, -1)).transpose(1, 2)
        affine = self._affine(z)
        return z if affine is None else z / affine[0] + affine[1]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        cfg, b = self.config, z.shape[0]
        affine = self._affine(z)
        if affine is not None:
            z = (z - affine[1]) * affine[0]
        x = self.from_patches(run(self.decoder, z.transpose(1, 2).flatten(0, 1), b))
        y = x.unflatten(0, (b, -1)).transpose(1, 2)
        trim = cfg.temporal_ratio - 1
        if trim and not cfg.clips and self.first_chunk():     # in a stream: the first chunk's frames only
            y = y[:, :, trim:]
        return y


# ---- MiniMax H3's clips (taeh3) -------------------------------------------------------------------

H3_CHANNELS = 24
H3_CLIP, H3_LEAD, H3_DROP = 17, 3, 3      # frames per encoder clip, black frames before it, latents dropped
H3_UNIT = 10                              # latent frames each decode unit outputs


@dataclass(frozen=True)
class Clips:
    """taeh3's units as its reference runs them (vae/engine/defined.py reads ``plan``, ``frames``,
    ``latents``, ``options``). Encode: one unit per 17-frame clip (the last padded with its last frame).
    Decode: the reference runs the decoder over the whole latent in one pass; a unit here decodes
    ``unit`` latent frames after ``warmup`` earlier ones whose frames it drops, and since the decoder's
    memory reaches back ``warmup`` latent frames at most (``TAEHVConfig.memory_reach``), each unit's
    frames equal that pass. Spatially one tile: the reference has none."""
    ratio: int
    rt: int
    warmup: int
    channels: int = H3_CHANNELS
    unit: int = H3_UNIT
    options: tuple[str, ...] = ()

    @property
    def per_clip(self) -> int:
        return (H3_CLIP + H3_LEAD) // self.rt          # 5 latent frames per clip

    def latents(self, frames: int) -> int:
        return 1 if frames == 1 else -(-frames // H3_CLIP) * self.per_clip - H3_DROP

    def frames(self, latents: int) -> int:
        """Of every ``per_clip`` latent frames' frames the first ``rt - 1`` are dropped, then the last
        ``H3_DROP`` latent frames' worth (frames past the decoded ones are the reference's black padding)."""
        if latents == 1:
            return 1
        per = self.per_clip * self.rt
        return -(-latents * self.rt // per) * (per - self.rt + 1) - H3_DROP * self.rt

    def _slot(self, f: int, total: int) -> int:
        """The output frame decoder frame ``f`` lands on, or -1."""
        per, trim = self.per_clip * self.rt, self.rt - 1
        c, q = divmod(f, per)
        j = c * (per - trim) + q - trim
        return j if q >= trim and j < total else -1

    def describe(self) -> str:
        return (f"MiniMax H3's clips: {H3_CLIP}-frame clips encoded apart; decoded {self.unit} latent frames a unit "
                f"after {self.warmup} frames of warm-up (the decoder's memory reach)")

    def decode_chunks(self, t: int) -> tuple[Chunk, ...]:
        if t == 1:
            return (Chunk((0,), (-1,) * (self.rt - 1) + (0,), (1.0,) * self.rt),)
        total, chunks = self.frames(t), []
        for s in range(0, t, self.unit):
            e, w = min(t, s + self.unit), min(self.warmup, s)
            n = (e - s + w) * self.rt
            dst = tuple(-1 if f < s * self.rt else self._slot(f, total)
                        for f in range((s - w) * self.rt, (s - w) * self.rt + n))
            chunks.append(Chunk(tuple(range(s - w, e)), dst, (1.0,) * n))
        return tuple(chunks)

    def encode_chunks(self, frames: int) -> tuple[Chunk, ...]:
        if frames == 1:
            return (Chunk((0,), (0,), (1.0,)),)
        out = self.latents(frames)
        return tuple(Chunk(tuple(min(i, frames - 1) for i in range(c * H3_CLIP, (c + 1) * H3_CLIP)),
                           tuple(c * self.per_clip + j if c * self.per_clip + j < out else -1
                                 for j in range(self.per_clip)), (1.0,) * self.per_clip)
                     for c in range(-(-frames // H3_CLIP)))

    def plan(self, op: str, shape: tuple[int, ...]) -> Plan:
        """``shape``: the latent (decode) or the clip (encode), (B, C, T, H, W)."""
        t, h, w = shape[2:]
        if op == "decode":
            size = (h * self.ratio, w * self.ratio)
            tiles, grid = spatial_tiles(size, self.ratio, 0, 0, True, "blend")
            return Plan(3, self.frames(t), size, self.decode_chunks(t), tiles, grid)
        tiles, grid = spatial_tiles((h, w), self.ratio, 0, 0, False, "blend")
        return Plan(self.channels, self.latents(t), (h // self.ratio, w // self.ratio), self.encode_chunks(t),
                    tiles, grid)


# ---- hyperparameters and the latent space ----------------------------------------------------------

def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _latent_space(fields: dict, name_hint: Optional[str], metadata: Mapping[str, str]) -> tuple[str, str]:
    """(the published file these weights are, how that was decided): the file's metadata
    (``taehv_model``), else the longest published name its file name contains (separators ignored:
    ``lighttae_hy1_5`` is ``lighttaehy1_5``), else the default for its shapes; never its dtype."""
    shape = (fields["latent_channels"], fields["patch"])
    fits = lambda s: (LATENT_SPACES[s].channels, LATENT_SPACES[s].patch) == shape
    named = metadata.get(METADATA_KEY)
    if named:
        if named not in LATENT_SPACES or not fits(named):
            known = ", ".join(s for s in LATENT_SPACES if fits(s)) or "none"
            raise LoadError(f"the file's metadata names it {METADATA_KEY}={named!r}, which is not a published "
                            f"{shape[0]}-channel TAEHV file (those: {known}).",
                            fix=f"set '{METADATA_KEY}' to one of those, or remove it to go by the file name.")
        return named, f"its metadata '{METADATA_KEY}'"
    hint, unfit = _norm(name_hint or ""), None
    for s in sorted(LATENT_SPACES, key=lambda s: len(_norm(s)), reverse=True):
        if _norm(s) in hint:
            if fits(s):
                return s, "its file name"
            unfit = unfit or s
    default = DEFAULT_SPACE.get(shape, "")
    why = f"the name says {unfit} but the weights are {shape[0]}-channel" if unfit else "the file name names none"
    return default, f"the default for these shapes ({why})"


def config_from_state_dict(sd, name_hint: Optional[str] = None,
                           metadata: Optional[Mapping[str, str]] = None) -> TAEHVConfig:
    fields = layout.structure(sd)
    space, source = _latent_space(fields, name_hint, metadata or {})
    ls = LATENT_SPACES.get(space)
    latent = dict(scale=ls.scale, shift=ls.shift, act=ls.act, value_range=ls.value_range) if ls else {}
    return TAEHVConfig(**fields, **latent, space=space, space_source=source)


def capabilities(cfg: TAEHVConfig) -> Capabilities:
    clips = Clips(cfg.spatial_ratio, cfg.temporal_ratio, math.ceil(cfg.memory_reach()), cfg.latent_channels) \
        if cfg.clips else None
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=cfg.spatial_ratio, image_channels=cfg.image_channels,
        temporal_ratio=cfg.temporal_ratio, value_range=cfg.value_range, norm="none", causal_decoder=True,
        stream_decode=not cfg.clips, stream_chunk=STREAM_CHUNK, can_encode=cfg.has_encoder,
        can_decode=cfg.has_decoder,
        working_dtypes=(torch.float16, torch.bfloat16, torch.float32), own_tiling=clips)


def describe(cfg: TAEHVConfig) -> str:
    space = f"{cfg.space}: {LATENT_SPACES[cfg.space].model}" if cfg.space else "latent space unknown"
    notes = [f"{cfg.spatial_ratio}x/{cfg.temporal_ratio}x"] + (["super decoder"] if cfg.decoder == "super" else [])
    notes.append(f"latent space from {cfg.space_source}")
    return spec.describe(f"TAEHV family ({space})", cfg.latent_channels, cfg.has_encoder, cfg.has_decoder, *notes)


SPEC = ArchSpec(id="taehv", name="TAEHV family", detect=layout.detect, to_canonical=layout.to_canonical,
                config_from_state_dict=config_from_state_dict, build=TAEHV, capabilities=capabilities,
                describe=describe, reads_metadata=True, priority=35)
