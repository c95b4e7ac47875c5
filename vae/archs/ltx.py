"""LTX-Video VAE (Lightricks) 0.9.0, 0.9.1, 0.9.5/0.9.7 and LTX-2 / LTX-2.3: 128 latent channels,
32x spatial (4x4 patches, then three 2x stages), 8x temporal, clips of 1 + 8k frames. No attention;
every norm is per voxel (RMS over channels, eps 1e-8; LayerNorm in the widening shortcuts), so tiles
and stream chunks see no foreign statistics.

Canonical layout and conversions: ltx_layout.py. The model is built from a list of blocks read off
the weights (the original's own description of the net), so one code path serves every version:
- 0.9.0: strided 3x3x3 convs down, plain depth-to-space up;
- 0.9.1: 0.9.0's encoder; a wider decoder conditioned on a timestep (adaLN in every resnet) with
  spatial noise injected after its convs, residual up-samplers that halve the width;
- 0.9.5+: space-to-depth down-samplers with a parameter-free residual; 0.9.1's decoder shape
  without noise injection;
- LTX-2 (2.0): 0.9.5's encoder and decoder shapes, the decoder as published without timestep
  conditioning (its up-samplers stay residual);
- LTX-2.3: narrower ends (the last down-sampler keeps its width), four up-samplers of which one
  is temporal only and one spatial only (``compress_time`` / ``compress_space``), none residual.

What the weights cannot tell (whether an up-sampler adds its input, which way each side pads, a
causal decoder) LTX-2 files carry in their safetensors metadata (``config`` -> ``vae``, read by the
original code and ComfyUI); files without it get the published values of the version their shapes
show. The load log (logger "VAEKit") says which setting came from where.

Conventions are ComfyUI's (VideoVAE.encode/decode) and the original's: encode returns the posterior
mean normalised with the per-channel statistics, (mean - mean_of_means) / std_of_means; decode
un-normalises first (diffusers' decode takes the un-normalised latent). For timestep-conditioned
decoders ``prepare_decode`` mixes seeded noise into the latent, z = (1 - s) z + s noise (ComfyUI:
unseeded, s = 0.025), and ``decode`` conditions on ``timestep`` (0.05) times the learned
``timestep_scale_multiplier``. The encoder is causal; the decoder pads time symmetrically
(non-causal) unless a file's metadata says ``causal_decoder``: an output frame then sees
``decoder_reach`` latent frames on either side, which is what makes temporal tiles approximate.

0.9.1's injected noise comes from a generator seeded from ``seed`` (diffusers draws it from the
global RNG, ComfyUI unseeded), so decodes repeat. It is drawn at each resnet's own size, so a tiled
decode draws different noise per tile (the noise is a small detail texture, scaled per channel)."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import LoadError
from ..noise import region_randn
from ..keymap import count_indices
from ..nn.causal import CausalConv3d, depth_to_space, space_to_depth
from ..nn.norm import ChannelLayerNorm, ChannelRMSNorm
from ..nn.resnet import ResnetBlock
from ..run import Seam, Streamable, boundary
from ..spec import ArchSpec, Capabilities
from . import ltx_layout
from .ltx_layout import MEAN, STD

log = logging.getLogger("VAEKit")

RMS_EPS = 1e-8            # PixelNorm / diffusers RMSNorm
LN_EPS = 1e-6             # the shortcut LayerNorm (resnet eps)
FREQ_DIM = 256            # sinusoidal timestep features
DEFAULT_TIMESTEP, DEFAULT_NOISE_SCALE = 0.05, 0.025   # ComfyUI's VideoVAE.decode
UP_STRIDE = (2, 2, 2)     # the strided convs of 0.9.0/0.9.1 encoders; their stride is not in the weights
# channels a resampler folds into (or out of) one voxel -> its stride (space-to-depth / depth-to-space)
FOLD_STRIDE = {8: (2, 2, 2), 4: (1, 2, 2), 2: (2, 1, 1)}
# the original's up-sampler names (metadata ``decoder_blocks``) -> stride; only compress_all has a residual
UP_BLOCKS = {"compress_all": (2, 2, 2), "compress_time": (2, 1, 1), "compress_space": (1, 2, 2)}
PADS = ("zeros", "reflect", "replicate")


def inject_seed(seed: int) -> int:
    """Seed of 0.9.1's injected-noise generator: derived from ``seed``, so that it is not the
    stream prepare_decode draws the latent noise from."""
    return (int(seed) + 0x9E3779B97F4A7C15) % 2 ** 64


@dataclass(frozen=True)
class Block:
    """One ``down_blocks.N`` / ``up_blocks.N`` of the original's block list.

    kind: "res" (``layers`` resnets at width cin), "res_xy" (one resnet cin -> cout), "down"
    (strided 3x3x3 conv, 0.9.0/0.9.1), "s2d" (space-to-depth down-sampler, 0.9.5+) or "up"
    (conv + depth-to-space; cout is the width after it). Resampler strides are read from how many
    channels they fold (``FOLD_STRIDE``)."""
    kind: str
    cin: int
    cout: int
    layers: int = 0
    stride: tuple[int, int, int] = UP_STRIDE
    noise: bool = False       # res: spatial noise after each conv (0.9.1 decoder)
    timestep: bool = False    # res: own timestep embedder, adaLN in its resnets (0.9.1+ decoder)
    residual: bool = False    # up: add the input's depth-to-space (0.9.1, 0.9.5, 2.0; not in the weights)


@dataclass(frozen=True)
class LTXConfig:
    latent_channels: int = 128
    patch_size: int = 4
    encoder: tuple[Block, ...] = ()     # empty: the file has no encoder
    encoder_out: int = 129              # latents + one log-variance shared by all channels
    decoder: tuple[Block, ...] = ()     # empty: no decoder
    timestep_conditioning: bool = False
    causal_decoder: bool = False        # as published; only an LTX-2 file's metadata can say otherwise
    # ComfyUI pads the decoder with reflect for files that carry no config (Lightricks' change, ComfyUI
    # #8930, July 2025), which is every 0.9.x VAE file users load; diffusers and LTX-Video 0.9.x pad with
    # zeros (set_decoder_padding(model, "zeros") for parity with them). Only frame borders differ.
    # LTX-2 as published: reflect (2.0), zeros (2.3); a file's metadata overrides both sides.
    decoder_spatial_pad: str = "reflect"
    encoder_spatial_pad: str = "zeros"
    version: str = "0.9.0"              # "0.9.0", "0.9.1", "0.9.5", "2.0", "2.3"; "0.9.0/0.9.1" (encoder only)
    in_channels: int = 3
    out_channels: int = 3
    # (setting, value, where it came from) for what the weights cannot tell: the load log; not the model
    sources: tuple[tuple[str, str, str], ...] = field(default=(), compare=False)

    @property
    def injects_noise(self) -> bool:
        return any(b.noise for b in self.decoder)

    @property
    def ltx2(self) -> bool:
        return self.version.startswith("2")


# ---- blocks ----------------------------------------------------------------------------------

def _conv_factory(causal: bool, spatial_pad: str = "zeros"):
    def conv(cin: int, cout: int, stride=1) -> CausalConv3d:
        return CausalConv3d(cin, cout, 3, stride, time_pad="causal" if causal else "symmetric",
                            spatial_pad=spatial_pad)
    return conv


def _rms(channels: int) -> nn.Module:
    return ChannelRMSNorm(channels, RMS_EPS)


class TimeEmbedder(nn.Module):
    """Sinusoidal features (256, cosines first) -> Linear -> SiLU -> Linear, under the names of
    PixArt-alpha's combined embedder that the checkpoints use (``timestep_embedder.linear_1/2``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.timestep_embedder = nn.Module()
        self.timestep_embedder.linear_1 = nn.Linear(FREQ_DIM, dim)
        self.timestep_embedder.linear_2 = nn.Linear(dim, dim)

    def forward(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        half = FREQ_DIM // 2
        freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(10000.0) / half))
        args = t.float()[:, None] * freqs
        feats = torch.cat([args.cos(), args.sin()], dim=-1).to(dtype)
        m = self.timestep_embedder
        return m.linear_2(F.silu(m.linear_1(feats)))


class ResBlock(ResnetBlock):
    """The shared norm-act-conv block with RMS norms, plus LTX's extras: a LayerNorm before the
    1x1x1 shortcut (``norm3``, ``conv_shortcut``), adaLN shift/scale from the timestep
    (``scale_shift_table``, 0.9.1+ decoders) and spatial noise, one (H, W) field per conv shared by
    all frames and scaled per channel (``per_channel_scale1/2``, 0.9.1 decoder)."""

    def __init__(self, cin: int, cout: int, conv, noise: bool = False, timestep: bool = False):
        super().__init__(cin, cout, conv=conv, shortcut=lambda i, o: None, norm=_rms)
        wide = cin != cout
        self.norm3 = ChannelLayerNorm(cin, eps=LN_EPS) if wide else None
        self.conv_shortcut = nn.Conv3d(cin, cout, 1) if wide else None
        self.per_channel_scale1 = nn.Parameter(torch.empty(cin, 1, 1)) if noise else None
        self.per_channel_scale2 = nn.Parameter(torch.empty(cin, 1, 1)) if noise else None
        self.scale_shift_table = nn.Parameter(torch.empty(4, cin)) if timestep else None

    @staticmethod
    def _noise(h: torch.Tensor, scale: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        field = region_randn(h.shape[-2:], gen, h).to(h)    # exact tiles: their part of the untiled field
        return h.add_((field * scale.to(h))[None, :, None])

    def forward(self, x: torch.Tensor, emb: Optional[torch.Tensor] = None,
                gen: Optional[torch.Generator] = None) -> torch.Tensor:
        h = self.norm1(x)
        if self.scale_shift_table is not None:
            ada = emb.unflatten(1, (4, -1)) + self.scale_shift_table.to(h)[None, :, :, None, None, None]
            shift1, scale1, shift2, scale2 = ada.unbind(1)
            h = h.mul_(1 + scale1).add_(shift1)
        h = self.conv1(F.silu(h, inplace=True))
        if self.per_channel_scale1 is not None:
            h = self._noise(h, self.per_channel_scale1, gen)
        h = self.norm2(h)
        if self.scale_shift_table is not None:
            h = h.mul_(1 + scale2).add_(shift2)
        h = self.conv2(F.silu(h, inplace=True))
        if self.per_channel_scale2 is not None:
            h = self._noise(h, self.per_channel_scale2, gen)
        skip = x if self.conv_shortcut is None else self.conv_shortcut(self.norm3(x))
        return h.add_(skip)


class ResGroup(nn.Module):
    """``layers`` resnets at one width (``res_blocks.N``); in 0.9.1+ decoders with their own
    timestep embedder feeding every resnet's adaLN."""

    def __init__(self, b: Block, conv):
        super().__init__()
        self.time_embedder = TimeEmbedder(4 * b.cin) if b.timestep else None
        self.res_blocks = nn.ModuleList(ResBlock(b.cin, b.cin, conv, b.noise, b.timestep) for _ in range(b.layers))

    def forward(self, x: torch.Tensor, t: Optional[torch.Tensor] = None,
                gen: Optional[torch.Generator] = None) -> torch.Tensor:
        emb = None
        if self.time_embedder is not None:
            emb = self.time_embedder(t, x.dtype).view(x.shape[0], -1, 1, 1, 1)
        for block in self.res_blocks:
            x = block(x, emb, gen)
        return x


class SpaceToDepthDown(Seam, Streamable, nn.Module):
    """0.9.5+ down-sampler: conv to cout/prod(stride) channels then space-to-depth, plus the input's
    space-to-depth averaged over groups of channels. A temporal stride first repeats the first
    frame (1 + 2k frames -> 1 + k); in a stream, only in the first chunk."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, cin: int, cout: int, stride: tuple[int, int, int], conv):
        super().__init__()
        self.stride = stride
        self.group = cin * math.prod(stride) // cout
        self.conv = conv(cin, cout // math.prod(stride))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first_chunk() and self.stride[0] == 2:        # the clip's (stream's) first chunk
            x = torch.cat([x[:, :, :1], x], dim=2)
        skip = space_to_depth(x, *self.stride).unflatten(1, (-1, self.group)).mean(2)
        return space_to_depth(self.conv(x), *self.stride).add_(skip)


class DepthToSpaceUp(Seam, Streamable, nn.Module):
    """Conv to prod(stride) * cout channels then depth-to-space; a temporal stride drops the first
    frame (t latents -> 2t - 1 frames), in a stream (causal decoders) only in the first chunk.
    ``residual`` adds the input's depth-to-space, repeated over channels up to cout."""

    exact_boundary = True     # nothing else is live across it: exact tiling may re-cut here

    def __init__(self, b: Block, conv):
        super().__init__()
        self.stride, self.residual = b.stride, b.residual
        self.repeats = b.cout * math.prod(b.stride) // b.cin
        self.conv = conv(b.cin, b.cout * math.prod(b.stride))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = depth_to_space(self.conv(x), *self.stride)
        if self.residual:
            y.unflatten(1, (self.repeats, -1)).add_(depth_to_space(x, *self.stride).unsqueeze(1))
        first = not self.recall(False)
        self.remember(True)
        return y[:, :, self.stride[0] - 1:] if first else y


def _block(b: Block, conv) -> nn.Module:
    if b.kind == "res":
        return ResGroup(b, conv)
    if b.kind == "res_xy":
        return ResBlock(b.cin, b.cout, conv)
    if b.kind == "down":
        return boundary(conv(b.cin, b.cout, stride=b.stride))
    if b.kind == "s2d":
        return SpaceToDepthDown(b.cin, b.cout, b.stride, conv)
    return DepthToSpaceUp(b, conv)


# Patches carry channels as (c, p_t, p_w, p_h): width before height, hence the transposes.
def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    return space_to_depth(x.transpose(3, 4), 1, p, p).transpose(3, 4)


def unpatchify(x: torch.Tensor, p: int) -> torch.Tensor:
    return depth_to_space(x.transpose(3, 4), 1, p, p).transpose(3, 4)


class Encoder(nn.Module):
    def __init__(self, cfg: LTXConfig):
        super().__init__()
        conv = _conv_factory(causal=True, spatial_pad=cfg.encoder_spatial_pad)
        self.patch_size = cfg.patch_size
        width = cfg.encoder[-1].cout
        self.conv_in = conv(cfg.in_channels * cfg.patch_size ** 2, cfg.encoder[0].cin)
        self.down_blocks = nn.ModuleList(_block(b, conv) for b in cfg.encoder)
        self.norm_out = _rms(width)
        self.conv_out = conv(width, cfg.encoder_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(patchify(x, self.patch_size))
        for block in self.down_blocks:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h), inplace=True))


def set_decoder_padding(model: nn.Module, mode: str, side: str = "decoder") -> None:
    """Switch the decoder's (or encoder's) spatial padding ("reflect": ComfyUI's for 0.9.x files;
    "zeros": diffusers' for 0.9.x)."""
    for m in getattr(model, side).modules():
        if isinstance(m, CausalConv3d):
            m.set_spatial_pad(mode)


class Decoder(nn.Module):
    def __init__(self, cfg: LTXConfig):
        super().__init__()
        conv = _conv_factory(cfg.causal_decoder, cfg.decoder_spatial_pad)
        self.patch_size = cfg.patch_size
        width = cfg.decoder[-1].cout
        self.conv_in = conv(cfg.latent_channels, cfg.decoder[0].cin)
        self.up_blocks = nn.ModuleList(_block(b, conv) for b in cfg.decoder)
        self.norm_out = _rms(width)
        self.conv_out = conv(width, cfg.out_channels * cfg.patch_size ** 2)
        if cfg.timestep_conditioning:
            self.timestep_scale_multiplier = nn.Parameter(torch.empty(()))
            self.last_time_embedder = TimeEmbedder(2 * width)
            self.last_scale_shift_table = nn.Parameter(torch.empty(2, width))

    def forward(self, z: torch.Tensor, t: Optional[torch.Tensor] = None,
                gen: Optional[torch.Generator] = None) -> torch.Tensor:
        h = self.conv_in(z)
        if t is not None:
            t = t * self.timestep_scale_multiplier.float()
        for block in self.up_blocks:
            h = block(h, t, gen) if isinstance(block, ResGroup) else block(h)
        h = self.norm_out(h)
        if t is not None:
            emb = self.last_time_embedder(t, h.dtype).view(h.shape[0], 2, -1, 1, 1, 1)
            shift, scale = (emb + self.last_scale_shift_table.to(h)[None, :, :, None, None, None]).unbind(1)
            h = h.mul_(1 + scale).add_(shift)
        return unpatchify(self.conv_out(F.silu(h, inplace=True)), self.patch_size)


class Statistics(nn.Module):
    """Per-channel latent statistics under the original's hyphenated buffer names."""

    def __init__(self, channels: int):
        super().__init__()
        self.register_buffer("mean-of-means", torch.empty(channels))
        self.register_buffer("std-of-means", torch.empty(channels))

    def _get(self, name: str, like: torch.Tensor) -> torch.Tensor:
        return self.get_buffer(name).to(like).view(1, -1, 1, 1, 1)

    def normalize(self, z: torch.Tensor) -> torch.Tensor:
        return (z - self._get("mean-of-means", z)) / self._get("std-of-means", z)

    def unnormalize(self, z: torch.Tensor) -> torch.Tensor:
        return z * self._get("std-of-means", z) + self._get("mean-of-means", z)


class LTXVideoVAE(nn.Module):
    """encode: clips (B, 3, 1 + 8k, H, W) in [-1, 1] -> normalised latents (B, 128, 1 + k, H/32, W/32);
    decode: the inverse, (B, 3, 1 + 8(t - 1), 32h, 32w), not clamped."""

    def __init__(self, cfg: LTXConfig):
        super().__init__()
        self.config = cfg
        if cfg.encoder:
            self.encoder = Encoder(cfg)
        if cfg.decoder:
            self.decoder = Decoder(cfg)
        self.per_channel_statistics = Statistics(cfg.latent_channels)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.encoder(x)[:, : self.config.latent_channels]     # the rest: log-variance
        return self.per_channel_statistics.normalize(mean)

    def prepare_decode(self, z: torch.Tensor, timestep: float = DEFAULT_TIMESTEP,
                       noise_scale: float = DEFAULT_NOISE_SCALE, seed: int = 0) -> torch.Tensor:
        """The whole-latent noise mix of timestep-conditioned decoders (once, before any tiling):
        z = (1 - s) z + s noise, noise from a CPU generator seeded with ``seed``."""
        if not self.config.timestep_conditioning or not noise_scale:
            return z
        gen = torch.Generator().manual_seed(int(seed) % 2 ** 64)
        noise = torch.randn(z.shape, generator=gen, dtype=torch.float32).to(z.device)
        return (z.float() * (1.0 - noise_scale) + noise * noise_scale).to(z.dtype)

    def decode(self, z: torch.Tensor, timestep: float = DEFAULT_TIMESTEP,
               noise_scale: float = DEFAULT_NOISE_SCALE, seed: int = 0) -> torch.Tensor:
        """``noise_scale`` belongs to prepare_decode (accepted here so one set of options serves both)."""
        z = self.per_channel_statistics.unnormalize(z)
        t = gen = None
        if self.config.timestep_conditioning:
            t = torch.as_tensor(timestep, dtype=torch.float32, device=z.device).reshape(-1)
            t = t.expand(z.shape[0]) if t.numel() == 1 else t
        if self.config.injects_noise:
            gen = torch.Generator().manual_seed(inject_seed(seed))
        return self.decoder(z, t, gen)


# ---- configuration from the weights (and an LTX-2 file's metadata) ---------------------------

def _blocks(sd, side: str) -> list[Block]:
    """The original's block list, read from canonical keys (strides filled in by the caller)."""
    keys = sd.keys()
    blocks = []
    for i in range(count_indices(keys, side)):
        p = f"{side}.{i}"
        if f"{p}.res_blocks.0.conv1.weight" in sd:
            c = sd[f"{p}.res_blocks.0.conv1.weight"].shape[0]
            blocks.append(Block("res", c, c, layers=count_indices(keys, f"{p}.res_blocks"),
                                noise=f"{p}.res_blocks.0.per_channel_scale1" in sd,
                                timestep=f"{p}.time_embedder.timestep_embedder.linear_1.weight" in sd))
        elif f"{p}.conv1.weight" in sd:
            w = sd[f"{p}.conv1.weight"]
            blocks.append(Block("res_xy", w.shape[1], w.shape[0]))
        elif f"{p}.conv.weight" in sd:               # s2d (encoder) / depth-to-space (decoder)
            w = sd[f"{p}.conv.weight"]
            kind = "s2d" if side.startswith("encoder") else "up"
            blocks.append(Block(kind, w.shape[1], w.shape[0]))
        elif f"{p}.weight" in sd:                    # strided conv (0.9.0/0.9.1 encoder)
            w = sd[f"{p}.weight"]
            blocks.append(Block("down", w.shape[1], w.shape[0]))
        else:
            raise LoadError(f"LTX VAE: block '{p}' is of no known kind.",
                            fix="the file may be damaged; please report it with the key list.")
    return blocks


def _fold(blocks: list[Block], widths_after: list[int], kind: str) -> tuple[Block, ...]:
    """Resamplers' strides and output widths: a space-to-depth conv emits cout / prod(stride)
    channels, a depth-to-space conv prod(stride) * cout, where cout is the next block's width."""
    for i, b in enumerate(blocks):
        if b.kind == kind:
            conv, width = b.cout, widths_after[i]
            folded = width // conv if kind == "s2d" else conv // width
            exact = (width % conv if kind == "s2d" else conv % width) == 0
            blocks[i] = dataclasses.replace(b, cout=width, stride=FOLD_STRIDE.get(folded, (0, 0, 0)) if exact
                                            else (0, 0, 0))
    return tuple(blocks)


def _encoder(sd) -> tuple[Block, ...]:
    blocks = _blocks(sd, "encoder.down_blocks")
    return _fold(blocks, [b.cin for b in blocks[1:]] + [sd["encoder.conv_out.weight"].shape[1]], "s2d")


def _decoder(sd) -> tuple[Block, ...]:
    blocks = _blocks(sd, "decoder.up_blocks")
    return _fold(blocks, [b.cin for b in blocks[1:]] + [sd["decoder.conv_out.weight"].shape[1]], "up")


def _ratios(blocks, kinds) -> tuple[int, int]:
    strides = [b.stride for b in blocks if b.kind in kinds]
    return 2 ** sum(s[1] == 2 for s in strides), 2 ** sum(s[0] == 2 for s in strides)


def _ups(blocks) -> list[Block]:
    return [b for b in blocks if b.kind == "up"]


def _version(encoder, decoder, timestep: bool, ltx2_file: bool) -> str:
    """The release these shapes are (2.0's shapes with timestep conditioning are 0.9.5's: the file's
    metadata tells them apart, the computation is the same)."""
    ups = _ups(decoder)
    if decoder:
        if all(b.stride == (2, 2, 2) for b in ups):
            if all(b.cin == b.cout for b in ups) and not timestep:
                return "0.9.0"
            if all(b.cin == 2 * b.cout for b in ups):
                if not timestep:
                    return "2.0"
                if any(b.noise for b in decoder):
                    return "0.9.1"
                return "2.0" if ltx2_file else "0.9.5"
        return "2.3"         # time-only / space-only up-samplers, or one that keeps its width
    downs = [b for b in encoder if b.kind == "s2d"]
    if not downs:
        return "0.9.0/0.9.1"
    if downs[-1].cin == downs[-1].cout:
        return "2.3"
    return "2.0" if ltx2_file else "0.9.5"


def _vae_metadata(metadata: Optional[Mapping[str, str]]) -> tuple[dict, bool]:
    """The ``vae`` part of a file's ``config`` metadata ({} if none), and whether the file is an
    LTX-2 one (its config also describes the audio VAE / vocoder, or it says ``model_version`` 2.x)."""
    raw = (metadata or {}).get("config")
    if not raw:
        return {}, False
    try:
        config = json.loads(raw)
    except ValueError as e:
        log.warning("LTX VAE: the file's 'config' metadata is not JSON (%s); using the weights and the "
                    "published values only", e)
        return {}, False
    vae_cfg = config.get("vae") if isinstance(config, dict) else None
    vae_cfg = vae_cfg if isinstance(vae_cfg, dict) else {}
    ltx2 = (isinstance(config, dict) and ("audio_vae" in config or "vocoder" in config)) \
        or str((metadata or {}).get("model_version", "")).startswith("2") or "decoder_base_channels" in vae_cfg
    return vae_cfg, ltx2


def _metadata_ups(vae_cfg: dict) -> Optional[list[tuple[tuple[int, int, int], bool]]]:
    """(stride, residual) of each up-sampler in execution order, from the metadata's block list (the
    original builds the decoder from it reversed; only ``compress_all`` takes ``residual``)."""
    blocks = vae_cfg.get("decoder_blocks", vae_cfg.get("blocks"))
    if not isinstance(blocks, list):
        return None
    ups = []
    for item in reversed(blocks):
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            return None
        name, params = item
        if name in UP_BLOCKS:
            residual = name == "compress_all" and isinstance(params, dict) and bool(params.get("residual", False))
            ups.append((UP_BLOCKS[name], residual))
    return ups


def _from_metadata(vae_cfg: dict, keys: tuple[str, ...], default, origin: str, check=None):
    """(value, where it came from) of the first of ``keys`` the metadata has, else ``default``."""
    for k in keys:
        if k in vae_cfg:
            value = vae_cfg[k]
            if check is not None and value not in check:
                raise LoadError(f"LTX VAE: the file's metadata says {k}={value!r}, which this pack does not "
                                f"implement (only {', '.join(map(repr, check))}).",
                                fix="please report the file; its weights cannot be run as its config says.")
            return value, f"metadata {k}"
    return default, origin


def config_from_state_dict(sd, name_hint: Optional[str] = None,
                           metadata: Optional[Mapping[str, str]] = None) -> LTXConfig:
    """Every shape from the weights; what they cannot tell from the file's metadata (``config`` ->
    ``vae``, as the original and ComfyUI read it), else the published value of the version the
    shapes show. Logged (logger "VAEKit")."""
    has_enc, has_dec = "encoder.conv_in.weight" in sd, "decoder.conv_in.weight" in sd
    if not (has_enc or has_dec):
        raise LoadError("LTX VAE file with neither encoder nor decoder weights.",
                        fix="load the VAE file (or the full checkpoint) itself.")
    vae_cfg, ltx2_file = _vae_metadata(metadata)
    if vae_cfg.get("_class_name", "CausalVideoAutoencoder") != "CausalVideoAutoencoder":
        raise LoadError(f"this LTX file's VAE is a {vae_cfg['_class_name']} (e.g. LTX-2.5's diffusion decoder), "
                        "not a convolutional autoencoder.", fix="load an LTX-Video 0.9.x / LTX-2 / LTX-2.3 VAE.")
    _from_metadata(vae_cfg, ("norm_layer",), "pixel_norm", "", check=("pixel_norm",))
    timestep = "decoder.timestep_scale_multiplier" in sd
    if "timestep_conditioning" in vae_cfg and has_dec and bool(vae_cfg["timestep_conditioning"]) != timestep:
        log.warning("LTX VAE: the file's metadata says timestep_conditioning=%s but its weights %s a timestep "
                    "embedder; following the weights", vae_cfg["timestep_conditioning"],
                    "have" if timestep else "have no")
    if has_dec:
        latent = sd["decoder.conv_in.weight"].shape[1]
        patch = math.isqrt(sd["decoder.conv_out.weight"].shape[0] // 3)
    else:
        latent = sd[STD].shape[0] if STD in sd else sd["encoder.conv_out.weight"].shape[0] - 1
        patch = math.isqrt(sd["encoder.conv_in.weight"].shape[1] // 3)
    encoder = _encoder(sd) if has_enc else ()
    decoder = _decoder(sd) if has_dec else ()
    version = _version(encoder, decoder, timestep, ltx2_file)
    published = f"published {version}"
    sources = []

    ups = _ups(decoder)
    listed = _metadata_ups(vae_cfg)
    if listed is not None and [s for s, _ in listed] != [b.stride for b in ups]:
        log.warning("LTX VAE: the file's metadata lists up-samplers %s, its weights have %s; following the "
                    "weights", [s for s, _ in listed], [b.stride for b in ups])
        listed = None
    if listed is not None:
        residual, origin = [r for _, r in listed], "metadata decoder_blocks"
    else:     # 0.9.1, 0.9.5, 2.0: three (2, 2, 2) up-samplers halving the width, all residual
        residual = [all(b.stride == (2, 2, 2) and b.cin == 2 * b.cout for b in ups)] * len(ups)
        origin = published
    it = iter(residual)
    decoder = tuple(dataclasses.replace(b, residual=next(it)) if b.kind == "up" else b for b in decoder)
    causal, causal_origin = _from_metadata(vae_cfg, ("causal_decoder",), False, published)
    # the original reads "spatial_padding_mode" for both sides, before the per-side keys
    dec_pad, dec_origin = _from_metadata(vae_cfg, ("spatial_padding_mode", "decoder_spatial_padding_mode"),
                                         "zeros" if version == "2.3" else "reflect",
                                         published if version.startswith("2") else "ComfyUI's default", check=PADS)
    enc_pad, enc_origin = _from_metadata(vae_cfg, ("spatial_padding_mode", "encoder_spatial_padding_mode"),
                                         "zeros", published, check=PADS)
    if has_dec:
        shown = "all" if all(residual) else "none" if not any(residual) else ",".join(map(str, residual))
        sources += [("residual up-samplers", shown, origin),
                    ("causal decoder", str(bool(causal)), causal_origin),
                    ("decoder padding", dec_pad, dec_origin)]
    if has_enc:
        sources.append(("encoder padding", enc_pad, enc_origin))
    cfg = LTXConfig(
        latent_channels=latent, patch_size=patch, encoder=encoder,
        encoder_out=sd["encoder.conv_out.weight"].shape[0] if has_enc else latent + 1,
        decoder=decoder, timestep_conditioning=timestep, causal_decoder=bool(causal),
        decoder_spatial_pad=dec_pad, encoder_spatial_pad=enc_pad, version=version, sources=tuple(sources))
    _check(cfg)
    log.info("%s. From the weights: patch %d, %s. Not in the weights: %s", describe(cfg), patch, _shape_summary(cfg),
             "; ".join(f"{name} {value} ({where})" for name, value, where in cfg.sources))
    return cfg


def _shape_summary(cfg: LTXConfig) -> str:
    parts = []
    for side, blocks, kinds in (("encoder", cfg.encoder, ("down", "s2d")), ("decoder", cfg.decoder, ("up",))):
        if blocks:
            strides = ",".join("".join(map(str, b.stride)) for b in blocks if b.kind in kinds)
            parts.append(f"{side} {len(blocks)} blocks, widths {blocks[0].cin}-{blocks[-1].cout}, strides {strides}")
    parts.append(f"timestep conditioning {'on' if cfg.timestep_conditioning else 'off'}")
    return ", ".join(parts)


def _check(cfg: LTXConfig) -> None:
    """Refuse what cannot be run as its weights and config say, rather than guess."""
    problems = []
    for side, blocks, kinds in (("encoder", cfg.encoder, ("down", "s2d")), ("decoder", cfg.decoder, ("up",))):
        if any(b.kind in kinds and b.stride == (0, 0, 0) for b in blocks):
            problems.append(f"a {side} resampler folds its channels in a way no LTX VAE does")
    if cfg.encoder and cfg.decoder and _ratios(cfg.encoder, ("down", "s2d")) != _ratios(cfg.decoder, ("up",)):
        problems.append("its encoder and decoder compress by different factors")
    if cfg.ltx2 and any(b.kind == "res_xy" for b in cfg.encoder + cfg.decoder):
        # no published LTX-2 VAE has one; the original normalises their shortcut over the whole clip
        # (GroupNorm, 1 group), diffusers per voxel (LayerNorm): no reference to follow
        problems.append("it has width-changing resnets, which no published LTX-2 VAE has")
    if problems:
        raise LoadError(f"this LTX VAE cannot be run as published code runs it: {'; '.join(problems)}.",
                        fix="LTX-Video 0.9.0-0.9.7, LTX-2 and LTX-2.3 VAEs are supported; please report the file.")


def decoder_reach(cfg: LTXConfig) -> int:
    """How many latent frames on either side of its own can change an output frame of the
    non-causal decoder: each 3-frame conv sees one more frame at its own frame rate (1/f latent
    frames after time up-samplers totalling f), rounded up (tests measure it by moving one latent
    frame). Temporal tiles and frame-wise chunks are exact only for frames more than this far from a
    tile edge; 0 for a causal decoder (no look-ahead)."""
    if cfg.causal_decoder:
        return 0
    rate, reach = 1, 1.0                           # conv_in
    for b in cfg.decoder:
        if b.kind == "res":
            reach += 2 * b.layers / rate
        elif b.kind == "res_xy":
            reach += 2 / rate
        elif b.kind == "up":
            reach += 1 / rate                      # its conv runs before the frames double
            rate *= b.stride[0]
    return math.ceil(reach + 1 / rate)             # conv_out


def complete_state_dict(sd: dict, cfg: LTXConfig) -> dict:
    """Files without statistics (none published) get the identity: latents are then raw."""
    if MEAN not in sd and STD not in sd:
        sd = {**sd, MEAN: torch.zeros(cfg.latent_channels), STD: torch.ones(cfg.latent_channels)}
    return sd


def capabilities(cfg: LTXConfig) -> Capabilities:
    if cfg.encoder:
        s, t = _ratios(cfg.encoder, ("down", "s2d"))
    else:
        s, t = _ratios(cfg.decoder, ("up",))
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=cfg.patch_size * s, temporal_ratio=t,
        image_channels=cfg.out_channels, has_attention=False, norm="rms",
        # the decoder is not causal as published; a causal one (LTX-2 metadata) streams, unless its
        # injected noise (0.9.1) would be drawn per chunk
        causal_encoder=True, causal_decoder=cfg.causal_decoder, stream_encode=True,
        stream_decode=cfg.causal_decoder and not cfg.injects_noise,
        can_encode=bool(cfg.encoder), can_decode=bool(cfg.decoder),
        default_tile=512, default_overlap=64, default_tile_frames=64, default_overlap_frames=16,
        decode_options=("timestep", "noise_scale", "seed") if cfg.timestep_conditioning else (),
        working_dtypes=(torch.bfloat16, torch.float32))


def describe(cfg: LTXConfig) -> str:
    if cfg.ltx2:
        name = f"LTX-{cfg.version}"
    else:
        name = f"LTX-Video {({'0.9.5': '0.9.5/0.9.7'}.get(cfg.version, cfg.version))}"
    extra = ", timestep-conditioned decoder" if cfg.timestep_conditioning else ""
    extra += ", causal decoder" if cfg.causal_decoder else ""
    if cfg.version == "0.9.5" and not cfg.decoder:
        extra += "; LTX-2.0's encoder has the same shapes"
    return f"{name} VAE ({cfg.latent_channels} latent channels{extra})"


SPEC = ArchSpec(id="ltx", name="LTX-Video / LTX-2 VAE", detect=ltx_layout.detect,
                to_canonical=ltx_layout.to_canonical, config_from_state_dict=config_from_state_dict,
                build=LTXVideoVAE, capabilities=capabilities, describe=describe,
                complete_state_dict=complete_state_dict, reads_metadata=True,
                priority=70, latent_hints=((128, 5, "LTX-Video/LTX-2"),))
