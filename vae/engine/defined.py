"""Models that tile as part of their definition: the reference's own tiles and time chunks ARE the
result to match, so the engine runs exactly those units and never tiles again on top.

MiniMax H3 is the case in point: its reference decodes 7-latent chunks through a ViT whose positions
are normalised by the grid it sees, in 256 px tiles blended linearly, and cross-fades the chunks;
encode runs 17-frame clips in 256 px tiles blended in the latent. An untiled pass is a different
model output (and worse: the decoder was trained on its tiles). So "exact" for such a family means
"equal to its own definition", and every engine feature is a schedule of the definition's units:

- a family declares ``Capabilities.own_tiling``: an object with ``plan(op, shape, **options)`` (a
  ``Plan``), ``frames(latent_frames)`` / ``latents(frames)`` (its frame rules), ``options`` (the
  decode options that choose among the reference's variants) and ``describe()``;
- a ``Plan`` is time chunks x spatial tiles. Every unit (one chunk of one tile) is an independent
  forward pass; its output is added into one preallocated output with weights fixed by the plan.
  The reference's blends (a tile blended into what is already there, chunk tails cross-faded) are
  linear with weights that sum to 1, so they are exactly such fixed weights (``cover``, ``weights``),
  and the order in which units run does not matter (up to float rounding);
- so: progress and interrupt per unit, one unit's working set on the device (the output waits on the
  intermediate device), the units split among ranks whose outputs are summed (vae/engine/distributed.py),
  the NaN guard per unit, and the memory a call needs is one unit's (``memory_needed``).
Nothing here knows a family: the spatial cover and its two compositions are generic, the time
chunks come from the family's plan."""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from . import budget as planner
from . import distributed, guard, memory
from ..errors import InputError
from .tiling import AxisPlan, Progress

log = logging.getLogger("VAEKit")

COMPOSITIONS = ("blend", "stitch")


@dataclass(frozen=True)
class Chunk:
    """One time chunk: the input frames the model call gets (repeats pad a clip's end), and per frame
    of its output the output frame it lands on (-1: dropped) and its blend weight there."""
    src: tuple[int, ...]
    dst: tuple[int, ...]
    weight: tuple[float, ...]


@dataclass(frozen=True)
class Tile:
    """One spatial tile: its input and output spans (start, stop) per axis (H, W), and its weight over
    the output span as a sum of outer products ``sum(wy[:, None] * wx[None, :])``."""
    src: tuple[tuple[int, int], tuple[int, int]]
    dst: tuple[tuple[int, int], tuple[int, int]]
    terms: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    def weight(self) -> torch.Tensor:
        return sum(wy[:, None] * wx[None, :] for wy, wx in self.terms)


@dataclass(frozen=True)
class Plan:
    out_channels: int
    out_frames: int
    out_size: tuple[int, int]
    chunks: tuple[Chunk, ...]
    tiles: tuple[Tile, ...]
    grid: tuple[int, int]                     # tile rows, columns

    @property
    def units(self) -> int:
        return len(self.chunks) * len(self.tiles)

    def unit_input(self, batch: int, channels: int) -> tuple[int, ...]:
        """The largest input one unit takes (for the memory estimate)."""
        t = max(len(c.src) for c in self.chunks)
        h = max(b - a for (a, b), _ in (t_.src for t_ in self.tiles))
        w = max(b - a for _, (a, b) in (t_.src for t_ in self.tiles))
        return batch, channels, t, h, w


# ---- the spatial cover and its weights -----------------------------------------------------------

def cover(length: int, tile: int, min_overlap: int, step: int) -> tuple[list[int], list[int], list[int]]:
    """Tiles of ``tile`` along ``length``: the fewest that cover it with overlaps of at least
    ``min_overlap``, the slack spread over the overlaps round-robin in ``step`` units (so tile edges stay
    on latent pixels). Returns starts, sizes, overlaps (overlap i: between tiles i and i+1). A side no
    longer than a tile is one tile of its own length."""
    if tile >= length:
        return [0], [length], []
    n = math.ceil(length / tile)
    while tile * n - min_overlap * (n - 1) < length:
        n += 1
    overlaps = [min_overlap] * (n - 1)
    for i in range((tile * n - sum(overlaps) - length) // step):
        overlaps[i % (n - 1)] += step
    starts = [0]
    for o in overlaps:
        starts.append(starts[-1] + tile - o)
    return starts, [tile] * n, overlaps


def _ramps(starts: Sequence[int], overlaps: Sequence[int], length: int) -> list[torch.Tensor]:
    """Per tile k > 0, how much of it a pixel takes when it is blended in: 0 before its start, then
    p / overlap over its first ``overlaps[k-1]`` pixels (p = 0, 1, ...), then 1. Tile 0 takes all."""
    x = torch.arange(length, dtype=torch.float64)
    out = [torch.ones(length, dtype=torch.float64)]
    for s, o in zip(starts[1:], overlaps):
        out.append(((x - s) / o).clamp(0, 1))
    return out


def _axis_vectors(starts: Sequence[int], overlaps: Sequence[int], length: int):
    """Per tile along one axis, over the whole axis: ``fold`` (its weight when tiles are blended in
    one after another), ``own`` (its ramp where it owns the pixel: from its start to the next tile's),
    ``one`` (1 where it owns the pixel) and ``nxt`` (1 - the next tile's ramp where that one owns it)."""
    r = _ramps(starts, overlaps, length)
    n = len(starts)
    owner = torch.zeros(length, dtype=torch.long)
    for k, s in enumerate(starts):
        owner[s:] = k
    fold, own, one, nxt = [], [], [], []
    for k in range(n):
        f = r[k].clone()
        for m in range(k + 1, n):
            f *= 1 - r[m]
        mine = (owner == k).double()
        fold.append(f)
        own.append(mine * r[k])
        one.append(mine)
        nxt.append((owner == k + 1).double() * (1 - r[k + 1]) if k + 1 < n else torch.zeros(length, dtype=torch.float64))
    return fold, own, one, nxt


def spatial_tiles(size: tuple[int, int], ratio: int, tile: int, min_overlap: int, decode: bool,
                  composition: str) -> tuple[tuple[Tile, ...], tuple[int, int]]:
    """The tiles of a frame of ``size`` (H, W) pixels, ``ratio`` pixels per latent pixel, laid out in
    pixels by ``cover`` (0: one untiled pass). Decode blends pixels; encode blends latents (the spans
    and overlaps divided by ``ratio``). The two compositions the references use:

    - ``blend``: each tile is blended into what is already there, rows then columns (ComfyUI core
      0.38.1+): ``out = (1 - r_k) * out + r_k * tile_k``. Unrolled, tile k weighs ``r_k * prod(1 - r_m,
      m > k)`` per axis: one separable term (a normalised overlap-add);
    - ``stitch``: each tile is blended with its raw neighbours above and to the left, then cut to the
      part it owns (up to the next tile's start): the original, diffusers, core before 0.38.1. A pixel
      owned by tile (i, j) is ``(1-u) T(i,j-1) + u [(1-v) T(i-1,j) + v T(i,j)]`` (u, v: that tile's
      column and row ramps): three separable terms per tile. The two differ where four tiles meet,
      and where an overlap reaches into the next one (three tiles over a pixel: stitch keeps two)."""
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition={composition!r}")
    axes = []
    for n in size:
        starts, sizes, overlaps = cover(n, tile, min_overlap, ratio) if tile else ([0], [n], [])
        px = [(a, a + z) for a, z in zip(starts, sizes)]
        lat = [(a // ratio, b // ratio) for a, b in px]
        src, dst = (lat, px) if decode else (px, lat)
        unit = 1 if decode else ratio            # the output's units per pixel
        vecs = _axis_vectors([a // unit for a in starts], [o // unit for o in overlaps], n // unit)
        axes.append((src, dst, vecs))
    (ys, yd, yv), (xs, xd, xv) = axes
    tiles = []
    for i in range(len(ys)):
        for j in range(len(xs)):
            (y0, y1), (x0, x1) = yd[i], xd[j]
            fy, oy, ey, ny = (v[i][y0:y1].float() for v in yv)
            fx, ox, ex, nx = (v[j][x0:x1].float() for v in xv)
            terms = ((fy, fx),) if composition == "blend" else ((oy, ox), (ey, nx), (ny, ox))
            tiles.append(Tile((ys[i], xs[j]), (yd[i], xd[j]), terms))
    return tuple(tiles), (len(ys), len(xs))


# ---- the engine ------------------------------------------------------------------------------------

def run(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, plan: Plan, out_device: torch.device,
        progress: Optional[Progress] = None) -> torch.Tensor:
    """Run every unit of ``plan`` (chunk-major, tiles row-major) through ``fn`` and add each output,
    weighted, into one float32 output on ``out_device``. ``progress(done, total)`` after each unit may
    raise to interrupt (the partial output is dropped). Across ranks each runs a contiguous block of
    the units and the outputs are summed."""
    b = x.shape[0]
    out = torch.zeros(b, plan.out_channels, plan.out_frames, *plan.out_size, device=out_device, dtype=torch.float32)
    units = [(c, t) for c in range(len(plan.chunks)) for t in range(len(plan.tiles))]
    comm = distributed.current()
    mine = [u for i, u in enumerate(units) if comm.owner(i, len(units)) == comm.rank]
    error = None
    try:
        _units(fn, x, plan, out, mine, progress)
    except BaseException as e:    # noqa: BLE001 - one rank's failure ends the call on every rank
        error = e
    comm.step(error, False)
    return comm.sum_(out)


def _units(fn, x: torch.Tensor, plan: Plan, out: torch.Tensor, units: Sequence[tuple[int, int]],
           progress: Optional[Progress]) -> None:
    maps: dict[int, torch.Tensor] = {}
    for done, (c, t) in enumerate(units, 1):
        chunk, tile = plan.chunks[c], plan.tiles[t]
        (y0, y1), (x0, x1) = tile.src
        frames = torch.tensor(chunk.src, device=x.device)
        y = fn(x[..., y0:y1, x0:x1].index_select(2, frames))
        (a0, a1), (b0, b1) = tile.dst
        expect = (x.shape[0], plan.out_channels, len(chunk.dst), a1 - a0, b1 - b0)
        if tuple(y.shape) != expect:
            raise RuntimeError(f"a unit of the model's own tiling gave {tuple(y.shape)}, expected {expect}")
        if t not in maps:
            maps[t] = tile.weight().to(out.device)
        for f0, f1, d0 in _runs(chunk.dst):
            w = torch.tensor(chunk.weight[f0:f1], dtype=torch.float32, device=out.device)
            dst = out[:, :, d0:d0 + f1 - f0, a0:a1, b0:b1]
            dst.addcmul_(y[:, :, f0:f1].to(out.device, torch.float32), w[:, None, None] * maps[t])
        del y
        if progress:
            progress(done, len(units))


def _runs(dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive kept output frames: (first, stop) in the unit's output and where
    the run starts in the output."""
    runs, f = [], 0
    while f < len(dst):
        if dst[f] < 0:
            f += 1
            continue
        g = f + 1
        while g < len(dst) and dst[g] == dst[g - 1] + 1:
            g += 1
        runs.append((f, g, dst[f]))
        f = g
    return runs


def unit_grid(plan: Plan) -> list[AxisPlan]:
    """The units as a grid (chunks, rows, columns), for the NaN guard's per-unit report."""
    return [AxisPlan(n, tuple((i, i + 1) for i in range(n))) for n in (len(plan.chunks), *plan.grid)]


# ---- the handle's hook: VAE.decode / VAE.encode of a family with ``own_tiling`` come here ------------

def decode(vae, z: torch.Tensor, options: dict, progress: Optional[Progress], out_device,
           budget: Optional[int] = None, **given) -> torch.Tensor:
    """``vae.decode`` for a family whose tiles are its definition: the latent (checked by the handle)
    through the plan; the options the definition reads (``own_tiling.options``) choose the plan, the
    others go to the model. Tile sizes in ``given`` are not used (said in the log); a ``budget`` is
    checked against one unit (``check_budget``)."""
    own, opts = vae.caps.own_tiling, vae.decode_options(options)
    chosen = {k: opts.pop(k) for k in list(opts) if k in own.options}
    plan = own.plan("decode", tuple(z.shape), **chosen)
    note_ignored(vae, **given)
    out_device = torch.device(out_device or "cpu")
    check_budget(vae, plan, "decode", tuple(z.shape), budget, out_device, **chosen)
    with torch.inference_mode(), guard.Guard(vae, "decode", vae.decode_fn(**opts)) as g:
        out = run(g.tiled(unit_grid(plan)), z, plan, out_device, progress)
        guard.require_finite(vae, out, "decode", z, opts, "samples")
        return out.clamp_(0.0, 1.0)


def encode(vae, x: torch.Tensor, progress: Optional[Progress], out_device, budget: Optional[int] = None,
           posterior: bool = False, pixel_range: tuple[float, float] = (0.0, 1.0), **given) -> torch.Tensor:
    """``vae.encode`` for a family whose tiles are its definition (the clip checked by the handle): the
    latent [B, C, ...] as the units give it (the handle packs it), or with ``posterior`` the mean and
    log-variance stacked in channels, blended alike (the references blend the encoder's moments)."""
    plan = vae.caps.own_tiling.plan("encode", tuple(x.shape))
    if posterior:
        plan = dataclasses.replace(plan, out_channels=2 * plan.out_channels)
    note_ignored(vae, **given)
    out_device = torch.device(out_device or "cpu")
    check_budget(vae, plan, "encode", tuple(x.shape), budget, out_device)
    with torch.inference_mode(), guard.Guard(vae, "encode", vae.encode_fn(posterior, pixel_range)) as g:
        z = run(g.tiled(unit_grid(plan)), x, plan, out_device, progress)
        guard.require_finite(vae, z, "encode", x, {}, "pixels")
        return z


def memory_needed(vae, shape: Sequence[int], op: str, device: Optional[torch.device] = None,
                  **options) -> Optional[int]:
    """Device bytes one unit of the model's own plan for an input of ``shape`` needs (the largest unit
    input, measured on the meta device and calibrated for ``device``, default the weights', as for every
    family: vae/engine/memory.py); None if it cannot be measured."""
    plan = vae.caps.own_tiling.plan(op, tuple(shape), **options)
    channels = vae.caps.latent_channels if op == "decode" else vae.caps.image_channels
    return memory.working_set(vae.model, op, plan.unit_input(shape[0], channels), vae.dtype,
                              device=device if device is not None else vae.device)


def check_budget(vae, plan: Plan, op: str, shape: Sequence[int], budget: Optional[int], out_device: torch.device,
                 **options) -> None:
    """The planner (vae/engine/budget.py) shrinks tiles and chunks to fit a budget; a definition's units cannot
    shrink. So a budget is checked against what the call holds on the compute device: one unit's
    working set (the planner's measurement), plus the output where it lives on that device too; a
    budget that is too small is refused naming the smallest that works, never silently exceeded."""
    if not budget:
        return
    need = memory_needed(vae, shape, op, **options)
    if need is None:
        log.warning("VAEKit: no memory estimate for %s's own units; the budget %s is not checked.",
                    vae.name, planner.gib(budget))
        return
    output = shape[0] * plan.out_channels * plan.out_frames * math.prod(plan.out_size) * 4
    total = need + (output if out_device.type == vae.device.type else 0)
    what = (f"{vae.name} runs its own {plan.units} units ({vae.caps.own_tiling.describe()}): one unit needs "
            f"about {planner.gib(need)} on {vae.device.type}, the output {planner.gib(output)} on {out_device.type}")
    if total > budget:
        raise InputError(f"{what}, which does not fit a memory budget of {planner.gib(budget)}; its tiles are part "
                         "of the model and cannot be made smaller.", input="budget",
                         fix=f"give a budget of at least {math.ceil(total / planner.GIB * 10) / 10:.1f} GB, or "
                             + ("decode a smaller latent (fewer latent pixels or frames)" if op == "decode" else
                                "encode smaller frames (fewer pixels)")
                             + " or keep the output off the device.")
    log.info("VAEKit %s: %s (budget %s).", op, what, planner.gib(budget))


def note_ignored(vae, **given) -> None:
    """Tile sizes given to a family whose tiles are its definition are not used; say so once per call."""
    given = {k: v for k, v in given.items() if v}
    if given:
        log.info("VAEKit: %s tiles as part of its definition (%s); %s not used.", vae.name,
                 vae.caps.own_tiling.describe(), ", ".join(f"{k}={v}" for k, v in given.items()))
