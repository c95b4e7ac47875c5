"""Mage-VAE (Microsoft Mage-Flow's image VAE): a symmetric one-step diffusion codec, 16x, 128 latent
channels in the Flux.2-VAE-anchored space (no packing, no normalisation: the LATENT is the raw
posterior mean, as core's sampler takes it; Mage-Flow's latent format holds the statistics).

encode: the DConv encoder, one step at t=0 on zero latent noise: a 16x16 patch embedding, two
plain DiCo blocks, then DiCo blocks modulated by the t=0 embedding; the first half of its output is
the posterior mean (the second, the log-variance, is unused: core and this pack take the mean; the
original pipeline samples it). decode: the CoD decoder (conv, GroupNorm resnets and attention in
32x32 latent windows) turns the latent into the denoiser's condition; the DConv denoiser runs once at
t=0 on a zero image: DiCo blocks at latent resolution, then a per-patch pixel MLP (a NeRF-style
position embedding of each 16x16 patch, adaLN MLP blocks, RMSNorm, linear) gives the pixels. No noise
is drawn anywhere (the original, core and the diffusers PR agree), so there is nothing to seed.

Where tiles meet (vae/engine/exact.py): the windowed attention runs on the whole latent (``exact_whole``,
its windows are aligned to the whole image and replicate-pad only at its bottom/right edge); the DiCo
blocks' channel gate pools the whole image (``ChannelMean``: a whole-tensor statistic, shared by
exact tiles as GroupNorm's are); resnets and DiCo blocks are re-cut points at latent resolution.
A re-cut carries one tensor, so the denoiser's DiCo blocks carry the condition along as extra
channels (the pixel MLP needs it beside their output, aligned). The pixel MLP is local to each patch:
it runs in chunks of latent pixels, so its per-pixel activations (the bulk of a decode's memory in
the reference) never exist for the whole image at once.

Layouts: mage_layout.py. Every width and depth is read from the weights; the attention window (32),
the GroupNorm (32 groups, eps 1e-6) and the LayerNorm/RMSNorm eps (1e-6) are not in them."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import LoadError
from ..files.keymap import count_indices
from ..nn import posterior as gaussian
from ..nn.attention import SpatialSelfAttention
from ..nn.norm import ChannelLayerNorm, ChannelMean, GroupNorm
from ..nn.resnet import ResnetBlock, conv2d_3x3
from ..run import Seam
from ..spec import ArchSpec, Capabilities, KnownConfigs
from . import mage_layout
from .mage_layout import COD, DEC, ENC

GROUPS, EPS = 32, 1e-6            # CoD GroupNorms; LayerNorms and the RMSNorm use EPS too
WINDOW = 32                       # CoD attention window, latent pixels
MAX_PERIOD = 10000                # timestep embedding
HEAD_CHUNK = 512                  # latent pixels (patches of 16x16 pixels) per pixel-MLP chunk


@dataclass(frozen=True)
class EncoderConfig:
    image_channels: int
    patch: int
    head: int                     # width of the patch embedding and the plain DiCo blocks
    head_blocks: int
    head_ffn: int
    hidden: int
    blocks: int
    ffn: int
    out_channels: int             # mean and log-variance
    freq: int                     # timestep embedding size


@dataclass(frozen=True)
class DecoderConfig:
    image_channels: int
    patch: int
    bottleneck: int               # the zero image's patch embedding, concatenated with the condition
    hidden: int                   # DiCo width = the condition's width
    blocks: int
    ffn: int
    pixel: int                    # the pixel MLP's width
    pixel_blocks: int
    freqs: int                    # position frequencies per axis of a patch
    freq: int
    cod: tuple[str, ...]          # the CoD decoder's blocks: "resnet" / "attention"


@dataclass(frozen=True)
class MageConfig:
    latent_channels: int
    encoder: Optional[EncoderConfig]
    decoder: Optional[DecoderConfig]

    @property
    def patch(self) -> int:
        return (self.encoder or self.decoder).patch

    @property
    def image_channels(self) -> int:
        return (self.encoder or self.decoder).image_channels


# ---- blocks -------------------------------------------------------------------------------------

class TimestepEmbedder(nn.Module):
    """Sinusoidal embedding (cos half, then sin half) of t, then Linear-SiLU-Linear (keys ``mlp.0``, ``mlp.2``)."""

    def __init__(self, hidden: int, freq: int):
        super().__init__()
        self.freq = freq
        self.mlp = nn.Sequential(nn.Linear(freq, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        half = self.freq // 2
        freqs = torch.exp(-math.log(MAX_PERIOD) * torch.arange(half, dtype=torch.float32) / half).to(t.device)
        args = t[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if self.freq % 2:
            emb = F.pad(emb, (0, 1))
        return self.mlp(emb.to(dtype))


def t0_embedding(embedder: TimestepEmbedder, like: torch.Tensor) -> torch.Tensor:
    """The t=0 embedding, one row: every image of a batch shares it (the DiCo blocks broadcast it)."""
    return embedder(torch.zeros(1, device=like.device), like.dtype)


class DiCoBlock(Seam, nn.Module):
    """DiCo block: LayerNorm, 1x1 conv, depthwise 3x3 conv, GELU, a channel gate (sigmoid of a 1x1
    conv of the image mean), 1x1 conv, residual; then LayerNorm, 1x1 conv FFN, residual. ``modulated``:
    both LayerNorms have no affine and are shifted/scaled, and both branches gated, by adaLN of the
    timestep embedding (keys ``adaLN_modulation.1``); otherwise the LayerNorms are affine.

    Channels of ``x`` beyond the block's width are carried through unchanged (see DConvDenoiser)."""

    exact_boundary = "coarse"     # chained at latent resolution: exact tiling re-cuts here (vae/engine/exact.py)

    def __init__(self, width: int, ffn: int, modulated: bool):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, groups=width)
        self.conv3 = nn.Conv2d(width, width, 1)
        self.ca = nn.Sequential(ChannelMean(width), nn.Conv2d(width, width, 1), nn.Sigmoid())
        self.conv4 = nn.Conv2d(width, ffn, 1)
        self.conv5 = nn.Conv2d(ffn, width, 1)
        self.norm1 = ChannelLayerNorm(width, eps=EPS, elementwise_affine=not modulated)
        self.norm2 = ChannelLayerNorm(width, eps=EPS, elementwise_affine=not modulated)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width)) if modulated else None

    def forward(self, x: torch.Tensor, c: Optional[torch.Tensor] = None) -> torch.Tensor:
        n = self.conv1.in_channels
        if x.shape[1] > n:
            return torch.cat([self._block(x[:, :n], c), x[:, n:]], dim=1)
        return self._block(x, c)

    def _block(self, x: torch.Tensor, c: Optional[torch.Tensor]) -> torch.Tensor:
        if self.adaLN_modulation is None:
            h = self._mix(self.norm1(x))
            x = x + h
            return x + self._ffn(self.norm2(x))
        shift1, scale1, gate1, shift2, scale2, gate2 = (
            m[:, :, None, None] for m in self.adaLN_modulation(c).chunk(6, dim=1))
        h = self._mix(self.norm1(x) * (1 + scale1) + shift1)
        x = x + gate1 * h
        return x + gate2 * self._ffn(self.norm2(x) * (1 + scale2) + shift2)

    def _mix(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2(self.conv1(x)))
        return self.conv3(x * self.ca(x))

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv5(F.gelu(self.conv4(x)))


class WindowAttention(SpatialSelfAttention):
    """Single-head attention inside windows of ``window`` x ``window`` positions aligned at the top
    left of the whole map; q/k/v are replicate-padded at the bottom/right to whole windows, and the
    padded copies take part. Keys as SpatialSelfAttention (``norm q k v proj_out``); exact tiling runs
    it on the whole latent (``exact_whole``, inherited), so the windows are the whole image's."""

    def __init__(self, channels: int, window: int = WINDOW):
        super().__init__(channels, GROUPS, EPS)
        self.window = window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        d = self.window
        hn = self.norm(x)
        parts = self.qkv(hn).chunk(3, dim=1) if self.qkv is not None else (self.q(hn), self.k(hn), self.v(hn))
        ph, pw = -h % d, -w % d
        if ph or pw:
            parts = [F.pad(p, (0, pw, 0, ph), mode="replicate") for p in parts]
        nh, nw = (h + ph) // d, (w + pw) // d
        # (B * windows, 1, d*d, C), contiguous (see SpatialSelfAttention)
        q, k, v = (p.reshape(b, c, nh, d, nw, d).permute(0, 2, 4, 3, 5, 1).reshape(b * nh * nw, 1, d * d, c)
                   .contiguous() for p in parts)
        out = F.scaled_dot_product_attention(q, k, v)
        out = out.reshape(b, nh, nw, d, d, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, nh * d, nw * d)
        return x + self.proj_out(out[:, :, :h, :w])


class CoDDecoder(nn.Module):
    """Latent -> the denoiser's condition: conv, resnets and window attentions (``block``), GroupNorm,
    SiLU, conv."""

    def __init__(self, latent: int, width: int, kinds: tuple[str, ...]):
        super().__init__()
        self.conv_in = conv2d_3x3(latent, width)
        self.block = nn.Sequential(*(WindowAttention(width) if k == "attention" else ResnetBlock(width, width, GROUPS, EPS)
                                     for k in kinds))
        self.norm_out = GroupNorm(GROUPS, width, eps=EPS)
        self.conv_out = conv2d_3x3(width, width)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.conv_out(F.silu(self.norm_out(self.block(self.conv_in(z)))))


class DConvEncoder(nn.Module):
    """Image in [-1, 1] -> the posterior's moments (mean: the first ``latent`` output channels, then the
    log-variance)."""

    def __init__(self, cfg: EncoderConfig, latent: int):
        super().__init__()
        self.latent = latent
        self.patch_cond_embed = nn.Conv2d(cfg.image_channels, cfg.head, cfg.patch, stride=cfg.patch)
        self.head_blocks = nn.ModuleList(DiCoBlock(cfg.head, cfg.head_ffn, False) for _ in range(cfg.head_blocks))
        self.proj_down = nn.Conv2d(cfg.head, cfg.hidden, 1)
        self.z_proj = nn.Conv2d(latent, cfg.hidden, 1)
        self.fuse_proj = nn.Conv2d(2 * cfg.hidden, cfg.hidden, 1)
        self.t_embedder = TimestepEmbedder(cfg.hidden, cfg.freq)
        self.blocks = nn.ModuleList(DiCoBlock(cfg.hidden, cfg.ffn, True) for _ in range(cfg.blocks))
        self.norm_out = ChannelLayerNorm(cfg.hidden, eps=EPS)
        self.proj_out = nn.Conv2d(cfg.hidden, cfg.out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patch_cond_embed(x)
        for block in self.head_blocks:
            h = block(h)
        h = self.proj_down(h)
        # one step at t=0 from zero latent noise (made at this map's size: exact tiles resize it)
        z_t = h.new_zeros(h.shape[0], self.latent, *h.shape[2:])
        s = self.fuse_proj(torch.cat([h, self.z_proj(z_t)], dim=1))
        c = t0_embedding(self.t_embedder, s)
        for block in self.blocks:
            s = block(s, c)
        return self.proj_out(self.norm_out(s))


class NerfEmbedder(nn.Module):
    """Per patch position: the features and a 2-D cosine basis (``freqs`` x ``freqs``, weighted
    1/(1 + fx*fy)), through a Linear (key ``embedder.0``)."""

    def __init__(self, cin: int, width: int, freqs: int):
        super().__init__()
        self.freqs = freqs
        self.embedder = nn.Sequential(nn.Linear(cin + freqs ** 2, width))

    def basis(self, patch: int, like: torch.Tensor) -> torch.Tensor:
        """[1, patch*patch, freqs^2] in ``like``'s dtype (the reference computes it in that dtype)."""
        kw = dict(device=like.device, dtype=like.dtype)
        pos = torch.linspace(0, 1, patch, **kw)
        pos_y, pos_x = torch.meshgrid(pos, pos, indexing="ij")
        f = torch.linspace(0, self.freqs, self.freqs, **kw)
        fx, fy = f[None, :, None], f[None, None, :]
        cos_x = torch.cos(pos_x.reshape(-1, 1, 1) * fx * torch.pi)
        cos_y = torch.cos(pos_y.reshape(-1, 1, 1) * fy * torch.pi)
        return (cos_x * cos_y * (1 + fx * fy) ** -1).reshape(1, -1, self.freqs ** 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, p2, _ = x.shape
        basis = self.basis(math.isqrt(p2), x).expand(n, -1, -1)
        return self.embedder(torch.cat([x, basis], dim=-1))


class PixelBlock(nn.Module):
    """x + gate * MLP(LayerNorm(x) * (1 + scale) + shift), shift/scale/gate from the patch's condition."""

    def __init__(self, width: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=EPS)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(self.in_ln(x) * (1 + scale) + shift)


class PixelMLP(nn.Module):
    """The patch's condition (Linear to one vector per pixel) modulates MLP blocks over the pixels."""

    def __init__(self, width: int, cond: int, blocks: int, patch: int):
        super().__init__()
        self.cond_embed = nn.Linear(cond, patch * patch * width)
        self.input_proj = nn.Linear(width, width)
        self.res_blocks = nn.ModuleList(PixelBlock(width) for _ in range(blocks))

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        x = self.input_proj(x)
        y = self.cond_embed(s).reshape(x.shape)
        for block in self.res_blocks:
            x = block(x, y)
        return x


class RMSNorm(nn.Module):
    """x / rms(x) over the last axis, computed in fp32, then scaled (key ``weight``)."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = x.float()
        return self.weight * (f * torch.rsqrt(f.square().mean(-1, keepdim=True) + EPS)).to(x.dtype)


class FinalLayer(nn.Module):
    def __init__(self, width: int, cout: int):
        super().__init__()
        self.norm = RMSNorm(width)
        self.linear = nn.Linear(width, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x))


class BottleneckPatchEmbed(nn.Module):
    def __init__(self, cin: int, bottleneck: int, hidden: int, patch: int):
        super().__init__()
        self.proj1 = nn.Conv2d(cin, bottleneck, patch, stride=patch, bias=False)
        self.proj2 = nn.Conv2d(bottleneck + hidden, hidden, 1)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.proj2(torch.cat([self.proj1(x), cond], dim=1))


class DConvDenoiser(nn.Module):
    """Latent -> image in [-1, 1]: one denoising step at t=0 from a zero image (``x_t``), conditioned
    on the CoD decoder's output."""

    def __init__(self, cfg: DecoderConfig, latent: int):
        super().__init__()
        self.patch, self.channels = cfg.patch, cfg.image_channels
        self.t_embedder = TimestepEmbedder(cfg.hidden, cfg.freq)
        self.y_embedder_x = nn.Conv2d(cfg.hidden, cfg.pixel * cfg.patch ** 2, 1)
        self.x_embedder = NerfEmbedder(cfg.image_channels + cfg.pixel, cfg.pixel, cfg.freqs)
        self.s_embedder = BottleneckPatchEmbed(cfg.image_channels, cfg.bottleneck, cfg.hidden, cfg.patch)
        self.blocks = nn.ModuleList(DiCoBlock(cfg.hidden, cfg.ffn, True) for _ in range(cfg.blocks))
        self.dec_net = PixelMLP(cfg.pixel, cfg.hidden, cfg.pixel_blocks, cfg.patch)
        self.final_layer = FinalLayer(cfg.pixel, cfg.image_channels)
        self.y_embedder = nn.Module()
        self.y_embedder.decoder = CoDDecoder(latent, cfg.hidden, cfg.cod)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        cond = self.y_embedder.decoder(z)
        p, (b, width, h, w) = self.patch, cond.shape
        x_t = cond.new_zeros(b, self.channels, h * p, w * p)
        c = t0_embedding(self.t_embedder, cond)
        # the condition rides along the DiCo blocks as extra channels: after exact tiling's re-cuts
        # it is still aligned with their output
        sc = torch.cat([self.s_embedder(x_t, cond), cond], dim=1)
        del x_t
        for block in self.blocks:
            sc = block(sc, c)
        s, cond = sc[:, :width], sc[:, width:]
        h, w = s.shape[2:]                     # an exact tile's extent changes at the re-cuts
        out = cond.new_empty(b, self.channels, h * p, w * p)
        rows = max(1, HEAD_CHUNK // w)
        for r in range(0, h, rows):
            out[:, :, r * p:(r + rows) * p] = self.pixels(s[:, :, r:r + rows], cond[:, :, r:r + rows])
        return out

    def pixels(self, s: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Rows of latent pixels -> their patches of pixels. Each patch sees only its own condition
        vector, its pixel features and the zero image's values there."""
        p, (b, width, h, w) = self.patch, s.shape
        n = h * w
        x_t = s.new_zeros(b, self.channels, h * p, w * p)
        x = torch.cat([F.unfold(x_t, p, stride=p), self.y_embedder_x(cond).flatten(2)], dim=1)
        x = x.reshape(b, -1, p * p, n).permute(0, 3, 2, 1).flatten(0, 1)    # [b*n, p*p, features]
        s = s.permute(0, 2, 3, 1).reshape(b * n, width)
        x = self.final_layer(self.dec_net(self.x_embedder(x), s))           # [b*n, p*p, channels]
        x = x.transpose(1, 2).reshape(b, n, -1).transpose(1, 2)
        return F.fold(x.contiguous(), (h * p, w * p), p, stride=p)


class MageVAE(nn.Module):
    """encode: pixels in [-1, 1] -> posterior mean [B, latent, H/16, W/16]; decode: the reverse."""

    def __init__(self, cfg: MageConfig):
        super().__init__()
        self.config = cfg
        if cfg.encoder is not None:
            self.dconv_encoder = DConvEncoder(cfg.encoder, cfg.latent_channels)
        if cfg.decoder is not None:
            self.decoder_model = DConvDenoiser(cfg.decoder, cfg.latent_channels)

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        moments, c = self.dconv_encoder(x), self.config.latent_channels
        return gaussian.from_moments(moments[:, :2 * c]) if posterior else moments[:, :c]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder_model(z)


# ---- configuration from the weights -------------------------------------------------------------

def _dico(sd, prefix: str) -> tuple[int, int]:
    """(count, ffn width) of the DiCo blocks under ``prefix``."""
    n = count_indices(sd.keys(), prefix)
    return n, (sd[f"{prefix}.0.conv4.weight"].shape[0] if n else 0)


def _encoder(sd) -> EncoderConfig:
    e = lambda k: sd[ENC + k]
    embed = e("patch_cond_embed.weight")
    heads, head_ffn = _dico(sd, ENC + "head_blocks")
    blocks, ffn = _dico(sd, ENC + "blocks")
    return EncoderConfig(image_channels=embed.shape[1], patch=embed.shape[-1], head=embed.shape[0], head_blocks=heads,
                         head_ffn=head_ffn, hidden=e("proj_down.weight").shape[0], blocks=blocks, ffn=ffn,
                         out_channels=e("proj_out.weight").shape[0], freq=e("t_embedder.mlp.0.weight").shape[1])


def _decoder(sd) -> DecoderConfig:
    d = lambda k: sd[DEC + k]
    proj1, pixel = d("s_embedder.proj1.weight"), d("dec_net.input_proj.weight").shape[0]
    blocks, ffn = _dico(sd, DEC + "blocks")
    cod = tuple("attention" if f"{COD}block.{i}.q.weight" in sd else "resnet"
                for i in range(count_indices(sd.keys(), COD + "block")))
    basis = d("x_embedder.embedder.0.weight").shape[1] - proj1.shape[1] - pixel
    if basis < 1 or math.isqrt(basis) ** 2 != basis:
        raise LoadError(f"the pixel embedder takes {basis} inputs beside the image and the pixel features, not a "
                        "square position basis.", fix="the file may be damaged; please report it with the key list.")
    return DecoderConfig(image_channels=proj1.shape[1], patch=proj1.shape[-1], bottleneck=proj1.shape[0],
                         hidden=d("y_embedder_x.weight").shape[1], blocks=blocks, ffn=ffn, pixel=pixel,
                         pixel_blocks=count_indices(sd.keys(), DEC + "dec_net.res_blocks"),
                         freqs=math.isqrt(basis), freq=d("t_embedder.mlp.0.weight").shape[1], cod=cod)


def config_from_state_dict(sd, name_hint: Optional[str] = None) -> MageConfig:
    has_enc, has_dec = ENC + "proj_out.weight" in sd, DEC + "dec_net.cond_embed.weight" in sd
    enc = _encoder(sd) if has_enc else None
    dec = _decoder(sd) if has_dec else None
    latents = {n for n in (sd[ENC + "z_proj.weight"].shape[1] if enc else None,
                           sd[COD + "conv_in.weight"].shape[1] if dec else None) if n}
    if len(latents) != 1 or (enc and dec and enc.patch != dec.patch):
        raise LoadError(f"this Mage-VAE file's encoder and decoder disagree (latent channels {sorted(latents)}, "
                        f"patch {enc and enc.patch} vs {dec and dec.patch}).",
                        fix="load a matching Mage-VAE file (e.g. mage_flow_vae_bf16.safetensors).")
    latent = latents.pop()
    if enc and enc.out_channels < latent:
        raise LoadError(f"the encoder gives {enc.out_channels} channels, fewer than the {latent} latent channels.",
                        fix="the file may be damaged; please report it with the key list.")
    return MageConfig(latent_channels=latent, encoder=enc, decoder=dec)


def capabilities(cfg: MageConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=cfg.patch, image_channels=cfg.image_channels,
        has_attention=cfg.decoder is not None and "attention" in cfg.decoder.cod, norm="groupnorm",
        can_encode=cfg.encoder is not None, can_decode=cfg.decoder is not None,
        posterior=cfg.encoder is not None and cfg.encoder.out_channels >= 2 * cfg.latent_channels,
        default_tile=1024, default_overlap=64, working_dtypes=(torch.bfloat16, torch.float32))


def describe(cfg: MageConfig) -> str:
    part = "" if cfg.encoder and cfg.decoder else (", decoder only" if cfg.decoder else ", encoder only")
    return f"Mage-VAE ({cfg.latent_channels} latent channels, {cfg.patch}x{part})"


# the published VAE (Mage-Flow's mage_flow_vae, ComfyUI's MageVAE()): DiCo and pixel-MLP blocks are counted from
# the keys, so a file without the last ones would load as a smaller model
KNOWN = KnownConfigs(
    parts={"Mage-VAE's encoder": {"encoder.patch": 16, "encoder.head": 768, "encoder.head_blocks": 2,
                                  "encoder.head_ffn": 3072, "encoder.hidden": 384, "encoder.blocks": 21,
                                  "encoder.ffn": 1536, "encoder.out_channels": 256, "encoder.freq": 256},
           "Mage-VAE's decoder": {"decoder.patch": 16, "decoder.bottleneck": 128, "decoder.hidden": 384,
                                  "decoder.blocks": 21, "decoder.ffn": 1536, "decoder.pixel": 32,
                                  "decoder.pixel_blocks": 3, "decoder.freqs": 8, "decoder.freq": 256}},
    blocks={"encoder.head_blocks": ("plain DiCo block(s)", ENC + "head_blocks.{i}"),
            "encoder.blocks": ("encoder DiCo block(s)", ENC + "blocks.{i}"),
            "decoder.blocks": ("decoder DiCo block(s)", DEC + "blocks.{i}"),
            "decoder.pixel_blocks": ("pixel-MLP block(s)", DEC + "dec_net.res_blocks.{i}")})

SPEC = ArchSpec(id="mage", name="Mage-VAE", detect=mage_layout.detect, to_canonical=mage_layout.to_canonical,
                config_from_state_dict=config_from_state_dict, build=MageVAE, capabilities=capabilities,
                describe=describe, priority=60, latent_hints=((128, 4, "Mage-Flow"),),
                known_configs=KNOWN)
