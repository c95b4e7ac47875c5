"""The only place that touches ComfyUI: optional bridges with plain fallbacks.

Inside ComfyUI: model folders from ``folder_paths``, progress and interrupt through
``comfy.utils.ProgressBar``, devices/dtypes and weight placement through ``comfy.model_management``.
Standalone (tests, ``python -m vae run``): folders from $VAEKIT_MODEL_DIRS, no progress bar, CPU."""
from __future__ import annotations

import logging
import os
import re
import weakref
from pathlib import Path
from typing import Callable, Optional

import torch

from ..vae import progress as progress_module
from ..vae.engine import guard
from . import patcher

log = logging.getLogger("VAEKit")
EXTENSIONS = (".safetensors", ".sft", ".pth", ".pt", ".ckpt", ".bin")
_PAIR = re.compile(r"^(?P<stem>.+)_(?:encoder|decoder)\.[^.]+$")


def _import(name: str):
    try:
        return __import__(name, fromlist=["_"])
    except Exception:   # not inside ComfyUI (or a broken install): use the fallbacks
        return None


def folder_paths():
    return _import("folder_paths")


def model_management():
    return _import("comfy.model_management")


# ---- model files -----------------------------------------------------------------------------

def _standalone_dirs(kind: str) -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("VAEKIT_MODEL_DIRS", "").split(os.pathsep) if p]
    return [d / kind if (d / kind).is_dir() else d for d in dirs]


def _files(kind: str) -> list[str]:
    fp = folder_paths()
    if fp is not None:
        return list(fp.get_filename_list(kind))
    names = []
    for d in _standalone_dirs(kind):
        if d.is_dir():
            names += sorted(p.name for p in d.iterdir() if p.suffix.lower() in EXTENSIONS)
    return names


def _full_path(kind: str, name: str) -> Optional[Path]:
    fp = folder_paths()
    if fp is not None:
        p = fp.get_full_path(kind, name)
        return Path(p) if p else None
    for d in _standalone_dirs(kind):
        if (d / name).is_file():
            return d / name
    return None


def vae_choices() -> list[str]:
    """Files in 'vae', then TAESD-style encoder/decoder pairs in 'vae_approx' listed once by stem
    (as core's VAE Loader shows 'taesd'), then other 'vae_approx' files by name."""
    approx = _files("vae_approx")
    stems: dict[str, int] = {}
    for n in approx:
        if m := _PAIR.match(n):
            stems[m["stem"]] = stems.get(m["stem"], 0) + 1
    pairs = [s for s, c in stems.items() if c >= 2]
    singles = [n for n in approx if not ((m := _PAIR.match(n)) and m["stem"] in pairs)]
    return _files("vae") + sorted(pairs) + singles


def resolve_vae(name: str) -> tuple[Path, str]:
    """A listed name (or, standalone, a path) -> (path to load, name hint for the latent space)."""
    for kind in ("vae", "vae_approx"):
        if p := _full_path(kind, name):
            return p, name
    for n in _files("vae_approx"):   # a pair by its stem: the loader finds the other half
        if (m := _PAIR.match(n)) and m["stem"] == name:
            return _full_path("vae_approx", n), name
    if folder_paths() is None and Path(name).exists():
        return Path(name), Path(name).name
    raise FileNotFoundError(f"VAE '{name}' not found in the 'vae' or 'vae_approx' model folders{_searched()}.")


def _searched() -> str:
    if folder_paths() is not None:
        return ""
    dirs = [str(d) for kind in ("vae", "vae_approx") for d in _standalone_dirs(kind)]
    return f" (searched: {', '.join(dict.fromkeys(dirs))})" if dirs else " (no model folder was given)"


def missing_model_fix() -> str:
    """Where a VAE file goes: ComfyUI's model folders, or, outside ComfyUI, the folders given to the runner."""
    if folder_paths() is not None:
        return "put the file in models/vae (or the TAESD pair in models/vae_approx) and refresh."
    return ("give the folder that holds it with --models (`vaekit run --models FOLDER` / `python -m vae run "
            "--models FOLDER`; the folder, or its vae/ and vae_approx/ subfolders, holds the files), or set "
            "VAEKIT_MODEL_DIRS.")


# ---- progress / interrupt -------------------------------------------------------------------

def progress_callback(node_id: Optional[str] = None) -> Optional[Callable[[int, int], None]]:
    """A progress(done, total) that drives ComfyUI's ProgressBar; its hook also raises on interrupt."""
    utils = _import("comfy.utils")
    if utils is None:
        return progress_module.current()        # outside ComfyUI: the CLI's terminal bar, if any
    bars: dict[int, object] = {}

    def progress(done: int, total: int) -> None:
        bar = bars.get(total)
        if bar is None:
            bar = bars[total] = utils.ProgressBar(total)
        bar.update_absolute(done, total)
        mm = model_management()
        if mm is not None:
            mm.throw_exception_if_processing_interrupted()

    return progress


# ---- devices, dtypes, weights ---------------------------------------------------------------

def compute_device(choice: str = "auto") -> torch.device:
    if choice != "auto":
        return torch.device(choice)
    mm = model_management()
    if mm is not None:
        return mm.vae_device()
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def intermediate_device() -> torch.device:
    mm = model_management()
    return mm.intermediate_device() if mm is not None else torch.device("cpu")


def pick_dtype(choice: str, device: torch.device, working: tuple[torch.dtype, ...]) -> torch.dtype:
    """The weights' dtype for the loader's ``dtype`` widget: a named one; ``auto``: ComfyUI's VAE choice,
    standalone bf16 where the model works in it and ``device`` runs it natively (vae/engine/guard.py
    ``bf16_native``), else fp32."""
    named = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if choice in named:
        return named[choice]
    mm = model_management()
    if mm is not None:
        return mm.vae_dtype(device, list(working))
    if torch.bfloat16 in working and guard.bf16_native(device):
        return torch.bfloat16
    return torch.float32


# model -> the patcher our calls load it through (nodes/patcher.py): the one ``place`` made, or the one a
# node set as ``vae.patcher`` last (a socket binds its own before each call)
_patchers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def registered(handle):
    return _patchers.get(handle.model)


def bind(handle, patcher) -> None:
    _patchers[handle.model] = patcher


def patcher_for(handle):
    """The patcher our calls load ``handle`` through: the one placed or set last, else a new one where its
    weights are (load and offload alike, as core's VAE on the CPU)."""
    p = registered(handle)
    if p is None:
        p = patcher.new(handle, handle.device, handle.device)
        bind(handle, p)
    return p


def place(handle, device: torch.device, dtype: torch.dtype) -> None:
    """Put freshly loaded weights where they wait: inside ComfyUI on its offload device (its memory
    manager moves them to ``device`` before each use, see nodes/call.py ``load_weights``); standalone on
    ``device``."""
    mm = model_management()
    if mm is None or device.type == "cpu":
        handle.to(device, dtype)
        return
    handle.to(mm.vae_offload_device(), dtype)
    bind(handle, patcher.new(handle, device, mm.vae_offload_device()))


def placed_device(handle) -> torch.device:
    """Where ``handle`` computes: its memory manager's load device when ``place`` gave it one (the
    weights may wait on the offload device), else where its weights are."""
    p = registered(handle)
    return torch.device(p.load_device) if p is not None else handle.device
