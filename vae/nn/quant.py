"""ComfyUI's int8 weight files (``comfy_quant`` format ``int8_tensorwise``), run weight-only.

A quantized Linear is stored as an int8 ``weight`` [out, in], a per-row ``weight_scale`` [out, 1] and
a ``comfy_quant`` byte string (JSON) naming the format. With ``convrot`` the weight was rotated
before quantizing: each group of ``group`` input columns multiplied by a normalised Hadamard matrix
H (``hadamard``: symmetric and orthogonal, so it is its own inverse). ComfyUI runs these layers
weight-only: W = (q * scale) H, per group, in float32, then rounded to float16 (its compute dtype for
these layers unless a dtype is forced) and cast to the activations' dtype. This module does the same
on every call, so the file's int8 weights are what stays in memory (a quarter of fp32), at the cost of
one (out x in x group) matmul per call (a few % of a MiniMax H3 decoder tile)."""
from __future__ import annotations

import functools
import json
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

FORMAT = "int8_tensorwise"
DEQUANT_DTYPE = torch.float16      # ComfyUI's compute dtype for its mixed-precision layers


@functools.lru_cache(maxsize=8)
def _hadamard(group: int) -> torch.Tensor:
    if group < 4 or 4 ** round(math.log(group, 4)) != group:
        raise ValueError(f"a rotation group of {group} columns (a power of 4 is needed)")
    base = torch.ones(4, 4, dtype=torch.float64) - 2 * torch.eye(4, dtype=torch.float64).flip(1)
    h = base
    while h.shape[0] < group:
        h = torch.kron(h, base)
    return (h / math.sqrt(group)).float()


def hadamard(group: int, device=None) -> torch.Tensor:
    """The normalised regular Hadamard matrix of ``group`` (a power of 4): Kronecker powers of the 4x4
    one with -1 on its anti-diagonal, divided by sqrt(group)."""
    return _hadamard(group).to(device)


def parse(raw: torch.Tensor) -> dict:
    """A ``comfy_quant`` tensor (uint8 bytes of a JSON object) -> the dict; ValueError if it is not one."""
    if raw.dtype != torch.uint8 or raw.dim() != 1:
        raise ValueError(f"a comfy_quant entry of {raw.dtype} {list(raw.shape)} (expected uint8 JSON bytes)")
    conf = json.loads(bytes(raw.tolist()).decode("utf-8"))
    if not isinstance(conf, dict):
        raise ValueError("a comfy_quant entry that is not a JSON object")
    params = conf.get("params") if isinstance(conf.get("params"), dict) else {}
    return {**params, **conf}


def rotation_group(conf: dict) -> int:
    """The Hadamard group of a parsed ``comfy_quant`` (0: not rotated); ValueError for other formats."""
    if conf.get("format") != FORMAT:
        raise ValueError(f"quantization format {conf.get('format')!r} (this pack reads {FORMAT!r} only)")
    return int(conf.get("convrot_groupsize", 256)) if conf.get("convrot") else 0


def dequantize(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """float32 weight of an int8 ``q`` [out, in] with per-row ``scale``, rotated back when ``group``."""
    w = q.float() * scale.float().reshape(-1, 1)
    if group:
        out, cin = w.shape
        w = (w.reshape(out, cin // group, group) @ hadamard(group, w.device)).reshape(out, cin)
    return w


class Int8Linear(nn.Module):
    """A Linear whose weight stays int8 (keys ``weight``, ``weight_scale``, ``bias``), dequantized per
    call as ComfyUI does. The scale stays float32 whatever dtype the model is cast to."""

    def __init__(self, cin: int, cout: int, group: int = 256, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features, self.group = cin, cout, group
        self.register_buffer("weight", torch.zeros(cout, cin, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(cout, 1, dtype=torch.float32))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None

    def _apply(self, fn, recurse=True):
        scale = self.weight_scale
        super()._apply(fn, recurse)
        moved = self.weight_scale
        if moved.dtype != scale.dtype and moved.device.type != "meta":
            self.weight_scale = scale.to(moved.device)
        return self

    def dequantized(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        w = dequantize(self.weight, self.weight_scale, self.group).to(DEQUANT_DTYPE)
        return w if dtype is None else w.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized(x.dtype), bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, int8, rotation group {self.group or 'none'}"
