"""ComfyUI data <-> library tensors: IMAGE is [N, H, W, C] float32 0..1 on the intermediate
device, LATENT is a dict whose 'samples' we replace (other keys such as noise_mask and
batch_index are kept)."""
from __future__ import annotations

import logging

import torch

from ..vae.errors import InputError

log = logging.getLogger("VAEKit")


def image_to_bchw(image: torch.Tensor) -> torch.Tensor:
    return image.movedim(-1, 1)


def bchw_to_image(x: torch.Tensor) -> torch.Tensor:
    return x.movedim(1, -1).contiguous()


def frames_to_image(x: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> IMAGE; video [B, C, T, H, W] -> IMAGE frames [B*T, H, W, C], as core's VAE Decode."""
    y = bchw_to_image(x)
    return y.reshape(-1, *y.shape[-3:]) if y.dim() == 5 else y


def latent_tensor(samples) -> torch.Tensor:
    """The tensor of a LATENT input (the first of a nested one)."""
    if not isinstance(samples, dict) or not torch.is_tensor(samples.get("samples")):
        raise InputError("expected a LATENT (a dict with a 'samples' tensor).", input="samples",
                         fix="connect a LATENT output (KSampler, VAE Encode, Load Latent).")
    z = samples["samples"]
    if getattr(z, "is_nested", False):
        z = z.unbind()[0]
    return z


def latent_out(latent_in: dict | None, samples: torch.Tensor) -> dict:
    out = dict(latent_in) if latent_in else {}
    out["samples"] = samples
    return out


def images_to_clips(x: torch.Tensor, r: int, one_clip: bool = True, engine=None) -> torch.Tensor:
    """An IMAGE batch [N, C, H, W] for a video VAE of temporal ratio ``r``, as core's VAE Encode takes
    it: one clip [1, C, N', H, W], or with ``one_clip=False`` (core's ``not_video``) every image its own
    one-frame clip [N, C, 1, H, W]. A clip for our VAE keeps every image: the library encodes the frames
    its family's rule takes (``VAE.clip_frames``: 1 + r*k, the rest dropped as core does, with a warning
    naming the counts that fit). For a core VAE tiled through its own calls the clip is cut here to the
    first N' = 1 + r*((N-1)//r) images, the same rule, said the same way."""
    if not one_clip:
        return x.unsqueeze(2)
    n = x.shape[0]
    keep = n if hasattr(engine, "clip_frames") else 1 + r * ((n - 1) // r) if n else 0
    if keep != n:
        log.warning("VAEKit: %d images make a clip of %d frames (1 + %d*k) for this video VAE; the last %d "
                    "are dropped, as core's VAE Encode does. %d or %d frames fit.", n, keep, r, n - keep, keep,
                    keep + r)
    return x[:keep].movedim(1, 0).unsqueeze(0)


def center_crop_to_multiple(image: torch.Tensor, r: int) -> torch.Tensor:
    """Core's rule for its own VAE Encode (a core node calling our VAE keeps core's behaviour)."""
    h, w = image.shape[1] // r * r, image.shape[2] // r * r
    if h == 0 or w == 0:      # smaller than one latent pixel: left for the encoder's check to name its size
        return image
    y, x = (image.shape[1] % r) // 2, (image.shape[2] % r) // 2
    return image[:, y:y + h, x:x + w]
