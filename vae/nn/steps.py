"""Running a network's containers step by step, so that nothing holds a container's input longer than
its first step needs it."""
from __future__ import annotations

from typing import Iterator, Optional

from torch import nn


def chain(*modules: Optional[nn.Module]) -> Iterator[nn.Module]:
    """The modules to run one after another, containers opened into their steps (a module's
    ``steps()``: what it runs, in order, each on the last one's output). A caller's ``h = module(h)``
    keeps ``module``'s input alive until the module returns, so a level called whole would hold its
    input through every block; looping over its steps, the caller holds only the current step's input
    (one activation map less at each level's peak)."""
    for m in modules:
        if m is not None:
            yield from m.steps() if hasattr(m, "steps") else [m]
