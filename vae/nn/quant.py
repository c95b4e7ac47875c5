"""ComfyUI's int8 weight files (``comfy_quant`` format ``int8_tensorwise``), run as ComfyUI runs them.

A quantized Linear is stored as an int8 ``weight`` [out, in], a per-row ``weight_scale`` [out, 1] and
a ``comfy_quant`` byte string (JSON) naming the format. With ``convrot`` the weight was rotated
before quantizing: each group of ``group`` input columns multiplied by a normalised Hadamard matrix
H (``hadamard``: symmetric and orthogonal, so it is its own inverse).

ComfyUI (core 783545f6 with comfy-kitchen 0.2.31, any device) runs these layers as an int8 x int8
matmul: the activations are rotated by the same H (in their dtype), quantized per row on the fly
(scale = row max / 127, rounded half to even, clamped to -128..127), multiplied with the int8 weight
with int32 accumulation, scaled back in float32 by (row scale x weight scale), cast to the activations'
dtype, and the bias added. This module does the same, so the file's int8 weights are what stays in
memory (a quarter of fp32) and the output is core's. ``dequantized`` (the weight-only view, float
weights rounded to fp16 as core's dequantize gives them) is for comparisons."""
from __future__ import annotations

import functools
import json
import math
from typing import Optional

import torch
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


def _int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [m, k] x b [n, k]^T, int8 -> float32 of the exact int32 sums."""
    if a.device.type in ("cpu", "meta") or (a.shape[0] > 16 and a.shape[1] % 8 == 0 and b.shape[0] % 8 == 0):
        return torch._int_mm(a, b.t().contiguous()).float()
    return (a.double() @ b.double().t()).float()          # exact: |sum| < 2^53


class Int8Linear(nn.Module):
    """A Linear whose weight stays int8 (keys ``weight``, ``weight_scale``, ``bias``), run as an int8
    matmul with activations quantized per row, as ComfyUI does. The scale stays float32 whatever dtype
    the model is cast to."""

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
        shape = x.shape
        if self.group:                                         # rotate the activations as the weight was
            x = (x.reshape(-1, shape[-1] // self.group, self.group) @ hadamard(self.group, x.device).to(x.dtype))
        x = x.reshape(-1, shape[-1])
        scale = (x.abs().amax(dim=-1, keepdim=True).float() / 127.0).clamp(min=1e-30)
        q = (x / scale.to(x.dtype)).round_().clamp_(-128.0, 127.0).to(torch.int8)
        y = (_int8_matmul(q, self.weight) * (scale * self.weight_scale.float().reshape(1, -1))).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, int8, rotation group {self.group or 'none'}"
