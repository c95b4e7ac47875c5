"""Read a weights file safely, unwrap it, convert its keys, build the model.

.safetensors are memory-mapped; .pth/.pt/.ckpt/.bin go through ``torch.load(weights_only=True)``
only, so a pickle that would run code is refused, never executed (files/pickle_scan.py says why a file was
refused without unpickling it). A file is validated before any tensor is used (files/safetensors_header.py),
and every step a family runs on its tensors is guarded (files/loadcheck.py), so a malformed file fails with
one LoadError naming the file, the problem and a fix, and no half-built model. The model gets its own
contiguous copy of every tensor (``_handed_over``), so every file and key layout of the same weights
runs bit for bit the same.

A full checkpoint (a diffusion model with its VAE under ``vae.`` / ``first_stage_model.``, and for
LTX-2 an audio VAE and a vocoder beside it) is read for its VAE only: of a .safetensors file, only
the tensors under the VAE prefix are ever loaded. The file's safetensors metadata (``__metadata__``)
reaches the families that read hyperparameters from it (``ArchSpec.reads_metadata``)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

import torch
from safetensors import safe_open

from . import checks, registry
from .files import filekind, loadcheck, pickle_scan, safetensors_header
from .archs.tiny import DEC, ENC
from .errors import LoadError
from .handle import VAE

PICKLE_SUFFIXES = {".pth", ".pt", ".ckpt", ".bin"}
SAFETENSORS_SUFFIXES = {".safetensors", ".sft"}
PREFIXES = ("first_stage_model.", "vae.")          # full checkpoints: keep only the VAE part
STRIP_IF_ALL = ("module.", "model.")               # training wrappers around a bare VAE
PathLike = Union[str, os.PathLike]
Select = Callable[[list[str]], Iterable[str]]      # the keys of a file -> the keys to read


def _check_safetensors(path: Path) -> dict[str, str]:
    """Validate the whole header (see files/safetensors_header.py) before any tensor is read; its metadata."""
    return safetensors_header.read_header_and_metadata(path)[1]


def _existing(path: PathLike) -> Path:
    path = Path(path)
    wrong = filekind.wrong_path(path, "file", tuple(SAFETENSORS_SUFFIXES | PICKLE_SUFFIXES))
    if wrong:
        problem, fix = wrong
        raise LoadError(problem, fix=fix if "folder" in problem else
                        "check the path, or put the file in ComfyUI's models/vae folder.")
    return path


def read_metadata(path: PathLike) -> dict[str, str]:
    """A .safetensors file's ``__metadata__`` (string keys and values; empty if it has none, and for
    pickle formats, which carry none)."""
    path = _existing(path)
    if path.suffix.lower() not in SAFETENSORS_SUFFIXES:
        return {}
    return dict(_check_safetensors(path))


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
        data = filekind.head(path)
        if not (data.startswith(filekind.ZIP) or filekind.looks_like_pickle(data)):
            raise _not_pytorch(path, data)
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=_is_zip(path))
        except Exception as e:
            raise pickle_scan.explain(path, e) from None
        sd = _as_tensor_dict(obj, path.name)
        return {k: sd[k] for k in select(list(sd))} if select else sd
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
    dtype, device = checks.dtype(dtype), checks.device(device)        # before any work
    sd = unwrap(loadcheck.tensor_entries(sd, source))
    if not sd:
        raise LoadError(f"{source} holds no tensors.", fix="load a VAE weights file.")
    spec = registry.detect(sd, source)
    tracked = loadcheck.Tracked()
    try:
        with loadcheck.family_step(spec.name, source, tracked):
            tracked.update(spec.to_canonical(sd))
            if spec.reads_metadata:
                config = spec.config_from_state_dict(tracked, name_hint, metadata=dict(metadata or {}))
            else:
                config = spec.config_from_state_dict(tracked, name_hint)
            sd = spec.complete_state_dict(dict(tracked), config)
            caps = spec.capabilities(config)
            with torch.device("meta"):
                model = spec.build(config)
            missing, unexpected, reshaped = _compare(model, sd)
            described = spec.describe(config) or spec.name
    except LoadError as e:
        # a family that trips over a damaged part: name what is missing where the keys tell it
        raise loadcheck.damaged(source, spec.name, tracked or sd, []) or e from None
    if missing or unexpected or reshaped:
        raise loadcheck.damaged(source, described, sd, missing, unexpected, reshaped, tracked.absent) or LoadError(
            f"{source} looks like {described} but does not match it: "
            f"{loadcheck.mismatch(missing, unexpected, reshaped)}.", fix=loadcheck.DAMAGED_FIX)
    loadcheck.check_shapes(model.eval(), caps, source, described, config)
    loadcheck.check_weights(sd, source, described, expected=model.state_dict())
    with loadcheck.family_step(spec.name, source):
        model.load_state_dict(_handed_over(sd, device), strict=True, assign=True)
    model.eval().requires_grad_(False)
    return VAE(spec, config, model, dtype=dtype, device=device, source=source)


def _handed_over(sd: Mapping[str, torch.Tensor], device=None) -> dict[str, torch.Tensor]:
    """The tensors as the model receives them, whatever file, layout or object they came from: each a
    fresh contiguous tensor with a storage of its own, on ``device`` (default the CPU).

    Tensors arrive in many shapes of memory: views into a memory-mapped .safetensors file at whatever
    byte offset the file gives them, a pickle's shared storages, slices and reshapes a key conversion
    made, a caller's own tensors. CPU kernels choose their path (and so the order they round in) from
    strides and data alignment, so one model's weights held in two such ways can give results 1e-7
    apart (seen on an AMD EPYC between two key layouts of the same Mage-VAE file). Copied here into
    the allocator's memory, contiguous, every layout hands the model the same tensors and runs bit for
    bit the same; and a handle never shares memory with the file or the caller's state dict. The copy
    is freed tensor by tensor when ``VAE.to`` casts to another dtype, so the peak stays that of the
    cast."""
    where = torch.device(device) if device is not None else torch.device("cpu")
    return {k: torch.empty_like(t, device=where, memory_format=torch.contiguous_format).copy_(t)
            for k, t in sd.items()}


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
    dtype, device = checks.dtype(dtype), checks.device(device)        # before the file is read
    paths = pair_paths(path)
    sd = read_vae_files(paths)
    metadata = read_metadata(paths[0]) if len(paths) == 1 else {}
    hint = name_hint or Path(path).name
    vae = from_state_dict(sd, name_hint=hint, source=f"'{Path(path).name}'", dtype=dtype, device=device,
                          metadata=metadata)
    vae.path = str(Path(path).resolve())
    return vae
