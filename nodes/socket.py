"""What travels on a ``VAE`` socket, both ways.

``VAEKitVAE`` wraps our handle with the calls core nodes make (VAE Decode/Encode and their tiled
versions, Set Latent Noise Mask helpers...) and the attributes they read and set, its ``patcher`` included
(core's patcher contract: nodes/patcher.py), so core nodes accept our VAE. ``as_engine`` turns
whatever arrives on a socket (ours, or a core ``comfy.sd.VAE``) into something our nodes can tile."""
from __future__ import annotations

import json
import weakref
from typing import Optional

import torch

from ..vae import VAE, checks, from_state_dict
from ..vae.engine import tiling
from ..vae.errors import VAEKitError
from . import _comfy, call
from . import patcher as patching
from .convert import bchw_to_image, center_crop_to_multiple, image_to_bchw, images_to_clips


class VAEKitVAE:
    # core's VAE reads it to load the weights whole: plain torch layers are never partly loaded
    disable_offload = True

    def __init__(self, handle: VAE):
        self.handle = handle
        self._patcher = None          # the patcher set on this socket object (core nodes set and clone it)
        self._output_device = None

    # -- core's patcher contract (nodes/patcher.py): the model, its patcher, devices, dtype, size --
    @property
    def patcher(self):
        """Core's ``vae.patcher``: a ModelPatcher around ``first_stage_model`` inside ComfyUI (the memory
        manager loads it, nodes clone and patch it), else VAEKit's stand-in with the same reads."""
        return self._patcher if self._patcher is not None else _comfy.patcher_for(self.handle)

    @patcher.setter
    def patcher(self, value) -> None:
        value = patching.checked(value)
        self.handle = patching.rebind(self.handle, value.model)      # a fresh copy (Select VAE Device's)
        self._patcher = value

    @property
    def first_stage_model(self):
        return self.handle.model

    @first_stage_model.setter
    def first_stage_model(self, model) -> None:
        if model is self.handle.model:       # vae.first_stage_model = vae.first_stage_model.to(...)
            return
        self.handle = patching.rebind(self.handle, model)
        if self._patcher is not None and self._patcher.model is not model:
            self._patcher = patching.new(self.handle, self._patcher.load_device, self._patcher.offload_device)

    @property
    def device(self) -> torch.device:
        """Core's ``vae.device``: where the VAE computes, its patcher's load device."""
        return torch.device(self.patcher.load_device)

    @device.setter
    def device(self, value) -> None:
        """A node that sets ``vae.device`` (with or without the patcher's) means the VAE to run there: its
        patcher loads the weights there (core's memory manager moves them before each call)."""
        self.patcher.load_device = checks.device(value, "vae.device")

    @property
    def output_device(self) -> torch.device:
        return self._output_device or _comfy.intermediate_device()

    @output_device.setter
    def output_device(self, value) -> None:
        self._output_device = checks.device(value, "vae.output_device")

    @property
    def vae_dtype(self) -> torch.dtype:
        return self.handle.dtype

    @vae_dtype.setter
    def vae_dtype(self, value) -> None:
        """Our VAE computes in its weights' dtype: setting core's ``vae_dtype`` converts them."""
        self.handle.to(dtype=checks.dtype(value, "vae.vae_dtype"))

    def model_size(self) -> int:
        return self.patcher.model_size()

    def is_dynamic(self) -> bool:
        return False

    def _prepare(self, op: str, shape, **plan) -> None:
        """Before each call: this socket's patcher (a node may have set or retargeted it) loads the weights."""
        if self._patcher is not None:
            _comfy.bind(self.handle, self._patcher)
        call.load_weights(self.handle, op, shape, **plan)

    @property
    def latent_channels(self) -> int:
        return self.handle.caps.latent_channels_packed

    # image VAEs: one ratio; video VAEs: (frames, h, w) as core's, frame counts by core's formulas. SVD's
    # LATENT keeps one clip's frames in the batch: core presents its VAE as an image VAE, and so do we
    @property
    def downscale_ratio(self):
        h, s = self.handle, self.handle.caps.spatial_ratio_packed
        return (lambda a: max(0, h.latent_frames_for(a)), s, s) if h.takes_clips else s

    @property
    def upscale_ratio(self):
        h, s = self.handle, self.handle.caps.spatial_ratio_packed
        return (lambda a: max(0, h.frames_for(a)), s, s) if h.takes_clips else s

    @property
    def downscale_index_formula(self):
        s, r = self.handle.caps.spatial_ratio_packed, self.handle.caps.temporal_ratio
        return (r, s, s) if self.handle.takes_clips else None

    upscale_index_formula = downscale_index_formula

    @property
    def latent_dim(self) -> int:
        return 3 if self.handle.takes_clips else 2

    @property
    def not_video(self) -> bool:
        return not self.handle.is_video

    @property
    def output_channels(self) -> int:
        return self.handle.caps.image_channels

    def spacial_compression_decode(self) -> int:
        return self.handle.caps.spatial_ratio_packed

    spacial_compression_encode = spacial_compression_decode

    def temporal_compression_decode(self):
        return self.handle.caps.temporal_ratio if self.handle.takes_clips else None

    # core's memory hooks (comfy.sd.VAE's; code that plans around a VAE reads them): what a call on an
    # input of ``shape`` (model layout, as core passes it) needs on the compute device (the patcher's load
    # device, wherever the weights wait now), measured for our architecture; ``dtype`` is the handle's own
    # (core passes its vae_dtype)
    handles_tiling = True       # our engines tile and stream inside encode/decode

    def memory_used_decode(self, shape, dtype=None) -> int:
        return self.handle.memory_needed(tuple(shape), "decode", device=self.device) or 0

    def memory_used_encode(self, shape, dtype=None) -> int:
        return self.handle.memory_needed(tuple(shape), "encode", device=self.device) or 0

    def throw_exception_if_invalid(self) -> None:
        return None

    def get_sd(self) -> dict:
        return self.handle.state_dict()

    def __repr__(self) -> str:
        return f"VAEKitVAE({self.handle!r})"

    # -- calls core makes (latent units for decode_tiled, pixels for encode_tiled, as core) --
    def _out(self, images: torch.Tensor, samples: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[B, C, H, W] -> IMAGE; video [B, C, T, H, W] -> [B, T, H, W, C] (core's VAEDecode flattens it). An
        image VAE whose LATENTs carry a frame axis (HunyuanImage 3.0; core's 3-D VAE) given such a LATENT
        returns [B, 1, H, W, C], as core's."""
        out = bchw_to_image(images)
        frame_axis = self.handle.caps.latent_frame_axis and samples is not None and samples.dim() == 5
        return out.unsqueeze(1) if frame_axis and out.dim() == 4 else out

    def _clip(self, pixels: torch.Tensor, not_video: Optional[bool] = None) -> torch.Tensor:
        """IMAGE -> model layout, as core's VAE.encode: sides centre-cropped to multiples of the ratio; a
        video VAE takes the IMAGE batch as one clip (extra frames dropped), or with ``not_video`` each
        image as a one-frame clip (core's Qwen-Image edit nodes ask for that). SVD's handle takes the
        batch as its clip itself (and gives its LATENT back as [T, 4, h, w])."""
        pixels = center_crop_to_multiple(pixels, self.handle.caps.spatial_ratio_packed)
        x = image_to_bchw(pixels)
        if not self.handle.takes_clips:
            return x
        return images_to_clips(x, self.handle.caps.temporal_ratio, one_clip=not not_video, engine=self.handle)

    def decode(self, samples: torch.Tensor, vae_options: Optional[dict] = None) -> torch.Tensor:
        self._prepare("decode", samples.shape)
        return self._out(self.handle.decode(samples, progress=_comfy.progress_callback(),
                                            out_device=self.output_device, **(vae_options or {})), samples)

    def decode_tiled(self, samples, tile_x=None, tile_y=None, overlap=None, tile_t=None, overlap_t=None):
        r = self.spacial_compression_decode()
        rt = self.handle.caps.temporal_ratio or 1
        tile = (int(tile_y or 64) * r, int(tile_x or 64) * r)
        frames = self.handle.temporal_tile(int(tile_t) * rt if tile_t else None)
        self._prepare("decode", samples.shape, tile=tile, tile_frames=frames)
        return self._out(self.handle.decode(samples, tile=tile, overlap=int(overlap or 16) * r,
                                            tile_frames=frames,
                                            overlap_frames=int(overlap_t or 1) * rt,
                                            progress=_comfy.progress_callback(),
                                            out_device=self.output_device), samples)

    def encode(self, pixels: torch.Tensor, not_video: Optional[bool] = None) -> torch.Tensor:
        x = self._clip(pixels, not_video)
        self._prepare("encode", x.shape)
        return self.handle.encode(x, progress=_comfy.progress_callback(), out_device=self.output_device)

    def encode_tiled(self, pixels, tile_x=None, tile_y=None, overlap=None, tile_t=None, overlap_t=None,
                     not_video: Optional[bool] = None):
        x, tile, frames = self._clip(pixels, not_video), (int(tile_y or 512), int(tile_x or 512)), self.handle.temporal_tile(tile_t)
        self._prepare("encode", x.shape, tile=tile, tile_frames=frames)
        return self.handle.encode(x, tile=tile, overlap=int(overlap or 64), tile_frames=frames,
                                  overlap_frames=overlap_t,
                                  progress=_comfy.progress_callback(), out_device=self.output_device)


class CoreVAEEngine:
    """A core ``comfy.sd.VAE`` whose architecture we do not implement: tiled through the one
    engine, each tile through its own decode/encode call. Encode and decode are planned with their own
    ratios: core VAEs may compress by another factor than they expand (Stable Cascade's Stage C
    EfficientNet encodes 32x, its previewer decodes 8x), and a tile planned with the other one is not
    the size the plan expects."""

    def __init__(self, core):
        self.core = core
        decode = int(core.spacial_compression_decode())
        encode = int(getattr(core, "spacial_compression_encode", core.spacial_compression_decode)())
        self.ratios = {"decode": decode, "encode": encode}
        self.frames = getattr(core, "temporal_compression_decode", lambda: None)()
        self.is_video = self.takes_clips = self.frames is not None
        self.name = f"core VAE ({type(core.first_stage_model).__name__})"

    def _plans(self, op, grid, tile, overlap, tile_frames, overlap_frames):
        plans = tiling.plan_grid(grid[-2:], tile, overlap, self.ratios[op])
        if self.is_video:
            plans.insert(0, tiling.plan_frames(grid[0], tile_frames, overlap_frames, self.frames))
        return plans

    def _scales(self, op):
        r = self.ratios[op]
        return ((1, 1, 1), (tiling.Frames(self.frames), r, r)) if self.is_video else ((1, 1), (r, r))

    def _fast_only(self, mode: str) -> None:
        if checks.mode(mode) != "fast":      # exact is the nodes' default: say what runs instead
            _comfy.log.warning("VAEKit: exact tiles need a VAE VAEKit implements; %s is tiled through its own "
                               "calls with blended (fast) tiles", self.name)

    def decode(self, z, tile=None, overlap=None, progress=None, out_device=None, tile_frames=None,
               overlap_frames=None, mode="fast", **options):
        self._fast_only(mode)
        checks.latent(z)

        def fn(t):
            return self.core.decode(t).movedim(-1, 1).float()
        lat, px = self._scales("decode")
        plans = self._plans("decode", z.shape[2:], tile, overlap, tile_frames, overlap_frames)
        return tiling.run_tiled(fn, z, plans, lat, px, int(self.core.output_channels), out_device, progress=progress)

    def encode(self, x, tile=None, overlap=None, progress=None, out_device=None, tile_frames=None,
               overlap_frames=None, mode="fast"):
        self._fast_only(mode)

        def fn(t):   # core takes IMAGE batches; a video VAE makes the batch one clip
            return self.core.encode((t[0].movedim(0, -1) if self.is_video else t.movedim(1, -1))).float()
        r = self.ratios["encode"]
        x = checks.image(x, int(getattr(self.core, "output_channels", 3)), r, self.is_video)
        checks.divisible(*x.shape[-2:], r, self.name)
        grid = (x.shape[-2] // r, x.shape[-1] // r)
        if self.is_video:
            grid = ((x.shape[2] - 1) // self.frames + 1,) + grid
        lat, px = self._scales("encode")
        return tiling.run_tiled(fn, x, self._plans("encode", grid, tile, overlap, tile_frames, overlap_frames), px,
                                lat, int(self.core.latent_channels), out_device, progress=progress)


_converted: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _core_metadata(core) -> dict:
    """What core built an LTX VAE with that its weights do not say (core reads it from the
    checkpoint's metadata, which ``get_sd()`` does not carry): the decoder's block list (residual
    up-samplers), each side's padding, a causal decoder, as the metadata our loader reads. {} for
    other architectures."""
    model = getattr(core, "first_stage_model", None)
    if "lightricks" not in type(model).__module__:
        return {}
    decoder, encoder = getattr(model, "decoder", None), getattr(model, "encoder", None)
    cfg = {"causal_decoder": bool(getattr(decoder, "causal", False))}
    blocks = getattr(decoder, "blocks_desc", None)          # ComfyUI since LTX-2; older ones: published rule
    if isinstance(blocks, (list, tuple)):
        cfg["decoder_blocks"] = blocks
    for side, module in (("decoder", decoder), ("encoder", encoder)):
        mode = getattr(getattr(getattr(module, "conv_in", None), "conv", None), "padding_mode", None)
        if isinstance(mode, str):
            cfg[f"{side}_spatial_padding_mode"] = mode
    try:
        return {"config": json.dumps({"vae": cfg})}
    except (TypeError, ValueError):
        return {}


def as_engine(vae, node: str):
    """Our handle for a VAE socket value. A core VAE is converted once per VAE object (into our
    layout, placed like a VAE from our loader) or, if we do not implement its architecture, tiled
    through its own calls."""
    if isinstance(vae, VAEKitVAE):
        if vae._patcher is not None:      # our nodes' calls load through the socket's own patcher too
            _comfy.bind(vae.handle, vae._patcher)
        return vae.handle
    if isinstance(vae, VAE):
        return vae
    if hasattr(vae, "get_sd") and hasattr(vae, "first_stage_model"):
        cached = _converted.get(vae)
        if cached is None:
            try:
                cached = from_state_dict(vae.get_sd(), source="core VAE", metadata=_core_metadata(vae))
            except VAEKitError as e:   # an architecture (or variant) we do not implement
                _comfy.log.info("VAEKit: tiling %s through its own calls (%s)", type(vae).__name__, e)
                cached = CoreVAEEngine(vae)
            else:
                _comfy.place(cached, _comfy.compute_device(), getattr(vae, "vae_dtype", None) or torch.float32)
            _converted[vae] = cached
        return cached
    raise VAEKitError(f"got a {type(vae).__name__} on the 'vae' input, not a VAE.", input="vae",
                      fix="connect a VAE loader's output.").for_node(node)
