"""From a file or a diffusers folder to a face: our loader reads the weights (any layout it reads); a
folder's ``config.json`` names the class and gives the config values the weights cannot tell (latent
statistics, scaling); the family declarations (families.py) give the rest."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional

from .. import loading
from ..errors import InputError, LoadError
from ..handle import VAE
from .face import Face, face_class
from .families import FAMILIES, MISSING, Family

WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")


def load(file_or_folder, budget=None, dtype=None, device=None, config: Optional[Mapping[str, Any]] = None) -> Face:
    """A VAE that answers as diffusers' class for it does (see docs/diffusers.md), from any file our loader
    reads or a diffusers folder (a pipeline's folder, whose ``vae/`` is read, or the VAE folder itself:
    ``config.json`` + ``diffusion_pytorch_model.safetensors``). ``budget``: what every call may use on the
    device (bytes, GB as a float, or '4GB'); default: what the device has free, used only when a call would
    not fit in it. ``config``: config values to set (e.g. ``scaling_factor`` of a file whose name does not
    tell SDXL's latent space from SD's); the weights' own values cannot be changed."""
    path = Path(file_or_folder)
    folder = _vae_folder(path) if path.is_dir() else None
    saved = _read_config(folder) if folder else {}
    hint = f"{folder.parent.name}/{folder.name}" if folder else path.name
    handle = loading.load(_weights(folder) if folder else path, dtype=dtype, device=device, name_hint=hint)
    family = choose(handle, saved.get("_class_name"), hint)
    return face_class(family)(handle, family, class_config(family, handle, hint, saved, dict(config or {})), budget)


def _vae_folder(path: Path) -> Path:
    for folder in (path, path / "vae"):
        if (folder / "config.json").is_file():
            return folder
    raise LoadError(f"'{path}' is a folder without a config.json, and has no vae/ folder with one.",
                    fix="give a diffusers pipeline folder, its vae/ folder, or a VAE weights file.")


def _weights(folder: Path) -> Path:
    found = next((folder / n for n in WEIGHTS if (folder / n).is_file()), None)
    if found is None:
        raise LoadError(f"'{folder}' has a config.json but no {' or '.join(WEIGHTS)}.",
                        fix="download the VAE's weights into that folder.")
    return found


def _read_config(folder: Path) -> dict:
    try:
        saved = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise LoadError(f"'{folder / 'config.json'}' could not be read as JSON ({e}).",
                        fix="download the folder's config.json again.") from None
    if not isinstance(saved, dict):
        raise LoadError(f"'{folder / 'config.json'}' is not a JSON object.", fix="download it again.")
    return saved


def choose(handle: VAE, class_name: Optional[str], hint: str) -> Family:
    """The declared class for ``handle``: the one a folder's config.json names, else the one a word of the
    file name chooses, else the first that serves the file."""
    candidates = [f for f in FAMILIES if f.arch == handle.spec.id and f.serves(handle.config)]
    served = ", ".join(f.class_name for f in FAMILIES)
    if class_name:
        named = [f for f in candidates if f.class_name == class_name]
        if not named:
            could = " or ".join(f.class_name for f in candidates) or "no class the face serves"
            raise LoadError(f"config.json names {class_name}, but the weights are {handle.name}, which is {could}.",
                            fix="check that config.json belongs to these weights.")
        return named[0]
    if not candidates:
        raise LoadError(f"{handle.name} has no diffusers class the face serves (it serves {served}).",
                        fix="use our handle (vae.load) for this file.")
    by_word = [f for f in candidates if any(w in hint.lower() for w in f.names)]
    return (by_word or [f for f in candidates if not f.names] or candidates)[0]


def class_config(family: Family, handle: VAE, hint: str, saved: Mapping[str, Any], given: Mapping[str, Any]) -> dict:
    """The class's config: its defaults, what the weights decide, what the file name tells and the file holds,
    then a folder's config.json and the caller's ``config``, which may not contradict the weights."""
    weights = family.weights(handle.config, handle.caps)
    config = {**family.defaults, **weights, **family.named(handle.config, hint), **family.held(handle)}
    unknown = sorted(set(given) - set(family.defaults))
    if unknown:
        raise InputError(f"{family.class_name}'s config has no {', '.join(unknown)}.", input="config",
                         fix=f"give only its keys: {', '.join(family.defaults)}.")
    for where, values in (("config.json", saved), ("config=", given)):
        for key, value in values.items():
            if key not in family.defaults:
                continue            # diffusers' bookkeeping (_class_name, ...) and keys of other versions
            ours = weights.get(key)
            if ours is not None and ours is not MISSING and value is not None and _plain(value) != _plain(ours):
                raise LoadError(f"{where} gives {key}={value!r}, but the weights ({handle.name}) have {ours!r}.",
                                fix="check that the config belongs to these weights.")
            config[key] = _plain(value)
    missing = [k for k, v in config.items() if v is MISSING]
    if missing:
        raise LoadError(f"diffusers' {family.class_name} config of {handle.name} needs {', '.join(missing)}, which "
                        "its weights do not tell.",
                        fix="load the model's diffusers folder (its vae/config.json has them), or pass "
                            f"config={{{', '.join(repr(k) + ': [...]' for k in missing)}}}.")
    return {**config, **family.derived(config), "_class_name": family.class_name}


def _plain(v):
    """Tuples as lists (as JSON gives them), recursively."""
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v
