"""State-dict key conversion shared by every architecture: ordered regex rules, applied once."""
from __future__ import annotations

import re
from typing import Callable, Iterable, Mapping, Union

import torch

Repl = Union[str, Callable[[re.Match], str]]
Rule = tuple[str, Repl]


def rename(sd: Mapping[str, torch.Tensor], rules: Iterable[Rule]) -> dict[str, torch.Tensor]:
    """Apply each (pattern, replacement) in order to every key; a key may match several rules."""
    compiled = [(re.compile(p), r) for p, r in rules]
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        for pat, repl in compiled:
            key = pat.sub(repl, key)
        out[key] = value
    return out


def linear_to_conv1x1(sd: dict[str, torch.Tensor], pattern: str, ndim: int = 4) -> dict[str, torch.Tensor]:
    """Reshape 2-D Linear weights whose key matches ``pattern`` into 1x1 conv weights."""
    pat = re.compile(pattern)
    for key, value in sd.items():
        if pat.search(key) and value.dim() == 2:
            sd[key] = value.reshape(*value.shape, *([1] * (ndim - 2)))
    return sd


def count_indices(keys: Iterable[str], prefix: str) -> int:
    """How many consecutive integer children ``prefix.<i>.`` exist (0 if none)."""
    pat = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    found = {int(m.group(1)) for k in keys if (m := pat.match(k))}
    return max(found) + 1 if found else 0
