"""Frame-wise Decode: a clip decoded chunk by chunk along time into one preallocated IMAGE batch, so
long videos decode in the memory of a few frames. Exact (equal to one pass) where the model streams
through causal caches; overlapping, blended chunks where it cannot."""
from __future__ import annotations

import torch

from ..vae import checks
from ..vae.errors import InputError
from . import _comfy, call
from .base import CATEGORY, names_node
from .convert import frames_to_image, latent_tensor
from .socket import as_engine

EXACTNESS = ("Exact (equal to a one-pass decode): Wan 2.1/2.2 (also Qwen-Image's VAE), HunyuanVideo 1.5, Mochi, "
             "EasyAnimate Magvit, SeedVR2, Cosmos-1, the TAEHV family (taeh3 runs MiniMax H3's own units), and image VAEs "
             "(TAESD family, SD/Flux KL) decoding a batch of frames; CogVideoX always runs its own batches (3 latent "
             "frames, then 2: part of its definition, whatever is set here). Approximate (overlapping chunks, blended): HunyuanVideo 1.0 "
             "(GroupNorm and attention over the whole clip), LTX-Video and LTX-2 (their decoders are not causal: "
             "an LTX-2 frame depends on 22 latent frames either way, LTX-2.3's on 14), LTX-2.5's diffusion decoder "
             "(its attention windows reach about 18 latent frames either way); raise 'overlap' to shrink "
             "their seams. Stable Video Diffusion: each chunk of frames is decoded as a clip of its own, as the "
             "original decodes 'decoding_t' frames at a time (its script: 14); one clip in bounded memory is "
             "Tiled Decode's exact mode.")


class VAEKitFramewiseDecode:
    DISPLAY_NAME = "Frame-wise Decode (VAEKit)"
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE",)
    OUTPUT_TOOLTIPS = ("Decoded frames [N, H, W, 3] in 0..1, as core's VAE Decode gives them.",)
    FUNCTION = "decode"
    LIBRARY_INPUTS = {"tile": "tile_size", "overlap": "tile_overlap", "tile_frames": "frames_per_chunk",
                      "overlap_frames": "overlap", "budget": "max_memory"}
    DESCRIPTION = ("Decodes a video LATENT a few latent frames at a time through the model's causal caches: peak "
                   "memory stays that of one chunk however long the clip. " + EXACTNESS)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "samples": ("LATENT", {"tooltip": "A video latent [B, C, frames, h, w] (or a batch of image latents)."}),
            "vae": ("VAE", {"tooltip": "A VAE from VAE Load (VAEKit) or from core's Load VAE."}),
            "frames_per_chunk": ("INT", {"default": 2, "min": 1, "max": 4096, "tooltip":
                                         "Latent frames decoded at a time (each is 4-8 video frames). Fewer use less "
                                         "memory; the result does not change for exact models. " + EXACTNESS}),
            "overlap": ("INT", {"default": 1, "min": 1, "max": 4096, "advanced": True, "tooltip":
                                "Latent frames shared by neighbouring chunks for models that cannot stream exactly "
                                "(HunyuanVideo 1.0, LTX-Video, LTX-2): a chunk's first latent frame is context only, more "
                                "blends the seam. Ignored by exact ones."}),
            "tile_size": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 32, "tooltip":
                                  "Spatial tiles on top, in pixels (0: whole frames). Each tile streams the clip."}),
            "tile_overlap": ("INT", {"default": 64, "min": 0, "max": 4096, "step": 32, "advanced": True, "tooltip":
                                     "Pixels shared by neighbouring spatial tiles and blended."})},
            "optional": {**call.DECODE_OPTIONS, "max_memory": call.BUDGET}}

    @names_node
    def decode(self, samples, vae, frames_per_chunk=2, overlap=1, tile_size=0, tile_overlap=64,
               decode_timestep=0.05, decode_noise_scale=0.025, seed=0, max_memory=0.0):
        engine = as_engine(vae, self.DISPLAY_NAME)
        z = latent_tensor(samples)
        checks.latent(z)
        _check_counts(frames_per_chunk, overlap, tile_size)
        r = call.temporal_ratio(engine)
        # image VAE: the batch is the frame axis; SVD's [T, 4, h, w]: each chunk its own clip, as the
        # original decodes ``decoding_t`` frames at a time
        batches = r is None or (z.dim() == 4 and not engine.takes_clips)
        if not batches and z.dim() != 5:
            raise InputError(f"expected a video latent [B, C, frames, h, w], got shape {tuple(z.shape)}.",
                             input="samples", fix="connect the LATENT of a video model.")
        frames = {} if batches else dict(tile_frames=frames_per_chunk * r, overlap_frames=overlap * r)
        decode = call.prepare(engine, "decode", z.shape, max_memory,
                              call.decode_options(decode_timestep, decode_noise_scale, seed),
                              tile=tile_size or None, overlap=tile_overlap, **frames)
        return (_decode_batches(decode, z, frames_per_chunk) if batches else frames_to_image(decode(z)),)


def _check_counts(frames_per_chunk, overlap: int, tile_size: int) -> None:
    """What the widgets allow but a direct call might not give: a bad chunk would loop forever or
    return nothing; the widget's step lets 1..63 px tiles through, which run many times slower."""
    if not isinstance(frames_per_chunk, int) or frames_per_chunk < 1:
        raise InputError(f"{frames_per_chunk!r} latent frames per chunk.", input="frames_per_chunk",
                         fix="use 1 or more (each latent frame is 4-8 video frames).")
    if not isinstance(overlap, int) or overlap < 0:
        raise InputError(f"an overlap of {overlap!r} latent frames.", input="overlap", fix="use 0 or more.")
    if not isinstance(tile_size, int) or not (tile_size == 0 or tile_size >= checks.MIN_TILE_PX):
        raise InputError(f"tiles of {tile_size!r} pixels.", input="tile_size",
                         fix=f"use 0 for whole frames, or {checks.MIN_TILE_PX} pixels or more.")


def _decode_batches(decode: call.NodeCall, z: torch.Tensor, chunk: int) -> torch.Tensor:
    """Image latents [N, C, h, w], ``chunk`` at a time into one preallocated IMAGE."""
    progress = _comfy.progress_callback()
    out = None
    n = z.shape[0]
    for i in range(0, n, chunk):
        part = frames_to_image(decode(z[i:i + chunk], progress=False))
        if out is None:
            out = torch.empty((n, *part.shape[1:]), dtype=part.dtype, device=part.device)
        out[i:i + len(part)] = part
        del part
        if progress:
            progress(min(n, i + chunk), n)
    if out is None:     # unreachable after checks.latent (batch >= 1); an IMAGE or an error, never None
        raise InputError("the latent holds no samples.", input="samples", fix="check the node that made it.")
    return out
