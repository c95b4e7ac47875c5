"""Read a weights file safely, unwrap it, convert its keys, build the model.

.safetensors are memory-mapped; .pth/.pt/.ckpt/.bin go through ``torch.load(weights_only=True)``
only, so a pickle that would run code is refused, never executed (pickle_scan.py says why a file was
refused without unpickling it). A file is validated before any tensor is used (safetensors_header.py),
and every step a family runs on its tensors is guarded (loadcheck.py), so a malformed file fails with
one LoadError naming the file, the problem and a fix, and no half-built model."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import torch

from . import filekind, loadcheck, pickle_scan, registry, safetensors_header
from .archs.tiny import DEC, ENC
from .errors import LoadError
from .handle import VAE

PICKLE_SUFFIXES = {".pth", ".pt", ".ckpt", ".bin"}
SAFETENSORS_SUFFIXES = {".safetensors", ".sft"}
PREFIXES = ("first_stage_model.", "vae.")          # full checkpoints: keep only the VAE part
STRIP_IF_ALL = ("module.", "model.")               # training wrappers around a bare VAE
PathLike = Union[str, os.PathLike]


def _check_safetensors(path: Path) -> None:
    """Validate the whole header (see safetensors_header.py) before any tensor is read."""
    safetensors_header.read_header(path)


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
        data = filekind.head(path)
        if not (data.startswith(filekind.ZIP) or filekind.looks_like_pickle(data)):
            raise _not_pytorch(path, data)
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=_is_zip(path))
        except Exception as e:
            raise pickle_scan.explain(path, e) from None
        return _as_tensor_dict(obj, path.name)
    raise LoadError(f"'{path.name}' has an unknown extension '{suffix}'.",
                    fix="use .safetensors (preferred), .pth, .pt, .ckpt or .bin.")


def _not_pytorch(path: Path, data: bytes) -> LoadError:
    kind = filekind.describe(data)
    if kind == "a safetensors file":
        return LoadError(f"'{path.name}' is a safetensors file with a {path.suffix} name.",
                         fix="rename it to .safetensors.")
    what = f"it is {kind}" if kind else \
        f"its first bytes ({filekind.first_bytes(data)}) are neither a zip archive nor a pickle"
    fix = filekind.lfs_fix() if kind and "LFS" in kind else \
        "the file is incomplete, corrupt or not a weights file: download the VAE again."
    return LoadError(f"'{path.name}' is not a PyTorch weights file: {what}.", fix=fix)


def _is_zip(path: Path) -> bool:
    return filekind.head(path, 4) == filekind.ZIP


def _as_tensor_dict(obj, name: str) -> dict[str, torch.Tensor]:
    return loadcheck.tensor_entries(obj, f"'{name}'")


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
    sd = unwrap(loadcheck.tensor_entries(sd, source))
    if not sd:
        raise LoadError(f"{source} holds no tensors.", fix="load a VAE weights file.")
    spec = registry.detect(sd, source)
    tracked = loadcheck.Tracked()
    with loadcheck.family_step(spec.name, source, tracked):
        tracked.update(spec.to_canonical(sd))
        config = spec.config_from_state_dict(tracked, name_hint)
        sd = spec.complete_state_dict(dict(tracked), config)
        spec.capabilities(config)
        with torch.device("meta"):
            model = spec.build(config)
        missing, unexpected, reshaped = _compare(model, sd)
        described = spec.describe(config) or spec.name
    if missing or unexpected or reshaped:
        raise LoadError(f"{source} looks like {described} but does not match it: "
                        f"{loadcheck.mismatch(missing, unexpected, reshaped)}.", fix=loadcheck.DAMAGED_FIX)
    loadcheck.check_weights(sd, source, described)
    with loadcheck.family_step(spec.name, source):
        model.load_state_dict(sd, strict=True, assign=True)
    model.eval().requires_grad_(False)
    return VAE(spec, config, model, dtype=dtype, device=device, source=source)


def _compare(model, sd) -> tuple[list[str], list[str], list[str]]:
    """Missing keys, unexpected keys, and keys whose shape differs (as "key is [..], the model takes
    [..]"): checked before any weight is assigned, so a mismatch is a LoadError rather than torch's
    RuntimeError half-way through."""
    want = model.state_dict()
    reshaped = [f"'{k}' is {list(sd[k].shape)}, the model takes {list(want[k].shape)}"
                for k in sorted(want.keys() & sd.keys()) if tuple(want[k].shape) != tuple(sd[k].shape)]
    return sorted(want.keys() - sd.keys()), sorted(sd.keys() - want.keys()), reshaped


def load(path: PathLike, dtype: Optional[torch.dtype] = None, device=None,
         name_hint: Optional[str] = None) -> VAE:
    """Load a VAE file (or a TAESD encoder/decoder pair given by either file or the stem)."""
    paths = pair_paths(path)
    sd = read_vae_files(paths)
    hint = name_hint or Path(path).name
    return from_state_dict(sd, name_hint=hint, source=f"'{Path(path).name}'", dtype=dtype, device=device)
