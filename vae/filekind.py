"""What a file really is, from its first bytes, so an error can say "this is a web page" rather than
"bad header": downloads that saved a login page, Git LFS pointers, images given as weights or latents,
and weights saved under the other format's extension."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Optional

ZIP = b"PK\x03\x04"


def head(path: Path, n: int = 512) -> bytes:
    with path.open("rb") as f:
        return f.read(n)


def looks_like_safetensors(data: bytes) -> bool:
    return len(data) >= 10 and data[8:9] == b"{" and 2 <= struct.unpack("<Q", data[:8])[0] < 100_000_000


def looks_like_pickle(data: bytes) -> bool:
    """A pickle (protocol 2-5), as torch's legacy format and plain ``pickle.dump`` files start."""
    return len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5


def describe(data: bytes) -> Optional[str]:
    """A short name for a known kind of file, or None when the bytes are not recognised."""
    text = data[:200].lstrip().lower()
    if not data:
        return "an empty file"
    if data.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer (a small text file standing in for the real weights)"
    if text.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml")):
        return "a web page (HTML), as a download that hit a login or error page saves"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "a PNG image"
    if data.startswith(b"\xff\xd8\xff"):
        return "a JPEG image"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "a WebP image"
    if data.startswith(ZIP):
        return "a zip archive (PyTorch's .pth/.ckpt format)"
    if looks_like_pickle(data):
        return "a Python pickle (PyTorch's legacy .pth/.ckpt format)"
    if looks_like_safetensors(data):
        return "a safetensors file"
    if data.startswith(b"\x1f\x8b"):
        return "a gzip archive"
    if text.startswith((b"{", b"[")):
        try:
            json.loads(data)
        except ValueError:
            return None
        return "a JSON text file"
    return None


def first_bytes(data: bytes, n: int = 8) -> str:
    return " ".join(f"{b:02x}" for b in data[:n]) or "none"


def lfs_fix() -> str:
    return "fetch the real file (`git lfs pull` in the repository you cloned, or download it directly)."
