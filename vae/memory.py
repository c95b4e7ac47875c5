"""How much device memory a decode or encode needs, measured from the architecture, not guessed per family.

One unit of work (a tile of a chunk: what the engines hold at once) runs through a copy of the model on
the ``meta`` device: shapes only, no memory, no arithmetic. The largest activation it produces, times
``LIVE`` (the input, the output and the temporaries a block holds around its largest tensor), plus what a
stream keeps between chunks (each causal conv's last input frames), is the working set the memory
manager is asked for (ComfyUI's ``load_models_gpu(memory_required=...)``); the output buffer lives on the
intermediate device and is not counted. ``LIVE`` is calibrated on CPU peak RSS (SD decoder at 512 px:
5.4x its largest activation; Wan one pass: 7.4x, allocator slack included); a GPU's caching allocator
packs tighter, so this errs on the safe side.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch import nn

from . import run

LIVE = 5          # tensors of the largest size alive together (see above)


_SEEN: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def _largest(model: nn.Module, op: str, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, int]:
    """The largest activation of ``getattr(model, op)`` on an input of ``shape``, and the frames its causal
    convs keep between chunks (bytes), remembered per model."""
    seen = _SEEN.setdefault(model, {})
    key = (op, shape, dtype)
    if key not in seen:
        seen[key] = _measure(model, op, shape, dtype)
    return seen[key]


def _measure(model: nn.Module, op: str, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, int]:
    from .guard import eager_copy
    from .nn.causal import CausalConv3d
    meta = eager_copy(model, lambda t: t.to("meta"))
    largest, kept = [0], [0]

    def hook(m, args, out):
        if torch.is_tensor(out):
            largest[0] = max(largest[0], out.numel() * out.element_size())
        x = args[0] if args else None
        if isinstance(m, CausalConv3d) and torch.is_tensor(x) and x.dim() == 5 and x.shape[2]:
            kept[0] += x.numel() * x.element_size() * min(m.time_span, x.shape[2]) // x.shape[2]
    for m in meta.modules():
        m.register_forward_hook(hook)
    with torch.inference_mode(), run.using(run.Run()):
        getattr(meta, op)(torch.empty(shape, device="meta", dtype=dtype))
    return largest[0], kept[0]


def working_set(model: nn.Module, op: str, unit: tuple[int, ...], dtype: torch.dtype,
                streamed: bool = False) -> Optional[int]:
    """Bytes one unit of work of input shape ``unit`` needs on the device (``streamed``: plus the
    stream's caches), or None if the model cannot run on the meta device (the caller then asks for nothing)."""
    try:
        largest, kept = _largest(model, op, tuple(unit), dtype)
    except Exception:     # noqa: BLE001 - an estimate, never a failure
        return None
    return LIVE * largest + (kept if streamed else 0)
