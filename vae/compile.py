"""torch.compile for a VAE handle: ``compile_vae`` returns a NEW handle and leaves its input untouched.

Why each rule (the anchors: compile nodes that patch the shared VAE and break on the next run,
recompiles or crashes when the resolution changes, an fp16 encoder that gives NaN only when it was
compiled together with the decoder):

- A copy, not a patch: the new handle runs its own module tree whose parameters are new Parameter
  objects viewing the input's storage (no extra memory until one side is moved or cast; moving or
  casting one never moves the other). The compiled callables are attributes of that copy only.
- Encoder and decoder are separate ``torch.compile`` calls on the copy's ``encode`` / ``decode``
  (each optional), isolated from each other's caches and recompile budget where torch can.
- Shapes: a tiled axis gets fixed-size tiles (``tiling.plan_axis(fixed=True)``: every tile is
  tile + overlap), so one static graph serves every resolution; an untiled axis is marked dynamic
  (``dynamic="auto"``), so a new resolution reuses one dynamic graph instead of recompiling.
- Sizes: see ``crop_to_multiple`` (the one rule for sides that are not multiples of the compression).
- Streamed (frame-wise) chunks run compiled: each stream's caches stay in its own run state, read
  eagerly at graph breaks around the stateful modules (vae/run.py), so a model that always streams
  (Wan) is compiled too, in pieces between its causal convs.
- Exact tiles pause inside the model (at re-cut points, whole-tensor modules, GroupNorms), so the
  model's call runs eagerly and what lies between two pauses is compiled: every seam module's own
  forward on a tile (vae/run.py ``Body``: residual blocks, resamplers, transformer blocks) through a
  ``torch.compile`` of a function that takes the module (``_Pieces``), static shapes. Tiles that run
  one after the other (vae/engine/stages.py) use it, with every tile of one shape (edge tiles moved
  inward, halos recomputed rather than shared: ``Tile.width``), so each module sees one input shape per
  kind of chunk and another image size with the same tile builds no graph. Eager: tiles that meet at
  every GroupNorm (rounds), whole-tensor modules on the assembled map (its shape is the image's), and
  layers outside seam modules (a network's head; chains of plain convolutions, as TAESD's).
- Graphs are counted per half (``graph_count``) from dynamo's own counter, around this handle's calls.
- A half the backend fails to compile is retried with static shapes (inductor 2.13 cannot lower some
  3-D convs with symbolic sizes), then, failing again, runs eagerly from then on, with a warning
  naming the error (``fallbacks``): never a crash.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from . import run
from .engine import tiling
from .errors import InputError
from .engine.guard import eager_copy
from .handle import VAE
from .nn.qkv import fuse_qkv as _fuse_qkv

log = logging.getLogger("VAEKit")

BACKENDS = ("inductor", "aot_eager", "eager", "cudagraphs")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DYNAMIC = {"auto": None, "true": True, "false": False}
HALVES = ("encode", "decode")
CROP_RULE = "centre-cropped to the nearest smaller multiple of the compression, as core's VAE Encode does"


@dataclass(frozen=True)
class CompileReport:
    encoder: bool            # compiled (lazily: the graph is built on the first call)
    decoder: bool
    backend: str
    mode: Optional[str]
    dynamic: str             # "auto", "true" or "false"
    qkv: str                 # the fuse_qkv message, or "" when not asked
    message: str             # one line for the node


def available_backends() -> tuple[str, ...]:
    """The backends offered: cudagraphs only where CUDA is."""
    return tuple(b for b in BACKENDS if b != "cudagraphs" or torch.cuda.is_available())


def crop_to_multiple(x: torch.Tensor, r: int) -> tuple[torch.Tensor, bool]:
    """THE size rule of compiled handles: images [..., H, W] whose sides are not multiples of ``r`` are
    centre-cropped to the nearest smaller multiple (core's VAE Encode rule), never padded (padding
    would invent border pixels that then decode as a frame). Returns (image, cropped?)."""
    h, w = x.shape[-2:]
    hh, ww = h // r * r, w // r * r
    if (hh, ww) == (h, w):
        return x, False
    if not (hh and ww):
        raise InputError(f"the image is {w}x{h} pixels, smaller than one latent pixel ({r}x{r}).",
                         input="pixels", fix=f"use an image of at least {r}x{r} pixels.")
    y0, x0 = (h - hh) // 2, (w - ww) // 2
    return x[..., y0:y0 + hh, x0:x0 + ww], True


def _graphs_built() -> int:
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def _compile_kwargs(backend: str, mode: Optional[str], dynamic: Optional[bool]) -> dict:
    kw = dict(backend=backend, dynamic=dynamic)
    if backend == "inductor" and mode not in (None, "default"):
        kw["mode"] = mode                 # the other backends take no mode
    accepted = inspect.signature(torch.compile).parameters
    if "isolate_recompiles" in accepted:  # torch >= 2.12: own cache entries and recompile budget
        kw["isolate_recompiles"] = True
    return kw


class _Compiled:
    """One half's compiled callable, installed as ``model.encode`` / ``model.decode`` on the copy.

    Marks the axes the handle did not tile as dynamic (``dims``, set per call by the handle), counts
    the graphs built while it runs, and runs the eager method while the model streams or after the
    backend failed to compile it (``failed``: why)."""

    def __init__(self, eager, kwargs: dict, model: nn.Module, auto_dynamic: bool):
        self.eager, self.kwargs = eager, kwargs
        self.fn = torch.compile(eager, **kwargs)
        self.model, self.auto_dynamic = model, auto_dynamic
        self.dims: tuple[int, ...] = ()   # tensor dims of the next call to mark dynamic
        self.graphs = 0
        self.failed = ""

    def __deepcopy__(self, memo):
        # a copy of the model (e.g. the NaN guard's upcast copy) is eager: its method, bound to the copy
        return copy.deepcopy(self.eager, memo)

    def __call__(self, x: torch.Tensor, *args, **kwargs):
        # exact tiles pause inside the model: they run eagerly
        if self.failed or run.current().exact is not None:
            return self.eager(x, *args, **kwargs)
        if self.auto_dynamic and self.dims:
            torch._dynamo.maybe_mark_dynamic(x, [x.dim() + d for d in self.dims])
        before = _graphs_built()
        try:
            return self._run(x, *args, **kwargs)
        finally:
            self.graphs += _graphs_built() - before

    def _run(self, x: torch.Tensor, *args, **kwargs):
        """The compiled call; a backend failure with dynamic shapes retries static (a new graph), a
        static one falls back to eager for good."""
        try:
            return self.fn(x, *args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as e:    # the backend's failure, not the model's
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            name = getattr(self.eager, "__name__", "it")
            if self.kwargs.get("dynamic") is not False:
                log.warning("VAEKit: torch.compile could not compile %s with dynamic shapes (%s); "
                            "retrying with static shapes", name, why)
                self.kwargs, self.auto_dynamic = {**self.kwargs, "dynamic": False}, False
                self.fn = torch.compile(self.eager, **self.kwargs)
                return self._run(x.detach(), *args, **kwargs)       # a tensor without dynamic marks
            self.failed = why
            log.warning("VAEKit: torch.compile could not compile %s (%s); it runs eagerly from now on", name, why)
            return self.eager(x, *args, **kwargs)


def _call_module(module: nn.Module, x: torch.Tensor, *args, **kwargs):
    return module(x, *args, **kwargs)


# graphs one half's exact pieces may build (module kinds x tile shapes x chunk kinds, plus graph breaks
# at causal convs); past it dynamo runs the new shapes eagerly
PIECE_GRAPHS = 512


class _Pieces:
    """One half's exact-tile pieces: ``self(module, x, *args)`` calls a seam module through a compiled
    function that takes the module, counting the graphs built; a backend failure falls back to eager
    calls for good (``failed``: why), as ``_Compiled`` does.

    Modules of one class and width share a graph (one compiled function), except in a stream: there a
    module reads its causal cache from the stream's memory, keyed by the module, at a graph break, and a
    graph shared across modules would read another module's cache (measured: Wan's tiny decoder, 0.48
    off). So in a stream each module has its compiled function of its own."""

    def __init__(self, kwargs: dict):
        self.kwargs = {**kwargs, "dynamic": False}
        if "recompile_limit" in inspect.signature(torch.compile).parameters:
            self.kwargs["recompile_limit"] = PIECE_GRAPHS
        self.fn = torch.compile(_call_module, **self.kwargs)
        self.own: dict[nn.Module, object] = {}       # streams: one compiled function per module
        self.graphs = 0
        self.failed = ""

    def _fn(self, module: nn.Module, streaming: bool):
        if not streaming:
            return self.fn
        if module not in self.own:
            self.own[module] = torch.compile(_call_module, **self.kwargs)
        return self.own[module]

    def __deepcopy__(self, memo):
        return self          # shared by copies of the handle's model: it holds no module

    def __call__(self, module: nn.Module, x: torch.Tensor, *args, **kwargs):
        if self.failed:
            return module(x, *args, **kwargs)
        before = _graphs_built()
        now = run.current()
        # inside, the module is called as usual (its own seams do not pause again, also where dynamo
        # runs a frame eagerly at a graph break); where the tile lies stays known (vae/nn/noise.py)
        plain = dataclasses.replace(now, exact=None, place=now.exact if now.exact is not None else now.place)
        try:
            with run.using(plain):
                return self._fn(module, now.memory is not None)(module, x, *args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as e:
            self.failed = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            log.warning("VAEKit: torch.compile could not compile an exact tile's %s (%s); exact tiles run "
                        "eagerly from now on", type(module).__name__, self.failed)
            return module(x, *args, **kwargs)
        finally:
            self.graphs += _graphs_built() - before


def _clone(model: nn.Module) -> nn.Module:
    """A new, eager module tree over the same storage: new Parameter objects (so ``.to()`` on one tree
    never moves the other's), the same buffer tensors (``.to()`` replaces buffers, never mutates them)."""
    return eager_copy(model, lambda t: t)


class CompiledVAE(VAE):
    """A VAE handle whose model's encode/decode are compiled (lazily: on the first call). Everything
    else (checks, tiling, streaming, the NaN guard) is the plain handle's."""

    report: CompileReport
    pieces: dict = {}       # half -> its exact tiles' compiled pieces (``_Pieces``); set by compile_vae

    def graph_count(self, half: Optional[str] = None) -> int:
        """Graphs dynamo built for this handle so far: ``half`` "encode" / "decode", or both (whole
        calls and exact tiles' pieces)."""
        halves = (half,) if half else HALVES
        return sum(c.graphs for c in self._compiled(halves)) + sum(self.pieces[h].graphs for h in halves
                                                                   if h in self.pieces)

    def _exact_body(self, decode: bool, model: nn.Module):
        pieces = self.pieces.get("decode" if decode else "encode")
        return pieces if model is self.model else None      # the NaN guard's upcast copy runs eagerly

    def fallbacks(self) -> dict[str, str]:
        """Halves the backend failed to compile (they run eagerly), with the error; "<half> exact
        tiles" for exact tiles' pieces."""
        out = {h: c.failed for h, c in zip(HALVES, (vars(self.model).get(h) for h in HALVES))
               if isinstance(c, _Compiled) and c.failed}
        out.update({f"{h} exact tiles": p.failed for h, p in self.pieces.items() if p.failed})
        return out

    def _compiled(self, halves=HALVES) -> list[_Compiled]:
        return [f for f in (vars(self.model).get(h) for h in halves) if isinstance(f, _Compiled)]

    def _plans(self, grid, tile, overlap, *args, **kwargs) -> list[tiling.AxisPlan]:
        plans = super()._plans(grid, tile, overlap, *args, **kwargs)
        plans[-2:] = tiling.plan_grid(grid[-2:], tile, overlap, self.caps.spatial_ratio, fixed=True)
        # an axis that stays whole has the input's size: mark it dynamic (tiled ones are fixed). Video
        # halves start static: inductor (2.13, CPU) fails to lower their 3-D convs with symbolic sizes
        dims = () if self.is_video else tuple(d for d, p in zip(range(-len(plans), 0), plans) if not p.tiled)
        for c in self._compiled():
            c.dims = dims
        return plans

    def encode(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        r = self.caps.spatial_ratio_packed
        cropped = False
        if torch.is_tensor(x) and x.dim() >= 4:       # anything else gets the handle's own message
            x, cropped = crop_to_multiple(x, r)
        if cropped:
            log.info("VAEKit compiled %s: image sides not multiples of %d were %s (now %dx%d)",
                     self.name, r, CROP_RULE, x.shape[-1], x.shape[-2])
        return super().encode(x, *args, **kwargs)


def compile_vae(vae: VAE, encoder: bool = True, decoder: bool = True, backend: str = "inductor",
                mode: Optional[str] = None, dynamic: Optional[str] = "auto",
                fuse_qkv: bool = False) -> tuple[CompiledVAE, CompileReport]:
    """A new handle whose encoder and/or decoder run through ``torch.compile`` (separate graphs);
    ``vae`` and its model are not modified. ``dynamic``: "auto" (tiled axes static with fixed-size
    tiles, untiled axes dynamic), "true" (everything dynamic) or "false" (everything static);
    True/False/None are taken too. ``fuse_qkv`` fuses attention projections in the copy only."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}.", input="backend", fix=f"use one of {', '.join(BACKENDS)}.")
    if backend == "cudagraphs" and not torch.cuda.is_available():
        raise InputError("the cudagraphs backend needs a CUDA device.", input="backend",
                         fix="use inductor (or eager/aot_eager to check a graph).")
    if mode not in (None, *MODES):
        raise InputError(f"unknown mode {mode!r}.", input="mode", fix=f"use one of {', '.join(MODES)}.")
    dyn = {None: "auto", True: "true", False: "false"}.get(dynamic, dynamic)
    if dyn not in DYNAMIC:
        raise InputError(f"unknown dynamic setting {dynamic!r}.", input="dynamic", fix="use auto, true or false.")
    model = _clone(vae.model)
    new = CompiledVAE(vae.spec, vae.config, model, vae.dtype, vae.device, vae.source)
    qkv = ""
    if fuse_qkv:
        qkv = _fuse_qkv(model, vae.name).message
    halves = [h for h, on in zip(HALVES, (encoder and vae.caps.can_encode, decoder and vae.caps.can_decode)) if on]
    kwargs = _compile_kwargs(backend, mode, DYNAMIC[dyn])
    for h in halves:
        setattr(model, h, _Compiled(getattr(model, h), kwargs, model, auto_dynamic=dyn == "auto"))
    new.pieces = {h: _Pieces(kwargs) for h in halves}
    done = " and ".join({"encode": "encoder", "decode": "decoder"}[h] for h in halves) or "nothing"
    msg = (f"compiled {done} with {backend}" + (f" ({mode})" if kwargs.get("mode") else "")
           + f", dynamic {dyn}; graphs are built on the first encode/decode")
    if mode not in (None, "default") and "mode" not in kwargs:
        msg += f"; mode {mode} applies to inductor only and was ignored"
    if qkv:
        msg += f"; {qkv}"
    new.report = CompileReport("encode" in halves, "decode" in halves, backend, kwargs.get("mode"), dyn, qkv, msg)
    return new, new.report
