"""What a file really is, from its first bytes, so an error can say "this is a web page" rather than
"bad header": downloads that saved a login page, Git LFS pointers, images given as weights or latents,
and weights saved under the other format's extension."""
from __future__ import annotations

import json
import struct
import os
from pathlib import Path
from typing import Optional, Sequence

ZIP = b"PK\x03\x04"


def wrong_path(path, what: str, suffixes: Sequence[str] = ()) -> Optional[tuple[str, str]]:
    """Why ``path`` is not a readable file of ``what`` (a problem and a fix), or None when it is one:
    missing, a folder (naming the files of ``suffixes`` in it, the likely meant ones), or not a
    regular file. One wording for every place a file path comes in (loader, latents, images, workflows)."""
    path = Path(path)
    if path.is_file():
        return None
    if path.is_dir():
        found = sorted(p.name for p in path.iterdir() if p.is_file() and (not suffixes or p.suffix.lower() in suffixes))
        hint = f" It holds {', '.join(repr(n) for n in found[:4])}{' ...' if len(found) > 4 else ''}." if found else ""
        return (f"'{path}' is a folder, not {_a(what)}.{hint}",
                f"give the path of the file itself{', e.g. ' + repr(str(path / found[0])) if found else ''}.")
    if path.exists() or os.path.lexists(path):
        kind = "a broken link" if not path.exists() else "not a regular file"
        return f"'{path}' is {kind}, not {_a(what)}.", "give the path of a file."
    return f"no {what} at '{path}'.", "check the path."


def wrong_folder(path, what: str = "folder") -> Optional[tuple[str, str]]:
    """Why ``path`` is not a folder (a problem and a fix), or None when it is one."""
    path = Path(path)
    if path.is_dir():
        return None
    if path.exists():
        return f"'{path}' is a file, not {_a(what)}.", f"give the {what} that holds it ('{path.parent}'?)."
    return f"no {what} at '{path}'.", "check the path."


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


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
