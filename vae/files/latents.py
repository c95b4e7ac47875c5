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

LATENT_FIX = "give a .latent file written by core 'Save Latent' or `python -m vae encode`."


def read_latent_file(path) -> torch.Tensor:
    """A ComfyUI .latent file: safetensors with 'latent_tensor'. Files without the
    'latent_format_version_0' marker predate ComfyUI's raw-latent convention and hold SD1 latents
    scaled by 0.18215, which core's Load Latent undoes; so do we. Anything else is one LoadError."""
    from pathlib import Path

    from safetensors.torch import load_file

    from . import filekind
    from ..errors import LoadError
    from .safetensors_header import read_header
    path = Path(path)
    wrong = filekind.wrong_path(path, "latent file", (".latent",))
    if wrong:
        raise LoadError(wrong[0], input="latent", fix=wrong[1])
    kind = filekind.describe(filekind.head(path))
    if kind and kind != "a safetensors file":
        image = kind.endswith("image")
        raise LoadError(f"'{path.name}' is {kind}, not a ComfyUI .latent file.", input="latent",
                        fix="to encode an image, run `python -m vae encode --vae VAE IMAGE`." if image else LATENT_FIX)
    try:
        header = read_header(path)
        if header.get("latent_tensor", {}).get("dtype") not in ("F32", "F16", "BF16", "F64"):
            raise LoadError(f"'{path.name}' has no floating-point 'latent_tensor'; it is not a ComfyUI .latent "
                            "file.", fix=LATENT_FIX)
        data = load_file(str(path))
    except LoadError as e:
        raise LoadError(e.problem, input="latent", fix=LATENT_FIX) from None
    except Exception as e:  # noqa: BLE001 (safetensors' error types vary by version)
        raise LoadError(f"'{path.name}' could not be read as a .latent file ({e}).", input="latent",
                        fix=LATENT_FIX) from None
    scale = 1.0 if "latent_format_version_0" in data else 1.0 / 0.18215
    return data["latent_tensor"].float() * scale


def write_latent_file(path, samples: torch.Tensor) -> None:
    """Write what core's Save Latent writes, atomically (no half-written or temporary file is left
    on failure or interrupt)."""
    from safetensors.torch import save_file

    from .outputs import AtomicFiles
    with AtomicFiles(overwrite=True) as files:
        save_file({"latent_tensor": samples.contiguous().cpu(), "latent_format_version_0": torch.tensor([])},
                  str(files.temp(path)))
