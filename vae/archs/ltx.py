"""LTX-Video VAE (Lightricks) 0.9.0, 0.9.1, 0.9.5/0.9.7 and LTX-2 / LTX-2.3: 128 latent channels,
32x spatial (4x4 patches, then three 2x stages), 8x temporal, clips of 1 + 8k frames. No attention;
every norm is per voxel (RMS over channels, eps 1e-8; LayerNorm in the widening shortcuts), so tiles
and stream chunks see no foreign statistics.

Canonical layout and conversions: ltx_layout.py; the configuration read from a file: ltx_config.py.
The model is built from a list of blocks read off the weights (the original's own description of
the net), so one code path serves every version:
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
global RNG, ComfyUI unseeded), so decodes repeat. It is drawn at each resnet's own size; a tile (fast or
exact) takes its part of the field an untiled decode draws (vae/nn/noise.py)."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..nn import posterior as gaussian
from ..nn.noise import region_randn
from ..nn.causal import CausalConv3d, depth_to_space, space_to_depth
from ..nn.norm import ChannelLayerNorm, ChannelRMSNorm
from ..nn.resnet import ResnetBlock
from ..nn.steps import chain
from ..run import Seam, Streamable, boundary
from ..spec import ArchSpec, Capabilities
from . import ltx_layout
from .ltx_config import (Block, LTXConfig, ratios, config_from_state_dict, decoder_reach,  # noqa: F401 (API)
                         describe)
from .ltx_layout import MEAN, STD

RMS_EPS = 1e-8            # PixelNorm / diffusers RMSNorm
LN_EPS = 1e-6             # the shortcut LayerNorm (resnet eps)
FREQ_DIM = 256            # sinusoidal timestep features
DEFAULT_TIMESTEP, DEFAULT_NOISE_SCALE = 0.05, 0.025   # ComfyUI's VideoVAE.decode


def inject_seed(seed: int) -> int:
    """Seed of 0.9.1's injected-noise generator: derived from ``seed``, so that it is not the
    stream prepare_decode draws the latent noise from."""
    return (int(seed) + 0x9E3779B97F4A7C15) % 2 ** 64


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

    def steps(self) -> list[nn.Module]:
        """Its resnets, where they need nothing but the map (``vae/nn/steps.py``: the encoder's); a group
        with a timestep or noise runs whole."""
        plain = self.time_embedder is None and all(b.per_channel_scale1 is None for b in self.res_blocks)
        return list(self.res_blocks) if plain else [self]

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
        for step in chain(*self.down_blocks):
            h = step(h)
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

    def latent(self, moments: torch.Tensor, cfg: LTXConfig, posterior: bool = False) -> torch.Tensor:
        """The encoder's output (``cfg.encoder_out`` channels) -> the normalised mean, or with
        ``posterior`` [mean; log-variance] (vae/nn/posterior.py) in the normalised latent's terms: the
        log-variance channel repeated for every latent channel ("uniform"), -30 ("constant": the
        original's stand-in for log 0), or one a channel ("per_channel")."""
        c = cfg.latent_channels
        mean = moments[:, :c]
        if not posterior:
            return self.normalize(mean)
        rest = moments[:, c:]
        logvar = {"uniform": lambda: rest[:, :1].expand_as(mean), "per_channel": lambda: rest,
                  "constant": lambda: torch.full_like(mean, gaussian.LOGVAR_RANGE[0])}[cfg.log_var]()
        return gaussian.normalised(gaussian.gaussian(mean, logvar), self.normalize, 1 / self._get("std-of-means", mean))

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

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        return self.per_channel_statistics.latent(self.encoder(x), self.config, posterior)

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


def complete_state_dict(sd: dict, cfg: LTXConfig) -> dict:
    """Files without statistics (none published) get the identity: latents are then raw."""
    if MEAN not in sd and STD not in sd:
        sd = {**sd, MEAN: torch.zeros(cfg.latent_channels), STD: torch.ones(cfg.latent_channels)}
    return sd


def capabilities(cfg: LTXConfig) -> Capabilities:
    if cfg.encoder:
        s, t = ratios(cfg.encoder, ("down", "s2d"))
    else:
        s, t = ratios(cfg.decoder, ("up",))
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=cfg.patch_size * s, temporal_ratio=t,
        image_channels=cfg.out_channels, has_attention=False, norm="rms",
        # the decoder is not causal as published; a causal one (LTX-2 metadata) streams, unless its
        # injected noise (0.9.1) would be drawn per chunk
        causal_encoder=True, causal_decoder=cfg.causal_decoder, stream_encode=True,
        stream_decode=cfg.causal_decoder and not cfg.injects_noise,
        posterior=True, can_encode=bool(cfg.encoder), can_decode=bool(cfg.decoder),
        default_tile=512, default_overlap=64, default_tile_frames=64, default_overlap_frames=16,
        decode_options=("timestep", "noise_scale", "seed") if cfg.timestep_conditioning else (),
        working_dtypes=(torch.bfloat16, torch.float32))


SPEC = ArchSpec(id="ltx", name="LTX-Video / LTX-2 VAE", detect=ltx_layout.detect,
                to_canonical=ltx_layout.to_canonical, config_from_state_dict=config_from_state_dict,
                build=LTXVideoVAE, capabilities=capabilities, describe=describe,
                complete_state_dict=complete_state_dict, reads_metadata=True,
                priority=70, latent_hints=((128, 5, "LTX-Video/LTX-2"),))
