"""Stable Video Diffusion's VAE (Stability-AI generative-models ``sgm/modules/autoencoding/temporal_ae.py``
with ``configs/inference/svd.yaml``; ComfyUI core ``comfy/ldm/modules/temporal_ae.py``; diffusers
``AutoencoderKLTemporalDecoder``): SD's KL encoder run frame by frame, and a decoder whose resnets
also mix frames. 4 latent channels, 8x spatial, no temporal compression (one latent frame a frame).

The decoder is the KL decoder (ldm.py) with, in every resnet, a temporal half after the image half:
``time_stack`` = GroupNorm over the clip (T*H*W, eps 1e-5), SiLU, a (k, 1, 1) conv, twice, plus its
input; the block's output is ``lerp(image half, temporal half, sigmoid(mix_factor))`` (the original's
"learned" merge). The output conv is followed by a (k, 1, 1) ``time_mix_conv``. Every 2-D part (convs,
per-frame GroupNorm, the mid-block attention, the up-samplers) runs frame by frame. k = 3 as published:
the time convs are zero-padded and see both neighbours (not causal), 29 of them in a row, and the
time stacks' GroupNorm is over the whole clip, so every output frame depends on every latent frame of
its clip. A clip is decoded in one pass; time is never cut into chunks (fast temporal tiles blend
overlapping clips: approximate). Exact spatial tiles: the temporal layers are 1x1 in space, so a tile
with its halo gives the untiled result once the clip GroupNorms' statistics are shared (vae/engine/exact.py).

What a clip is (the frames decoded together): here, each batch item of a [B, 4, T, h, w] latent;
ComfyUI's LATENT [T, 4, h, w] is one clip (``Capabilities.frames_in_batch``: the handle takes and
gives that layout). The original decodes the ``decoding_t`` frames it is given at a time as a clip
(its sampling script: 14; its model's default: all), diffusers ``decode_chunk_size`` (default: all),
core the frames that fit its free-memory estimate (all when they fit). docs/families/svd.md.

Conventions (as core's): raw latents (SVD's 0.18215 is the sampler's latent format); encode gives the
posterior mean. Key layouts (the original's = core's, diffusers'): svd_layout.py."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import nn

from .. import spec
from ..nn.attention import FrameSelfAttention
from ..nn.causal import frames, unframes
from ..nn.norm import FrameGroupNorm, GroupNorm
from ..nn.resnet import ResnetBlock, conv2d_1x1
from ..nn.sampling import Upsample2x
from ..spec import ArchSpec, Capabilities
from . import kl, ldm
from . import svd_layout as layout

GROUPS, EPS = kl.GROUPS, kl.EPS
TIME_EPS = 1e-5        # the time stacks' GroupNorm (the original's openaimodel ResBlock: torch's default)


@dataclass(frozen=True)
class SVDConfig(kl.KLConfig):
    time_kernel: int = 3          # frames a temporal conv spans: (k, 1, 1)


class FrameConv2d(nn.Conv2d):
    """A 2-D conv on every frame of (B, C, T, H, W) (the original's Conv2d on frames folded into the batch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return unframes(super().forward(frames(x)), x.shape[0])


def _time_conv(channels: int, kernel: int) -> nn.Conv3d:
    return nn.Conv3d(channels, channels, (kernel, 1, 1), padding=(kernel // 2, 0, 0))


class TimeStack(nn.Module):
    """GroupNorm over the clip, SiLU, (k, 1, 1) conv, twice, plus the input (keys as the original's
    ``in_layers.{0,2}``, ``out_layers.{0,3}``: ``out_layers.2`` was its dropout)."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        norm = lambda: GroupNorm(GROUPS, channels, eps=TIME_EPS)       # noqa: E731
        self.in_layers = nn.Sequential(norm(), nn.SiLU(inplace=True), _time_conv(channels, kernel))
        self.out_layers = nn.Sequential(norm(), nn.SiLU(inplace=True), nn.Identity(), _time_conv(channels, kernel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_layers(self.in_layers(x)).add_(x)


class VideoResnetBlock(ResnetBlock):
    """The KL resnet on every frame, then its temporal half, merged by ``sigmoid(mix_factor)``."""

    def __init__(self, cin: int, cout: int, groups: int = GROUPS, eps: float = EPS, conv=None, shortcut=None,
                 norm=None, *, kernel: int):
        # ResnetBlock's signature (ldm.Ops.block); the ops' frame-wise conv and norm are not taken: the
        # image half runs on the frames folded into the batch, with 2-D layers
        super().__init__(cin, cout, groups, eps)
        self.time_stack = TimeStack(cout, kernel)
        self.mix_factor = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = unframes(super().forward(frames(x)), x.shape[0])     # a fresh tensor: merged in place
        return h.lerp_(self.time_stack(h), torch.sigmoid(self.mix_factor))


class FrameUpsample(Upsample2x):
    """Nearest 2x and a 3x3 conv, frame by frame (key ``conv``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return unframes(super().forward(frames(x)), x.shape[0])


class TimeMixConv(FrameConv2d):
    """The decoder's output conv on every frame, then a (k, 1, 1) ``time_mix_conv`` across them."""

    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__(cin, cout, 3, padding=1)
        self.time_mix_conv = _time_conv(cout, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.time_mix_conv(super().forward(x))


def _decoder(cfg: SVDConfig) -> ldm.Decoder:
    k = cfg.time_kernel
    ops = ldm.Ops(conv=lambda i, o: FrameConv2d(i, o, 3, padding=1), shortcut=conv2d_1x1,
                  norm=lambda c: FrameGroupNorm(GROUPS, c, eps=EPS),
                  attention=lambda c: FrameSelfAttention(c, GROUPS, EPS) if cfg.mid_attention else None,
                  block=functools.partial(VideoResnetBlock, kernel=k))
    n_res = cfg.num_res_blocks if cfg.decoder_res_blocks is None else cfg.decoder_res_blocks
    return ldm.Decoder(cfg.decoder_widths or cfg.widths, n_res, cfg.z_channels, cfg.out_channels, ops,
                       upsample=lambda i, c: FrameUpsample(c) if i != 0 else None,
                       conv_out=lambda i, o: TimeMixConv(i, o, k))


class SVDVAE(ldm.Autoencoder):
    """encode: clips [B, 3, T, H, W] in [-1, 1] -> posterior means [B, 4, T, h, w], frame by frame;
    decode: [B, 4, T, h, w] -> [B, 3, T, H, W] in [-1, 1], each batch item one clip."""

    def __init__(self, cfg: SVDConfig):
        encoder, quant_conv = kl.encoder_half(cfg) if cfg.has_encoder else (None, None)
        super().__init__(encoder, _decoder(cfg) if cfg.has_decoder else None, quant_conv)
        self.config = cfg

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        return unframes(super().encode(frames(x), posterior), x.shape[0])


def config_from_state_dict(sd, name_hint=None) -> SVDConfig:
    base = dataclasses.asdict(kl.config_from_state_dict(sd, name_hint))
    kernel = layout.time_kernel(sd) if base["has_decoder"] else 3
    return SVDConfig(**base, time_kernel=kernel)


def capabilities(cfg: SVDConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.embed_dim or cfg.z_channels, spatial_ratio=2 ** (len(cfg.ch_mult) - 1),
        temporal_ratio=1, image_channels=cfg.out_channels, has_attention=cfg.mid_attention,
        norm="groupnorm_clip", causal_encoder=True, stream_encode=True, frames_in_batch=True,
        posterior=True, can_encode=cfg.has_encoder, can_decode=cfg.has_decoder)


def describe(cfg: SVDConfig) -> str:
    return spec.describe("Stable Video Diffusion VAE", cfg.embed_dim or cfg.z_channels, cfg.has_encoder,
                         cfg.has_decoder, "temporal decoder")


# before the KL family (60), whose detection declines temporal keys anyway (kl.detect)
SPEC = ArchSpec(id="svd", name="Stable Video Diffusion VAE", detect=layout.detect, to_canonical=layout.to_canonical,
                config_from_state_dict=config_from_state_dict, build=SVDVAE, capabilities=capabilities,
                describe=describe, priority=55, latent_hints=((4, 4, "SVD"),))
