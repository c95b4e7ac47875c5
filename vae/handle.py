"""The VAE handle: spec + built model + dtype/device. encode()/decode() check their input, then
route through the tiling engine (a single tile when no tiling is asked for or needed)."""
from __future__ import annotations

from typing import Any, Optional, Union

import torch

from . import checks, exact, guard, latents, streaming, tiling
from .errors import InputError
from .spec import ArchSpec, Capabilities

DeviceLike = Union[str, torch.device, None]
Tile = Union[int, tuple[int, int], None]

_CHANNEL_HINTS = {4: "SD1.x/SD2.x/SDXL", 12: "Mochi", 16: "SD3/Flux.1, HunyuanVideo, EasyAnimate and Wan",
                  32: "Flux.2 (unpacked)", 128: "Flux.2 or LTX-Video"}


def check_divisible(h: int, w: int, r: int, what: str, input: str = "pixels") -> None:
    """Images must tile the latent grid exactly: one rule and one message for every engine."""
    if h % r or w % r:
        raise InputError(f"the image is {w}x{h} pixels; {what} needs width and height divisible by {r}.", input=input,
                         fix=f"crop or resize to {w // r * r}x{h // r * r} (e.g. core 'ImageCrop' or 'Upscale Image') first.")


MODES = ("fast", "exact")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise InputError(f"unknown tiling mode {mode!r}.", input="mode", fix=f"use one of {', '.join(MODES)}.")


class VAE:
    def __init__(self, spec: ArchSpec, config: Any, model: torch.nn.Module, dtype: Optional[torch.dtype] = None,
                 device: DeviceLike = None, source: str = ""):
        self.spec, self.config, self.model, self.source = spec, config, model, source
        self.caps: Capabilities = spec.capabilities(config)
        self.last_upcast: Optional[guard.Upcast] = None     # the NaN guard's record of the last call
        self.to(device or "cpu", dtype or torch.float32)

    # device and dtype are read from the weights: a memory manager (ComfyUI's) may move them.
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # ---- description ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.describe(self.config) or self.spec.name

    def __repr__(self) -> str:
        return f"VAE({self.name}, {self.dtype}, {self.device}, from {self.source})"

    def to(self, device: DeviceLike = None, dtype: Optional[torch.dtype] = None) -> "VAE":
        # channels_last: oneDNN and cuDNN convolutions run natively in it; in NCHW, CPU convs convert
        # every activation back and forth (measured: 8% of an SD decode's time, 27% of its memory).
        device = torch.device(device) if device is not None else self.device
        self.model.to(device, dtype or self.dtype, memory_format=self._memory_format)
        return self

    @property
    def _memory_format(self) -> torch.memory_format:
        # video models run 3-D convs; channels_last applies to 4-D tensors only
        return torch.contiguous_format if self.caps.temporal_ratio else torch.channels_last

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights in the canonical layout, contiguous (they run channels_last; safetensors and
        other savers refuse strided tensors)."""
        return {k: v.contiguous() for k, v in self.model.state_dict().items()}

    def _model_input(self, t: torch.Tensor, model: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """``t`` on the device and in the dtype of ``model`` (default: ours; the NaN guard passes its
        upcast copy)."""
        dtype = self.dtype if model is None else next(model.parameters()).dtype
        return t.to(self.device, dtype).contiguous(memory_format=self._memory_format)

    @property
    def is_video(self) -> bool:
        return self.caps.temporal_ratio is not None

    def frames_for(self, latent_frames: int) -> int:
        """Pixel frames a clip of ``latent_frames`` decodes to: 1 + r*(t-1)."""
        return 1 + self.caps.temporal_ratio * (latent_frames - 1)

    # ---- checks --------------------------------------------------------------------------------
    def check_latent(self, z: torch.Tensor, input: str = "samples") -> torch.Tensor:
        """Validate a LATENT tensor and return it on the model's own latent grid (unpacked)."""
        checks.latent(z, input)
        caps = self.caps
        if not caps.can_decode:
            raise InputError("this VAE has no decoder (only an encoder file was loaded).", input="vae",
                             fix="load the matching *_decoder file too, or the pair by its stem name.")
        if self.is_video:
            if z.dim() != 5:
                raise InputError(f"{self.name} is a video VAE and takes video latents [B, C, frames, h, w]; "
                                 f"got shape {tuple(z.shape)}.", input=input,
                                 fix="connect the LATENT of a video model (e.g. its sampler's output); "
                                     "an image latent belongs to an image VAE.")
        else:
            if z.dim() == 5 and z.shape[2] == 1:
                z = z[:, :, 0]
            if z.dim() != 4:
                raise InputError(f"expected an image latent [B, C, h, w] for {self.name}, got shape {tuple(z.shape)}.",
                                 input=input, fix="decode video latents with a video VAE.")
        c = z.shape[1]
        accepted = {caps.latent_channels_packed, caps.latent_channels}
        if c not in accepted:
            src = _CHANNEL_HINTS.get(c, f"a {c}-channel model")
            raise InputError(
                f"this latent has {c} channels (as {src} latents do) but the loaded VAE, {self.name}, "
                f"takes {caps.latent_channels_packed}.", input=input,
                fix="load the VAE that belongs to the model that made this latent.")
        if not torch.isfinite(z).all():
            bad = int((~torch.isfinite(z)).sum())
            raise InputError(f"the latent contains {bad} NaN/Inf values; decoding it would give a black or broken image.",
                             input=input, fix="the sampler diverged: re-run it in fp32/bf16 (not fp16), "
                                              "or with fewer steps/lower CFG; check the model and LoRA weights.")
        if c == caps.latent_channels_packed and caps.latent_pack > 1:
            z = latents.unpack(z, caps.latent_pack)
        return z

    def check_image(self, x: torch.Tensor, input: str = "pixels") -> torch.Tensor:
        """Validate images [B, C, H, W] (or clips [B, C, T, H, W] for a video VAE) in 0..1."""
        x = checks.image(x, self.caps.image_channels, self.caps.spatial_ratio_packed, self.is_video, input)
        caps = self.caps
        if not caps.can_encode:
            raise InputError("this VAE has no encoder (only a decoder file was loaded).", input="vae",
                             fix="load the matching *_encoder file too, or the pair by its stem name.")
        dims = 5 if self.is_video else 4
        if x.dim() != dims or x.shape[1] < caps.image_channels:
            what = "clips [B, C, frames, H, W]" if self.is_video else "images [B, C, H, W]"
            raise InputError(f"expected {what} with {caps.image_channels} channels, got shape {tuple(x.shape)}.",
                             input=input)
        x = x[:, : caps.image_channels]
        check_divisible(*x.shape[-2:], caps.spatial_ratio_packed, self.name, input)
        if self.is_video:
            r, t = caps.temporal_ratio, x.shape[2]
            if (t - 1) % r:
                lo = (t - 1) // r * r + 1
                raise InputError(f"the clip has {t} frames; {self.name} encodes 1 + {r}*k frames "
                                 f"(one first frame, then groups of {r}).", input=input,
                                 fix=f"use {lo} frames (drop the last {t - lo}) or {lo + r} "
                                     f"(e.g. core 'ImageFromBatch' / 'RepeatImageBatch').")
        if not torch.isfinite(x).all():
            raise InputError("the image contains NaN/Inf values.", input=input,
                             fix="check the node that produced the image.")
        return x

    # ---- engines -------------------------------------------------------------------------------
    def _plans(self, grid: tuple[int, ...], tile: Tile, overlap: Optional[int], tile_frames: Optional[int],
               overlap_frames: Optional[int]) -> list[tiling.AxisPlan]:
        plans = tiling.plan_grid(grid[-2:], tile, overlap, self.caps.spatial_ratio)
        if self.is_video:
            plans.insert(0, tiling.plan_frames(grid[0], tile_frames, overlap_frames, self.caps.temporal_ratio))
        return plans

    def _scales(self) -> tuple[tuple, tuple]:
        """(latent units, pixel units) per tiled axis."""
        r = self.caps.spatial_ratio
        if self.is_video:
            return (1, 1, 1), (tiling.Frames(self.caps.temporal_ratio), r, r)
        return (1, 1), (r, r)

    def decode_options(self, options: dict) -> dict:
        """The decode inputs this model takes (e.g. LTX's timestep/noise_scale/seed); others are dropped."""
        return {k: v for k, v in options.items() if k in self.caps.decode_options and v is not None}

    def decode(self, z: torch.Tensor, tile: Tile = None, overlap: Optional[int] = None,
               progress: Optional[tiling.Progress] = None, out_device: DeviceLike = None,
               tile_frames: Optional[int] = None, overlap_frames: Optional[int] = None,
               mode: str = "fast", **options) -> torch.Tensor:
        """Latent [B, C, h, w] -> images [B, C, H, W] (video: [B, C, t, h, w] -> [B, C, T, H, W]) in
        0..1, float32 on ``out_device`` (CPU). ``tile``/``overlap`` in pixels, ``tile_frames``/
        ``overlap_frames`` in pixel frames; ``options`` are model decode inputs (see decode_options).
        ``mode``: "fast" (independent tiles, blended) or "exact" (the untiled result; see vae/exact.py)."""
        z = self.check_latent(z)
        _check_mode(mode)
        lo, hi = self.caps.value_range
        opts = self.decode_options(options)
        latent_units, pixel_units = self._scales()

        def fn(t: torch.Tensor, model: Optional[torch.nn.Module] = None) -> torch.Tensor:
            model = self.model if model is None else model      # the NaN guard's upcast copy
            y = model.decode(self._model_input(t, model), **opts)
            return (y.float() - lo) / (hi - lo)

        with torch.inference_mode(), guard.Guard(self, "decode", fn) as g:
            if hasattr(self.model, "prepare_decode"):     # whole-latent steps (seeded noise) before tiling
                z = self.model.prepare_decode(self._model_input(z), **opts)
            plans = self._plans(z.shape[2:], tile, overlap, tile_frames, overlap_frames)
            out_device = torch.device(out_device or "cpu")
            chunk = self._stream_chunk(z.shape[2], tile_frames, self.caps.stream_decode)
            cores = self._exact_cores(z.shape[-2:], tile) if mode == "exact" else None
            if cores:
                out = g.whole(lambda f, m: exact.run_exact(f, m, z, cores, 1, self.caps.spatial_ratio, out_device,
                                                           progress=progress))
            elif chunk:
                ins, outs = streaming.decode_chunks(z.shape[2], chunk, self.caps.temporal_ratio)
                out = streaming.run_streamed(g.streamed(plans[1:], len(ins)), self.model, z, ins, outs, plans[1:],
                                             (1, 1), pixel_units[1:], self.caps.image_channels,
                                             self.frames_for(z.shape[2]), out_device, progress)
            else:
                out = tiling.run_tiled(g.tiled(plans), z, plans, latent_units, pixel_units, self.caps.image_channels,
                                       out_device, progress=progress)
            return out.clamp_(0.0, 1.0)

    def _exact_cores(self, grid: tuple[int, ...], tile: Tile) -> Optional[list]:
        """Exact mode's tile cores per spatial axis (latent units), or None when one tile covers it.
        Time is not tiled in exact mode: each spatial tile runs the whole clip."""
        tiles = tile if isinstance(tile, (tuple, list)) else (tile, tile)
        r = self.caps.spatial_ratio
        cores = [tiling.core_spans(n, max(1, t // r) if t else 0) for n, t in zip(grid, tiles)]
        return cores if any(len(c) > 1 for c in cores) else None

    def _stream_chunk(self, latent_frames: int, tile_frames: Optional[int], declared: bool) -> int:
        """Latent frames per chunk when the time axis is streamed (exact), else 0 (one pass, or
        overlapping temporal tiles for models that cannot stream)."""
        if not (self.is_video and declared and tile_frames):
            return 0
        chunk = max(1, tile_frames // self.caps.temporal_ratio)
        return chunk if tiling.needs_tiling(latent_frames, chunk) else 0

    def encode(self, x: torch.Tensor, tile: Tile = None, overlap: Optional[int] = None,
               progress: Optional[tiling.Progress] = None, out_device: DeviceLike = None,
               tile_frames: Optional[int] = None, overlap_frames: Optional[int] = None,
               mode: str = "fast") -> torch.Tensor:
        """Images [B, C, H, W] (video: clips [B, C, T, H, W]) in 0..1 -> LATENT tensor (packed the way
        the model family's LATENTs are). ``mode`` as for decode."""
        x = self.check_image(x)
        _check_mode(mode)
        lo, hi = self.caps.value_range
        r = self.caps.spatial_ratio
        latent_units, pixel_units = self._scales()

        def fn(t: torch.Tensor, model: Optional[torch.nn.Module] = None) -> torch.Tensor:
            model = self.model if model is None else model      # the NaN guard's upcast copy
            return model.encode(self._model_input(t, model) * (hi - lo) + lo).float()

        grid = (x.shape[-2] // r, x.shape[-1] // r)
        if self.is_video:
            grid = ((x.shape[2] - 1) // self.caps.temporal_ratio + 1,) + grid
        plans = self._plans(grid, tile, overlap, tile_frames, overlap_frames)
        out_device = torch.device(out_device or "cpu")
        with torch.inference_mode(), guard.Guard(self, "encode", fn) as g:
            chunk = self._stream_chunk(grid[0], tile_frames, self.caps.stream_encode)
            cores = self._exact_cores(grid[-2:], tile) if mode == "exact" else None
            if cores:
                z = g.whole(lambda f, m: exact.run_exact(f, m, x, cores, r, 1, out_device, progress=progress))
            elif chunk:
                ins, outs = streaming.encode_chunks(grid[0], chunk, self.caps.temporal_ratio)
                z = streaming.run_streamed(g.streamed(plans[1:], len(ins)), self.model, x, ins, outs, plans[1:],
                                           (r, r), (1, 1),
                                           self.caps.latent_channels, grid[0], out_device, progress)
            else:
                z = tiling.run_tiled(g.tiled(plans), x, plans, pixel_units, latent_units, self.caps.latent_channels,
                                     out_device, progress=progress)
            return latents.pack(z, self.caps.latent_pack)
