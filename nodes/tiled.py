"""Tiled Decode and Tiled Encode through the one tiling engine."""
from __future__ import annotations

import torch

from ..vae.errors import InputError
from . import call
from .base import CATEGORY, names_node
from .convert import frames_to_image, image_to_bchw, images_to_clips, latent_out, latent_tensor
from .devices import DEVICES
from .socket import as_engine

_TILE = ("INT", {"default": 512, "min": 64, "max": 4096, "step": 32,
                 "tooltip": "Tile size in pixels. Each tile covers about this much plus the overlap it shares with "
                            "its neighbours; an image no larger than this is processed in one untiled pass. "
                            "Smaller tiles use less memory. MiniMax H3 runs its own tiles (256 px, part of the "
                            "model's definition) whatever is set here, and its tiny autoencoder taeh3 whole frames."})
_OVERLAP = ("INT", {"default": 64, "min": 0, "max": 4096, "step": 32,
                    "tooltip": "Pixels shared by neighbouring tiles and blended (at most half the tile). "
                               "More overlap hides seams better and costs a little more time."})
_TEMPORAL = ("INT", {"default": 64, "min": 8, "max": 4096, "step": 4, "advanced": True,
                     "tooltip": "Frames per temporal tile (pixel frames), for video VAEs; a clip no longer than "
                                "this is one pass in time. Models that stream through causal caches (Wan, "
                                "HunyuanVideo 1.5, Mochi, Magvit, SeedVR2, the TAEHV decoders; the LTX-Video and LTX-2 "
                                "encoders) take the clip this many frames at a time with an exact result (Wan and "
                                "SeedVR2 at most 4, one latent frame, HunyuanVideo 1.5 at most 8, two, as their "
                                "references run, TAEHV at most 16 (32 for taeltx_2), four: more frames only cost "
                                "memory; CogVideoX decodes in its own batches of latent frames, 3 then 2, whatever "
                                "is set: they are part of its definition); others blend overlapping tiles, "
                                "approximately: an LTX-2 "
                                "decoder frame depends on 22 latent frames (176 frames; LTX-2.3: 14, 112 frames; "
                                "LTX-2.5's diffusion decoder: about 18) either way, so frames nearer a tile edge "
                                "than that differ from one pass. Stable Video Diffusion decodes a clip together (its "
                                "frames mix): exact mode never cuts it, fast mode blends overlapping clips. Ignored "
                                "by image VAEs and by MiniMax H3 (17-frame clips and 7-latent chunks are part of its "
                                "definition)."})
_TEMPORAL_OVERLAP = ("INT", {"default": 8, "min": 4, "max": 4096, "step": 4, "advanced": True,
                             "tooltip": "Frames shared by neighbouring temporal tiles, for video VAEs (at least one "
                                        "latent frame: a later tile's first latent frame is context only, its frames "
                                        "are dropped). Ignored by image VAEs."})
_MODE = (["exact", "fast"], {"default": "exact",
                    "tooltip": "exact (default): the result of an untiled pass, no seams (differences at fp32 "
                               "rounding level): tiles carry a halo as wide as the layers' reach, attention runs "
                               "on the whole latent (LTX-2.5's neighbourhood attention is local: its tiles carry "
                               "the windows' reach), GroupNorm statistics are shared; overlap is not used. Wan, "
                               "Qwen-Image, HunyuanVideo 1.5, LTX, the TAEHV family and Stable Cascade stage A run "
                               "tile after tile, each "
                               "through all its "
                               "frames, so memory is one tile's however large the image or clip; VAEs with "
                               "GroupNorm (SD/Flux KL, HunyuanImage, HunyuanVideo 1.0, Mochi, Magvit, SeedVR2, CogVideoX, "
                               "SVD, Cosmos-1) keep paused "
                               "tiles on the CPU while a GPU runs the others. fast: independent tiles blended in "
                               "their overlap: "
                               "faint seams (and flicker in video) where tiles meet, for somewhat less time and "
                               "memory than exact. MiniMax H3: both modes give its own definition (its blended "
                               "256 px tiles in 17-frame clips), which is what its reference computes."})
_TILING = {"tile_size": _TILE, "overlap": _OVERLAP, "temporal_size": _TEMPORAL, "temporal_overlap": _TEMPORAL_OVERLAP}
# the library's argument -> this node's input, for error messages
_TILING_INPUTS = {"tile": "tile_size", "overlap": "overlap", "tile_frames": "temporal_size",
                  "overlap_frames": "temporal_overlap", "budget": "max_memory"}


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
            "samples": ("LATENT", {"tooltip": "The latent to decode (e.g. from a KSampler). Flux.2: the 128-channel "
                                              "LATENT core's nodes make (packed 2x2, normalised by the VAE's BatchNorm "
                                              "statistics); a 32-channel one is read as that latent unpacked (taef2's "
                                              "space, as core's TAESD path makes it), not as diffusers' raw z. Qwen-Image "
                                              "2.1: the 64-channel image LATENT [N, 64, h, w]; it decodes to RGBA. HunyuanImage "
                                              "2.1: [N, 64, h, w] (32x); 3.0: [N, 32, 1, h, w] as core's VAE Encode "
                                              "gives it (or [N, 32, h, w]). Stable Video Diffusion: the LATENT "
                                              "[frames, 4, h, w] its sampler makes, one clip."}),
            "vae": ("VAE", {"tooltip": "A VAE from VAE Load (VAEKit) or from core's Load VAE."}),
            **_TILING},
            # optional, after the older widgets: saved workflows keep their widget positions
            "optional": {**call.DECODE_OPTIONS, "mode": _MODE, "devices": DEVICES, "max_memory": call.BUDGET}}

    @names_node
    def decode(self, samples, vae, tile_size=512, overlap=64, temporal_size=64, temporal_overlap=8,
               decode_timestep=0.05, decode_noise_scale=0.025, seed=0, mode="exact", devices="", max_memory=0.0):
        engine = as_engine(vae, self.DISPLAY_NAME)
        z = latent_tensor(samples)
        images = call.run(engine, "decode", z, devices, max_memory,
                          call.decode_options(decode_timestep, decode_noise_scale, seed), tile=tile_size,
                          overlap=overlap, tile_frames=_temporal_tile(engine, temporal_size),
                          overlap_frames=temporal_overlap, mode=mode)
        return (frames_to_image(images),)


class VAEKitTiledEncode:
    DISPLAY_NAME = "Tiled Encode (VAEKit)"
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT",)
    OUTPUT_TOOLTIPS = ("The latent, in the layout the VAE's diffusion model expects (Flux.2: 128 channels, packed "
                       "2x2 and normalised by the VAE's BatchNorm statistics; HunyuanImage 3.0: [N, 32, 1, h, w]; as "
                       "core's VAE Encode gives them).",)
    FUNCTION = "encode"
    LIBRARY_INPUTS = _TILING_INPUTS
    DESCRIPTION = "Encodes images tile by tile into one preallocated latent; memory is bounded by the tile."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "pixels": ("IMAGE", {"tooltip": "Images [N, H, W, 3] in 0..1; sides must be multiples of the VAE's "
                                            "compression (8 for SD/Flux.1 and Wan 2.1 VAEs, 16 for Flux.2's packed "
                                            "latents, Wan 2.2, Qwen-Image 2.1, Mage-VAE and HunyuanImage 3.0, 32 for "
                                            "HunyuanImage 2.1). A video VAE takes the batch as one clip, as "
                                            "core's VAE Encode does: N images give 1 + (N-1)//4 latent frames for "
                                            "Wan (frames past the last whole group are dropped); one image is a "
                                            "one-frame clip (Qwen-Image); Stable Video Diffusion encodes each frame "
                                            "alone into a LATENT [N, 4, h, w], as core's. An RGBA VAE (Qwen-Image 2.1) gets RGB with opaque "
                                            "alpha."}),
            "vae": ("VAE", {"tooltip": "A VAE from VAE Load (VAEKit) or from core's Load VAE."}),
            **_TILING},
            "optional": {"mode": _MODE, "devices": DEVICES, "max_memory": call.BUDGET}}

    @names_node
    def encode(self, pixels, vae, tile_size=512, overlap=64, temporal_size=64, temporal_overlap=8, mode="exact",
               devices="", max_memory=0.0):
        engine = as_engine(vae, self.DISPLAY_NAME)
        if not torch.is_tensor(pixels) or pixels.dim() != 4:
            raise InputError(f"expected an IMAGE [N, H, W, C], got {type(pixels).__name__}"
                             f"{tuple(pixels.shape) if torch.is_tensor(pixels) else ''}.", input="pixels")
        x = image_to_bchw(pixels)
        if getattr(engine, "takes_clips", False):      # the IMAGE batch is one clip, as core's VAE Encode
            x = images_to_clips(x, call.temporal_ratio(engine), engine=engine)
        z = call.run(engine, "encode", x, devices, max_memory, tile=tile_size, overlap=overlap,
                     tile_frames=_temporal_tile(engine, temporal_size), overlap_frames=temporal_overlap, mode=mode)
        return (latent_out(None, z),)


def _temporal_tile(engine, frames: int) -> int:
    """Frames run at a time: the widget's size, or less for a model that streams in chunks of its own."""
    return engine.temporal_tile(frames) if hasattr(engine, "temporal_tile") else frames
