"""Read and write RGB images as float tensors [H, W, 3] in 0..1 (written also RGBA [H, W, 4]: what
RGBA VAEs decode).

Pillow is used when it is importable. Without it, PNG still works through a small built-in codec:
the writer emits 8-bit RGB(A) with filter type 0 (None) on every row; the reader takes 8-bit RGB/RGBA,
non-interlaced files whose rows use filter types 0 (None), 1 (Sub) or 2 (Up), which covers what
the writer makes. ``.npy`` arrays [H, W, 3] (float in 0..1, or uint8) need only numpy."""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Union

import numpy as np
import torch

from . import filekind
from ..errors import InputError

PathLike = Union[str, os.PathLike]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image


def _to_float(a: np.ndarray, name: str) -> torch.Tensor:
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise InputError(f"'{name}': expected an image [H, W, 3], got shape {a.shape}.", input="image",
                         fix="give an RGB(A) or greyscale image.")
    a = a[:, :, :3]
    if a.dtype == np.uint8:
        a = a.astype(np.float32) / 255.0
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def _to_uint8(image: torch.Tensor, channels: tuple[int, ...] = (3,)) -> np.ndarray:
    image = torch.as_tensor(image).detach()
    if image.dim() != 3 or image.shape[2] not in channels:
        want = " or ".join(f"[H, W, {c}]" for c in channels)
        raise ValueError(f"expected an image tensor {want}, got shape {tuple(image.shape)}.")
    return (image.float().cpu().clamp(0, 1) * 255).round().to(torch.uint8).numpy()


# ---- public API --------------------------------------------------------------------------------

def read_image(path: PathLike) -> torch.Tensor:
    """An image file (or a .npy array) -> float32 tensor [H, W, 3] in 0..1. Unreadable files raise
    one InputError saying what the file is."""
    path = Path(path)
    wrong = filekind.wrong_path(path, "image", (".png", ".jpg", ".jpeg", ".webp", ".npy"))
    if wrong:
        raise InputError(wrong[0], input="image", fix=wrong[1])
    try:
        if path.suffix.lower() == ".npy":
            return _to_float(np.load(path, allow_pickle=False), path.name)
        Image = _pillow()
        if Image is not None:
            with Image.open(path) as im:
                return _to_float(np.asarray(im.convert("RGB")), path.name)
        if path.suffix.lower() == ".png":
            return _to_float(read_png(path), path.name)
    except InputError:
        raise
    except (OSError, ValueError, SyntaxError, zlib.error) as e:     # Pillow's and numpy's decode errors
        if str(e).startswith(f"'{path.name}'"):     # the built-in PNG reader's message (may say: install Pillow)
            raise InputError(str(e), input="image", fix="give a PNG, JPEG or WebP image.") from None
        kind = filekind.describe(filekind.head(path))
        what = f"it is {kind}" if kind else str(e)
        raise InputError(f"cannot read '{path.name}' as an image: {what}.", input="image",
                         fix="give a PNG, JPEG or WebP image (or a .npy array [H, W, 3]).") from None
    raise InputError(f"cannot read '{path.name}' without Pillow (only PNG and .npy are built in).", input="image",
                     fix="install Pillow, or convert the image to PNG.")


def write_animated_webp(path: PathLike, frames: torch.Tensor, fps: float, lossless: bool = True,
                        quality: int = 80, method: int = 4) -> None:
    """Frames [N, H, W, 3] in 0..1 as one animated WebP, as core's Save Animated WEBP writes it."""
    Image = _pillow()
    if Image is None:
        raise ValueError("an animated WebP needs Pillow: install Pillow.")
    images = [Image.fromarray(_to_uint8(f), "RGB") for f in frames]
    images[0].save(path, format="WEBP", save_all=True, append_images=images[1:], duration=round(1000 / fps),
                   lossless=lossless, quality=quality, method=method)


def read_frames(path: PathLike) -> torch.Tensor:
    """Every frame of an animated image [N, H, W, 3] in 0..1 (one frame for a still image)."""
    Image = _pillow()
    if Image is None:
        raise ValueError("reading animated images needs Pillow: install Pillow.")
    from PIL import ImageSequence
    with Image.open(path) as im:
        return torch.stack([_to_float(np.asarray(f.convert("RGB")), Path(path).name)
                            for f in ImageSequence.Iterator(im)])


def write_image(path: PathLike, image: torch.Tensor) -> None:
    """Write a tensor [H, W, 3] (or RGBA [H, W, 4], as RGBA VAEs decode) in 0..1 (clamped, rounded to
    8 bits for image formats)."""
    path = Path(path)
    if path.suffix.lower() == ".npy":
        np.save(path, torch.as_tensor(image).detach().float().cpu().numpy())
        return
    pixels = _to_uint8(image, (3, 4))
    Image = _pillow()
    if Image is not None:
        Image.fromarray(pixels, "RGBA" if pixels.shape[2] == 4 else "RGB").save(path)
    elif path.suffix.lower() == ".png":
        write_png(path, pixels)
    else:
        raise ValueError(f"cannot write '{path.name}' without Pillow (only PNG and .npy are built in): "
                         "install Pillow.")


# ---- built-in PNG codec ------------------------------------------------------------------------

def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def write_png(path: PathLike, pixels: np.ndarray) -> None:
    """uint8 array [H, W, 3] (or [H, W, 4]) -> 8-bit RGB (RGBA) PNG, filter type 0 on every row."""
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    h, w, c = pixels.shape
    rows = np.concatenate([np.zeros((h, 1), np.uint8), pixels.reshape(h, w * c)], axis=1)
    colour = 6 if c == 4 else 2                           # truecolour with alpha, or truecolour
    ihdr = struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0)   # 8-bit, deflate, no interlace
    data = PNG_SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) \
        + _chunk(b"IEND", b"")
    Path(path).write_bytes(data)


def read_png(path: PathLike) -> np.ndarray:
    """8-bit RGB/RGBA non-interlaced PNG with row filters None/Sub/Up -> uint8 array [H, W, 3|4]."""
    path = Path(path)
    data = path.read_bytes()

    def unsupported(what: str) -> ValueError:
        return ValueError(f"'{path.name}': {what}; the built-in PNG reader handles only 8-bit RGB/RGBA, "
                          "non-interlaced, row filters None/Sub/Up: install Pillow to read it.")

    if not data.startswith(PNG_SIGNATURE):
        raise ValueError(f"'{path.name}' is not a PNG file.")
    pos, header, idat = len(PNG_SIGNATURE), None, []
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos: pos + 8])
        body = data[pos + 8: pos + 8 + length]
        if len(body) != length or pos + 12 + length > len(data):
            raise ValueError(f"'{path.name}' is truncated.")
        crc = struct.unpack(">I", data[pos + 8 + length: pos + 12 + length])[0]
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            raise ValueError(f"'{path.name}' is corrupt (bad CRC in its {kind.decode('latin-1')} chunk).")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if header is None or not idat:
        raise ValueError(f"'{path.name}' has no IHDR or IDAT chunk.")
    w, h, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6):
        raise unsupported(f"bit depth {depth}, colour type {colour}")
    if interlace:
        raise unsupported("interlaced")
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8)
    if raw.size != h * (1 + w * bpp):
        raise ValueError(f"'{path.name}' is corrupt (image data has the wrong size).")
    raw = raw.reshape(h, 1 + w * bpp)
    filters, rows = raw[:, 0], raw[:, 1:]
    bad = set(np.unique(filters).tolist()) - {0, 1, 2}
    if bad:
        raise unsupported(f"row filter type(s) {sorted(bad)} (3 = Average, 4 = Paeth)")
    out = np.empty((h, w * bpp), np.uint8)
    prev = np.zeros(w * bpp, np.uint8)
    for y in range(h):
        row, f = rows[y], filters[y]
        if f == 1:      # Sub: each byte adds the one bpp to the left = running sum per channel
            row = (np.cumsum(row.reshape(w, bpp), axis=0, dtype=np.uint32) % 256).astype(np.uint8).reshape(-1)
        elif f == 2:    # Up: adds the byte above
            row = row + prev            # uint8 arithmetic wraps mod 256
        out[y] = row
        prev = out[y]
    return out.reshape(h, w, bpp)
