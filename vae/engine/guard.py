"""The fp16/bf16 NaN guard: a tile whose output is not finite is recomputed upcast.

fp16 tops out at 65504; some VAEs (the original SDXL VAE above all) exceed it in their decoder's
activations, and the image comes out black (NaN). The guard checks each tile's output (one
``isfinite`` reduction per tile) and recomputes a bad tile with an upcast copy of the model, so a
half-precision VAE costs extra only where it actually overflows. fp32 handles are not touched at all.

Upcast dtype: fp32 always for a bf16 handle, and for fp16 on CPU (no fast bf16 convs without AMX:
measured slower than fp32 here). On a CUDA device that runs bf16 natively (``bf16_native``: compute
capability 8.0 or later, where cuDNN has bf16 convolutions), an fp16 tile is first redone in bf16: the same exponent range as fp32, so an fp16 overflow cannot recur, at half the copy's memory
and tensor-core speed; fp32 follows only if the bf16 result is still not finite. (Not measured on a
GPU in this project yet: ``LADDER_CUDA`` names the order in one place.)

Why a copy, not a temporary in-place cast: the model is shared with other nodes (and a compiled
graph guards on its dtypes). A cast-and-restore would leave it half-cast if an interrupt or an OOM
hit between the two casts, and would recompile a compiled model twice per bad tile. The copy is
built lazily on the first bad tile (weights cast straight into the new dtype: an fp32 copy holds 2x
the fp16 weights, e.g. 335 MB for an SDXL VAE), reused for the call's other bad tiles, and dropped
when the call ends. The shared model is never written.

Paths:
- tiled (and untiled = one tile): each tile is independent, so just that tile is redone;
- streamed (a clip chunk by chunk through causal caches): a chunk cannot be redone alone, since its
  output depends on the caches of the chunks before it. The spatial tile's stream is replayed on the
  upcast copy from its first chunk (outputs of the chunks already written are discarded, they were
  finite), and the rest of that tile's chunks run upcast; the next spatial tile starts back in the
  handle's dtype. The copy's caches live in the same per-tile stream memory (keyed by its own
  modules), so they end with the tile's stream;
- whole runs (exact mode: tiles share GroupNorm statistics, so one bad tile spoils all): the run is
  redone on the upcast copy.
One log line per encode/decode call (logger "VAEKit") names the upcast tiles; the same facts are kept
on the handle as ``vae.last_upcast`` (an ``Upcast``; None for a handle the guard does not cover)."""
from __future__ import annotations

import copy
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from .. import run as runstate
from ..errors import NonFiniteError


log = logging.getLogger("VAEKit")

GUARDED = (torch.float16, torch.bfloat16)
LADDER_CUDA = (torch.bfloat16, torch.float32)     # fp16 on a CUDA device that runs bf16 natively
BF16_CAPABILITY = (8, 0)        # Ampere and later: bf16 tensor cores, cuDNN's bf16 convolutions
AXES = {1: "", 2: "(row,col)", 3: "(time,row,col)"}

# fn(tile) runs the handle's model; fn(tile, model) runs ``model`` instead (an upcast copy)
TileFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Upcast:
    """What one encode/decode call recomputed. ``tiles[i]`` was redone in ``dtypes[i]`` (a grid index
    per tiled axis; streamed: the spatial tile, whose stream was replayed); ``failed``: tiles still not
    finite after the last upcast (their NaNs are in the output)."""
    op: str
    dtype: torch.dtype
    total: int
    tiles: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[torch.dtype, ...] = ()
    failed: tuple[tuple[int, ...], ...] = ()
    streamed: bool = False
    whole: bool = False

    @property
    def message(self) -> str:
        if not self.tiles:
            return f"{self.op}: no tile overflowed in {_name(self.dtype)}"
        if self.whole:
            head = f"{self.op}: the output overflowed in {_name(self.dtype)} and was recomputed whole in "
            return head + ", then ".join(_name(d) for d in dict.fromkeys(self.dtypes)) + self._failed()
        what = "spatial tiles" if self.streamed else "tiles"
        how = "re-streamed from their first chunk" if self.streamed else "recomputed"
        groups = []
        for d in dict.fromkeys(self.dtypes):
            idx = ", ".join(_fmt(t) for t, td in zip(self.tiles, self.dtypes) if td == d)
            axes = AXES.get(len(self.tiles[0]), "")
            groups.append(f"in {_name(d)}: tiles {idx}" + (f" {axes}" if axes else ""))
        return (f"{self.op}: {len(self.tiles)} of {self.total} {what} overflowed in {_name(self.dtype)} "
                f"and were {how} " + "; ".join(groups) + self._failed())

    def _failed(self) -> str:
        if not self.failed:
            return ""
        bad = ", ".join(_fmt(t) for t in self.failed)
        return f"; STILL NOT FINITE in float32: {bad} (the weights or the input may be broken)"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _fmt(idx: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, idx)) + ")"


def finite(y: torch.Tensor) -> bool:
    """The tile guard's check (``all_finite``)."""
    return all_finite(y)


def all_finite(y: torch.Tensor) -> bool:
    """Whether every value of ``y`` is finite, by a reduction: the min and max are NaN or infinite where
    any value is. ``isfinite(y).all()`` made masks and an ``abs`` of ``y`` besides (an LTX-Video decode's
    220 MiB output at 512x768x49: a 385 MiB peak outside the plan, measured)."""
    return not y.numel() or all(math.isfinite(float(v)) for v in torch.aminmax(y))


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively: a CUDA device of compute capability 8.0 or later.
    Not ``torch.cuda.is_bf16_supported()``: it counts emulation by default (yes on Turing, Volta and
    Pascal cards, where cuDNN has no bf16 convolution) and answers for the current device, not this one."""
    device = torch.device(device)
    return device.type == "cuda" and tuple(torch.cuda.get_device_capability(device)) >= BF16_CAPABILITY


def ladder(dtype: torch.dtype, device: torch.device) -> tuple[torch.dtype, ...]:
    """The dtypes a bad tile is redone in, in order."""
    if dtype == torch.float16 and bf16_native(device):
        return LADDER_CUDA
    return (torch.float32,)


def eager_copy(model: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """A new module tree like ``model``, each parameter and buffer replaced by ``convert(tensor)``,
    with every torch.compile wrapper dropped (it runs eagerly); ``model`` is only read. The NaN
    guard's upcast copy and a compiled handle's own tree (vae/compile.py) are both made here.

    The converted tensors go into the deepcopy memo, so nothing is duplicated on the way (an upcast
    copy peaks at the copy alone; an identity ``convert`` shares the storage)."""
    model = getattr(model, "_orig_mod", model)
    memo: dict = {id(p): nn.Parameter(convert(p.detach()), requires_grad=p.requires_grad)
                  for p in model.parameters()}
    memo.update({id(b): convert(b) for b in model.buffers()})
    for m in model.modules():
        for name, child in m._modules.items():
            if child is not None and hasattr(child, "_orig_mod"):      # a torch.compile'd submodule
                memo[id(child)] = copy.deepcopy(child._orig_mod, memo)
    out = copy.deepcopy(model, memo)
    for m in out.modules():
        if getattr(m, "_compiled_call_impl", None) is not None:       # nn.Module.compile()
            m._compiled_call_impl = None
        for name in [k for k, v in vars(m).items() if callable(v) and callable(getattr(type(m), k, None))]:
            delattr(m, name)            # a method replaced on the instance (e.g. a compiled decode)
    return out


def upcast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """An eager copy of ``model`` in ``dtype`` (floating tensors cast, others copied). A rare
    recompute does not pay a compile, and must not run the original through a compiled call."""
    return eager_copy(model, lambda t: t.to(dtype) if t.is_floating_point() else t.clone())


class Guard:
    """One encode/decode call's guard: wrap the tile function for the path the call takes, and use
    it as a context manager around the run (it logs, records ``vae.last_upcast`` and frees the copy).

        with Guard(vae, "decode", fn) as g:
            out = tiling.run_tiled(g.tiled(plans), ...)
    """

    def __init__(self, vae, op: str, fn: TileFn):
        self.vae, self.op, self.fn = vae, op, fn
        self.dtype = vae.dtype
        self.active = self.dtype in GUARDED
        self._ladder = ladder(self.dtype, vae.device) if self.active else ()
        self._copies: dict[torch.dtype, nn.Module] = {}
        self._redone: dict[tuple[int, ...], torch.dtype] = {}
        self._failed: list[tuple[int, ...]] = []
        self._total, self._streamed, self._whole = 1, False, False
        self._stream: Optional[tuple[int, nn.Module]] = None     # (rung, copy) replaying the current tile

    # ---- paths ---------------------------------------------------------------------------------
    def tiled(self, plans: Sequence) -> TileFn:
        """For ``tiling.run_tiled``: tiles are called in grid order (``itertools.product``)."""
        if not self.active:
            return self.fn
        grid = tuple(len(p.spans) for p in plans)
        self._total = math.prod(grid)
        calls = itertools.count()

        def guarded(t: torch.Tensor) -> torch.Tensor:
            idx = _index(next(calls), grid)
            y = self.fn(t)
            for rung in range(len(self._ladder)):
                if finite(y):
                    break
                self._redone[idx] = self._ladder[rung]
                y = self.fn(t, self._copy(self._ladder[rung]))
            else:
                self._check_last(idx, y)
            return y
        return guarded

    def streamed(self, spatial: Sequence, chunks: int) -> TileFn:
        """For ``streaming.run_streamed``: each spatial tile (grid order) streams ``chunks`` chunks."""
        if not self.active:
            return self.fn
        grid = tuple(len(p.spans) for p in spatial)
        self._total, self._streamed = math.prod(grid), True
        calls = itertools.count()
        inputs: list[torch.Tensor] = []        # this tile's chunks so far (views of the input)

        def guarded(t: torch.Tensor) -> torch.Tensor:
            tile, chunk = divmod(next(calls), chunks)
            idx = _index(tile, grid)
            if chunk == 0:
                self._end_stream()
                inputs.clear()
            inputs.append(t)
            rung = self._stream[0] if self._stream else -1
            y = self.fn(t, self._stream[1]) if self._stream else self.fn(t)
            while not finite(y) and rung + 1 < len(self._ladder):
                rung += 1
                self._redone[idx] = self._ladder[rung]
                y = self.fn(t, self._restream(rung, inputs[:-1]))
            if rung >= 0:
                self._check_last(idx, y)
            return y
        return guarded

    def whole(self, run: Callable[[TileFn, nn.Module], torch.Tensor]) -> torch.Tensor:
        """For runs whose tiles depend on each other (exact mode): ``run(fn, model)`` is redone on the
        upcast copy when its output is not finite."""
        y = run(self.fn, self.vae.model)
        if not self.active:
            return y
        self._whole = True
        for dtype in self._ladder:
            if finite(y):
                break
            self._redone[(0,) * 2] = dtype
            y = run(self.fn, self._copy(dtype))
        else:
            self._check_last((0,) * 2, y)
        return y

    # ---- internals -----------------------------------------------------------------------------
    def _copy(self, dtype: torch.dtype) -> nn.Module:
        if dtype not in self._copies:
            self._copies[dtype] = upcast_copy(self.vae.model, dtype)
        return self._copies[dtype]

    def _restream(self, rung: int, before: list[torch.Tensor]) -> nn.Module:
        """Start this tile's stream over on the copy of ``rung`` and replay the chunks already
        written, to rebuild the causal caches (their outputs were finite and stay in place). The
        copy's modules have no state in this stream yet: it starts from the first chunk."""
        m = self._copy(self._ladder[rung])
        self._stream = (rung, m)
        with runstate.replaying():
            for t in before:
                self.fn(t, m)
        return m

    def _end_stream(self) -> None:
        self._stream = None

    def _check_last(self, idx: tuple[int, ...], y: torch.Tensor) -> None:
        if not finite(y) and idx not in self._failed:
            self._failed.append(idx)

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._end_stream()
        self._copies.clear()
        if not self.active:
            self.vae.last_upcast = None
            return
        report = Upcast(self.op, self.dtype, self._total, tuple(self._redone), tuple(self._redone.values()),
                        tuple(self._failed), self._streamed, self._whole)
        self.vae.last_upcast = report
        if exc_type is None and report.tiles:
            (log.error if report.failed else log.warning)(report.message)


def require_finite(vae, y: torch.Tensor, op: str, x: torch.Tensor, options: dict, input: str) -> None:
    """Never return NaN/Inf pixels or latents: raise with the likely cause (checked in this order: the
    weights, a decode option, the input's magnitude, the precision), found only when it happens."""
    if all_finite(y):      # once per call, on the output (the tile guard is fp16/bf16 only)
        return
    bad = int((~torch.isfinite(y)).sum())
    head = f"the {op} gave {bad} NaN/Inf values out of {y.numel()}"
    broken = [name for name, p in vae.model.named_parameters() if not torch.isfinite(p).all()]
    if broken:
        raise NonFiniteError(f"{head}: the VAE's weights have NaN/Inf values in {len(broken)} tensors "
                             f"(e.g. {', '.join(broken[:3])}).", input="vae",
                             fix="the VAE file is damaged: download it again or load another copy.")
    for name, value in options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise NonFiniteError(f"{head}: the decode option '{name}' is {value}.", input=name,
                                 fix=f"give '{name}' a finite value.")
    peak = float(x.detach().abs().max()) if x.numel() else 0.0
    if op == "decode" and peak > 1e3:
        raise NonFiniteError(f"{head}: the latent's values reach {peak:.3g} (a sampler's latents stay within "
                             "about +-20).", input=input,
                             fix="check the sampler and model that made this latent (a diverged sampler, an fp16 "
                                 "overflow upstream) and that the latent belongs to this VAE.")
    if vae.dtype in GUARDED:
        raise NonFiniteError(f"{head}, even after recomputing in float32.", input="vae",
                             fix="load the VAE in fp32 and check the input; please report the file if it persists.")
    raise NonFiniteError(f"{head} in {_name(vae.dtype)}.", input=input,
                         fix="check the input values; load the VAE in fp32 if it runs in another precision.")


def _index(n: int, grid: tuple[int, ...]) -> tuple[int, ...]:
    """The n-th index of ``itertools.product`` over ``grid`` (past the grid: the call number)."""
    if n >= math.prod(grid):
        return (n,)
    idx = []
    for size in reversed(grid):
        n, i = divmod(n, size)
        idx.append(i)
    return tuple(reversed(idx))
