"""Core's ``patcher`` contract: what core code reads from a VAE's ``patcher``, answered for ours.

Core's ``comfy.sd.VAE`` keeps its model in a ``ModelPatcher`` (``vae.patcher``) and code around it reads
and sets that patcher:
- core's memory manager, ``model_management.load_models_gpu([vae.patcher])`` (custom nodes call it too):
  ``model``, ``load_device``, ``offload_device``, ``model_size()``, ``loaded_size()``,
  ``current_loaded_device()``, ``model_dtype()``, ``parent``, ``patch_model`` / ``partially_unload`` /
  ``detach``, ``model_patches_to``, ``is_dynamic()``, ``is_clone()``;
- core's SUPIR Apply (``SUPIRApply``): ``vae.patcher = vae.patcher.clone()``, then
  ``add_patches({"encoder.<key>": (tensor,)}, strength_model=0.0)`` (its denoise encoder's weights) and
  ``vae.encode``, which loads the patched clone; then the original patcher back;
- core's Select VAE Device (``SelectVAEDevice``): ``copy.copy(vae)``, ``vae.patcher.clone()``, a
  patcher retargeted to another device (on another GPU: ``deepclone_multigpu``, a fresh model made by
  ``cached_patcher_init``), then ``vae.first_stage_model = vae.patcher.model`` and ``vae.device = ...``;
- custom nodes: ``vae.patcher.load_device`` / ``offload_device`` read and set, ``patch_model(device_to=)``,
  ``vae.first_stage_model.to(device)``, a new ``ModelPatcher(vae.first_stage_model, ...)`` set as
  ``vae.patcher``, ``vae.device``, ``vae.vae_dtype``, ``vae.output_device``, ``vae.model_size()``.

Inside ComfyUI our VAE's patcher is core's own ``ModelPatcher`` around our model (a subclass that
refuses weight patches our model has no weight for, which core drops without a word), so core's code
runs on it unchanged: the memory manager loads and offloads it, SUPIR's patches are applied when the
encode loads it, Select VAE Device moves it (a fresh copy through ``reload``, for a VAE loaded from a
file). Outside ComfyUI, ``Patcher`` answers the same reads and moves; what it cannot serve (weight
patches: nothing outside ComfyUI applies them; any other attribute) is an error naming the attribute
and why. The socket (nodes/socket.py) keeps its model and its patcher's model the same module, and
runs each call on the device its patcher loads to."""
from __future__ import annotations

import os
import weakref

import torch

from ..vae import VAE, checks, load
from ..vae.errors import VAEKitError

_names: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()    # model -> its VAE's name, for errors
PATCH_FIX = ("use core's Load VAE for this node (core's model carries the weight names the node patches); "
             "VAEKit's VAEs decode and encode in every other node.")


def _name(model) -> str:
    return _names.get(model, type(model).__name__)


def check_patch_keys(model, patches) -> None:
    """Weight patches must name weights the model has: core's ``add_patches`` keeps only those and drops
    the rest without a word, and the node would then compute with the unpatched VAE."""
    have = model.state_dict().keys()
    keys = [k if isinstance(k, str) else k[0] for k in patches]
    unknown = [k for k in keys if k not in have]
    if unknown:
        sample = ", ".join(f"'{k}'" for k in unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise VAEKitError(f"a node patches {len(unknown)} of {len(keys)} weight(s) this VAE ({_name(model)}, VAEKit) "
                          f"has no weight for ({sample}); they would be dropped without a word and the node would "
                          "compute with the unpatched VAE.", input="vae.patcher", fix=PATCH_FIX)


class Patcher:
    """``vae.patcher`` outside ComfyUI: core's ModelPatcher's reads and moves for a plain torch model
    (whole, never partly loaded), so code written for core's patcher runs on our VAE standalone."""
    is_clip = False

    def __init__(self, model, load_device, offload_device, size: int = 0, weight_inplace_update: bool = False):
        self.model, self.size = model, size
        self.load_device, self.offload_device = torch.device(load_device), torch.device(offload_device)
        self.weight_inplace_update = weight_inplace_update
        self.parent = None
        self.patches: dict = {}
        self.model_options: dict = {"transformer_options": {}}
        self.attachments: dict = {}
        self.additional_models: dict = {}
        self.cached_patcher_init = None

    def model_size(self) -> int:
        if not self.size:
            self.size = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
        return self.size

    def current_loaded_device(self) -> torch.device:
        return next(self.model.parameters()).device

    def loaded_size(self) -> int:
        return self.model_size() if self.current_loaded_device() == self.load_device else 0

    def model_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def is_dynamic(self) -> bool:
        return False

    def is_clone(self, other) -> bool:
        return getattr(other, "model", None) is self.model

    def clone(self, *args, **kwargs) -> "Patcher":
        n = type(self)(self.model, self.load_device, self.offload_device, self.size, self.weight_inplace_update)
        n.parent, n.cached_patcher_init = self, self.cached_patcher_init
        n.model_options = {k: dict(v) if isinstance(v, dict) else v for k, v in self.model_options.items()}
        return n

    def _move(self, device) -> None:
        if device is not None:
            self.model.to(torch.device(device))

    def patch_model(self, device_to=None, lowvram_model_memory=0, load_weights=True, force_patch_weights=False):
        self._move(device_to)
        return self.model

    def unpatch_model(self, device_to=None, unpatch_weights=True) -> None:
        self._move(device_to)

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False) -> int:
        freed = self.loaded_size()
        self._move(device_to)
        return freed

    def detach(self, unpatch_all=True):
        self._move(self.offload_device)
        return self.model

    def model_patches_to(self, device) -> None:
        return None

    def get_free_memory(self, device) -> int:
        device = torch.device(device)
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0]
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

    def add_patches(self, patches, strength_patch=1.0, strength_model=1.0):
        check_patch_keys(self.model, patches)
        raise VAEKitError("a node patches this VAE's weights; outside ComfyUI nothing applies weight patches (core's "
                          "memory manager does, when it loads the VAE), so the node would compute with the "
                          "unpatched VAE.", input="vae.patcher", fix="run the graph inside ComfyUI.")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"vae.patcher.{name}: VAEKit's patcher outside ComfyUI answers core's reads of a "
                             f"VAE's model, devices, size and moves, not '{name}'; inside ComfyUI the patcher is "
                             "core's own ModelPatcher.")

    def __repr__(self) -> str:
        return f"Patcher({_name(self.model)}, load {self.load_device}, offload {self.offload_device})"


_core_class = None


def _patcher_class():
    """Core's ModelPatcher, refusing unknown weight patches, inside ComfyUI; else ``Patcher``."""
    global _core_class
    try:
        import comfy.model_patcher as mp
    except Exception:     # not inside ComfyUI (or a broken install): the fallback, as nodes/_comfy.py's
        return Patcher
    if _core_class is None:
        class VAEKitModelPatcher(mp.ModelPatcher):
            """Core's ModelPatcher around a VAEKit model (its clones keep the class)."""

            def add_patches(self, patches, strength_patch=1.0, strength_model=1.0):
                check_patch_keys(self.model, patches)
                return super().add_patches(patches, strength_patch, strength_model)
        _core_class = VAEKitModelPatcher
    return _core_class


def new(handle: VAE, load_device, offload_device):
    """A patcher around ``handle``'s model (core's inside ComfyUI), which core can reload from the VAE's
    file onto another device (``cached_patcher_init``, as core's VAE Loader sets)."""
    _names[handle.model] = handle.name
    p = _patcher_class()(handle.model, load_device=torch.device(load_device),
                         offload_device=torch.device(offload_device))
    if handle.path is not None:
        p.cached_patcher_init = (reload, (handle.path, str(handle.dtype).removeprefix("torch."),
                                          str(p.offload_device)))
    return p


def reload(path: str, dtype: str, offload_device: str, **_ignored):
    """``cached_patcher_init``: the VAE read again from its file, its weights on ``offload_device``,
    in a patcher of its own (core's multi-GPU clones call this for a fresh model on another device)."""
    handle = load(path)
    handle.to(offload_device, checks.dtype(dtype))
    return new(handle, offload_device, offload_device)


def rebind(handle: VAE, model) -> VAE:
    """``handle`` around ``model`` when a node hands the socket another copy of its model (a patcher's
    fresh copy on another device): the same VAE (its spec and config), so the copy must be one it builds.
    Anything else cannot be run by our engines and is refused naming the attribute."""
    if model is handle.model:
        return handle
    if type(model) is not type(handle.model) or model.state_dict().keys() != handle.model.state_dict().keys():
        raise VAEKitError(f"a node set this VAE's model to a {type(model).__name__}; VAEKit's {handle.name} runs "
                          f"its own model ({type(handle.model).__name__}) or a copy of it, not another one.",
                          input="vae.first_stage_model", fix=PATCH_FIX)
    p = next(model.parameters())
    new_handle = VAE(handle.spec, handle.config, model, dtype=p.dtype, device=p.device, source=handle.source)
    new_handle.path = handle.path
    _names[model] = handle.name
    return new_handle


def checked(value):
    """A patcher a node sets as ``vae.patcher``: it must answer the reads our calls make."""
    missing = [a for a in ("model", "load_device", "offload_device") if not hasattr(value, a)]
    if missing:
        raise VAEKitError(f"a node set this VAE's patcher to a {type(value).__name__}, which has no "
                          f"{', '.join(missing)}.", input="vae.patcher",
                          fix="set a ModelPatcher around vae.first_stage_model (or a clone of vae.patcher).")
    return value
