"""Read a weights file safely, unwrap it, convert its keys, build the model.

.safetensors are memory-mapped; .pth/.pt/.ckpt/.bin go through ``torch.load(weights_only=True)``
only, so a pickle that would run code is refused, never executed. A file is validated before any
tensor is used, so a corrupt file fails with a message and no half-built model."""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import torch

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


def _check_safetensors(path: Path) -> None:
    """Validate the header and that the file is long enough for every tensor it declares."""
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


def read_state_dict(path: PathLike) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"no file at '{path}'.", fix="check the path, or put the file in ComfyUI's models/vae folder.")
    suffix = path.suffix.lower()
    if suffix in SAFETENSORS_SUFFIXES:
        _check_safetensors(path)
        from safetensors.torch import load_file
        try:
            return load_file(str(path), device="cpu")
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
        return _as_tensor_dict(obj, path.name)
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


def unwrap(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keep the VAE part of a full checkpoint and strip wrapper prefixes."""
    for prefix in PREFIXES:
        if any(k.startswith(prefix) for k in sd):
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
        return unwrap(read_state_dict(paths[0]))
    sd: dict[str, torch.Tensor] = {}
    for p in paths:
        part = PAIR.match(Path(p).name)["part"]
        prefix = ENC if part == "encoder" else DEC
        sd.update({f"{prefix}.{k}": v for k, v in unwrap(read_state_dict(p)).items()})
    return sd


def from_state_dict(sd: Mapping[str, torch.Tensor], name_hint: Optional[str] = None,
                    source: str = "state dict", dtype: Optional[torch.dtype] = None,
                    device: Union[str, torch.device, None] = None) -> VAE:
    sd = unwrap(sd)
    spec = registry.detect(sd, source)
    sd = spec.to_canonical(sd)
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
    hint = name_hint or Path(path).name
    return from_state_dict(sd, name_hint=hint, source=f"'{Path(path).name}'", dtype=dtype, device=device)
