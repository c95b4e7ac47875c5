"""MiniMax H3 video VAE: a causal 3-D CNN encoder and a ViT decoder; 24 latent channels, 16x spatial,
4x temporal in 17-frame clips (17k + 5 frames <-> 5k + 2 latent frames).

Definition (MiniMax's release, ComfyUI core, diffusers ``AutoencoderKLMiniMaxH3``): the model is run in
its own tiles and chunks, and those are part of the result (vae/engine/defined.py runs exactly these units):
- encode: clips of 17 frames (the last one padded by repeating its last frame), each its own causal
  stream (2 zero frames in front), 5 latent frames each; the last 3 latent frames of the video are
  dropped. A single frame is a clip of its own and gives 1 latent frame. Each clip is encoded in
  256 px tiles blended in the latent (raw neighbours: ``stitch``);
- decode: chunks of 5 latent frames plus the next 2 (7 -> 28 frames through the ViT); of each chunk's
  frames [3, 20) are its 17, [23, 28) the 5 that cross-fade (linearly) into the next chunk's first 5,
  or end the video. Latents are padded by repeating the last one to whole chunks and the extra frames
  cut again. One latent frame decodes alone (4 frames, the last kept); two are padded to a chunk
  (5 frames), as ComfyUI does (diffusers cannot decode 1 or 2). Each chunk is decoded in 256 px tiles
  blended in pixels: ``blend`` (each tile into what is there: ComfyUI core 0.38.1+, the default) or
  ``stitch`` (raw neighbours: MiniMax's code, diffusers, core before 0.38.1), the ``tiling`` decode
  option; ``off`` decodes each chunk in one pass (diffusers' ``disable_tiling``): the ViT's positions
  are normalised by the grid it sees, so that is a different (and, by MiniMax, worse) output.

Pixels: ImageNet mean/std over a 0..1 base inside the model; decode returns 0..1 (clamped by the
handle). Latents are normalised inside the model with ``latents_mean`` / ``latents_std`` (the
published values when a file lacks them: MiniMax's own file does). Encoder: per-frame GroupNorm (32
groups, eps 1e-6), reflect spatial padding, zero causal time padding, stride-2 down-samplers that
reflect-pad bottom/right first. Decoder: ``x_embedder`` per latent voxel, registers and one zero token
appended, pre-norm blocks (RMSNorm, fused per-head-interleaved ``to_qkv``, weightless RMSNorm on q and k,
3-axis split-half RoPE on 3/4 of each 64-wide head, theta 100, positions (i + 0.5) / n * 2 - 1 times
2 pi; SwiGLU ``w1`` stored [gate; value]; per-channel layer scales), LayerNorm, ``proj_out`` to
3 x 4 x 16 x 16 pixels per token. ComfyUI's int8 files run as core runs them (int8 matmuls: vae/nn/quant.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..engine.defined import Chunk, Plan, spatial_tiles
from ..errors import InputError
from ..nn import posterior as gaussian
from ..nn.causal import CausalConv3d
from ..nn.norm import FrameGroupNorm
from ..nn.quant import Int8Linear
from .. import spec
from ..spec import ArchSpec, Capabilities, KnownConfigs
from . import ldm
from . import minimax_layout as layout

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP, DROP, RT = 17, 3, 4                 # pixel frames per encoder clip, latent frames dropped, time ratio
CHUNK = -(-CLIP // RT)                    # 5 latent frames per clip (and per decode chunk)
PRE = -CLIP % RT                          # 3: frames a chunk's decode starts with that no clip frame made
CARRY = -DROP % CHUNK                     # 2: latent frames a decode chunk reads from the next one
FADE = CARRY * RT - PRE                   # 5: frames cross-faded between neighbouring chunks
TIME_LEVELS = (1, 2)                      # encoder levels whose down-sampler also halves time
HEAD = 64                                 # decoder head width (the weights do not say; published)
GROUPS, EPS = 32, 1e-6
TILINGS = ("blend", "stitch", "off")


@dataclass(frozen=True)
class MiniMaxConfig:
    latent_channels: int = 24
    enc_widths: tuple[int, ...] = ()          # per level; () for a decoder-only file
    enc_blocks: int = 2
    enc_down: tuple[bool, ...] = ()           # levels with a down-sampler
    dec_dim: int = 0                          # 0: encoder-only file
    dec_depth: int = 36
    dec_ff: int = 8192
    registers: int = 4
    patch: int = 16
    quantized: tuple[tuple[str, int], ...] = ()   # int8 Linears: (canonical name, rotation group)
    # the definition's tiles, in pixels (the published values; tests narrow them)
    tile: int = 256
    min_overlap: int = 64

    @property
    def has_encoder(self) -> bool:
        return bool(self.enc_widths)

    @property
    def has_decoder(self) -> bool:
        return self.dec_dim > 0

    @property
    def spatial_ratio(self) -> int:
        return self.patch if self.has_decoder else 2 ** sum(self.enc_down)


# ---- encoder ---------------------------------------------------------------------------------------

def _conv(cin: int, cout: int) -> nn.Module:
    return CausalConv3d(cin, cout, 3, time_pad="causal_zeros", spatial_pad="reflect")


def _shortcut(cin: int, cout: int) -> nn.Module:
    return CausalConv3d(cin, cout, 1)


ENCODER_OPS = ldm.Ops(conv=_conv, shortcut=_shortcut, norm=lambda c: FrameGroupNorm(GROUPS, c, eps=EPS),
                      attention=lambda c: None)


class Downsample(nn.Module):
    """Reflect-pad bottom and right by one, then a stride-2 conv (stride 2 in time too on the time levels)."""

    def __init__(self, channels: int, time_stride: int):
        super().__init__()
        self.conv = CausalConv3d(channels, channels, 3, stride=(time_stride, 2, 2), time_pad="causal_zeros",
                                 spatial_padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1, 0, 0), mode="reflect"))


def encoder(cfg: MiniMaxConfig) -> nn.Module:
    down = lambda i, c: Downsample(c, 2 if i in TIME_LEVELS else 1) if cfg.enc_down[i] else None
    return ldm.Encoder(cfg.enc_widths[0], cfg.enc_widths, cfg.enc_blocks, 3, 2 * cfg.latent_channels,
                       ENCODER_OPS, downsample=down, mid=False)


# ---- decoder ---------------------------------------------------------------------------------------

def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Split-half rotary embedding on the first ``2 * cos.shape[-1]`` channels of x (B, S, heads, D)."""
    r = cos.shape[-1]
    a, b = x[..., :r], x[..., r:2 * r]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, x[..., 2 * r:]], dim=-1)


class Attention(nn.Module):
    """Self-attention over all tokens; ``to_qkv`` interleaved per head ([q_h, k_h, v_h] for each head)."""

    fused_qkv = True          # its q/k/v are one projection already (vae/nn/qkv.py)

    def __init__(self, dim: int, linear):
        super().__init__()
        self.heads = dim // HEAD
        self.to_qkv = linear("attn.to_qkv", dim, 3 * dim)
        self.to_out = linear("attn.to_out", dim, dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.to_qkv(x).view(b, s, self.heads, 3 * HEAD).chunk(3, dim=-1)
        q = _rope(F.rms_norm(q, (HEAD,), eps=1e-5), *rope)
        k = _rope(F.rms_norm(k, (HEAD,), eps=1e-5), *rope)
        o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
        return self.to_out(o.transpose(1, 2).reshape(b, s, d).nan_to_num_(0.0))


class FeedForward(nn.Module):
    """SwiGLU: ``w1`` gives [gate; value], ``w2(silu(gate) * value)``."""

    def __init__(self, dim: int, hidden: int, linear):
        super().__init__()
        self.w1 = linear("ff.w1", dim, 2 * hidden)
        self.w2 = linear("ff.w2", hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.w1(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate).mul_(value))


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int, linear):
        super().__init__()
        self.norm1 = nn.RMSNorm(dim, eps=1e-5)
        self.attn = Attention(dim, linear)
        self.scale1 = nn.Parameter(torch.zeros(dim))
        self.norm2 = nn.RMSNorm(dim, eps=1e-5)
        self.ff = FeedForward(dim, hidden, linear)
        self.scale2 = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        x = x.addcmul_(self.attn(self.norm1(x), rope), self.scale1)
        return x.addcmul_(self.ff(self.norm2(x)), self.scale2)


class Decoder(nn.Module):
    """Latent voxels (B, C, t, h, w) -> raw pixels (B, 3, 4t, 16h, 16w), ImageNet-normalised."""

    def __init__(self, cfg: MiniMaxConfig):
        super().__init__()
        dim, quantized = cfg.dec_dim, dict(cfg.quantized)

        def linear_in(i: int):
            def make(name: str, cin: int, cout: int) -> nn.Module:
                group = quantized.get(f"decoder.transformer_blocks.{i}.{name}")
                return nn.Linear(cin, cout) if group is None else Int8Linear(cin, cout, group)
            return make
        self.x_embedder = nn.Linear(cfg.latent_channels, dim)
        self.register_tokens = nn.Parameter(torch.zeros(1, cfg.registers, dim))
        self.transformer_blocks = nn.ModuleList(Block(dim, cfg.dec_ff, linear_in(i)) for i in range(cfg.dec_depth))
        self.norm_out = nn.LayerNorm(dim, eps=1e-5)
        self.proj_out = nn.Linear(dim, 3 * RT * cfg.patch ** 2)
        self.patch = cfg.patch

    def _rope(self, t: int, h: int, w: int, suffix: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (S, 1, 24): the token's (t, h, w) position, each normalised over its axis to
        (i + 0.5) / n * 2 - 1, times 2 pi and the frequencies; appended tokens sit at 0."""
        axes = [torch.arange(n, dtype=torch.float32, device=device).add_(0.5).div_(n).mul_(2).sub_(1) for n in (t, h, w)]
        pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
        pos = torch.cat([pos, pos.new_zeros(suffix, 3)])
        pairs = HEAD * 3 // 4 // 2                 # rotated pairs per head: 8 frequencies per axis
        inv_freq = 1 / 100.0 ** torch.arange(0, 1, 3 / pairs, dtype=torch.float32, device=device)
        angles = (2 * math.pi * pos[:, :, None] * inv_freq).flatten(1)
        return angles.cos()[:, None], angles.sin()[:, None]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = z.shape
        x = self.x_embedder(z.flatten(2).transpose(1, 2))
        n = x.shape[1]
        x = torch.cat([x, self.register_tokens.to(x.dtype).expand(b, -1, -1), x.new_zeros(b, 1, x.shape[2])], dim=1)
        cos, sin = self._rope(t, h, w, x.shape[1] - n, z.device)
        rope = (cos.to(x.dtype), sin.to(x.dtype))
        for block in self.transformer_blocks:
            x = block(x, rope)
        y = self.proj_out(self.norm_out(x[:, :n]))
        p = self.patch
        y = y.view(b, t, h, w, 3, RT, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
        return y.reshape(b, 3, t * RT, h * p, w * p)


# ---- the model ---------------------------------------------------------------------------------------

class MiniMaxH3VAE(ldm.Autoencoder):
    """One unit of the definition (a tile of a clip or chunk; vae/engine/defined.py runs the units).
    encode: pixels 0..1 (B, 3, T, H, W) -> normalised latent means (float32); decode: normalised latents
    -> pixels 0..1, unclamped (float32): every step after the network is affine, so it commutes with
    the definition's blends and runs per unit."""

    def __init__(self, cfg: MiniMaxConfig):
        z = cfg.latent_channels
        super().__init__(encoder(cfg) if cfg.has_encoder else None, Decoder(cfg) if cfg.has_decoder else None,
                         nn.Conv3d(2 * z, 2 * z, 1) if cfg.has_encoder else None,
                         nn.Conv3d(z, z, 1) if cfg.has_decoder else None)
        self.config = cfg
        self.register_buffer("latents_mean", torch.zeros(z))
        self.register_buffer("latents_std", torch.ones(z))

    def _pixels(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        view = lambda v: torch.tensor(v, device=like.device).view(1, 3, 1, 1, 1)
        return view(IMAGENET_MEAN), view(IMAGENET_STD)

    def _latent_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        view = lambda v: v.view(1, -1, 1, 1, 1).to(like)
        return view(self.latents_mean), view(self.latents_std)

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        mean, std = self._pixels(x)
        z = super().encode(((x - mean.to(x.dtype)) / std.to(x.dtype)), posterior).float()
        lm, ls = self._latent_stats(z)
        normalise = lambda m: (m - lm) / ls     # noqa: E731
        return gaussian.normalised(z, normalise, 1 / ls) if posterior else normalise(z)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        lm, ls = self._latent_stats(z)
        y = super().decode(z * ls + lm).float()
        mean, std = self._pixels(y)
        return y.mul_(std).add_(mean)


# ---- the definition's units --------------------------------------------------------------------------

def latent_frames(frames: int) -> int:
    """Latent frames an encode of ``frames`` frames gives: 1 for one frame, else 5 per started clip
    of 17, less the 3 dropped."""
    return 1 if frames == 1 else -(-frames // CLIP) * CHUNK - DROP


def _chunks(t: int) -> tuple[int, int]:
    """(padding latent frames, chunks) of a decode of ``t`` latent frames (t > 1)."""
    pad = -(t + DROP) % CHUNK
    n = (t + DROP + pad) // CHUNK - 1
    if n < 1:                      # two latent frames: one chunk, padded (ComfyUI's rule)
        pad, n = pad + CHUNK, n + 1
    return pad, n


def pixel_frames(t: int) -> int:
    """Frames a decode of ``t`` latent frames gives: 17 per chunk plus the last chunk's 5, less what
    the padding latents made (4 each, 1 for one that ends a clip)."""
    if t == 1:
        return 1
    pad, n = _chunks(t)
    cut = sum(CLIP % RT if (t + k) % CHUNK == 0 and CLIP % RT else RT for k in range(pad))
    return n * CLIP + FADE - cut


def decode_chunks(t: int) -> tuple[Chunk, ...]:
    if t == 1:                     # one latent frame: 4 frames, the last kept
        return (Chunk((0,), (-1,) * (RT - 1) + (0,), (1.0,) * RT),)
    pad, n = _chunks(t)
    out = pixel_frames(t)
    chunks = []
    for c in range(n):
        src = tuple(min(i, t - 1) for i in range(c * CHUNK, c * CHUNK + CHUNK + CARRY))
        dst, weight = [], []
        for f in range(len(src) * RT):
            if PRE <= f < CHUNK * RT:                           # the chunk's own 17 frames
                d, p = c * CLIP + f - PRE, f - PRE
                w = p / FADE if c and p < FADE else 1.0          # fading in over the last chunk's tail
            elif f >= CHUNK * RT + PRE:                         # its tail: the next chunk's first frames
                d, p = (c + 1) * CLIP + f - CHUNK * RT - PRE, f - CHUNK * RT - PRE
                w = 1 - p / FADE if c < n - 1 else 1.0
            else:
                d, w = -1, 0.0
            dst.append(d if d < out else -1)
            weight.append(w)
        chunks.append(Chunk(src, tuple(dst), tuple(weight)))
    return tuple(chunks)


def encode_chunks(frames: int) -> tuple[Chunk, ...]:
    if frames == 1:
        return (Chunk((0,), (0,), (1.0,)),)
    out = latent_frames(frames)
    return tuple(Chunk(tuple(min(i, frames - 1) for i in range(c * CLIP, (c + 1) * CLIP)),
                       tuple(c * CHUNK + j if c * CHUNK + j < out else -1 for j in range(CHUNK)), (1.0,) * CHUNK)
                 for c in range(-(-frames // CLIP)))


@dataclass(frozen=True)
class MiniMaxTiling:
    """The definition's units (vae/engine/defined.py reads ``plan``, ``frames``, ``latents``, ``options``)."""
    ratio: int = 16
    tile: int = 256
    min_overlap: int = 64
    channels: int = 24
    options: tuple[str, ...] = ("tiling",)

    def frames(self, latents: int) -> int:
        return pixel_frames(latents)

    def latents(self, frames: int) -> int:
        return latent_frames(frames)

    def describe(self) -> str:
        return (f"{self.tile} px tiles with at least {self.min_overlap} px overlaps, clips of {CLIP} frames "
                f"and decode chunks of {CHUNK + CARRY} latent frames")

    def plan(self, op: str, shape: tuple[int, ...], tiling: Optional[str] = None) -> Plan:
        """``shape``: the latent (decode) or the clip (encode), (B, C, T, H, W)."""
        tiling = tiling or "blend"
        if tiling not in TILINGS:
            raise InputError(f"unknown tiling {tiling!r} for MiniMax H3.", input="tiling",
                             fix=f"use one of {', '.join(TILINGS)} (blend: ComfyUI's; stitch: MiniMax's original "
                                 "and diffusers'; off: one pass per chunk, which is not the released behaviour).")
        t, h, w = shape[2:]
        if op == "decode":
            size = (h * self.ratio, w * self.ratio)
            tiles, grid = spatial_tiles(size, self.ratio, 0 if tiling == "off" else self.tile, self.min_overlap,
                                        True, "stitch" if tiling == "stitch" else "blend")
            return Plan(3, pixel_frames(t), size, decode_chunks(t), tiles, grid)
        tiles, grid = spatial_tiles((h, w), self.ratio, self.tile, self.min_overlap, False, "stitch")
        return Plan(self.channels, latent_frames(t), (h // self.ratio, w // self.ratio), encode_chunks(t), tiles, grid)


def capabilities(cfg: MiniMaxConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=cfg.spatial_ratio, temporal_ratio=RT,
        value_range=(0.0, 1.0), has_attention=cfg.has_decoder, norm="groupnorm_frame",
        posterior=True, can_encode=cfg.has_encoder, can_decode=cfg.has_decoder,
        default_tile=cfg.tile, default_overlap=cfg.min_overlap, default_tile_frames=CLIP + CHUNK,
        default_overlap_frames=FADE, decode_options=("tiling",),
        working_dtypes=(torch.float16, torch.float32),
        own_tiling=MiniMaxTiling(cfg.spatial_ratio, cfg.tile, cfg.min_overlap, cfg.latent_channels))


def describe(cfg: MiniMaxConfig) -> str:
    notes = [f"int8 decoder ({len(cfg.quantized)} layers, int8 matmuls)"] if cfg.quantized else []
    return spec.describe("MiniMax H3 video VAE", cfg.latent_channels, cfg.has_encoder, cfg.has_decoder, *notes)


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> MiniMaxConfig:
    return MiniMaxConfig(**layout.config_fields(sd))


def with_tiles(cfg: MiniMaxConfig, tile: int, min_overlap: int) -> MiniMaxConfig:
    """The same model with other definition tiles (what diffusers' ``enable_tiling`` sizes change)."""
    return replace(cfg, tile=tile, min_overlap=min_overlap)


# the published VAE (MiniMax's model.safetensors, ComfyUI's MiniMaxH3VideoVAE()): blocks per encoder level and
# transformer blocks are counted from the keys, so a file without the last ones would load as a smaller model
KNOWN = KnownConfigs(
    parts={"MiniMax H3's encoder": dict(enc_widths=(128, 256, 256, 512, 512, 1024), enc_blocks=2,
                                        enc_down=(True,) * 4 + (False,) * 2, latent_channels=24),
           "MiniMax H3's decoder": dict(dec_dim=2048, dec_depth=36, dec_ff=8192, registers=4, patch=16,
                                        latent_channels=24)},
    blocks={"enc_blocks": ("resnet(s) per encoder level", "encoder.down.0.block.{i}"),
            "dec_depth": ("transformer block(s)", "decoder.transformer_blocks.{i}")})

SPEC = ArchSpec(id="minimax", name="MiniMax H3 VAE", detect=layout.detect, to_canonical=layout.to_canonical,
                config_from_state_dict=config_from_state_dict, build=MiniMaxH3VAE, capabilities=capabilities,
                describe=describe, complete_state_dict=layout.complete,
                priority=25, latent_hints=((24, 5, "MiniMax H3"),), known_configs=KNOWN)
