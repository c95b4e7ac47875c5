"""Read a weights file safely, unwrap it, convert its keys, build the model.

.safetensors are memory-mapped; .pth/.pt/.ckpt/.bin go through ``torch.load(weights_only=True)``
only, so a pickle that would run code is refused, never executed. A file is validated before any
tensor is used, so a corrupt file fails with a message and no half-built model.

A full checkpoint (a diffusion model with its VAE under ``vae.`` / ``first_stage_model.``, and for
LTX-2 an audio VAE and a vocoder beside it) is read for its VAE only: of a .safetensors file, only
the tensors under the VAE prefix are ever loaded. The file's safetensors metadata (``__metadata__``)
reaches the families that read hyperparameters from it (``ArchSpec.reads_metadata``)."""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

import torch
from safetensors import safe_open

from . import registry
from .archs.tiny import DEC, ENC
from .errors import LoadError
from .handle import VAE

PICKLE_SUFFIXES = {".pth", ".pt", ".ckpt", ".bin"}
SAFETENSORS_SUFFIXES = {".safetensors", ".sft"}
WRAPPERS = ("state_dict", "model", "module")
PREFIXES = ("first_stage_model.", "vae.")          # full checkpoints: keep only the VAE part
STRIP_IF_ALL = ("module.", "model.")               # training wrappers around a bare VAE
PathLike = Union[str, os.PathLike]
Select = Callable[[list[str]], Iterable[str]]      # the keys of a file -> the keys to read


def _check_safetensors(path: Path) -> dict:
    """Validate the header and that the file is long enough for every tensor it declares; the
    header (with its ``__metadata__``, if any)."""
    size = path.stat().st_size
    fix = "the file is incomplete or corrupt: download it again (compare its size or hash with the source)."
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise LoadError(f"'{path.name}' is {size} bytes, too short to be a safetensors file.", fix=fix)
        n = struct.unpack("<Q", head)[0]
        if n > size - 8:
            raise LoadError(f"'{path.name}' declares a {n}-byte header but has only {size} bytes.", fix=fix)
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise LoadError(f"'{path.name}' has an unreadable safetensors header ({e}).", fix=fix) from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise LoadError(f"'{path.name}' is truncated: its header needs {8 + n + end} bytes, the file has {size}.",
                        fix=fix)
    return header


def _existing(path: PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"no file at '{path}'.", fix="check the path, or put the file in ComfyUI's models/vae folder.")
    return path


def read_metadata(path: PathLike) -> dict[str, str]:
    """A .safetensors file's ``__metadata__`` (string keys and values; empty if it has none, and for
    pickle formats, which carry none)."""
    path = _existing(path)
    if path.suffix.lower() not in SAFETENSORS_SUFFIXES:
        return {}
    meta = _check_safetensors(path).get("__metadata__") or {}
    return {str(k): v for k, v in meta.items() if isinstance(v, str)}


def read_state_dict(path: PathLike, select: Optional[Select] = None) -> dict[str, torch.Tensor]:
    """The tensors of a weights file; ``select`` (the file's keys -> those to read) limits a
    .safetensors read to those tensors, the rest of the file is never touched."""
    path = _existing(path)
    suffix = path.suffix.lower()
    if suffix in SAFETENSORS_SUFFIXES:
        _check_safetensors(path)
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                keys = list(f.keys())
                return {k: f.get_tensor(k) for k in (select(keys) if select else keys)}
        except Exception as e:  # the library's own error types vary by version
            raise LoadError(f"'{path.name}' could not be read as safetensors ({e}).",
                            fix="download the file again.") from None
    if suffix in PICKLE_SUFFIXES:
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=_is_zip(path))
        except Exception as e:
            text = str(e)
            if "weights_only" in text or "Unsupported global" in text or "GLOBAL" in text:
                raise LoadError(
                    f"refused to load '{path.name}': it is a pickle that contains Python objects, not only tensors, "
                    "and unpickling it could run code.",
                    fix="use a .safetensors version of this VAE, or convert it in a trusted environment.") from None
            raise LoadError(f"'{path.name}' could not be read ({text.splitlines()[0] if text else type(e).__name__}).",
                            fix="the file is incomplete or not a PyTorch weights file: download it again.") from None
        sd = _as_tensor_dict(obj, path.name)
        return {k: sd[k] for k in select(list(sd))} if select else sd
    raise LoadError(f"'{path.name}' has an unknown extension '{suffix}'.",
                    fix="use .safetensors (preferred), .pth, .pt, .ckpt or .bin.")


def _is_zip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _as_tensor_dict(obj, name: str) -> dict[str, torch.Tensor]:
    for _ in range(3):  # nested wrappers such as {"state_dict": {...}}
        if isinstance(obj, Mapping):
            inner = next((obj[w] for w in WRAPPERS if isinstance(obj.get(w), Mapping)), None)
            if inner is not None and not any(torch.is_tensor(v) for v in obj.values()):
                obj = inner
                continue
        break
    if not isinstance(obj, Mapping):
        raise LoadError(f"'{name}' holds a {type(obj).__name__}, not a state dict.",
                        fix="load a file of tensors (a state dict).")
    return {k: v for k, v in obj.items() if torch.is_tensor(v)}


def _vae_prefix(keys: Iterable[str]) -> Optional[str]:
    """The prefix a full checkpoint keeps its VAE under, if any (the first of ``PREFIXES`` found)."""
    keys = list(keys)
    return next((p for p in PREFIXES if any(k.startswith(p) for k in keys)), None)


def vae_keys(keys: list[str]) -> list[str]:
    """Of a file's keys, those a VAE load reads: a full checkpoint's VAE part, else all."""
    prefix = _vae_prefix(keys)
    return [k for k in keys if k.startswith(prefix)] if prefix else keys


def unwrap(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keep the VAE part of a full checkpoint and strip wrapper prefixes."""
    prefix = _vae_prefix(sd)
    if prefix:
        return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    for prefix in STRIP_IF_ALL:
        if sd and all(k.startswith(prefix) for k in sd):
            return {k[len(prefix):]: v for k, v in sd.items()}
    return dict(sd)


PAIR = re.compile(r"^(?P<stem>.*)_(?P<part>encoder|decoder)(?P<ext>\.[^.]+)$")
PAIR_EXTS = (".safetensors", ".sft", ".pth", ".pt", ".ckpt", ".bin")


def _part_file(folder: Path, stem: str, part: str, prefer: str = ".safetensors") -> Optional[Path]:
    for ext in (prefer,) + PAIR_EXTS:
        if (p := folder / f"{stem}_{part}{ext}").is_file():
            return p
    return None


def pair_paths(path: PathLike) -> list[Path]:
    """TAESD ships encoder and decoder as two files; given either (or the shared stem, as ComfyUI
    lists the pair: "taef2"), find both. The halves may have different extensions."""
    path = Path(path)
    if m := PAIR.match(path.name):
        other = _part_file(path.parent, m["stem"], "decoder" if m["part"] == "encoder" else "encoder", m["ext"])
        return [path, other] if other else [path]
    if not path.exists():
        found = [p for part in ("encoder", "decoder") if (p := _part_file(path.parent, path.name, part))]
        if found:
            return found
    return [path]


def read_vae_files(paths: Sequence[PathLike]) -> dict[str, torch.Tensor]:
    if len(paths) == 1:
        return unwrap(read_state_dict(paths[0], select=vae_keys))
    sd: dict[str, torch.Tensor] = {}
    for p in paths:
        part = PAIR.match(Path(p).name)["part"]
        prefix = ENC if part == "encoder" else DEC
        sd.update({f"{prefix}.{k}": v for k, v in unwrap(read_state_dict(p)).items()})
    return sd


def from_state_dict(sd: Mapping[str, torch.Tensor], name_hint: Optional[str] = None,
                    source: str = "state dict", dtype: Optional[torch.dtype] = None,
                    device: Union[str, torch.device, None] = None,
                    metadata: Optional[Mapping[str, str]] = None) -> VAE:
    """``metadata``: the file's safetensors metadata, for families whose files carry hyperparameters
    there (LTX-2's ``config``); the others read everything from the weights."""
    sd = unwrap(sd)
    spec = registry.detect(sd, source)
    sd = spec.to_canonical(sd)
    if spec.reads_metadata:
        config = spec.config_from_state_dict(sd, name_hint, metadata=dict(metadata or {}))
    else:
        config = spec.config_from_state_dict(sd, name_hint)
    sd = spec.complete_state_dict(sd, config)
    with torch.device("meta"):
        model = spec.build(config)
    missing, unexpected, reshaped = _compare(model, sd)
    if missing or unexpected or reshaped:
        raise LoadError(
            f"{source} looks like {spec.describe(config)} but does not match it: "
            f"{len(missing)} keys missing (e.g. {', '.join(missing[:3])}), {len(unexpected)} unexpected "
            f"(e.g. {', '.join(unexpected[:3])}), {len(reshaped)} with other shapes (e.g. {', '.join(reshaped[:3])}).",
            fix="the file may be a different variant or damaged; please report it with the key list.")
    model.load_state_dict(sd, strict=True, assign=True)
    model.eval().requires_grad_(False)
    return VAE(spec, config, model, dtype=dtype, device=device, source=source)


def _compare(model, sd) -> tuple[list[str], list[str], list[str]]:
    """Missing keys, unexpected keys, and keys whose shape differs: checked before any weight is
    assigned, so a mismatch is a LoadError rather than torch's RuntimeError half-way through."""
    want = model.state_dict()
    reshaped = [k for k in sorted(want.keys() & sd.keys()) if tuple(want[k].shape) != tuple(sd[k].shape)]
    return sorted(want.keys() - sd.keys()), sorted(sd.keys() - want.keys()), reshaped


def load(path: PathLike, dtype: Optional[torch.dtype] = None, device=None,
         name_hint: Optional[str] = None) -> VAE:
    """Load a VAE file (or a TAESD encoder/decoder pair given by either file or the stem)."""
    paths = pair_paths(path)
    sd = read_vae_files(paths)
    metadata = read_metadata(paths[0]) if len(paths) == 1 else {}
    hint = name_hint or Path(path).name
    return from_state_dict(sd, name_hint=hint, source=f"'{Path(path).name}'", dtype=dtype, device=device,
                           metadata=metadata)
