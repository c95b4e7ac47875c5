"""Exact tiles run one after the other: the working set of one tile, however large the image or clip.

For a model without GroupNorm statistics (per-voxel norms: Wan, Qwen-Image, HunyuanVideo 1.5, LTX),
tiles need each other only at a few points: a module that mixes every position (attention at latent
resolution: ``exact_whole``) and, by choice, re-cut points at latent resolution, where assembling the
map is cheap and saves the halo recomputation a tile would otherwise repeat, and re-cut points that
declare themselves separators at any resolution (``exact_boundary = SEPARATOR``, vae/engine/receptive.py). These
are the **separators**. Between two of them a tile needs nothing from the others, so a run goes stage by
stage, and inside a stage **tile by tile, each tile through all its chunks** (through its own causal
caches, which end with the tile), writing its core of the separator's input into a map per chunk on
the offload device (host memory on a GPU machine). At a whole separator the module then runs once per
chunk on the assembled map (in order, through the run's own stream memory); the next stage's tiles
read their slices of it, with the halo their layers need.

A tile's halo at a stage's start covers the reach of every layer up to the stage's end; at the
re-cut points inside the stage the tile crops its own tensor down to what the rest of the stage
needs (``Tile.crop``), so high-resolution layers carry a few pixels of halo, not the whole stage's.

A later stage re-enters the model's own forward (no model code changes): the layers before the
stage's start run on a tiny input (one aligned latent pixel or two, through the tile's own tiny
stream state; a separator whose output keeps its input's shape runs there once per call, then passes
its input through: ``_Stages.replay``), and at the start the flowing tensor is replaced by the tile's
slice of the map; at the stage's end the tile hands over its core and the forward is unwound.
Nothing else may be live across a separator (a module's residual input): the classes that declare
``exact_whole`` / ``exact_boundary`` promise that, and the first stage that breaks it fails loudly on
a shape.

Memory: one tile's activations and caches on the compute device, two maps at latent resolution per
chunk on the offload device, the output on the intermediate device.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from . import distributed, transfer
from . import memory as vram
from .. import run as runstate
from .receptive import Event, Segment, active, scale_of, segments, separates
from .tiles import Output, Tile, grid

# Re-cut points at this scale or coarser (map pixels per latent pixel) become separators.
SEPARATE_AT = Fraction(1)


@dataclass(frozen=True)
class Stage:
    start: Optional[int]                   # event index of the separator it starts at (None: the input)
    end: Optional[int]                     # event index of the separator it ends at (None: the output)
    cuts: dict                             # event index (None: input) -> the cut of the segment starting there
    cost: float                            # share of the multiply-adds (progress weights)
    leads: dict = dataclasses.field(default_factory=dict)   # event index -> a shared halo's lead (``_cuts``)


@dataclass(frozen=True)
class StagePlan:
    events: tuple[Event, ...]
    seams: tuple[int, ...]                 # event indices of the seam calls a forward makes, in order
    roles: dict                            # event index -> "separator" or "crop"
    stages: tuple[Stage, ...]
    align: tuple[int, int]                 # the input's alignment (pixels): a replay's tiny input is 2x it


def plan(events: Sequence[Event], latent: tuple[int, int], in_unit: int, out_unit: int) -> Optional[StagePlan]:
    """The stages of a model whose probe (``events`` on a ``latent``-sized input) has no GroupNorm; None
    if it has one (its tiles meet at every norm: vae/engine/exact.py). Every re-cut point finer than
    ``SEPARATE_AT`` is a crop (unless it ``separates`` at any scale), also those the meeting engine
    skips (cropping costs nothing)."""
    if any(e.kind == "stats" for e in events):
        return None
    segs = segments(events, latent, in_unit, out_unit, every=True)
    # the model's own input checks want whole latent pixels (e.g. sides divisible by 8)
    segs[0] = dataclasses.replace(segs[0], align=tuple(math.lcm(a, in_unit) for a in segs[0].align))
    roles, seams = {}, []
    for i, e in enumerate(events):
        if e.kind not in ("whole", "boundary"):
            continue
        seams.append(i)
        scale = scale_of(e, latent)
        if e.kind == "whole" or (active(e.module, scale) and (max(scale) <= SEPARATE_AT or separates(e.module))):
            roles[i] = "separator"
        else:
            roles[i] = "crop"
    groups: list[list[Segment]] = [[]]
    for seg in segs:
        if seg.start is not None and roles.get(seg.start) == "separator":
            groups.append([])
        groups[-1].append(seg)
    total = sum(s.cost for s in segs) or 1.0
    stages = []
    for k, group in enumerate(groups):
        end = groups[k + 1][0].start if k + 1 < len(groups) else None
        cuts, leads = _cuts(group)
        stages.append(Stage(group[0].start, end, cuts, sum(s.cost for s in group) / total, leads))
    return StagePlan(tuple(events), tuple(seams), roles, tuple(stages), segs[0].align)


def _cuts(group: Sequence[Segment]) -> tuple[dict, dict]:
    """Per segment of a stage, the halo to cut it with: its own layers' reach plus what the rest of
    the stage needs after it, rounded up to its grid (so the next crop finds valid context); and the
    lead of a shared halo (``_Shared``): how far behind that the segment's input must reach, its
    reach twice over less the rounding (the tile before it computed that part)."""
    grid = lambda n, s, al: Fraction(math.ceil(n * s / al) * al) / s      # noqa: E731 - up to the grid
    cuts, leads, after = {}, {}, (Fraction(0), Fraction(0))
    for seg in reversed(group):
        halo = tuple(grid(h + a, s, al) for h, a, s, al in zip(seg.halo, after, seg.scale, seg.align))
        cuts[seg.start] = dataclasses.replace(seg, halo=halo)
        leads[seg.start] = tuple(grid(d - a + h, s, al) for d, a, h, s, al in
                                 zip(halo, after, seg.halo, seg.scale, seg.align))
        after = halo
    return cuts, leads


class _StageDone(BaseException):
    """Unwinds a tile's forward at its stage's end (its core is handed over)."""


@contextlib.contextmanager
def _plain():
    """Modules run as usual (no exact hooks), with the stream state they had."""
    with runstate.using(dataclasses.replace(runstate.current(), exact=None)):
        yield


class _Maps:
    """A separator's map per chunk (the assembled cores of its input; after a whole module, its output),
    on the offload device; tiles' cores are copied in and slices out through ``transfers``."""

    def __init__(self, latent: tuple[int, ...], device: torch.device, zeros: bool, transfers: transfer.Transfers):
        self.latent, self.device, self.zeros, self.transfers = latent, device, zeros, transfers
        self.maps: dict[int, torch.Tensor] = {}
        self.fmt = torch.contiguous_format

    def write(self, chunk: int, tile: Tile, x: torch.Tensor) -> None:
        scales, core = tile.locate(x)
        if chunk not in self.maps:
            size = [int(n * s) for n, s in zip(self.latent, scales)]
            last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())    # the map keeps x's layout
            self.fmt = last if last is not None and x.is_contiguous(memory_format=last) else torch.contiguous_format
            with vram.placed_away():        # born on the offload device: never among the tile's bytes
                m = torch.empty(*x.shape[:-2], *size, dtype=x.dtype, device=self.device, memory_format=self.fmt)
                self.maps[chunk] = m.zero_() if self.zeros else m      # zeros where other ranks' cores go
        dst = tuple(slice(int(a * s), int(b * s)) for (a, b), s in zip(tile.core, scales))
        self.transfers.to_host(x[core], self.device, self.maps[chunk][(..., *dst)].copy_)

    def read(self, chunk: int, tile: Tile, place: Callable, like: torch.Tensor) -> torch.Tensor:
        """The tile's slice of chunk ``chunk``'s map, on ``like``'s device; ``place(tile, scales, size)``
        sets its extent (core plus halo)."""
        full = self.maps[chunk]
        scales = [Fraction(n, m) for n, m in zip(full.shape[-2:], self.latent)]
        if full.shape[:-2] != like.shape[:-2]:
            raise RuntimeError(f"exact tiling: a later stage met a map of shape {tuple(full.shape)} where its "
                               f"forward carries {tuple(like.shape)} (something besides the separator's input is "
                               "live across it)")
        place(tile, scales, full.shape[-2:])
        return self.transfers.to_device(full[tile.slices()], like.device, self.fmt)      # one copy, counted

    def _put(self, chunk: int, y: torch.Tensor) -> None:
        self.maps[chunk] = y
        vram.offloaded(y)           # (on one device ``to`` hands back y itself)

    def finish(self, comm, module: Optional[nn.Module], device: torch.device, memory: Optional[dict]) -> None:
        """All tiles have written: sum the ranks' shares; run a whole module on each chunk, in order
        (eagerly: its input is the map, whose shape is the image's, not a tile's)."""
        self.transfers.wait()
        for c in sorted(self.maps):
            comm.sum_(self.maps[c])
            if module is not None:
                with runstate.stream(memory) if memory is not None else contextlib.nullcontext():
                    y = module(self.transfers.to_device(self.maps[c], device, copy=False))
                self.transfers.to_host(y, self.device, functools.partial(self._put, c))
                del y
        self.transfers.wait()


def _layout(x: torch.Tensor) -> torch.memory_format:
    last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return last if last is not None and x.is_contiguous(memory_format=last) else torch.contiguous_format


class _Shared:
    """Halos shared between the tiles of a stage (one process; tiles in row-major order, each through
    all its chunks). At a re-cut point a tile needs its core plus the reach of the layers still to come
    before the stage ends. Instead of recomputing that halo, each tile runs ``ahead`` by that reach
    (the stage's output is back on the core) and computes only what no tile before it did; the rest it
    takes from them: the last columns of the tile on its left (``strips``) and the last rows of the row
    of tiles above, across the map's width (``bands``), kept per re-cut point and chunk on the offload
    device. A segment then recomputes twice its own reach, not that of the whole rest of the stage (Wan
    2.1's last stage: 2 latent pixels at 2x resolution instead of 12). ``sample`` (the planner's dry
    run, where the neighbours did not run): what a tile would take is made up, at its size."""

    def __init__(self, device: torch.device, sample: bool):
        self.device, self.sample = device, sample
        self.strips: dict = {}
        self.bands: dict = {}

    def recut(self, key, x: torch.Tensor, tile: Tile, seg: Segment, lead) -> torch.Tensor:
        f = [tile._factor(x, d) for d in range(2)]
        was = [lo * k for lo, k in zip(tile.lo, f)]          # x's extent at its own scale
        if any(w.denominator != 1 for w in was):
            raise RuntimeError("exact tiling: a tile's extent does not fall on this layer's grid")
        was = [int(w) for w in was]
        scales = [s * k for s, k in zip(tile.scale, f)]
        own, after = tile.shift(scales, seg, lead, [int(n * s) for n, s in zip(tile.latent, scales)])
        lo, hi = tile.lo, tile.hi
        if any(o < w or h > w + x.shape[x.dim() - 2 + d] for d, (o, h, w) in enumerate(zip(own, hi, was))):
            raise RuntimeError("exact tiling: a tile's halo ran short of the layers' reach")
        new = x[..., own[0] - was[0]:hi[0] - was[0], own[1] - was[1]:hi[1] - was[1]]
        dy, dx = own[0] - lo[0], own[1] - lo[1]
        if dy or dx:
            out = torch.empty(*x.shape[:-2], hi[0] - lo[0], hi[1] - lo[1], dtype=x.dtype, device=x.device,
                              memory_format=_layout(x))
            out[..., dy:, dx:] = new
            if dx:
                out[..., :dx] = self._stored(self.strips, key, out[..., :dx])
            if dy:
                band = self._band((*key, tile.core[0][0]), out[..., :dy, :], self._width(tile, scales), reading=True)
                out[..., :dy, dx:] = band[..., own[1]:hi[1]]
        else:
            out = new
        if after[1] is not None:                 # for the tile on the right
            with vram.placed_away():
                self.strips[key] = out[..., after[1] - lo[1]:].to(self.device, copy=True)
        if after[0] is not None:                 # for the row below
            rows = out[..., after[0] - lo[0]:, :]
            self._next_band(key, tile.core[0], rows, self._width(tile, scales))[..., lo[1]:hi[1]] = rows
        return out

    @staticmethod
    def _width(tile: Tile, scales) -> int:
        return int(tile.latent[1] * scales[1])

    def _stored(self, store: dict, key, like: torch.Tensor) -> torch.Tensor:
        got = store.get(key)
        if got is None or got.shape != like.shape:
            if not self.sample:
                raise RuntimeError("exact tiling: a tile found no halo from the tiles before it")
            with vram.placed_away():
                got = store[key] = torch.empty(like.shape, dtype=like.dtype, device=self.device)
        return got

    def _next_band(self, key, rows_at: tuple[int, int], rows: torch.Tensor, width: int) -> torch.Tensor:
        """The band a row of tiles (latent rows ``rows_at``) writes for the row below, keyed by where that
        row starts. Where it has the shape of the band this row reads, that one is reused in place (a tile
        writes only the columns the tiles on its right have read, see ``recut``); where not (rows of tiles
        of different heights need bands of different heights), a second one; older rows' bands are dropped."""
        for k in [k for k in self.bands if k[:-1] == key and k[-1] < rows_at[0]]:
            del self.bands[k]
        here = self.bands.get((*key, rows_at[0]))
        if (*key, rows_at[1]) not in self.bands and here is not None and here.shape == (*rows.shape[:-1], width):
            self.bands[(*key, rows_at[1])] = here
        return self._band((*key, rows_at[1]), rows, width)

    def _band(self, key, rows: torch.Tensor, width: int, reading: bool = False) -> torch.Tensor:
        """The band ``key`` (re-cut point, chunk, first latent row of the tiles that read it): ``rows``'
        leading shape and rows, the map's width."""
        band = self.bands.get(key)
        shape = (*rows.shape[:-1], width)
        if band is None or band.shape != shape:
            if reading and not self.sample:
                raise RuntimeError("exact tiling: a tile found no halo from the row of tiles above")
            with vram.placed_away():
                band = self.bands[key] = torch.empty(shape, dtype=rows.dtype, device=self.device)
        return band


class _Hooks:
    """One tile's forward through one stage (the run state's ``exact`` for that call)."""

    def __init__(self, run: "_Stages", stage: Stage, tile: Tile, chunk: int, view: Tile):
        self.run, self.stage, self.tile, self.chunk = run, stage, tile, chunk
        self.view = view            # what the flowing tensor covers: the tiny replay, then the tile
        self.calls = 0

    def extent(self, x: torch.Tensor):
        return self.view.extent(x)

    def stats(self, norm, x):
        raise RuntimeError("exact tiling: a GroupNorm the probe did not see ran in a tile-major stage")

    def seam(self, module: nn.Module, x: torch.Tensor, forward: Callable[[torch.Tensor], torch.Tensor]):
        if not (getattr(module, "exact_whole", False) or getattr(module, "exact_boundary", False)):
            return forward(x)            # a seam class switched off for this instance (the probe skips it)
        vram.keep_within()               # a budgeted call on the CPU: the allocator's freed blocks back
        plan, stage = self.run.plan, self.stage
        j, self.calls = self.calls, self.calls + 1
        i = plan.seams[j] if j < len(plan.seams) else None
        if i is None or plan.events[i].module is not module:
            raise RuntimeError("exact tiling: the tiles took a different path than the probe pass")
        if stage.start is not None and i < stage.start:       # replaying the stages before this one
            return self.run.replay(i, self.chunk, x, forward)
        if i == stage.start:
            src = self.run.maps_in.read(self.chunk, self.tile, lambda t, s, n: self.run.place(t, stage, i, s, n), x)
            self.view = self.tile
            return src if plan.events[i].kind == "whole" else self.run.forward(forward, src)
        if i == stage.end:
            self.run.maps_out.write(self.chunk, self.tile, x)
            raise _StageDone
        if plan.roles[i] == "crop":
            x = self.run.recut(stage, i, self.chunk, self.tile, x)
        return self.run.forward(forward, x)


class _Stages:
    def __init__(self, fn, model: nn.Module, x: torch.Tensor, latent: tuple[int, int], plan: StagePlan,
                 chunks, out_device: torch.device, offload: torch.device, progress, sample: bool = False,
                 body: Optional[Callable] = None, fixed: bool = False):
        self.fn, self.model, self.x, self.latent, self.plan = fn, model, x, latent, plan
        self.chunks, self.progress = chunks, progress
        self.offload, self.sample, self.body = offload, sample, body
        self.fixed = fixed or body is not None      # compiled graphs: every tile of one shape
        self.device = next(model.parameters()).device       # where whole modules run
        self.comm = distributed.current()
        self.transfers = transfer.Transfers()
        self.out = Output(out_device, self.comm.size > 1, chunks[1][-1][1] if chunks else None, self.transfers)
        self.maps_in: Optional[_Maps] = None
        self.maps_out: Optional[_Maps] = None
        self.shared: Optional[_Shared] = None     # one process: tiles share their halos (``_Shared``)
        self.replayed: dict = {}                  # (event, chunk, input shape, dtype) -> output's (``replay``)

    def place(self, tile: Tile, stage: Stage, i: Optional[int], scales, size) -> None:
        """Set ``tile``'s extent at the start of the segment at event ``i`` (None: the input)."""
        if self.shared is not None:
            tile.shift(scales, stage.cuts[i], stage.leads[i], size)
        else:
            tile.cut(scales, stage.cuts[i], size)

    def recut(self, stage: Stage, i: int, chunk: int, tile: Tile, x: torch.Tensor) -> torch.Tensor:
        """A tile's tensor at re-cut point ``i`` inside a stage, cut for the layers up to the next one."""
        if self.shared is not None:
            return self.shared.recut((i, chunk), x, tile, stage.cuts[i], stage.leads[i])
        return tile.crop(x, stage.cuts[i])

    def replay(self, i: int, chunk: int, x: torch.Tensor, forward: Callable) -> torch.Tensor:
        """Seam ``i`` before a stage's start, on the tiny replay input. Its values are never read (the
        start replaces the flowing tensor, and nothing else is live across a separator), only its shape:
        it runs once per event, chunk and input shape in a call, and after that one whose output had its
        input's shape and dtype passes its input through. Otherwise every tile of every stage would rerun
        every earlier block on the tiny input (LTX-2.5's 24 separators: as many tokens as one pass at
        17 x 256 x 256 with 128 px tiles). A skipped module's stream state is never read: it is skipped
        in every later replay of that chunk too."""
        key = (i, chunk, tuple(x.shape), x.dtype)
        if self.replayed.get(key) == key[2:]:
            return x
        with _plain():
            y = forward(x)
        self.replayed[key] = (tuple(y.shape), y.dtype)
        return y

    def forward(self, body: runstate.Body, x: torch.Tensor) -> torch.Tensor:
        """A seam module's own forward on a tile's tensor: through ``self.body`` (compiled graphs) if given."""
        return body(x) if self.body is None else body.via(self.body, x)

    def go(self, cores, in_unit: int, tiny: tuple[int, int]) -> torch.Tensor:
        tiles = grid(cores, self.latent, fixed=self.fixed)
        mine = [t for i, t in enumerate(tiles) if self.comm.owns(i, len(tiles))]
        if self.sample:       # the first tile (the widest with shared halos) and the most interior one
            middle = tuple(spans[len(spans) // 2] for spans in cores)
            mine = [t for t in mine if t.core == middle or all(a == 0 for a, _ in t.core)]
        spans = self.chunks[0] if self.chunks else [None]
        units, done = len(mine) * len(spans), 0.0
        whole_memory = {} if self.chunks else None
        for stage in self.plan.stages:
            last = stage.end is None
            self.maps_out = None if last else _Maps(self.latent, self.offload, self.comm.size > 1, self.transfers)
            # shared halos: one process, and tiles of any shape (fixed shapes overlap their halos instead)
            self.shared = _Shared(self.offload, self.sample) if self.comm.size == 1 and not self.fixed else None
            error = None
            try:
                for tile in mine:
                    memory = {} if self.chunks else None      # this tile's stream, for this stage only
                    for c, span in enumerate(spans):
                        y = self._one(stage, tile, c, span, memory, in_unit, tiny)
                        if last:
                            self.out.write(tile, y, self.chunks[1][c] if self.chunks else None)
                        del y
                        vram.trim()          # the unit's freed blocks back to the system (memory.trim)
                        done += stage.cost / units
                        if self.progress:          # ComfyUI's interrupt is raised here
                            self.progress(min(units, round(done * units)), units)
                    del memory
            except BaseException as e:     # noqa: BLE001 - every rank learns of it in step()
                error = e
            self.comm.step(error, False)
            if self.maps_out is not None:
                module = self.plan.events[stage.end].module
                self.maps_out.finish(self.comm, module if self.plan.events[stage.end].kind == "whole" else None,
                                     self.device, whole_memory)
            self.maps_in, self.maps_out, self.shared = self.maps_out, None, None
            if not last:
                transfer.between_stages(self.device)
        if self.progress:
            self.progress(units, units)
        return self.comm.sum_(self.out.result())

    def _one(self, stage: Stage, tile: Tile, c: int, span, memory, in_unit: int, tiny: tuple[int, int]):
        """One tile's chunk ``c`` through ``stage``: its output (last stage) or None."""
        src = self.x if span is None else self.x[:, :, span[0]:span[1]]
        if stage.start is None:
            self.place(tile, stage, None, [Fraction(in_unit)] * 2, self.x.shape[-2:])
            view = tile
            src = src[tile.slices()]
        else:                      # the layers before the stage run on a tiny corner of the input
            view = Tile(((0, tiny[0] // in_unit), (0, tiny[1] // in_unit)), self.latent, [0, 0], list(tiny),
                        [Fraction(in_unit)] * 2)
            src = src[(..., slice(0, tiny[0]), slice(0, tiny[1]))]
        hooks = _Hooks(self, stage, tile, c, view)
        with runstate.using(runstate.Run(memory=memory, exact=hooks)):
            try:
                return self.fn(src, self.model)
            except _StageDone:
                return None


def run_stages(fn, model: nn.Module, x: torch.Tensor, latent: tuple[int, int], plan: StagePlan, cores,
               in_unit: int, out_device: torch.device, chunks=None,
               offload: Optional[torch.device] = None, progress=None, sample: bool = False,
               body: Optional[Callable] = None, fixed: bool = False) -> torch.Tensor:
    """Apply ``fn(x, model)`` tile by tile, stage by stage (see the module docstring); the arguments are
    those of ``vae.engine.exact.run_exact`` plus the plan. ``sample``: only the first tile and the most
    interior one run (the planner's dry run: every tile's working set is at most the larger of theirs).
    ``body``: how the seam modules' own forwards run between the pauses, ``body(module, x, *args)``
    (a compiled handle's graphs, vae/compile.py); None: eagerly. ``fixed`` (implied by ``body``): every
    tile's extents of one shape, their halos overlapping (``Tile.width``), instead of shared halos."""
    tiny = tuple(min(n, 2 * a) for n, a in zip(x.shape[-2:], plan.align))
    run = _Stages(fn, model, x, latent, plan, chunks, out_device, offload or out_device, progress, sample, body,
                  fixed)
    with torch.inference_mode():
        return run.go(cores, in_unit, tiny)
