"""The memory planner: the largest tile and chunk whose working set fits a budget, found before the work.

Every candidate is measured, not guessed: the engine the call would take runs on the model's meta copy
(vae/engine/memory.py) over one unit of what it repeats: one tile (the most interior, with the widest halo)
through its first chunks for tiles that run one after the other; every tile for tiles that meet in
rounds (they are all alive together); one blended tile (of one chunk) for fast mode. The tracker gives
the compute device's peak and the maps kept on the offload device; the output's size is known.

A prediction is ``device`` (calibrated peak on the compute device), ``maps`` (offload device) and
``output`` (intermediate device). The budget is checked against what lands on the compute device: all
three on a CPU-only machine, the device part alone when maps and output live in host memory.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch

from . import distributed, exact, memory
from ..errors import InputError

GIB = 1 << 30
MIN_TILE = 4          # latent pixels: the smallest tile the planner tries, unless ...
MIN_TILE_PX = 64      # ... this many pixels (the nodes' widget minimum) is fewer: 2 of LTX-Video's latent pixels


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class Prediction:
    device: int              # bytes on the compute device, calibrated
    maps: int                # bytes of maps on the offload device (exact tile-major runs)
    output: int              # bytes of the output on the intermediate device
    live: int                # the uncalibrated peak the tracker measured


@dataclass(frozen=True)
class Plan:
    call: object                 # the handle's Call with the planned tile and chunk
    route: object
    prediction: Prediction
    budget: Optional[int]
    device: torch.device
    offload: torch.device
    out_device: torch.device

    def on_device(self) -> int:
        """What the budget is checked against: the compute device's share of the prediction."""
        return on_device(self.prediction, self.device, self.offload, self.out_device)

    def describe(self) -> str:
        c, r, p = self.call, self.route, self.prediction
        tiles = math.prod(len(x) for x in r.cores) if r.cores else math.prod(len(x.spans) for x in r.plans[-2:])
        size = "untiled" if tiles == 1 else f"{_tile_text(c.tile)} tiles ({tiles})"
        blended = "fast" if tiles > 1 or c.mode == "fast" else "exact"      # one tile: nothing is blended
        how = {"exact": "exact", "streamed": f"{blended}, streamed", "tiled": "fast" if tiles > 1 else "one pass"}[r.engine]
        parts = [how, size]
        if r.chunk:
            parts.append(f"{r.chunk} latent frame{'s' if r.chunk > 1 else ''} a chunk")
        where = f"{gib(self.on_device())} predicted on {self.device.type}"
        if self.budget:
            where += f" (budget {gib(self.budget)})"
        parts.append(where)
        if p.maps:
            parts.append(f"maps {gib(p.maps)} on {self.offload.type}")
        parts.append(f"output {gib(p.output)} on {self.out_device.type}")
        return ", ".join(parts)


def _tile_text(tile) -> str:
    if isinstance(tile, (tuple, list)):
        return f"{tile[1]}x{tile[0]} px"
    return f"{tile} px"


def on_device(p: Prediction, device: torch.device, offload: torch.device, out_device: torch.device) -> int:
    same = lambda d: torch.device(d).type == torch.device(device).type       # noqa: E731
    return p.device + (p.maps if same(offload) else 0) + (p.output if same(out_device) else 0)


def _output_bytes(handle, call) -> int:
    caps = handle.caps
    if call.decode:
        frames = handle.frames_for(call.grid[0]) if handle.is_video else 1
        px = math.prod(n * caps.spatial_ratio for n in call.grid[-2:])
        return call.shape[0] * caps.image_channels * frames * px * 4
    return call.shape[0] * caps.latent_channels * (2 if call.posterior else 1) * math.prod(call.grid) * 4


def _subgrid(cores, x: torch.Tensor, in_unit: int, most: int):
    """The first ``most`` tiles per axis, the input cut to them, and the area ratio of the whole."""
    sub = [spans[:most] for spans in cores]
    ends = [spans[-1][1] for spans in sub]
    full = [spans[-1][1] for spans in cores]
    x = x[(..., *(slice(0, e * in_unit) for e in ends))]
    return sub, x, math.prod(full) / math.prod(ends)


def predict(handle, call, device: torch.device, offload: torch.device) -> Prediction:
    """Run ``call``'s engine on the meta copy over one unit of work; see the module docstring."""
    with distributed.alone():
        return _predict(handle, call, torch.device(device), torch.device(offload))


def _predict(handle, call, device: torch.device, offload: torch.device) -> Prediction:
    route = handle.route(call)
    model = memory.meta_model(handle.model)
    fn = handle.decode_fn() if call.decode else handle.encode_fn(call.posterior)
    x = torch.empty(call.shape, device="meta")
    output = _output_bytes(handle, call)
    if route.engine == "exact":
        r = handle.caps.spatial_ratio
        units = (1, r) if call.decode else (r, 1)
        chunks = route.chunks
        if chunks:                  # the first chunks: the later ones repeat them with the same caches
            k = min(3, len(chunks[0]))
            chunks = (chunks[0][:k], chunks[1][:k])
        meta, parks = torch.device("meta"), offload.type != device.type
        fixed = handle._exact_body(call.decode, handle.model) is not None      # a compiled handle's tile shapes
        cores, scale = route.cores, 1.0
        if not exact.tile_major(fn, model, x, *units, chunks):
            # tiles meet in rounds, all alive together: measure up to 4x4 of them and scale by area,
            # unless paused tiles wait on the offload device (then one runs at a time)
            cores, x, scale = _subgrid(cores, x, units[0], 4)
            scale = 1.0 if parks else scale
        def call():
            memory.offloaded(x, count=False)      # the input waits where the caller has it; tiles are cut from it
            exact.run_exact(fn, model, x, cores, *units, meta, chunks=chunks, offload=meta, park_tiles=parks,
                            sample=True, fixed=fixed)
        m = memory.measure(call, model=model)
        maps = m.offload
        if chunks:                  # maps scale with the chunks; the tracker saw the first k
            done = chunks[0][-1][1] - chunks[0][0][0]
            total = route.chunks[0][-1][1] - route.chunks[0][0][0]
            maps = int(maps * total / max(done, 1))
        return Prediction(memory.working(m, device, scale), maps, output, int(m.device * scale))
    # fast: one tile (the largest) of one chunk, streamed where the model streams
    plans = route.plans
    px = 1 if call.decode else handle.caps.spatial_ratio
    unit = [max(b - a for a, b in p.spans) * px for p in plans[-2:]]
    lead = list(call.shape[:2])
    lengths = 1
    if handle.is_video:
        if route.chunk:         # the stream's first chunks as they run (an encode's first frame alone)
            lengths = tuple(b - a for a, b in route.chunks[0][:3])
            frames = max(lengths)
        else:
            span = max(b - a for a, b in plans[0].spans)
            frames = span if call.decode else 1 + handle.caps.temporal_ratio * (span - 1)
        unit.insert(0, frames)
    m = memory.unit_bytes(handle.model, "decode" if call.decode else "encode", (*lead, *unit), handle.dtype, lengths)
    return Prediction(memory.working(m, device), 0, output, m.device)


def _candidates(handle, call, max_tile) -> list:
    """Tiles to try, largest first (pixels): the fewest tiles along the longer side first."""
    r = handle.caps.spatial_ratio
    longest = max(call.grid[-2:])
    cap = max_tile if max_tile else longest * r
    least = min(MIN_TILE, -(-MIN_TILE_PX // r))
    sizes, seen = [], set()
    for k in range(1, longest + 1):
        t = -(-longest // k)
        if t < least and sizes:
            break
        px = min(cap, t * r)
        if px not in seen:
            seen.add(px)
            sizes.append(px)
    return sizes


def streams(handle, call) -> bool:
    """Whether ``call``'s direction runs chunk by chunk in time through the model's causal caches."""
    caps = handle.caps
    return handle.is_video and (caps.stream_decode if call.decode else caps.stream_encode)


def _chunks(handle, call) -> list:
    """Temporal tiles to try (pixel frames; None: the whole clip at once), largest first. A model that
    streams this direction: the call's chunk (or the model's own) and every smaller one down to one
    latent frame; with neither, the whole clip first. Others: the call's temporal tile alone (a clip
    that cannot stream is never cut in time by exact mode: ``cannot_stream`` says why)."""
    if not streams(handle, call):
        return [call.tile_frames]
    r = handle.caps.temporal_ratio
    first = handle.temporal_tile(call.tile_frames) or (handle.caps.stream_chunk * r or None)
    latent = max(1, first // r) if first else call.grid[0] - 1     # encode: frame 0, then chunks of the rest
    return ([] if first else [None]) + [n * r for n in range(latent, 0, -1)]


def cannot_stream(handle, call) -> str:
    """Why a video call's time axis is not streamed (from the capabilities), or ""."""
    if not handle.is_video or streams(handle, call):
        return ""
    caps, part = handle.caps, "decoder" if call.decode else "encoder"
    if caps.norm == "groupnorm_clip":
        why = "normalises over the whole clip (GroupNorm statistics over all frames and pixels)"
    elif not (caps.causal_decoder if call.decode else caps.causal_encoder):
        why = "is not causal in time (a latent frame depends on later frames)"
    else:
        why = "does not declare streaming in time"
    return f"{handle.name}'s {part} {why}, so exact mode runs the whole clip in every tile"


def _first_fit(n: int, make) -> tuple[Optional[Plan], Optional[Plan]]:
    """Bisect candidates 0..n-1 (largest first; predictions shrink along them) for the first whose plan
    ``make(i)`` fits: (that plan or None, the smallest plan seen that did not fit). ``make`` returns None
    for a candidate the input checks refuse (too many or too small tiles): a larger one is tried."""
    lo, hi, fits, best = 0, n - 1, None, None
    while lo <= hi:
        mid = (lo + hi) // 2
        p = make(mid)
        if p is None:
            hi = mid - 1
        elif p.on_device() <= p.budget:
            fits, hi = p, mid - 1
        else:
            if best is None or p.on_device() < best.on_device():
                best = p
            lo = mid + 1
    return fits, best


def plan(handle, call, budget: int, device: torch.device, out_device: torch.device,
         offload: torch.device) -> Plan:
    """The largest tile (at most the call's), then the largest chunk at that tile, whose prediction
    fits ``budget`` bytes on the compute device; an InputError naming the smallest budget that works
    if none does. Tiles first: a smaller tile recomputes its halo, while a shorter chunk of a model
    that streams costs nothing but its caches (so an encode of a long clip shrinks its chunk first)."""
    sizes, frames = _candidates(handle, call, call.tile), _chunks(handle, call)

    def make(tile, chunk) -> Optional[Plan]:
        c = dataclasses.replace(call, tile=tile, tile_frames=chunk)
        try:
            return Plan(c, handle.route(c), predict(handle, c, device, offload), budget, device, offload, out_device)
        except InputError:          # tiles the input checks refuse (too many, too small)
            return None

    fits, best = _first_fit(len(sizes), lambda i: make(sizes[i], frames[-1]))
    if fits is not None and len(frames) > 1:      # the largest chunk at that tile
        tile = fits.call.tile
        longer, _ = _first_fit(len(frames) - 1, lambda i: make(tile, frames[i]))
        fits = longer or fits
    if fits is not None:
        return fits
    need = best.on_device() if best else 0
    op = "decode" if call.decode else "encode"
    why = cannot_stream(handle, call)
    smaller = ("decode a smaller latent (fewer latent pixels or frames)" if call.decode else
               "encode a shorter clip or smaller frames (fewer pixel frames or pixels)")
    raise InputError(f"no tile or chunk fits a memory budget of {gib(budget)} for this {op}: the smallest plan "
                     f"({best.describe() if best else 'none'}) needs about {gib(need)}"
                     + (f"; {why}." if why else "."), input="budget",
                     fix=f"give a budget of at least {math.ceil(need / GIB * 10) / 10:.1f} GB, or {smaller}.")
