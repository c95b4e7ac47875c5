"""The receptive field of a model, measured by one probe pass (for exact tiling, vae/engine/exact.py).

A tile gives the untiled result when it carries a halo at least as wide as the reach of the layers it
runs before its tensor is cut again. The reach is read from the architecture, never from a family
name: one pass on a tiny input records, in execution order, every spatial conv (its kernel, dilation
and padding at the resolution it runs), every module that declares a reach of its own
(``exact_reach``: e.g. windowed or neighbourhood attention), every GroupNorm (tiles must share its
statistics), every module that mixes all positions (``exact_whole``: attention) and every re-cut point
(``exact_boundary``: resamplers and residual blocks, where nothing else is live across the module;
``SEPARATOR``: a re-cut point where tiles that run one after the other meet at any resolution).
``segments`` splits that record at the re-cut points into stretches of layers with their halo.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from .. import run as runstate
from ..nn.norm import STATISTICS

Fn = Callable[[torch.Tensor, nn.Module], torch.Tensor]     # fn(x, model): a forward of ``model``

COARSE = "coarse"
# ``exact_boundary = SEPARATOR``: tiles run one after the other (vae/engine/stages.py) assemble the map at this
# module's input at whatever resolution it runs, not only at latent resolution. For a module whose reach
# is wide at a resolution where a stage's halos would add up over many blocks (neighbourhood attention
# in every block of a high-resolution stage): a map per such module costs host memory, a halo that
# covers every later block would cost a tile most of the frame.
SEPARATOR = "separator"


def active(module: nn.Module, scale: Sequence[Fraction]) -> bool:
    """Whether a re-cut point at ``scale`` (map pixels per latent pixel) is used: ``COARSE`` ones
    (residual blocks) only at latent resolution or coarser, where a halo pixel costs the most compute
    and an assembled map the least memory."""
    flag = getattr(module, "exact_boundary", False)
    return bool(flag) and (flag != COARSE or max(scale) <= 1)


def separates(module: nn.Module) -> bool:
    """Whether a re-cut point is a ``SEPARATOR`` at every resolution."""
    return getattr(module, "exact_boundary", False) == SEPARATOR


@dataclass(frozen=True)
class Event:
    kind: str                       # "conv", "stats" (a GroupNorm, a ChannelMean), "whole", "boundary"
    module: nn.Module
    size: tuple[int, int]           # spatial size of the module's input
    cost: float = 0.0               # multiply-adds (convs), for progress weights


def reach(module: nn.Module) -> tuple[int, int]:
    """How far (input pixels, per spatial axis) one output pixel of ``module`` looks to either side.
    A module may declare it (``exact_reach``); a conv's is max(left padding, kernel span - left
    padding), and convs that pad themselves say how much (``hw_padding``)."""
    declared = getattr(module, "exact_reach", None)
    if declared is not None:
        return tuple(declared)
    pad = getattr(module, "hw_padding", None) or module.padding[-2:]
    if isinstance(pad, str):
        raise ValueError(f"exact tiling: string padding {pad!r} is not supported")
    return tuple(max(p, (k - 1) * d - p) for p, k, d in zip(pad, module.kernel_size[-2:], module.dilation[-2:]))


def _is_spatial(m: nn.Module) -> bool:
    if getattr(m, "exact_reach", None) is not None:
        return True
    return isinstance(m, nn.modules.conv._ConvNd) and any(k > 1 for k in m.kernel_size[-2:])


def _cost(m: nn.Module, x: torch.Tensor) -> float:
    weight = getattr(m, "weight", None)
    if not torch.is_tensor(weight):
        return 0.0
    stride = getattr(m, "stride", (1,))
    return float(weight.numel()) * x[0, 0].numel() / math.prod(stride)


def probe(fn: Fn, model: nn.Module, x: torch.Tensor) -> list[Event]:
    """Run ``fn(x, model)`` once (a tiny input, as a whole clip) and record the events above with their
    input sizes. Modules inside a whole module are not recorded (they run on the whole tensor).

    The hooks go on a private copy of the module tree on the meta device (shapes only: no memory, no
    arithmetic; LTX-2.5's stage 5 at 4 x 4 latents costs a tenth of a 384 x 512 decode run for real),
    never on the shared model; events name the shared model's modules."""
    from .guard import eager_copy
    shadow = eager_copy(model, lambda t: t.to("meta"))
    x = x.to("meta")
    original = dict(zip(shadow.modules(), model.modules()))
    events: list[Event] = []
    inside = [0]

    def pre(m, args):
        if inside[0]:
            return
        size = tuple(args[0].shape[-2:])
        if getattr(m, "exact_boundary", False):
            events.append(Event("boundary", original[m], size))
        if getattr(m, "exact_whole", False):
            events.append(Event("whole", original[m], size))
            inside[0] += 1
        elif isinstance(m, STATISTICS):
            events.append(Event("stats", original[m], size))
        elif _is_spatial(m):
            events.append(Event("conv", original[m], size, _cost(m, args[0])))

    def post(m, args, out):
        if getattr(m, "exact_whole", False) and inside[0]:
            inside[0] -= 1

    for m in shadow.modules():
        m.register_forward_pre_hook(pre)
        m.register_forward_hook(post)
    with runstate.using(runstate.Run()):
        fn(x, shadow)
    return events


@dataclass(frozen=True)
class Segment:
    """The layers between two re-cut points: the halo they need (latent pixels, per axis), the
    alignment (the segment's resolution drop: a tile cut must fall on its strided grid), the scale it
    starts at (map pixels per latent pixel), the event that starts it (None: the model's input) and
    its share of the probe's multiply-adds."""
    halo: tuple[Fraction, Fraction]
    align: tuple[int, int]
    scale: tuple[Fraction, Fraction] = (Fraction(1), Fraction(1))
    start: Optional[int] = None     # index into the probe's events
    cost: float = 0.0


def scale_of(event: Event, latent_size: Sequence[int]) -> tuple[Fraction, Fraction]:
    return tuple(Fraction(n, m) for n, m in zip(event.size, latent_size))


def segments(events: Sequence[Event], latent_size: tuple[int, int], in_scale: int, out_scale: int,
             every: bool = False) -> list[Segment]:
    """Split the probe's events at re-cut points and whole modules; ``in_scale``/``out_scale``: pixels
    per latent pixel of the model's input and output. ``every``: at every re-cut point, also those
    ``active`` leaves out (a tile that crops its own tensor pays nothing for a cut)."""
    out: list[Segment] = []

    def start(scale, index):
        return {"halo": [Fraction(0)] * 2, "start": scale, "low": list(scale), "index": index, "cost": 0.0}

    def close(seg):
        align = tuple(math.ceil(s / lo) for s, lo in zip(seg["start"], seg["low"]))
        out.append(Segment(tuple(seg["halo"]), align, tuple(seg["start"]), seg["index"], seg["cost"]))

    seg = start((Fraction(in_scale),) * 2, None)
    for i, e in enumerate(events):
        scale = scale_of(e, latent_size)
        if e.kind == "boundary" and not every and not active(e.module, scale):
            continue
        seg["low"] = [min(a, b) for a, b in zip(seg["low"], scale)]
        if e.kind in ("whole", "boundary"):
            close(seg)
            seg = start(scale, i)
        elif e.kind == "conv":
            seg["halo"] = [h + Fraction(r) / s for h, r, s in zip(seg["halo"], reach(e.module), scale)]
            seg["cost"] += e.cost
    seg["low"] = [min(a, Fraction(out_scale)) for a in seg["low"]]
    close(seg)
    return out
