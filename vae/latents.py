"""Latent layout helpers: 2x2 packing of latent pixels into channels (Flux.2 convention)."""
from __future__ import annotations

import torch


def unpack(z: torch.Tensor, p: int) -> torch.Tensor:
    """[B, C*p*p, h, w] -> [B, C, h*p, w*p]; channel order (c, py, px) as ComfyUI packs it."""
    if p == 1:
        return z
    b, cp, h, w = z.shape
    c = cp // (p * p)
    return z.reshape(b, c, p, p, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c, h * p, w * p)


def pack(z: torch.Tensor, p: int) -> torch.Tensor:
    """Inverse of ``unpack``."""
    if p == 1:
        return z
    b, c, hp, wp = z.shape
    return z.reshape(b, c, hp // p, p, wp // p, p).permute(0, 1, 3, 5, 2, 4).reshape(b, c * p * p, hp // p, wp // p)


# ---- ComfyUI's .latent files (Save Latent / Load Latent) --------------------------------------

def read_latent_file(path) -> torch.Tensor:
    """A ComfyUI .latent file: safetensors with 'latent_tensor'. Files without the
    'latent_format_version_0' marker predate ComfyUI's raw-latent convention and hold SD1 latents
    scaled by 0.18215, which core's Load Latent undoes; so do we."""
    from safetensors.torch import load_file

    from .errors import LoadError
    from .loading import _check_safetensors
    from pathlib import Path
    _check_safetensors(Path(path))
    data = load_file(str(path))
    if "latent_tensor" not in data:
        raise LoadError(f"'{Path(path).name}' has no 'latent_tensor'; it is not a ComfyUI .latent file.",
                        fix="save latents with core 'Save Latent' or `python -m vae encode`.")
    scale = 1.0 if "latent_format_version_0" in data else 1.0 / 0.18215
    return data["latent_tensor"].float() * scale


def write_latent_file(path, samples: torch.Tensor) -> None:
    """Write what core's Save Latent writes, atomically (no half-written file on failure)."""
    import os
    from safetensors.torch import save_file
    tmp = f"{path}.partial"
    save_file({"latent_tensor": samples.contiguous().cpu(), "latent_format_version_0": torch.tensor([])}, tmp)
    os.replace(tmp, path)
