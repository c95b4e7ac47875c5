"""The VAE handle: spec + built model + dtype/device. encode()/decode() check their input, then
route through the tiling engine (a single tile when no tiling is asked for or needed)."""
from __future__ import annotations

import dataclasses
import gc
import logging
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch

from . import checks
from .engine import defined, exact, guard, memory, streaming, tiling, transfer
from .files import latents
from .nn import posterior as gaussian
from .errors import InputError
from .spec import ArchSpec, Capabilities

log = logging.getLogger("VAEKit")
DeviceLike = Union[str, torch.device, None]
Tile = Union[int, tuple[int, int], None]
Budget = Union[int, float, str, None]        # bytes, GB, or '4GB' / '512MB' (vae/checks.py: budget)

def channel_hint(channels: int, rank: int) -> str:
    """The models whose latents have ``channels`` channels at this rank (the families declare them)."""
    from .registry import channel_hint as hint
    return hint(channels, rank)


def check_divisible(h: int, w: int, r: int, what: str, input: str = "pixels") -> None:
    """Images must tile the latent grid exactly: one rule and one message for every engine."""
    if h % r or w % r:
        raise InputError(f"the image is {w}x{h} pixels; {what} needs width and height divisible by {r}.", input=input,
                         fix=f"crop or resize to {w // r * r}x{h // r * r} (e.g. core 'ImageCrop' or 'Upscale Image') first.")


MODES = checks.MODES


class VAE:
    def __init__(self, spec: ArchSpec, config: Any, model: torch.nn.Module, dtype: Optional[torch.dtype] = None,
                 device: DeviceLike = None, source: str = ""):
        self.spec, self.config, self.model, self.source = spec, config, model, source
        self.caps: Capabilities = spec.capabilities(config)
        # 3-D convs (video models, and image models that run an image as a clip): channels_last is 4-D only
        self._volumetric = bool(self.caps.temporal_ratio) or any(p.dim() == 5 for p in model.parameters())
        self.last_upcast: Optional[guard.Upcast] = None     # the NaN guard's record of the last call
        self.path: Optional[str] = None      # the file it was loaded from (worker processes load it too)
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
        return torch.contiguous_format if self._volumetric else torch.channels_last

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights in the canonical layout, contiguous (they run channels_last; safetensors and
        other savers refuse strided tensors)."""
        return {k: v.contiguous() for k, v in self.model.state_dict().items()}

    def _model_input(self, t: torch.Tensor, model: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """``t`` on the device and in the dtype of ``model`` (default: ours; the NaN guard passes its
        upcast copy, the planner its meta copy)."""
        p = next((self.model if model is None else model).parameters())
        return t.to(p.device, p.dtype).contiguous(memory_format=self._memory_format)

    @property
    def is_video(self) -> bool:
        return self.caps.temporal_ratio is not None

    @property
    def takes_clips(self) -> bool:
        """Whether ComfyUI's LATENT / IMAGE for this VAE are clips [B, C, T, ...] (video VAEs but SVD,
        whose LATENT keeps one clip's frames in the batch: ``Capabilities.frames_in_batch``)."""
        return self.is_video and not self.caps.frames_in_batch

    def _as_clip(self, t: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """For a ``frames_in_batch`` model, a 4-D [T, C, h, w] tensor as the one clip [1, C, T, h, w] it
        holds; and whether it was one (the result then goes back to [T, C, H, W])."""
        if self.caps.frames_in_batch and torch.is_tensor(t) and t.dim() == 4:
            return t.movedim(0, 1).unsqueeze(0), True
        return t, False

    def frames_for(self, latent_frames: int) -> int:
        """Pixel frames a clip of ``latent_frames`` decodes to: 1 + r*(t-1) (r*t for an even t where the
        first frame stands alone in odd counts only), or the model's own rule."""
        if self.caps.own_tiling is not None:
            return self.caps.own_tiling.frames(latent_frames)
        if self.caps.first_frame_odd_only and latent_frames % 2 == 0:
            return self.caps.temporal_ratio * latent_frames
        return 1 + self.caps.temporal_ratio * (latent_frames - 1)

    def latent_frames_for(self, frames: int) -> int:
        """Latent frames a clip of ``frames`` encodes to: 1 + (T-1)//r, or the model's own rule."""
        if self.caps.own_tiling is not None:
            return self.caps.own_tiling.latents(frames)
        return (frames - 1) // self.caps.temporal_ratio + 1

    def clip_frames(self, frames: int) -> int:
        """Of ``frames`` images, how many make the clip an encode takes: 1 + r*k (the rest is dropped,
        as core's VAE Encode does), or all for a model that pads its own clips."""
        if self.caps.own_tiling is not None:
            return frames
        return 1 + self.caps.temporal_ratio * ((frames - 1) // self.caps.temporal_ratio) if frames else 0

    # ---- checks --------------------------------------------------------------------------------
    def check_latent(self, z: torch.Tensor, input: str = "samples") -> torch.Tensor:
        """Validate a LATENT tensor and return it on the model's own latent grid (unpacked)."""
        checks.latent(z, input)
        caps = self.caps
        rank = z.dim()
        if not caps.can_decode:
            raise InputError("this VAE has no decoder (only an encoder file was loaded).", input="vae",
                             fix="load the matching *_decoder file too, or the pair by its stem name.")
        z, _ = self._as_clip(z)
        if self.is_video:
            if z.dim() != 5:
                seen = f" (as {channel_hint(z.shape[1], z.dim())} latents have)" if z.dim() == 4 else ""
                takes = "[B, C, frames, h, w] or one clip's frames [frames, C, h, w]" if caps.frames_in_batch \
                    else "[B, C, frames, h, w] (one frame: [B, C, 1, h, w], as Qwen-Image's sampler gives them)"
                raise InputError(f"{self.name} is a video VAE and takes video latents {takes}; got shape "
                                 f"{tuple(z.shape)}{seen}.", input=input,
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
            src = channel_hint(c, rank)      # the rank as given (a 5-D latent is a video model's)
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
        """Validate images [B, C, H, W] (or clips [B, C, T, H, W] for a video VAE; a ``frames_in_batch``
        model's one clip [T, C, H, W] becomes [1, C, T, H, W]) in 0..1."""
        x, _ = self._as_clip(x)
        x = checks.image(x, self.caps.image_channels, self.caps.spatial_ratio_packed, self.is_video, input)
        caps = self.caps
        if not caps.can_encode:
            raise InputError("this VAE has no encoder (only a decoder file was loaded).", input="vae",
                             fix="load the matching *_encoder file too, or the pair by its stem name.")
        dims = 5 if self.is_video else 4
        if x.dim() == dims and x.shape[1] == 3 and caps.image_channels == 4:
            x = torch.cat([x, x.new_ones(x[:, :1].shape)], dim=1)    # RGB into an RGBA VAE: opaque, as ComfyUI pads
        if x.dim() != dims or x.shape[1] < caps.image_channels:
            what = "clips [B, C, frames, H, W]" if self.is_video else "images [B, C, H, W]"
            raise InputError(f"expected {what} with {caps.image_channels} channels, got shape {tuple(x.shape)}.",
                             input=input)
        x = x[:, : caps.image_channels]
        check_divisible(*x.shape[-2:], caps.spatial_ratio_packed, self.name, input)
        if self.is_video:
            x = x[:, :, : self._fit_frames(x.shape[2], input)]
        if not torch.isfinite(x).all():
            raise InputError("the image contains NaN/Inf values.", input=input,
                             fix="check the node that produced the image.")
        return x

    def _fit_frames(self, t: int, input: str) -> int:
        """Of a clip of ``t`` frames, how many an encode takes (``clip_frames``: 1 + r*k by the temporal
        compression the family declares; a model with its own clips pads them and takes all). The rest
        is dropped from the end, as ComfyUI core's VAE Encode does, with a warning naming the counts
        that fit."""
        keep = self.clip_frames(t)
        if keep != t:
            r = self.caps.temporal_ratio
            log.warning("VAEKit: %s: the clip has %d frames; %s encodes 1 + %d*k frames (a first frame, then groups "
                        "of %d): the first %d are encoded and the last %d dropped, as ComfyUI core does. %d or %d "
                        "frames fit.", input, t, self.name, r, r, keep, t - keep, keep, keep + r)
        return keep

    def _checked(self, op: str, options: dict, *given) -> tuple:
        """The call's keywords through the one check where they enter (vae/checks.py: call), in the order
        decode/encode name them: tile, overlap, tile_frames, overlap_frames, mode, budget, offload, out_device."""
        names = ("tile", "overlap", "tile_frames", "overlap_frames", "mode", "budget", "offload", "out_device")
        own = self.caps.decode_options if op == "decode" else self.caps.encode_options
        checked = checks.call(op, options, own, **dict(zip(names, given)))
        return tuple(checked[n] for n in names)

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

    def decode_fn(self, **options) -> Callable[..., torch.Tensor]:
        """The decode of one tile: ``fn(latent, model=None)`` -> pixels in 0..1 (float32); ``model`` is
        another copy of ours (the NaN guard's upcast copy, the planner's meta copy)."""
        lo, hi = self.caps.value_range
        opts = self.decode_options(options)

        def fn(t: torch.Tensor, model: Optional[torch.nn.Module] = None) -> torch.Tensor:
            model = self.model if model is None else model
            y = model.decode(self._model_input(t, model), **opts)
            return (y.float() - lo) / (hi - lo)
        return fn

    def encode_fn(self, posterior: bool = False, **options) -> Callable[..., torch.Tensor]:
        """The encode of one tile: ``fn(pixels in 0..1, model=None)`` -> latent (float32); ``posterior``:
        the posterior's mean and log-variance stacked in channels (vae/nn/posterior.py), which every
        engine runs as a latent of twice the channels; ``options``: the model's own encode inputs
        (``encode_options``)."""
        lo, hi = self.caps.value_range
        kw = {k: v for k, v in options.items() if k in self.caps.encode_options and v is not None}
        if posterior:
            kw["posterior"] = True

        def fn(t: torch.Tensor, model: Optional[torch.nn.Module] = None) -> torch.Tensor:
            model = self.model if model is None else model
            return model.encode(self._model_input(t, model) * (hi - lo) + lo, **kw).float()
        return fn

    def decode(self, z: torch.Tensor, tile: Tile = None, overlap: Optional[int] = None,
               progress: Optional[tiling.Progress] = None, out_device: DeviceLike = None,
               tile_frames: Optional[int] = None, overlap_frames: Optional[int] = None,
               mode: str = "fast", budget: Budget = None, offload: DeviceLike = None, clamp: bool = True,
               **options) -> torch.Tensor:
        """Latent [B, C, h, w] -> images [B, C, H, W] (video: [B, C, t, h, w] -> [B, C, T, H, W]; SVD's one
        clip [T, C, h, w] -> [T, C, H, W]) in 0..1, float32 on ``out_device`` (CPU). ``tile``/``overlap`` in pixels, ``tile_frames``/
        ``overlap_frames`` in pixel frames; ``options`` are model decode inputs (see decode_options).
        ``mode``: "fast" (independent tiles, blended) or "exact" (the untiled result; see vae/engine/exact.py).
        ``budget``: what the call may use on the device: bytes (int), GB (float), or '4GB' / '512MB' (a GB is
        2^30 bytes; vae/checks.py: budget); the planner (vae/engine/budget.py) then picks the
        largest tile (at most ``tile``) and chunk that fit, or raises naming the smallest budget that
        works. ``offload``: where exact mode keeps its maps between stages (default ``out_device``).
        ``clamp``: False gives the decoder's values as they are, beyond 0..1 too (callers that keep them, as
        diffusers' AutoencoderKL does)."""
        tile, overlap, tile_frames, overlap_frames, mode, budget, offload, out_device = self._checked(
            "decode", options, tile, overlap, tile_frames, overlap_frames, mode, budget, offload, out_device)
        _, frames_in_batch = self._as_clip(z)
        z = self.check_latent(z)
        with transfer.releasing(self.device):
            return self._decode(z, options, progress, out_device, tile, overlap, tile_frames, overlap_frames, mode,
                                budget, offload, frames_in_batch, clamp)

    def _decode(self, z, options, progress, out_device, tile, overlap, tile_frames, overlap_frames, mode, budget,
                offload, frames_in_batch, clamp=True) -> torch.Tensor:
        if self.caps.own_tiling is not None:       # hook: the model's own tiles are its definition
            return defined.decode(self, z, options, progress, out_device, budget, tile=tile, overlap=overlap,
                                  tile_frames=tile_frames, overlap_frames=overlap_frames)
        opts = self.decode_options(options)
        fn = self.decode_fn(**opts)
        with torch.inference_mode(), guard.Guard(self, "decode", fn) as g:
            if hasattr(self.model, "prepare_decode"):     # whole-latent steps (seeded noise) before tiling
                z = self.model.prepare_decode(self._model_input(z), **opts)
            call = Call(True, z.shape, tuple(z.shape[2:]), tile, overlap, tile_frames, overlap_frames, mode)
            out = self._planned(call, budget, out_device, offload, lambda c: self._engine(
                g, z, c, progress, out_device, offload))
            guard.require_finite(self, out, "decode", z, opts, "samples")
            out = out.clamp_(0.0, 1.0) if clamp else out
            return out[0].movedim(1, 0) if frames_in_batch else out

    def route(self, call: "Call") -> "Route":
        """How ``call`` runs: exact tiles (streamed in time where the model streams), a streamed time
        axis (spatial tiles blended), or the tiling engine (one tile when nothing needs tiling)."""
        caps, grid = self.caps, call.grid
        plans = self._plans(grid, call.tile, call.overlap, call.tile_frames, call.overlap_frames)
        chunk = self._stream_chunk(grid[0], call.tile_frames, caps.stream_decode if call.decode else caps.stream_encode)
        chunks = None
        if chunk and call.decode:
            chunks = streaming.decode_chunks(grid[0], chunk, caps.temporal_ratio, lead=caps.stream_batches,
                                             frames=self.frames_for(grid[0]))
        elif chunk:
            chunks = streaming.encode_chunks(grid[0], chunk, caps.temporal_ratio)
        cores = self._exact_cores(grid[-2:], call.tile) if call.mode == "exact" else None
        engine = "exact" if cores else "streamed" if chunk else "tiled"
        return Route(call, plans, chunk, chunks, cores, engine)

    def _engine(self, g: guard.Guard, x: torch.Tensor, call: "Call", progress: Optional[tiling.Progress],
                out_device: DeviceLike, offload: DeviceLike = None) -> torch.Tensor:
        """The one dispatch of both directions (see ``route``)."""
        caps, r = self.caps, self.caps.spatial_ratio
        out_device = torch.device(out_device or "cpu")
        route = self.route(call)
        latent_units, pixel_units = self._scales()
        ins_u, outs_u = (latent_units, pixel_units) if call.decode else (pixel_units, latent_units)
        channels = caps.image_channels if call.decode else caps.latent_channels * (2 if call.posterior else 1)
        plans, chunks = route.plans, route.chunks
        if route.engine == "exact":
            units = (1, r) if call.decode else (r, 1)
            return g.whole(lambda f, m: exact.run_exact(f, m, x, route.cores, *units, out_device, chunks=chunks,
                                                        progress=progress, offload=offload and torch.device(offload),
                                                        body=self._exact_body(call.decode, m)))
        if route.engine == "streamed":
            ins, outs = chunks
            frames = self.frames_for(call.grid[0]) if call.decode else call.grid[0]
            return streaming.run_streamed(g.streamed(plans[1:], len(ins)), self.model, x, ins, outs, plans[1:],
                                          ins_u[1:], outs_u[1:], channels, frames, out_device, progress)
        return tiling.run_tiled(g.tiled(plans), x, plans, ins_u, outs_u, channels, out_device, progress=progress)

    def _exact_body(self, decode: bool, model: torch.nn.Module) -> Optional[Callable]:
        """How exact tiles call the seam modules of ``model`` between their pauses (vae/run.py ``Body``):
        None, eagerly (a compiled handle: through its graphs)."""
        return None

    def _planned(self, call: "Call", budget: Optional[int], out_device: DeviceLike, offload: DeviceLike,
                 run: Callable[["Call"], torch.Tensor]) -> torch.Tensor:
        """``run(call)``, with its tile and chunk planned for ``budget`` first when one is given; on
        running out of memory, again with a plan for half the budget (or, without one, see ``_oom_retry``).
        Before the new plan runs, what the failed attempt held is freed (``_released``)."""
        from .engine import budget as planner
        where = dict(device=self.device, out_device=torch.device(out_device or "cpu"),
                     offload=torch.device(offload or out_device or "cpu"))
        if budget is None:
            return self._oom_retry(call, lambda c: run(c))
        while True:
            p = planner.plan(self, call, budget, **where)
            log.info("VAEKit %s: %s", "decode" if call.decode else "encode", p.describe())
            try:
                with memory.host_limit(p.on_device(), self.device):     # the CPU allocator held to the plan
                    return run(p.call)
            except Exception as e:        # noqa: BLE001 - only out-of-memory errors are retried
                if not _out_of_memory(e) or budget <= 1 << 20:
                    raise
                _released(e)
            _free_memory(self.device)       # outside the handler: the failed attempt's frames are gone
            log.warning("VAEKit: out of memory with a plan for %s; planning again for half of it",
                        planner.gib(budget))
            budget //= 2

    def _oom_retry(self, call: "Call", run: Callable[["Call"], torch.Tensor]) -> torch.Tensor:
        """``run(call)``; when the device runs out of memory, again with spatial tiles of half the size
        (down to 4 latent pixels), as core falls back to tiles. A call that asked for no tiles at all (one
        pass) is retried in exact tiles: the result it asked for, in less memory. Said in the log each time."""
        r = self.caps.spatial_ratio
        while True:
            try:
                return run(call)
            except Exception as e:        # noqa: BLE001 - only out-of-memory errors are retried
                if not _out_of_memory(e):
                    raise
                tile = call.tile
                sizes = tile if isinstance(tile, (tuple, list)) else (tile or 0,) * 2
                now = [t or max(call.grid[-2:]) * r for t in sizes]                # untiled: the longer side
                smaller = tuple(max(4 * r, t // 2 // r * r) for t in now)
                if smaller == tuple(now):
                    raise
                _released(e)
            _free_memory(self.device)       # outside the handler: the failed attempt's frames are gone
            mode = "exact" if not (tile or call.tile_frames) else call.mode      # one pass asked: its result
            log.warning("VAEKit %s: out of memory with %s tiles; retrying with %dx%d px %s tiles",
                        "decode" if call.decode else "encode", "no" if not tile else f"{now[1]}x{now[0]} px",
                        smaller[1], smaller[0], mode)
            call = dataclasses.replace(call, tile=smaller, mode=mode)

    def _exact_cores(self, grid: tuple[int, ...], tile: Tile) -> Optional[list]:
        """Exact mode's tile cores per spatial axis (latent units), or None when one tile covers it.
        Time is never cut in exact mode: a model that streams runs each tile chunk by chunk through
        its caches; any other runs the whole clip per tile."""
        tiles = tile if isinstance(tile, (tuple, list)) else (tile, tile)
        r = self.caps.spatial_ratio
        cores = [tiling.core_spans(n, max(1, t // r) if t else 0) for n, t in zip(grid, tiles)]
        return cores if any(len(c) > 1 for c in cores) else None

    def _stream_chunk(self, latent_frames: int, tile_frames: Optional[int], declared: bool) -> int:
        """Latent frames per chunk when the time axis is streamed (exact), else 0 (one pass, or
        overlapping temporal tiles for models that cannot stream). ``tile_frames`` (pixel frames)
        gives the chunk; without it, the model's own ``stream_chunk`` (the reference's chunking, e.g.
        Wan's one latent frame), or one pass. A model whose batches are its definition (``stream_batches``)
        always runs those."""
        if not (self.is_video and declared):
            return 0
        if self.caps.stream_batches:
            return self.caps.stream_chunk
        chunk = max(1, tile_frames // self.caps.temporal_ratio) if tile_frames else self.caps.stream_chunk
        return chunk if tiling.needs_tiling(latent_frames, chunk) else 0

    def call_for(self, op: str, shape: tuple[int, ...], tile: Tile = None, overlap: Optional[int] = None,
                 tile_frames: Optional[int] = None, overlap_frames: Optional[int] = None, mode: str = "fast") -> "Call":
        """The ``Call`` a decode of a latent (encode of pixels) of ``shape`` makes."""
        caps, r = self.caps, self.caps.spatial_ratio
        shape = tuple(shape)
        if caps.frames_in_batch and len(shape) == 4:          # one clip's frames in the batch
            shape = (1, shape[1], shape[0], *shape[2:])
        if op == "decode":
            if not self.is_video and len(shape) == 5 and shape[2] == 1:     # an image LATENT's frame axis
                shape = shape[:2] + shape[3:]
            if caps.latent_pack > 1 and shape[1] == caps.latent_channels_packed:      # LATENTs packed 2x2
                p = caps.latent_pack
                shape = (shape[0], caps.latent_channels, *shape[2:-2], shape[-2] * p, shape[-1] * p)
            grid = tuple(shape[2:]) if self.is_video else tuple(shape[-2:])
        else:
            grid = tuple(n // r for n in shape[-2:])
            if self.is_video:
                grid = ((shape[2] - 1) // caps.temporal_ratio + 1,) + grid
        return Call(op == "decode", shape, grid, tile, overlap, tile_frames, overlap_frames, mode)

    def memory_needed(self, shape: tuple[int, ...], op: str = "decode", tile: Tile = None,
                      overlap: Optional[int] = None, tile_frames: Optional[int] = None,
                      overlap_frames: Optional[int] = None, mode: str = "fast",
                      offload: DeviceLike = "cpu", device: DeviceLike = None) -> Optional[int]:
        """Device bytes a call on an input of ``shape`` needs on the compute device (one tile of one chunk
        at its peak; exact tiles that meet: all of them), measured on the meta device (vae/engine/budget.py,
        vae/engine/memory.py); None if it cannot be measured. For memory managers.

        ``device``: where the call will run (default: where the weights are now). A memory manager asks
        before it loads the weights, while they still wait on its offload device, so it names its load
        device: the prediction takes that device type's calibration, copies and parking."""
        device = torch.device(device) if device is not None else self.device
        if self.caps.own_tiling is not None:       # hook: one unit of the model's own plan
            return defined.memory_needed(self, shape, op, device=device)
        from .engine import budget
        call = self.call_for(op, shape, tile, overlap, tile_frames, overlap_frames, mode)
        try:
            return budget.predict(self, call, device, torch.device(offload)).device
        except Exception:     # noqa: BLE001 - an estimate, never a failure
            log.debug("VAEKit: no memory estimate for %s", call, exc_info=True)
            return None

    def temporal_tile(self, frames: Optional[int]) -> Optional[int]:
        """A node's temporal tile size (pixel frames) as the frames to run at a time: a model that
        streams in its own chunks (``stream_chunk``) takes no more at once than that, since a longer
        chunk only costs memory (Wan: one latent frame, 4 frames, as its reference decodes)."""
        own = self.caps.stream_chunk
        if not (frames and own and self.is_video):
            return frames
        return min(frames, own * self.caps.temporal_ratio)

    def encode(self, x: torch.Tensor, tile: Tile = None, overlap: Optional[int] = None,
               progress: Optional[tiling.Progress] = None, out_device: DeviceLike = None,
               tile_frames: Optional[int] = None, overlap_frames: Optional[int] = None,
               mode: str = "fast", budget: Budget = None, offload: DeviceLike = None,
               posterior: bool = False, **options) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Images [B, C, H, W] (video: clips [B, C, T, H, W]) in 0..1 -> LATENT tensor (packed the way
        the model family's LATENTs are; SVD's one clip [T, C, H, W] -> [T, C, h, w]). A clip whose frame
        count does not fit the family's rule is encoded as core does (the frames past the last whole group
        dropped) with a warning. ``mode``, ``budget``, ``offload`` and ``options`` (the model's own encode
        inputs, if any) as for decode; an exact encode of a model that streams runs its clip in time chunks
        when the budget asks for them.

        ``posterior``: return ``(mean, logvar)``, the encoder's Gaussian posterior in the LATENT's layout
        and normalisation (``mean`` is what ``encode(x)`` returns; ``logvar`` is the log-variance of that
        normalised latent, clamped to [-30, 20] before the normalisation as diffusers clamps it), from
        the same encoder output under any tiles and chunks. Families without one (TAESD) raise."""
        tile, overlap, tile_frames, overlap_frames, mode, budget, offload, out_device = self._checked(
            "encode", options, tile, overlap, tile_frames, overlap_frames, mode, budget, offload, out_device)
        _, frames_in_batch = self._as_clip(x)
        x = self.check_image(x)
        if posterior and not self.caps.posterior:
            raise InputError(f"{self.name} has no Gaussian posterior: its encoder gives one latent, not a mean and "
                             "a log-variance.", input="posterior",
                             fix="encode without posterior (its latent is already deterministic), or use a VAE "
                                 "with a Gaussian posterior (a KL VAE, Wan, LTX, HunyuanVideo, ...).")
        with transfer.releasing(self.device):
            return self._encode(x, progress, out_device, tile, overlap, tile_frames, overlap_frames, mode, budget,
                                offload, posterior, frames_in_batch, options)

    def _encode(self, x, progress, out_device, tile, overlap, tile_frames, overlap_frames, mode, budget, offload,
                posterior, frames_in_batch, options):
        if self.caps.own_tiling is not None:       # hook: the model's own tiles are its definition
            z = defined.encode(self, x, progress, out_device, budget, posterior, tile=tile, overlap=overlap,
                               tile_frames=tile_frames, overlap_frames=overlap_frames)
            return self._latent_out(z, posterior)
        r = self.caps.spatial_ratio
        grid = (x.shape[-2] // r, x.shape[-1] // r)
        if self.is_video:
            grid = ((x.shape[2] - 1) // self.caps.temporal_ratio + 1,) + grid
        with torch.inference_mode(), guard.Guard(self, "encode", self.encode_fn(posterior, **options)) as g:
            call = Call(False, x.shape, grid, tile, overlap, tile_frames, overlap_frames, mode, posterior)
            z = self._planned(call, budget, out_device, offload, lambda c: self._engine(
                g, x, c, progress, out_device, offload))
            if hasattr(self.model, "finish_encode"):     # whole-latent steps after tiling (Flux.2's BatchNorm)
                z = self.model.finish_encode(z, posterior=True) if posterior else self.model.finish_encode(z)
            guard.require_finite(self, z, "encode", x, {}, "pixels")
            return self._latent_out(z, posterior, frames_in_batch)

    def _latent_out(self, z: torch.Tensor, posterior: bool, frames_in_batch: bool = False
                    ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The engines' encode output as the caller gets it: packed as the family's LATENTs (with a frame axis
        where the family's image LATENTs carry one; SVD's frames back in the batch where they came in);
        a posterior split into (mean, logvar), each packed alike."""
        def out(h: torch.Tensor) -> torch.Tensor:
            h = latents.pack(h.contiguous(), self.caps.latent_pack)
            if frames_in_batch:
                return h[0].movedim(1, 0)
            return h.unsqueeze(2) if self.caps.latent_frame_axis else h
        if not posterior:
            return out(z)
        return tuple(out(h) for h in gaussian.split(z))


@dataclass(frozen=True)
class Call:
    """One encode or decode as asked: its direction, input shape, latent grid (per tiled axis: time
    for video, then H, W) and tiling inputs (pixels, pixel frames)."""
    decode: bool
    shape: tuple[int, ...]
    grid: tuple[int, ...]
    tile: Tile = None
    overlap: Optional[int] = None
    tile_frames: Optional[int] = None
    overlap_frames: Optional[int] = None
    mode: str = "fast"
    posterior: bool = False        # an encode of the posterior: its output has twice the latent channels


@dataclass(frozen=True)
class Route:
    """How a call runs: the engine ("exact", "streamed" or "tiled"), its per-axis plans, the stream
    chunk (latent frames; 0: none) and chunk spans (input, output), exact mode's tile cores."""
    call: Call
    plans: list
    chunk: int
    chunks: Optional[tuple[list, list]]
    cores: Optional[list]
    engine: str


# what CUDA libraries raise when the caching allocator cannot give them their workspace. cuDNN's plan
# search (PyTorch's cudnn/Conv_v8.cpp) skips each plan whose workspace allocation fails and, with none
# left, raises "GET (or FIND) was unable to find an engine to execute this computation". The same words
# end a search that failed for another reason (no engine for the dtype on that card): such a call is
# retried with smaller tiles until none is left, then fails.
_ALLOC_FAILED = ("out of memory", "can't allocate memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED",
                 "unable to find an engine to execute this computation")


def _out_of_memory(e: BaseException) -> bool:
    """A device (CUDA: torch.OutOfMemoryError, or a library's failed workspace allocation, cuDNN's plan
    search included) or host (CPU allocator) out-of-memory error."""
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and any(m in str(e) for m in _ALLOC_FAILED))


def _released(e: BaseException) -> None:
    """Drop the tensors a failed attempt still holds through ``e``: its traceback keeps every frame of
    the attempt alive (an exact run's tile threads included), and with them their tensors, until the
    handler exits; clearing the frames' locals lets them go. Chained exceptions too."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__


def _free_memory(device: torch.device) -> None:
    """Collect what the failed attempt left (reference cycles through its frames) and give the
    allocator's cached blocks back, so the new plan starts from what is really free."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
