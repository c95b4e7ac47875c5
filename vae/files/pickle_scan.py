"""Why ``torch.load(weights_only=True)`` refused a .pth/.ckpt file, told without unpickling it.

torch's weights-only unpickler fails with the same kind of message for a pickle that names Python
callables (which a plain unpickler would run) and for bytes that are no pickle at all. Reading the
opcodes with ``pickletools.genops`` (it parses, it never executes) tells them apart: a stream that
does not parse is corrupt; one that parses and imports something outside torch's tensor rebuilders
is refused for safety, and the message names what it imports."""
from __future__ import annotations

import io
import pickletools
import re
import zipfile
from pathlib import Path
from typing import Optional

from . import filekind
from ..errors import LoadError

REDOWNLOAD = "the file is incomplete or corrupt: download it again (compare its size or hash with the source)."
UNSAFE_FIX = ("use a .safetensors version of this VAE, or convert it in a trusted environment "
              "(torch.load, then safetensors.torch.save_file).")
# what torch's tensor pickles import besides torch itself
_HARMLESS = {("collections", "OrderedDict"), ("_codecs", "encode"), ("builtins", "set"), ("builtins", "frozenset"),
             ("builtins", "bytearray"), ("builtins", "slice"), ("builtins", "complex")}
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
LEGACY_PICKLES = 5    # torch's legacy format: magic number, protocol, sys info, the object, storage keys


def _globals(stream: io.BytesIO) -> list[str]:
    """Globals one pickle imports (raises on a malformed stream); the stream is left after its STOP."""
    found, strings, memo = [], [], {}
    for op, arg, _ in pickletools.genops(stream):
        name = op.name
        if name in _STRINGS:
            strings.append(arg)
        elif name in ("MEMOIZE", "BINPUT", "LONG_BINPUT") and strings:
            memo[len(memo) if name == "MEMOIZE" else arg] = strings[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET") and arg in memo:
            strings.append(memo[arg])
        elif name in ("GLOBAL", "INST"):
            found.append(".".join(arg.split(" ", 1)))
        elif name == "STACK_GLOBAL" and len(strings) >= 2:
            found.append(f"{strings[-2]}.{strings[-1]}")
    return found


def _suspicious(names: list[str]) -> list[str]:
    out = []
    for n in names:
        module, _, attr = n.rpartition(".")
        module = "builtins" if module == "__builtin__" else module      # protocol 2 spells it so
        if module == "torch" or module.startswith("torch.") or (module, attr) in _HARMLESS:
            continue
        if n not in out:
            out.append(n)
    return out


def _pickles(path: Path) -> tuple[Optional[bytes], Optional[str]]:
    """(the bytes holding the pickle stream(s), or None with the reason they cannot be had)."""
    data = path.read_bytes()
    if not data.startswith(filekind.ZIP):
        return data, None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = [n for n in z.namelist() if n.endswith("data.pkl")]
            if not names:
                return None, "its zip archive holds no data.pkl, so it is not a PyTorch weights file"
            return z.read(names[0]), None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:   # CRC errors are BadZipFile too
        return None, f"its zip archive is incomplete or damaged ({e})"


def explain(path: Path, error: Exception) -> LoadError:
    """The LoadError for a .pth/.ckpt file that ``torch.load(weights_only=True)`` failed on."""
    data, broken = _pickles(path)
    if broken:
        return LoadError(f"'{path.name}' cannot be read: {broken}.", fix=REDOWNLOAD)
    stream, names = io.BytesIO(data), []
    legacy = not data.startswith(filekind.ZIP)
    for i in range(LEGACY_PICKLES if legacy else 1):
        try:
            names += _globals(stream)
        except Exception as e:   # noqa: BLE001 (genops raises ValueError, struct.error... on bad bytes)
            if i == 0 or not names:
                return LoadError(f"'{path.name}' is not a readable PyTorch file: its pickle data is corrupt "
                                 f"({type(e).__name__}: {e}).", fix=REDOWNLOAD)
            break
        if stream.tell() >= len(data):
            break
    bad = _suspicious(names)
    # torch names the global it refused (a whole pickled nn.Module is torch.* but not a tensor)
    bad = bad or re.findall(r"GLOBAL ([\w.]+)", str(error))
    if bad:
        return LoadError(f"refused to load '{path.name}': it is a pickle that imports Python objects "
                         f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}), not only tensors, and "
                         "unpickling it could run code.", fix=UNSAFE_FIX)
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return LoadError(f"'{path.name}' could not be read as PyTorch weights ({first}).", fix=REDOWNLOAD)
