"""Tiled Decode and Tiled Encode through the one tiling engine."""
from __future__ import annotations

import torch

from ..vae.errors import InputError
from . import _comfy
from .base import CATEGORY, names_node
from .convert import frames_to_image, image_to_bchw, latent_out
from .socket import as_engine

_TILE = ("INT", {"default": 512, "min": 64, "max": 4096, "step": 32,
                 "tooltip": "Tile size in pixels. Each tile covers about this much plus the overlap it shares with "
                            "its neighbours; an image no larger than this is processed in one untiled pass. "
                            "Smaller tiles use less memory."})
_OVERLAP = ("INT", {"default": 64, "min": 0, "max": 4096, "step": 32,
                    "tooltip": "Pixels shared by neighbouring tiles and blended (at most half the tile). "
                               "More overlap hides seams better and costs a little more time."})
_TEMPORAL = ("INT", {"default": 64, "min": 8, "max": 4096, "step": 4,
                     "tooltip": "Frames per temporal tile (pixel frames), for video VAEs; a clip no longer than "
                                "this is one pass in time. Models that stream through causal caches (Mochi, "
                                "Magvit; LTX-Video's encoder) take the clip this many frames at a time with an "
                                "exact result; others blend overlapping tiles. Ignored by image VAEs."})
_TEMPORAL_OVERLAP = ("INT", {"default": 8, "min": 4, "max": 4096, "step": 4,
                             "tooltip": "Frames shared by neighbouring temporal tiles, for video VAEs (at least one "
                                        "latent frame: a later tile's first latent frame is context only, its frames "
                                        "are dropped). Ignored by image VAEs."})
# Inputs of timestep-conditioned or sampling decoders (LTX-Video 0.9.1+; seed: also the Consistency
# Decoder); other VAEs ignore them.
_DECODE_OPTIONS = {
    "decode_timestep": ("FLOAT", {"default": 0.05, "min": 0.0, "max": 1.0, "step": 0.001,
                                  "tooltip": "LTX-Video 0.9.1+ only: the timestep the decoder is conditioned on "
                                             "(ComfyUI's default 0.05). Ignored by other VAEs."}),
    "decode_noise_scale": ("FLOAT", {"default": 0.025, "min": 0.0, "max": 1.0, "step": 0.001,
                                     "tooltip": "LTX-Video 0.9.1+ only: share of noise mixed into the latent before "
                                                "decoding (ComfyUI's default 0.025). Ignored by other VAEs."}),
    "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF,
                     "tooltip": "Seed of the noise a decoder draws, so a decode repeats exactly: LTX-Video 0.9.1+ "
                                "(the noise above) and the Consistency Decoder (its sampler). Ignored by other VAEs."}),
}

_MODE = (["fast", "exact"], {"default": "fast",
                    "tooltip": "fast: independent tiles blended in their overlap (faint seams). exact: the result "
                               "of an untiled pass (differences at fp32 rounding level): tiles carry a halo as wide "
                               "as the layers' reach instead of the overlap, share GroupNorm statistics, and "
                               "attention runs on the whole latent; overlap is not used. Costs: about 1.3-1.5x the "
                               "untiled time (CPU, SD-shape VAE at 1024 px), and the paused tiles together hold the "
                               "current level's activations: less memory than an untiled pass, more than fast mode. "
                               "Video: tiles are spatial and each runs the whole clip (temporal size is ignored)."})
_TILING = {"tile_size": _TILE, "overlap": _OVERLAP, "temporal_size": _TEMPORAL, "temporal_overlap": _TEMPORAL_OVERLAP}
# the library's argument -> this node's input, for error messages
_TILING_INPUTS = {"tile": "tile_size", "overlap": "overlap", "tile_frames": "temporal_size",
                  "overlap_frames": "temporal_overlap"}


class VAEKitTiledDecode:
    DISPLAY_NAME = "Tiled Decode (VAEKit)"
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE",)
    OUTPUT_TOOLTIPS = ("Decoded images [N, H, W, 3] in 0..1.",)
    FUNCTION = "decode"
    LIBRARY_INPUTS = _TILING_INPUTS
    DESCRIPTION = ("Decodes a LATENT tile by tile into one preallocated image: memory is bounded by the tile, "
                   "time stays close to an untiled decode (one pass, no repeated passes).")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "samples": ("LATENT", {"tooltip": "The latent to decode (e.g. from a KSampler)."}),
            "vae": ("VAE", {"tooltip": "A VAE from VAE Load (VAEKit) or from core's Load VAE."}),
            **_TILING},
            # optional, after the older widgets: saved workflows keep their widget positions
            "optional": {**_DECODE_OPTIONS, "mode": _MODE}}

    @names_node
    def decode(self, samples, vae, tile_size=512, overlap=64, temporal_size=64, temporal_overlap=8,
               decode_timestep=0.05, decode_noise_scale=0.025, seed=0, mode="fast"):
        engine = as_engine(vae, self.DISPLAY_NAME)
        z = _latent_tensor(samples)
        _prepare(engine)
        images = engine.decode(z, tile=tile_size, overlap=overlap, tile_frames=temporal_size,
                               overlap_frames=temporal_overlap, progress=_comfy.progress_callback(),
                               out_device=_comfy.intermediate_device(),
                               timestep=decode_timestep, noise_scale=decode_noise_scale, seed=seed, mode=mode)
        return (frames_to_image(images),)


class VAEKitTiledEncode:
    DISPLAY_NAME = "Tiled Encode (VAEKit)"
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT",)
    OUTPUT_TOOLTIPS = ("The latent, in the layout the VAE's diffusion model expects.",)
    FUNCTION = "encode"
    LIBRARY_INPUTS = _TILING_INPUTS
    DESCRIPTION = "Encodes images tile by tile into one preallocated latent; memory is bounded by the tile."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "pixels": ("IMAGE", {"tooltip": "Images [N, H, W, 3] in 0..1; sides must be multiples of the VAE's "
                                            "compression (8 for SD/Flux.1 VAEs, 16 for Flux.2's packed latents)."}),
            "vae": ("VAE", {"tooltip": "A VAE from VAE Load (VAEKit) or from core's Load VAE."}),
            **_TILING},
            "optional": {"mode": _MODE}}

    @names_node
    def encode(self, pixels, vae, tile_size=512, overlap=64, temporal_size=64, temporal_overlap=8, mode="fast"):
        engine = as_engine(vae, self.DISPLAY_NAME)
        if not torch.is_tensor(pixels) or pixels.dim() != 4:
            raise InputError(f"expected an IMAGE [N, H, W, C], got {type(pixels).__name__}"
                             f"{tuple(pixels.shape) if torch.is_tensor(pixels) else ''}.", input="pixels")
        _prepare(engine)
        x = image_to_bchw(pixels)
        if getattr(engine, "is_video", False):      # the IMAGE batch is one clip, as core's VAE Encode
            x = x.movedim(1, 0).unsqueeze(0)
        z = engine.encode(x, tile=tile_size, overlap=overlap, tile_frames=temporal_size,
                          overlap_frames=temporal_overlap, progress=_comfy.progress_callback(),
                          out_device=_comfy.intermediate_device(), mode=mode)
        return (latent_out(None, z),)


def _latent_tensor(samples) -> torch.Tensor:
    if not isinstance(samples, dict) or not torch.is_tensor(samples.get("samples")):
        raise InputError("expected a LATENT (a dict with a 'samples' tensor).", input="samples",
                         fix="connect a LATENT output (KSampler, VAE Encode, Load Latent).")
    z = samples["samples"]
    if getattr(z, "is_nested", False):
        z = z.unbind()[0]
    return z


def _prepare(engine) -> None:
    if hasattr(engine, "model"):
        _comfy.prepare(engine)
