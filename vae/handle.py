"""The VAE handle: spec + built model + dtype/device. encode()/decode() check their input, then
route through the tiling engine (a single tile when no tiling is asked for or needed)."""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Union

import torch

from . import checks
from .engine import defined, guard, replan, tiling, transfer
from .engine import route as routing
from .engine.route import Call, Route, Tile
from .files import latents
from .nn import posterior as gaussian
from .errors import InputError
from .spec import ArchSpec, Capabilities

log = logging.getLogger("VAEKit")
DeviceLike = Union[str, torch.device, None]
Budget = Union[int, float, str, None]        # bytes, GB, or '4GB' / '512MB' (vae/checks.py: budget)


def channel_hint(channels: int, rank: int) -> str:
    """The models whose latents have ``channels`` channels at this rank (the families declare them)."""
    from .registry import channel_hint as hint
    return hint(channels, rank)


check_divisible = checks.divisible
MODES = checks.MODES
# vae/cache/runner.py asks the replan's test for an out-of-memory error here
_out_of_memory = replan.out_of_memory


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
        return checks.as_clip(self.caps, t)

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
        """Validate a LATENT tensor (vae/checks.py: model_latent) and return it on the model's own latent
        grid (unpacked)."""
        z = checks.model_latent(self, z, input, channel_hint)
        if z.shape[1] == self.caps.latent_channels_packed and self.caps.latent_pack > 1:
            z = latents.unpack(z, self.caps.latent_pack)
        return z

    def check_image(self, x: torch.Tensor, input: str = "pixels",
                    pixel_range: tuple[float, float] = (0.0, 1.0)) -> torch.Tensor:
        """Validate images [B, C, H, W] (or clips [B, C, T, H, W] for a video VAE; a ``frames_in_batch``
        model's one clip [T, C, H, W] becomes [1, C, T, H, W]) in ``pixel_range`` (vae/checks.py: model_image)."""
        return checks.model_image(self, x, input, pixel_range)

    def _checked(self, op: str, options: dict, *given) -> tuple:
        """The call's keywords through the one check where they enter (vae/checks.py: call), in the order
        decode/encode name them: tile, overlap, tile_frames, overlap_frames, mode, budget, offload, out_device."""
        names = ("tile", "overlap", "tile_frames", "overlap_frames", "mode", "budget", "offload", "out_device")
        own = self.caps.decode_options if op == "decode" else self.caps.encode_options
        checked = checks.call(op, options, own, **dict(zip(names, given)))
        return tuple(checked[n] for n in names)

    # ---- engines (vae/engine/route.py) ---------------------------------------------------------
    def _plans(self, grid: tuple[int, ...], tile: Tile, overlap: Optional[int], tile_frames: Optional[int],
               overlap_frames: Optional[int]) -> list[tiling.AxisPlan]:
        """The tiling engine's plan per axis; a compiled handle fixes its tiles' shapes here."""
        return routing.plans(self.caps, grid, tile, overlap, tile_frames, overlap_frames)

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

    def encode_fn(self, posterior: bool = False, pixel_range: tuple[float, float] = (0.0, 1.0),
                  **options) -> Callable[..., torch.Tensor]:
        """The encode of one tile: ``fn(pixels in pixel_range, model=None)`` -> latent (float32);
        ``posterior``: the posterior's mean and log-variance stacked in channels (vae/nn/posterior.py), which
        every engine runs as a latent of twice the channels; ``options``: the model's own encode inputs
        (``encode_options``). Pixels are mapped to the model's range tile by tile (never a copy of the
        whole input), not at all where they are given in it."""
        (a, b), (lo, hi) = pixel_range, self.caps.value_range
        scale = (hi - lo) / (b - a)
        kw = {k: v for k, v in options.items() if k in self.caps.encode_options and v is not None}
        if posterior:
            kw["posterior"] = True

        def fn(t: torch.Tensor, model: Optional[torch.nn.Module] = None) -> torch.Tensor:
            model = self.model if model is None else model
            t = self._model_input(t, model)
            return model.encode(t if (a, b) == (lo, hi) else t * scale + (lo - a * scale), **kw).float()
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
            out = replan.planned(self, call, budget, out_device, offload, lambda c: self._engine(
                g, z, c, progress, out_device, offload))
            guard.require_finite(self, out, "decode", z, opts, "samples")
            out = out.clamp_(0.0, 1.0) if clamp else out
            return out[0].movedim(1, 0) if frames_in_batch else out

    def route(self, call: Call) -> Route:
        """How ``call`` runs (vae/engine/route.py: route): exact tiles, a streamed time axis, or the
        tiling engine."""
        return routing.route(self, call)

    def _engine(self, g: guard.Guard, x: torch.Tensor, call: Call, progress: Optional[tiling.Progress],
                out_device: DeviceLike, offload: DeviceLike = None) -> torch.Tensor:
        """The one dispatch of both directions (vae/engine/route.py: run)."""
        return routing.run(self, g, x, call, progress, out_device, offload)

    def _exact_body(self, decode: bool, model: torch.nn.Module) -> Optional[Callable]:
        """How exact tiles call the seam modules of ``model`` between their pauses (vae/run.py ``Body``):
        None, eagerly (a compiled handle: through its graphs)."""
        return None

    def call_for(self, op: str, shape: tuple[int, ...], tile: Tile = None, overlap: Optional[int] = None,
                 tile_frames: Optional[int] = None, overlap_frames: Optional[int] = None, mode: str = "fast") -> Call:
        """The ``Call`` a decode of a latent (encode of pixels) of ``shape`` makes."""
        return routing.call_for(self.caps, op, shape, tile, overlap, tile_frames, overlap_frames, mode)

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
               posterior: bool = False, pixel_range: tuple[float, float] = (0.0, 1.0),
               **options) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Images [B, C, H, W] (video: clips [B, C, T, H, W]) in 0..1 -> LATENT tensor (packed the way
        the model family's LATENTs are; SVD's one clip [T, C, H, W] -> [T, C, h, w]). A clip whose frame
        count does not fit the family's rule is encoded as core does (the frames past the last whole group
        dropped) with a warning. ``mode``, ``budget``, ``offload`` and ``options`` (the model's own encode
        inputs, if any) as for decode; an exact encode of a model that streams runs its clip in time chunks
        when the budget asks for them.

        ``posterior``: return ``(mean, logvar)``, the encoder's Gaussian posterior in the LATENT's layout
        and normalisation (``mean`` is what ``encode(x)`` returns; ``logvar`` is the log-variance of that
        normalised latent, clamped to [-30, 20] before the normalisation as diffusers clamps it), from
        the same encoder output under any tiles and chunks. Families without one (TAESD) raise.
        ``pixel_range``: the range ``x`` is in, where not 0..1 (diffusers' -1..1): mapped tile by tile."""
        tile, overlap, tile_frames, overlap_frames, mode, budget, offload, out_device = self._checked(
            "encode", options, tile, overlap, tile_frames, overlap_frames, mode, budget, offload, out_device)
        _, frames_in_batch = self._as_clip(x)
        x = self.check_image(x, pixel_range=pixel_range)
        if posterior and not self.caps.posterior:
            raise InputError(f"{self.name} has no Gaussian posterior: its encoder gives one latent, not a mean and "
                             "a log-variance.", input="posterior",
                             fix="encode without posterior (its latent is already deterministic), or use a VAE "
                                 "with a Gaussian posterior (a KL VAE, Wan, LTX, HunyuanVideo, ...).")
        with transfer.releasing(self.device):
            return self._encode(x, progress, out_device, tile, overlap, tile_frames, overlap_frames, mode, budget,
                                offload, posterior, frames_in_batch, options, pixel_range)

    def _encode(self, x, progress, out_device, tile, overlap, tile_frames, overlap_frames, mode, budget, offload,
                posterior, frames_in_batch, options, pixel_range=(0.0, 1.0)):
        if self.caps.own_tiling is not None:       # hook: the model's own tiles are its definition
            z = defined.encode(self, x, progress, out_device, budget, posterior, pixel_range, tile=tile,
                               overlap=overlap, tile_frames=tile_frames, overlap_frames=overlap_frames)
            return self._latent_out(z, posterior)
        r = self.caps.spatial_ratio
        grid = (x.shape[-2] // r, x.shape[-1] // r)
        if self.is_video:
            grid = ((x.shape[2] - 1) // self.caps.temporal_ratio + 1,) + grid
        with torch.inference_mode(), guard.Guard(self, "encode", self.encode_fn(posterior, pixel_range, **options)) as g:
            call = Call(False, x.shape, grid, tile, overlap, tile_frames, overlap_frames, mode, posterior)
            z = replan.planned(self, call, budget, out_device, offload, lambda c: self._engine(
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
