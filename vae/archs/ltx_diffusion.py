"""LTX-2.5's video VAE (Lightricks; ComfyUI's ``CausalDiffusionVAE``, "LTX 2.4" in its code; diffusers'
``LTX2VideoDiffusionDecoderModel``): LTX-2.3's convolutional encoder and a diffusion decoder, 128
latent channels, 32x in space, 8x in time (t latents <-> 8t - 7 frames).

encode: LTX-2.3's encoder (vae/archs/ltx.py, its ``latent_log_var`` "constant": one log-variance
channel, dropped), the posterior mean normalised with the per-channel statistics, as LTX-2.3.

decode: the latent un-normalised, then
- stages 1-4: a linear embedding, neighbourhood-attention transformer blocks (published: widths 2048,
  1024, 512, 512; depths 4, 6, 4, 2; windows (3, 7, 7), (3, 7, 7), (3, 5, 5), (3, 5, 5)), each stage
  followed by a linear pixel shuffle ((1, 2, 2), (2, 1, 1), (2, 2, 2), (2, 2, 2); a temporal one drops
  its duplicated first frame). The last latent frame is repeated twice more through these stages and
  its frames cut off after them (the windows shift inward at the clip's end; the repeat keeps that
  shift off the frames kept). The result is the context, one token per 4x4 pixel patch.
- stage 5: Gaussian noise at pixel size, patchified and embedded, runs through diffusion blocks
  (published: 8, width 256, window 11^3) that add the context's projection, then attention and an MLP
  each scaled and shifted by the timestep (adaLN, shared plus a per-block table). One step at t = 1
  (timestep 1000) predicts x0, which is the image in [-1, 1]. More steps (a file's config) integrate
  with Euler steps as the reference does.

The noise is drawn from a CPU generator seeded with ``seed`` (default 0, never random) as
``randn([B, 3, T, H, W])``: ComfyUI draws the same field with a generator seeded 0 on the latent's
device, so a CPU decode here equals ComfyUI's CPU decode; on a GPU ComfyUI's noise differs (CUDA's
generator) and ours stays the CPU field. Exact tiles draw their part of the untiled field.

Neighbourhood attention (vae/nn/neighborhood.py) is local: a query sees a window of k positions per
axis, shifted inward at the map's borders, so an output pixel depends on inputs at most k // 2 map
pixels away per block (k - 1 at the borders, where the tile's edge is the map's). Exact tiles carry
that halo (``exact_reach``, ``exact_window``) and meet at every block (a separator at any resolution:
vae/engine/stages.py); positions for the rotary embedding are the whole map's.
Nothing is causal in time and time is never cut. Stage 5 carries its state and the context as one
tensor (channels [state, context]) so that a re-cut cuts both.

Layouts and the canonical one: ltx_diffusion_layout.py. Widths, depths, head size, patch size and
strides come from the weights; the windows, the step count and the timestep scale are not in them: a
file's ``config`` metadata (``vae`` -> ``decoder``, as ComfyUI reads it) or the published values."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import run as runstate
from ..errors import InputError, LoadError
from ..files.keymap import count_indices
from ..nn.neighborhood import neighborhood_attention
from ..nn.noise import region_origin, region_randn
from ..engine.receptive import SEPARATOR
from ..run import Seam
from ..spec import ArchSpec, Capabilities
from . import ltx, ltx_config, ltx_diffusion_layout
from .ltx_config import LTXConfig
from .ltx_layout import MEAN, STD

log = logging.getLogger("VAEKit")

EPS = 1e-6                  # every RMSNorm (blocks, q/k, output)
ROPE_BASE = 10000.0
TOKENS = 1 << 24            # elements of the widest per-token temporary (the MLP's hidden) at once
# published values of what the weights do not hold (ComfyUI's built-in config)
KERNELS = ((3, 7, 7), (3, 7, 7), (3, 5, 5), (3, 5, 5))
STAGE5_KERNEL = (11, 11, 11)
FOLD_STRIDE = {8: (2, 2, 2), 4: (1, 2, 2), 2: (2, 1, 1)}     # channels a pixel shuffle unfolds -> its stride


@dataclass(frozen=True)
class Stage:
    width: int
    depth: int
    hidden: int                         # the MLP's
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]        # the pixel shuffle after it
    out: int                            # width after the shuffle


@dataclass(frozen=True)
class DiffusionConfig:
    encoder: Optional[LTXConfig]        # LTX-2.3's encoder; None: a decoder-only file
    latent_channels: int
    stages: tuple[Stage, ...]           # stages 1-4
    width: int                          # stage 5
    depth: int
    hidden: int
    kernel: tuple[int, int, int]
    head_dim: int
    time_dim: int
    chunks: int = 7                     # adaLN chunks (scale/shift/gate x 2, a context gate; 4 used)
    patch_size: int = 4
    out_channels: int = 3
    steps: int = 1
    timestep_scale: float = 1000.0
    output: str = "x0"                  # what stage 5 predicts: "x0" or "v"
    sources: tuple[tuple[str, str, str], ...] = field(default=(), compare=False)

    @property
    def trailing_pad(self) -> int:
        """Latent frames repeated after the last (the first window's reach in time, both ways)."""
        return self.stages[0].kernel[0] // 2 * 2

    @property
    def temporal_ratio(self) -> int:
        return math.prod(s.stride[0] for s in self.stages)

    @property
    def spatial_ratio(self) -> int:
        return self.patch_size * math.prod(s.stride[1] for s in self.stages)


# ---- blocks (tokens channels-last; between blocks [B, C, T, H, W] views of channels-last storage) ----

def _chunks(n: int, per: int):
    for a in range(0, n, per):
        yield a, min(a + per, n)


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """[B, C, T, H, W] -> its tokens [B, T, H, W, C] (a view when stored channels-last)."""
    return x.permute(0, 2, 3, 4, 1).contiguous()


def _grid(tokens: torch.Tensor) -> torch.Tensor:
    return tokens.permute(0, 4, 1, 2, 3)


def add_linear(h: torch.Tensor, x: torch.Tensor, linear: nn.Linear) -> None:
    """``h += linear(x)`` for tokens [B, n, C], the product accumulated into ``h`` (one pass over it, no
    temporary)."""
    for hi, xi in zip(h, x):
        hi.addmm_(xi, linear.weight.t())
        if linear.bias is not None:
            hi.add_(linear.bias)


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return torch.addcmul(shift, x, 1.0 + scale)          # x * (1 + scale) + shift, one pass


class Rope:
    """Rotary embedding over (T, H, W): the head split into a quarter for time (even) and two halves
    for the rows and columns, consecutive pairs rotated by position x base^(-2i/d) of their axis, in
    fp32. Positions count from the whole map's origin (``origin``: the tile's offset in rows/columns).
    A pair is a complex number and its rotation one complex product (the same products and sums as
    the real form; measured 6x faster than rotating even and odd halves apart)."""

    def __init__(self, head_dim: int, grid: tuple[int, int, int], origin: tuple[int, int], device):
        d_t = head_dim // 4 // 2 * 2
        d_hw = (head_dim - d_t) // 2
        if d_hw % 2:
            d_t -= 2
            d_hw = (head_dim - d_t) // 2
        self.grid = grid
        self.tables = []
        for n, d, o in zip(grid, (d_t, d_hw, d_hw), (0, *origin)):
            inv = 1.0 / torch.tensor(ROPE_BASE, dtype=torch.float64) ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
            angle = torch.arange(o, o + n, dtype=torch.float32)[:, None] * inv.float()[None]
            self.tables.append(torch.complex(angle.cos(), angle.sin()).to(device))

    def turns(self, a: int, b: int) -> torch.Tensor:
        """The rotations of the tokens [a, b) of the grid in raster order: [1, n, 1, head_dim / 2]."""
        _, h, w = self.grid
        i = torch.arange(a, b, device=self.tables[0].device)
        rows = (i // (h * w), i // w % h, i % w)
        return torch.cat([t[r] for t, r in zip(self.tables, rows)], -1)[None, :, None]

    @staticmethod
    def rotate(x: torch.Tensor, turns: torch.Tensor, out: torch.Tensor) -> None:
        """``x`` [B, n, heads, dim] rotated by ``turns`` (``Rope.turns`` of its tokens) into ``out``
        (in place where both are fp32)."""
        pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
        if out.dtype == torch.float32:
            torch.mul(pairs, turns, out=torch.view_as_complex(out.unflatten(-1, (-1, 2))))
        else:
            out.copy_(torch.view_as_real(pairs * turns).flatten(-2))


class Attention(nn.Module):
    """Fused q/k/v, RMS-normed q and k (the query scaled by dim^-0.5), rotary positions, neighbourhood
    attention, output projection."""

    fused_qkv = True          # one projection already (vae/nn/qkv.py has nothing to fuse)

    def __init__(self, dim: int, head_dim: int, kernel: tuple[int, int, int]):
        super().__init__()
        self.head_dim, self.kernel = head_dim, kernel
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.q_norm = nn.RMSNorm(head_dim, eps=EPS)
        self.k_norm = nn.RMSNorm(head_dim, eps=EPS)

    def add_to(self, h: torch.Tensor, grid: tuple[int, int, int], pre: Callable, origin: tuple[int, int]) -> None:
        """``h`` [B, N, C] (the tokens of ``grid``) += attention(pre(h)), a chunk of tokens at a time
        but for the attention itself."""
        batch, n, dim = h.shape
        heads, hd = dim // self.head_dim, self.head_dim
        q, k, v = (h.new_empty(batch, n, heads, hd) for _ in range(3))
        qw = self.q_norm.weight * hd ** -0.5            # a power of two: the same as scaling after the norm
        kw = self.k_norm.weight
        rope = Rope(hd, grid, origin, h.device)
        per = max(1, TOKENS // (3 * dim))
        for a, b in _chunks(n, per):
            yq, yk, yv = self.qkv(pre(h[:, a:b])).unflatten(-1, (3, heads, hd)).unbind(2)
            turns = rope.turns(a, b)
            rope.rotate(F.rms_norm(yq, (hd,), qw.to(yq.dtype), EPS), turns, q[:, a:b])
            rope.rotate(F.rms_norm(yk, (hd,), kw.to(yk.dtype), EPS), turns, k[:, a:b])
            v[:, a:b] = yv
        shape = (batch, *grid, heads, hd)
        neighborhood_attention(q.view(shape), k.view(shape), v.view(shape), self.kernel, out=q.view(shape))  # into q
        del k, v
        for a, b in _chunks(n, per):
            add_linear(h[:, a:b], q[:, a:b].flatten(2), self.proj)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)

    def add_to(self, h: torch.Tensor, pre: Callable) -> None:
        for a, b in _chunks(h.shape[1], max(1, TOKENS // self.w_up.out_features)):
            s = pre(h[:, a:b])
            add_linear(h[:, a:b], F.silu(self.w_gate(s), inplace=True).mul_(self.w_up(s)), self.w_down)


class _Local(Seam, nn.Module):
    """A transformer block of neighbourhood attention: an exact tile re-cuts at its input and needs a
    halo of half the window (``exact_reach``: a query's window is centred on it away from the map's
    border); a window at the border shifts inward, k - 1 pixels from its query, which only a tile
    whose core lies within half a window of the border would miss: the engine keeps edge cores at least
    ``exact_window`` less the reach wide (vae/engine/exact.py). Every block is a separator at any
    resolution: tiles run one after the other meet here (a map of the block's input on the offload
    device), so a tile carries one block's halo, not that of every block up to the next
    latent-resolution point."""

    exact_boundary = SEPARATOR

    def _setup(self, dim: int, head_dim: int, kernel: tuple[int, int, int], hidden: int) -> None:
        self.norm1 = nn.RMSNorm(dim, eps=EPS)
        self.attn = Attention(dim, head_dim, kernel)
        self.norm2 = nn.RMSNorm(dim, eps=EPS)
        self.mlp = SwiGLU(dim, hidden)

    @property
    def exact_reach(self) -> tuple[int, int]:
        return self.attn.kernel[1] // 2, self.attn.kernel[2] // 2

    @property
    def exact_window(self) -> tuple[int, int]:
        return self.attn.kernel[1], self.attn.kernel[2]


class NABlock(_Local):
    """Pre-norm attention and MLP with residuals (stages 1-4)."""

    def __init__(self, dim: int, head_dim: int, kernel: tuple[int, int, int], hidden: int):
        super().__init__()
        self._setup(dim, head_dim, kernel, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = _tokens(x)
        grid, h = tokens.shape[1:4], tokens.flatten(1, 3)
        self.attn.add_to(h, grid, self.norm1, region_origin(x))
        self.mlp.add_to(h, self.norm2)
        return _grid(tokens)


class DiffusionBlock(_Local):
    """Stage 5: adds the context's projection, then attention and MLP on adaLN-modulated norms
    (ungated residuals). Takes and returns [state, context] along channels."""

    def __init__(self, dim: int, head_dim: int, kernel: tuple[int, int, int], hidden: int, chunks: int):
        super().__init__()
        self.context_proj = nn.Linear(dim, dim)
        self.scale_shift_table = nn.Parameter(torch.empty(chunks, dim))
        self._setup(dim, head_dim, kernel, hidden)

    def forward(self, x: torch.Tensor, modulation: torch.Tensor) -> torch.Tensor:
        tokens = _tokens(x)
        dim = tokens.shape[-1] // 2
        grid, both = tokens.shape[1:4], tokens.flatten(1, 3)
        h, context = both[..., :dim], both[..., dim:]
        mod = modulation + self.scale_shift_table[None]          # [B, chunks, C]
        scale_msa, shift_msa, scale_mlp, shift_mlp = (mod[:, i, None] for i in (0, 1, 3, 4))
        for a, b in _chunks(h.shape[1], max(1, TOKENS // dim)):
            add_linear(h[:, a:b], context[:, a:b], self.context_proj)
        self.attn.add_to(h, grid, lambda s: modulate(self.norm1(s), scale_msa, shift_msa), region_origin(x))
        self.mlp.add_to(h, lambda s: modulate(self.norm2(s), scale_mlp, shift_mlp))
        return _grid(tokens)


class PixelShuffleUp(nn.Module):
    """Linear to prod(stride) x the new width, then channels-last depth-to-space (channels as (c, t, h,
    w)); a temporal stride drops the first frame (t frames -> 2t - 1)."""

    def __init__(self, dim: int, out: int, stride: tuple[int, int, int]):
        super().__init__()
        self.stride, self.out = stride, out
        self.proj = nn.Linear(dim, math.prod(stride) * out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = _tokens(x)
        b, t, h, w, _ = tokens.shape
        st, sh, sw = self.stride
        y = tokens.new_empty(b, t * st, h * sh, w * sw, self.out)
        for a, e in _chunks(t, max(1, TOKENS // (h * w * self.proj.out_features))):
            part = self.proj(tokens[:, a:e]).unflatten(-1, (self.out, st, sh, sw))
            y[:, a * st:e * st] = part.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, (e - a) * st, h * sh, w * sw, self.out)
        return _grid(y[:, st - 1:])


class AdaLN(nn.Module):
    def __init__(self, time_dim: int, dim: int, chunks: int):
        super().__init__()
        self.chunks = chunks
        self.proj = nn.Linear(time_dim, chunks * dim)

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(emb)).unflatten(-1, (self.chunks, -1))


class DiffusionDecoder(nn.Module):
    def __init__(self, cfg: DiffusionConfig):
        super().__init__()
        self.cfg = cfg
        self.conv_in = nn.Linear(cfg.latent_channels, cfg.stages[0].width)
        self.det_stages = nn.ModuleList(
            nn.ModuleList(NABlock(s.width, cfg.head_dim, s.kernel, s.hidden) for _ in range(s.depth))
            for s in cfg.stages)
        self.upsamples = nn.ModuleList(PixelShuffleUp(s.width, s.out, s.stride) for s in cfg.stages)
        self.t_embedder = ltx.TimeEmbedder(cfg.time_dim)
        pixels = cfg.out_channels * cfg.patch_size ** 2
        self.conv_in_x_t = nn.Linear(pixels, cfg.width)
        self.shared_adaln = AdaLN(cfg.time_dim, cfg.width, cfg.chunks)
        self.diff_blocks = nn.ModuleList(DiffusionBlock(cfg.width, cfg.head_dim, cfg.kernel, cfg.hidden, cfg.chunks)
                                         for _ in range(cfg.depth))
        self.norm_out = nn.RMSNorm(cfg.width, eps=EPS)
        self.conv_out = nn.Linear(cfg.width, pixels)

    def context(self, z: torch.Tensor) -> torch.Tensor:
        """Stages 1-4: latent [B, C, t, h, w] -> context [B, C5, 8t - 7, 8h, 8w] (channels-last)."""
        pad = self.cfg.trailing_pad
        z = torch.cat([z, z[:, :, -1:].expand(-1, -1, pad, -1, -1)], 2)
        x = _grid(self.conv_in(z.permute(0, 2, 3, 4, 1)))
        for blocks, up in zip(self.det_stages, self.upsamples):
            for block in blocks:
                x = block(x)
            x = up(x)
        return x[:, :, : x.shape[2] - pad * self.cfg.temporal_ratio]

    def _noise(self, context: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        b, _, t, h, w = context.shape
        p = self.cfg.patch_size
        shape = (b, self.cfg.out_channels, t, h * p, w * p)
        if context.device.type == "meta":
            return torch.empty(shape, device="meta", dtype=context.dtype)
        like = torch.empty(h * p, w * p, device="meta")         # where an exact tile's pixels lie
        return region_randn(shape, gen, like).to(context.device, context.dtype)

    def _embed(self, x_t: torch.Tensor, state: torch.Tensor) -> None:
        """Patchified noisy pixels -> the state's first half (tokens)."""
        patches = ltx.patchify(x_t, self.cfg.patch_size).permute(0, 2, 3, 4, 1).flatten(1, 3)
        dst = state[..., : self.cfg.width]
        for a, b in _chunks(patches.shape[1], max(1, TOKENS // self.cfg.width)):
            dst[:, a:b] = self.conv_in_x_t(patches[:, a:b])

    def _predict(self, state: torch.Tensor, grid: tuple[int, int, int], modulation: torch.Tensor) -> torch.Tensor:
        x = _grid(state.unflatten(1, grid))
        for block in self.diff_blocks:
            x = block(x, modulation)
        tokens = _tokens(x)                      # an exact tile's extent may have changed at the blocks
        grid, tokens = tokens.shape[1:4], tokens.flatten(1, 3)[..., : self.cfg.width]
        out = tokens.new_empty(*tokens.shape[:2], self.conv_out.out_features)
        for a, b in _chunks(tokens.shape[1], max(1, TOKENS // self.cfg.width)):
            out[:, a:b] = self.conv_out(self.norm_out(tokens[:, a:b]))
        return ltx.unpatchify(_grid(out.unflatten(1, grid)), self.cfg.patch_size)

    def forward(self, z: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        if self.cfg.steps > 1 and runstate.current().exact is not None:
            raise InputError("exact tiles run one-step diffusion decoders only; this file's decoder takes "
                             f"{self.cfg.steps} steps.", input="mode", fix="decode untiled, or with fast tiles.")
        context = self.context(z)
        x_t = self._noise(context, gen)
        grid = tuple(context.shape[2:])
        c = self.cfg.width
        state = context.new_empty(context.shape[0], math.prod(grid), 2 * c)
        state[..., c:] = _tokens(context).flatten(1, 3)
        del context
        steps = torch.linspace(1.0, 1.0 / self.cfg.steps, self.cfg.steps)
        for i, t in enumerate(steps):
            emb = self.t_embedder((self.cfg.timestep_scale * t).expand(z.shape[0]).to(z.device), z.dtype)
            self._embed(x_t, state)
            out = self._predict(state, grid, self.shared_adaln(emb))
            if i == len(steps) - 1:
                return out if self.cfg.output == "x0" else (x_t.float() - t * out.float()).to(z.dtype)
            # an Euler step to the next time on the velocity
            velocity = (x_t.float() - out.float()) / t if self.cfg.output == "x0" else out.float()
            x_t = (x_t.float() - (t - steps[i + 1]) * velocity).to(z.dtype)
        raise AssertionError("no steps")


class LTXDiffusionVAE(nn.Module):
    """encode: clips (B, 3, 1 + 8k, H, W) in [-1, 1] -> normalised latents (B, 128, 1 + k, H/32, W/32);
    decode: the inverse, (B, 3, 1 + 8(t - 1), 32h, 32w), the x0 prediction, not clamped."""

    def __init__(self, cfg: DiffusionConfig):
        super().__init__()
        self.config = cfg
        if cfg.encoder is not None:
            self.encoder = ltx.Encoder(cfg.encoder)
        self.decoder = DiffusionDecoder(cfg)
        self.per_channel_statistics = ltx.Statistics(cfg.latent_channels)

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        return self.per_channel_statistics.latent(self.encoder(x), self.config.encoder, posterior)

    def decode(self, z: torch.Tensor, seed: int = 0) -> torch.Tensor:
        gen = torch.Generator().manual_seed(int(seed) % 2 ** 64)
        return self.decoder(self.per_channel_statistics.unnormalize(z), gen)


# ---- configuration from the weights (and the file's metadata) ---------------------------------

def _kernel(value, what: str) -> tuple[int, int, int]:
    if not (isinstance(value, (list, tuple)) and len(value) == 3 and all(isinstance(k, int) and k > 0 for k in value)):
        raise LoadError(f"LTX-2.5 VAE: the file's metadata gives {what} as {value!r}; expected three positive "
                        "window sizes (frames, rows, columns).", fix="please report the file.")
    return tuple(value)


def config_from_state_dict(sd, name_hint: Optional[str] = None,
                           metadata: Optional[Mapping[str, str]] = None) -> DiffusionConfig:
    """Widths, depths, heads, strides and the patch from the weights; windows, steps, timestep scale
    and output type from the file's ``config`` metadata (``vae``: ``decoder`` and ``encoder``), else the
    published values. Logged (logger "VAEKit")."""
    vae_cfg, _ = ltx_config.vae_metadata(metadata)
    dec = vae_cfg.get("decoder") if isinstance(vae_cfg.get("decoder"), dict) else {}
    enc = vae_cfg.get("encoder") if isinstance(vae_cfg.get("encoder"), dict) else {}
    keys = list(sd.keys())
    n = count_indices(keys, "decoder.upsamples")
    width = sd["decoder.conv_in_x_t.weight"].shape[0]
    widths = [sd[f"decoder.upsamples.{i}.proj.weight"].shape[1] for i in range(n)]
    outs = widths[1:] + [width]
    sources = []

    def meta(name, default):
        if name in dec:
            sources.append((name, str(dec[name]), "metadata"))
            return dec[name]
        sources.append((name, str(default), "published"))
        return default
    kernels = meta("stage_kernels", [list(k) for k in KERNELS])
    if not isinstance(kernels, list) or len(kernels) < n:
        raise LoadError(f"LTX-2.5 VAE: the file's metadata lists {kernels!r} as stage windows for {n} stages.",
                        fix="please report the file.")
    listed = meta("upsamples", None)
    stages = []
    for i in range(n):
        folded, rest = divmod(sd[f"decoder.upsamples.{i}.proj.weight"].shape[0], outs[i])
        stride = tuple(listed[i][0]) if listed else FOLD_STRIDE.get(folded) if not rest else None
        if stride is None or math.prod(stride) != folded or rest:
            raise LoadError(f"LTX-2.5 VAE: up-sampler {i} unfolds {sd[f'decoder.upsamples.{i}.proj.weight'].shape[0]} "
                            f"channels into width {outs[i]}, which no stride{' the metadata lists' if listed else ''} "
                            "explains.", fix="the file may be damaged; please report it.")
        depth = count_indices(keys, f"decoder.det_stages.{i}")
        hidden = sd[f"decoder.det_stages.{i}.0.mlp.w_up.weight"].shape[0] if depth else 4 * widths[i]
        stages.append(Stage(widths[i], depth, hidden, _kernel(kernels[i], f"stage {i + 1}'s window"), stride, outs[i]))
    head_dim = sd["decoder.diff_blocks.0.attn.q_norm.weight"].shape[0]
    out_channels = int(dec.get("out_channels", 3))
    pixels = sd["decoder.conv_in_x_t.weight"].shape[1]
    patch = math.isqrt(pixels // out_channels)
    encoder = None
    if "encoder.conv_in.weight" in sd:
        pad = enc.get("spatial_padding_mode", "zeros")
        if pad not in ltx_config.PADS:
            raise LoadError(f"LTX-2.5 VAE: the file's metadata says the encoder pads with {pad!r}.",
                            fix="please report the file.")
        encoder = ltx_config.encoder_config(sd, pad, enc.get("latent_log_var", "constant"))
    cfg = DiffusionConfig(
        encoder=encoder, latent_channels=sd["decoder.conv_in.weight"].shape[1], stages=tuple(stages), width=width,
        depth=count_indices(keys, "decoder.diff_blocks"), hidden=sd["decoder.diff_blocks.0.mlp.w_up.weight"].shape[0],
        kernel=_kernel(meta("stage5_kernel", list(STAGE5_KERNEL)), "stage 5's window"), head_dim=head_dim,
        time_dim=sd["decoder.t_embedder.timestep_embedder.linear_1.weight"].shape[0],
        chunks=sd["decoder.shared_adaln.proj.weight"].shape[0] // width, patch_size=patch, out_channels=out_channels,
        steps=int(meta("default_num_inference_steps", 1)),
        timestep_scale=float(meta("timestep_scale_multiplier", 1000.0)),
        output=str(vae_cfg.get("model_output_type", "x0")), sources=tuple(sources))
    _check(cfg, pixels)
    log.info("%s. From the weights: stage widths %s, depths %s, head %d, patch %d. Not in the weights: %s",
             describe(cfg), [s.width for s in cfg.stages] + [cfg.width], [s.depth for s in cfg.stages] + [cfg.depth],
             head_dim, patch, "; ".join(f"{name} {value} ({where})" for name, value, where in cfg.sources))
    return cfg


def _check(cfg: DiffusionConfig, pixels: int) -> None:
    problems = []
    if cfg.out_channels * cfg.patch_size ** 2 != pixels:
        problems.append(f"its noisy-pixel input has {pixels} channels, not {cfg.out_channels} x a square patch")
    if any(w % cfg.head_dim for w in [s.width for s in cfg.stages] + [cfg.width]):
        problems.append(f"a width is not a multiple of the head size {cfg.head_dim}")
    if cfg.output not in ("x0", "v") or cfg.steps < 1 or cfg.chunks < 5:
        problems.append(f"it predicts {cfg.output!r} in {cfg.steps} steps with {cfg.chunks} adaLN chunks")
    if cfg.encoder is not None:
        s, t = ltx_config.ratios(cfg.encoder.encoder, ("down", "s2d"))
        if (cfg.encoder.patch_size * s, t) != (cfg.spatial_ratio, cfg.temporal_ratio):
            problems.append("its encoder and decoder compress by different factors")
    if problems:
        raise LoadError(f"this LTX-2.5 VAE cannot be run as the published code runs it: {'; '.join(problems)}.",
                        fix="please report the file.")


def temporal_reach(cfg: DiffusionConfig) -> float:
    """How many latent frames on either side of its own can change an output frame away from the clip's
    ends: each block's window reaches k_t // 2 frames at its stage's frame rate (published: 17.5; the
    windows shift inward at the ends, reaching further there). Temporal tiles are exact only for
    frames farther than this from a tile edge."""
    rate, reach = 1, 0.0
    for s in cfg.stages:
        reach += s.depth * (s.kernel[0] // 2) / rate
        rate *= s.stride[0]
    return reach + cfg.depth * (cfg.kernel[0] // 2) / rate


def complete_state_dict(sd: dict, cfg: DiffusionConfig) -> dict:
    """Files without statistics (diffusers keeps them with the pipeline's VAE) get the identity."""
    if MEAN not in sd and STD not in sd:
        sd = {**sd, MEAN: torch.zeros(cfg.latent_channels), STD: torch.ones(cfg.latent_channels)}
    return sd


def capabilities(cfg: DiffusionConfig) -> Capabilities:
    return Capabilities(
        latent_channels=cfg.latent_channels, spatial_ratio=cfg.spatial_ratio, temporal_ratio=cfg.temporal_ratio,
        image_channels=cfg.out_channels, has_attention=True, norm="rms",
        causal_encoder=True, stream_encode=cfg.encoder is not None, causal_decoder=False, stream_decode=False,
        posterior=True, can_encode=cfg.encoder is not None, can_decode=True,
        default_tile=512, default_overlap=64, default_tile_frames=64, default_overlap_frames=16,
        decode_options=("seed",), working_dtypes=(torch.bfloat16, torch.float32))


def describe(cfg: DiffusionConfig) -> str:
    extra = "" if cfg.encoder is not None else ", decoder only"
    return f"LTX-2.5 VAE (diffusion decoder, {cfg.latent_channels} latent channels{extra})"


SPEC = ArchSpec(id="ltx_diffusion", name="LTX-2.5 diffusion VAE", detect=ltx_diffusion_layout.detect,
                to_canonical=ltx_diffusion_layout.to_canonical, config_from_state_dict=config_from_state_dict,
                build=LTXDiffusionVAE, capabilities=capabilities, describe=describe,
                complete_state_dict=complete_state_dict, reads_metadata=True,
                # before LTX (70): these files carry an LTX-2.3 encoder
                priority=65, latent_hints=((128, 5, "LTX-Video/LTX-2"),))   # LTX-2.5 samples in LTX-2's latent space
