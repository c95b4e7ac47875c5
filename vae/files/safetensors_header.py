"""Validate a safetensors file's header completely before any tensor is touched.

The format: 8 bytes little-endian header length N, N bytes of UTF-8 JSON (an object mapping tensor
names to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__" object of
strings), then the data buffer. Offsets are relative to the buffer; the tensors must cover it
exactly, in order, without gaps or overlaps (as the reference implementation requires). Every rule
broken gets its own message naming the file and the tensor."""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from . import filekind
from ..errors import LoadError

MAX_HEADER = 100_000_000          # the reference implementation's limit
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1,
            "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "I64": 8, "U64": 8,
            "F64": 8}
REDOWNLOAD = "the file is incomplete or corrupt: download it again (compare its size or hash with the source)."


def _fail(path: Path, problem: str, fix: str = REDOWNLOAD) -> LoadError:
    return LoadError(f"'{path.name}' {problem}", fix=fix)


def _not_safetensors(path: Path, data: bytes, why: str) -> LoadError:
    kind = filekind.describe(data)
    if kind and kind != "a safetensors file":
        fix = {"a zip archive (PyTorch's .pth/.ckpt format)": "rename it to .pth (it is then read with "
               "torch.load(weights_only=True)).",
               "a Python pickle (PyTorch's legacy .pth/.ckpt format)": "rename it to .ckpt (it is then read with "
               "torch.load(weights_only=True)).",
               "an empty file": REDOWNLOAD}.get(kind)
        if kind.startswith("a Git LFS pointer"):
            fix = filekind.lfs_fix()
        return _fail(path, f"is not a safetensors file: it is {kind}.", fix or "download the weights file itself.")
    return _fail(path, why)


def _is_uint(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_entry(path: Path, name: str, e) -> tuple[int, int]:
    what = f"has a malformed header: tensor '{name}'"
    if not isinstance(e, dict):
        raise _fail(path, f"{what} is described by a {type(e).__name__}, not an object.")
    for field in ("dtype", "shape", "data_offsets"):
        if field not in e:
            raise _fail(path, f"{what} has no '{field}'.")
    dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise _fail(path, f"{what} has the unknown dtype {dtype!r} (known: {', '.join(ITEMSIZE)}).",
                    fix="the file was written by another tool or is corrupt: save it again with safetensors, or "
                        "download it again.")
    if not isinstance(shape, list) or not all(_is_uint(s) for s in shape):
        raise _fail(path, f"{what} has the shape {shape!r}; a shape is a list of non-negative integers.")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets)):
        raise _fail(path, f"{what} has data_offsets {offsets!r}; they are two non-negative integers [begin, end].")
    begin, end = offsets
    if end < begin:
        raise _fail(path, f"{what} ends (byte {end}) before it begins (byte {begin}).")
    need = math.prod(shape) * ITEMSIZE[dtype]
    if end - begin != need:
        raise _fail(path, f"{what} is {dtype} of shape {shape} ({need} bytes) but its data_offsets span "
                          f"{end - begin} bytes.")
    return begin, end


def read_header(path: Path) -> dict:
    """The validated header of ``path`` (tensor entries only, without "__metadata__")."""
    return read_header_and_metadata(path)[0]


def read_header_and_metadata(path: Path) -> tuple[dict, dict[str, str]]:
    """The validated header of ``path`` (tensor entries) and its "__metadata__" (strings)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        data = f.read(8)
        if len(data) < 8:
            raise _not_safetensors(path, data, f"is {size} bytes, too short to be a safetensors file.")
        n = struct.unpack("<Q", data)[0]
        if n > MAX_HEADER:
            raise _not_safetensors(path, data + f.read(504), f"is not a safetensors file: its first 8 bytes "
                                   f"declare a {n}-byte header (the format allows {MAX_HEADER}).")
        if n > size - 8:
            raise _not_safetensors(path, data + f.read(504), f"is truncated: it declares a {n}-byte header but "
                                   f"has only {size} bytes.")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _fail(path, "has a safetensors header that is not UTF-8 text.") from None
    except ValueError as e:
        raise _not_safetensors(path, data + raw[:504], f"has an unreadable safetensors header ({e}).") from None
    if not isinstance(header, dict):
        raise _fail(path, f"has a malformed header: a JSON {type(header).__name__}, not an object.")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _fail(path, "has a malformed header: '__metadata__' must be an object of strings.")
    spans = sorted((_check_entry(path, k, v), k) for k, v in header.items())
    pos, prev = 0, None
    for (begin, end), name in spans:
        if begin < pos:
            raise _fail(path, f"has a malformed header: tensors '{prev}' and '{name}' overlap (bytes {begin}-{pos}).")
        if begin > pos:
            raise _fail(path, f"has a malformed header: {begin - pos} bytes before tensor '{name}' belong to no "
                              "tensor.")
        pos, prev = end, name
    body = size - 8 - n
    if pos > body:
        raise _fail(path, f"is truncated: its header needs {8 + n + pos} bytes, the file has {size}.")
    if pos < body:
        raise _fail(path, f"has {body - pos} bytes after its last tensor that its header does not describe.")
    return header, meta
