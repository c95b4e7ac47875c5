"""What travels on a ``VAE`` socket, both ways.

``VAEKitVAE`` wraps our handle with the calls core nodes make (VAE Decode/Encode and their tiled
versions, Set Latent Noise Mask helpers...), so core nodes accept our VAE. ``as_engine`` turns
whatever arrives on a socket (ours, or a core ``comfy.sd.VAE``) into something our nodes can tile."""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from ..vae import VAE, from_state_dict, tiling
from ..vae.errors import VAEKitError
from ..vae.handle import check_divisible
from . import _comfy
from .convert import bchw_to_image, center_crop_to_multiple, image_to_bchw


class VAEKitVAE:
    def __init__(self, handle: VAE):
        self.handle = handle

    # -- attributes core reads --
    @property
    def first_stage_model(self):
        return self.handle.model

    @property
    def latent_channels(self) -> int:
        return self.handle.caps.latent_channels_packed

    @property
    def downscale_ratio(self) -> int:
        return self.handle.caps.spatial_ratio_packed

    upscale_ratio = downscale_ratio
    latent_dim = 2
    downscale_index_formula = upscale_index_formula = None
    not_video = True

    @property
    def output_channels(self) -> int:
        return self.handle.caps.image_channels

    @property
    def vae_dtype(self) -> torch.dtype:
        return self.handle.dtype

    def spacial_compression_decode(self) -> int:
        return self.downscale_ratio

    spacial_compression_encode = spacial_compression_decode

    def temporal_compression_decode(self):
        return None

    def throw_exception_if_invalid(self) -> None:
        return None

    def get_sd(self) -> dict:
        return self.handle.state_dict()

    def __repr__(self) -> str:
        return f"VAEKitVAE({self.handle!r})"

    # -- calls core makes (latent units for decode_tiled, pixels for encode_tiled, as core) --
    def decode(self, samples: torch.Tensor, vae_options: Optional[dict] = None) -> torch.Tensor:
        _comfy.prepare(self.handle)
        return bchw_to_image(self.handle.decode(samples, progress=_comfy.progress_callback(),
                                                out_device=_comfy.intermediate_device()))

    def decode_tiled(self, samples, tile_x=None, tile_y=None, overlap=None, tile_t=None, overlap_t=None):
        r = self.downscale_ratio
        tile = (int(tile_y or 64) * r, int(tile_x or 64) * r)
        _comfy.prepare(self.handle)
        return bchw_to_image(self.handle.decode(samples, tile=tile, overlap=int(overlap or 16) * r,
                                                progress=_comfy.progress_callback(),
                                                out_device=_comfy.intermediate_device()))

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        pixels = center_crop_to_multiple(pixels, self.downscale_ratio)
        _comfy.prepare(self.handle)
        return self.handle.encode(image_to_bchw(pixels), progress=_comfy.progress_callback(),
                                  out_device=_comfy.intermediate_device())

    def encode_tiled(self, pixels, tile_x=None, tile_y=None, overlap=None, tile_t=None, overlap_t=None):
        pixels = center_crop_to_multiple(pixels, self.downscale_ratio)
        _comfy.prepare(self.handle)
        return self.handle.encode(image_to_bchw(pixels), tile=(int(tile_y or 512), int(tile_x or 512)),
                                  overlap=int(overlap or 64), progress=_comfy.progress_callback(),
                                  out_device=_comfy.intermediate_device())


class CoreVAEEngine:
    """A core ``comfy.sd.VAE`` whose architecture we do not implement: tiled through the one
    engine, each tile through its own decode/encode call."""

    def __init__(self, core):
        self.core = core
        self.ratio = int(core.spacial_compression_decode())
        self.name = f"core VAE ({type(core.first_stage_model).__name__})"

    def decode(self, z, tile=None, overlap=None, progress=None, out_device=None):
        def fn(t):
            return self.core.decode(t).movedim(-1, 1).float()
        plans = tiling.plan_grid(z.shape[-2:], tile, overlap, self.ratio)
        return tiling.run_tiled(fn, z, plans, (1, 1), (self.ratio, self.ratio), int(self.core.output_channels),
                                out_device, progress=progress)

    def encode(self, x, tile=None, overlap=None, progress=None, out_device=None):
        def fn(t):
            return self.core.encode(t.movedim(1, -1)).float()
        r = self.ratio
        check_divisible(*x.shape[-2:], r, self.name)
        plans = tiling.plan_grid((x.shape[-2] // r, x.shape[-1] // r), tile, overlap, r)
        return tiling.run_tiled(fn, x, plans, (r, r), (1, 1), int(self.core.latent_channels), out_device,
                                progress=progress)


_converted: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def as_engine(vae, node: str):
    """Our handle for a VAE socket value. A core VAE is converted once per VAE object (into our
    layout, placed like a VAE from our loader) or, if we do not implement its architecture, tiled
    through its own calls."""
    if isinstance(vae, VAEKitVAE):
        return vae.handle
    if isinstance(vae, VAE):
        return vae
    if hasattr(vae, "get_sd") and hasattr(vae, "first_stage_model"):
        cached = _converted.get(vae)
        if cached is None:
            try:
                cached = from_state_dict(vae.get_sd(), source="core VAE")
            except VAEKitError as e:   # an architecture (or variant) we do not implement
                _comfy.log.info("VAEKit: tiling %s through its own calls (%s)", type(vae).__name__, e)
                cached = CoreVAEEngine(vae)
            else:
                _comfy.place(cached, _comfy.compute_device(), getattr(vae, "vae_dtype", None) or torch.float32)
            _converted[vae] = cached
        return cached
    raise VAEKitError(f"got a {type(vae).__name__} on the 'vae' input, not a VAE.", input="vae",
                      fix="connect a VAE loader's output.").for_node(node)
