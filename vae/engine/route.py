"""How one encode or decode runs: the call as asked (``Call``), the engine and plans it takes (``route``:
exact tiles, a streamed time axis, or the tiling engine) and the one dispatch to that engine (``run``).

The functions take the handle (vae/handle.py) for what its family declares (``caps``) and for the hooks
a subclass may change: ``_plans`` (a compiled handle's fixed tile shapes), ``_exact_body`` (its
compiled exact pieces), ``frames_for``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from . import exact, guard, streaming, tiling

Tile = Union[int, tuple[int, int], None]


@dataclass(frozen=True)
class Call:
    """One encode or decode as asked: its direction, input shape, latent grid (per tiled axis: time
    for video, then H, W) and tiling inputs (pixels, pixel frames)."""
    decode: bool
    shape: tuple[int, ...]
    grid: tuple[int, ...]
    tile: Tile = None
    overlap: Optional[int] = None
    tile_frames: Optional[int] = None
    overlap_frames: Optional[int] = None
    mode: str = "fast"
    posterior: bool = False        # an encode of the posterior: its output has twice the latent channels


@dataclass(frozen=True)
class Route:
    """How a call runs: the engine ("exact", "streamed" or "tiled"), its per-axis plans, the stream
    chunk (latent frames; 0: none) and chunk spans (input, output), exact mode's tile cores."""
    call: Call
    plans: list
    chunk: int
    chunks: Optional[tuple[list, list]]
    cores: Optional[list]
    engine: str


def _is_video(caps) -> bool:
    return caps.temporal_ratio is not None


def call_for(caps, op: str, shape: tuple[int, ...], tile: Tile = None, overlap: Optional[int] = None,
             tile_frames: Optional[int] = None, overlap_frames: Optional[int] = None, mode: str = "fast") -> Call:
    """The ``Call`` a decode of a latent (encode of pixels) of ``shape`` makes, for a model of ``caps``."""
    r, video = caps.spatial_ratio, _is_video(caps)
    shape = tuple(shape)
    if caps.frames_in_batch and len(shape) == 4:          # one clip's frames in the batch
        shape = (1, shape[1], shape[0], *shape[2:])
    if op == "decode":
        if not video and len(shape) == 5 and shape[2] == 1:     # an image LATENT's frame axis
            shape = shape[:2] + shape[3:]
        if caps.latent_pack > 1 and shape[1] == caps.latent_channels_packed:      # LATENTs packed 2x2
            p = caps.latent_pack
            shape = (shape[0], caps.latent_channels, *shape[2:-2], shape[-2] * p, shape[-1] * p)
        grid = tuple(shape[2:]) if video else tuple(shape[-2:])
    else:
        grid = tuple(n // r for n in shape[-2:])
        if video:
            grid = ((shape[2] - 1) // caps.temporal_ratio + 1,) + grid
    return Call(op == "decode", shape, grid, tile, overlap, tile_frames, overlap_frames, mode)


def plans(caps, grid: tuple[int, ...], tile: Tile, overlap: Optional[int], tile_frames: Optional[int],
          overlap_frames: Optional[int]) -> list[tiling.AxisPlan]:
    """The tiling engine's plan per axis of ``grid`` (time first for video)."""
    axes = tiling.plan_grid(grid[-2:], tile, overlap, caps.spatial_ratio)
    if _is_video(caps):
        axes.insert(0, tiling.plan_frames(grid[0], tile_frames, overlap_frames, caps.temporal_ratio))
    return axes


def scales(caps) -> tuple[tuple, tuple]:
    """(latent units, pixel units) per tiled axis."""
    r = caps.spatial_ratio
    if _is_video(caps):
        return (1, 1, 1), (tiling.Frames(caps.temporal_ratio), r, r)
    return (1, 1), (r, r)


def exact_cores(caps, grid: tuple[int, ...], tile: Tile) -> Optional[list]:
    """Exact mode's tile cores per spatial axis (latent units), or None when one tile covers it.
    Time is never cut in exact mode: a model that streams runs each tile chunk by chunk through
    its caches; any other runs the whole clip per tile."""
    tiles = tile if isinstance(tile, (tuple, list)) else (tile, tile)
    r = caps.spatial_ratio
    cores = [tiling.core_spans(n, max(1, t // r) if t else 0) for n, t in zip(grid, tiles)]
    return cores if any(len(c) > 1 for c in cores) else None


def stream_chunk(caps, latent_frames: int, tile_frames: Optional[int], declared: bool) -> int:
    """Latent frames per chunk when the time axis is streamed (exact), else 0 (one pass, or
    overlapping temporal tiles for models that cannot stream). ``tile_frames`` (pixel frames)
    gives the chunk; without it, the model's own ``stream_chunk`` (the reference's chunking, e.g.
    Wan's one latent frame), or one pass. A model whose batches are its definition (``stream_batches``)
    always runs those."""
    if not (_is_video(caps) and declared):
        return 0
    if caps.stream_batches:
        return caps.stream_chunk
    chunk = max(1, tile_frames // caps.temporal_ratio) if tile_frames else caps.stream_chunk
    return chunk if tiling.needs_tiling(latent_frames, chunk) else 0


def route(handle, call: Call) -> Route:
    """How ``call`` runs on ``handle``: exact tiles (streamed in time where the model streams), a streamed
    time axis (spatial tiles blended), or the tiling engine (one tile when nothing needs tiling)."""
    caps, grid = handle.caps, call.grid
    axes = handle._plans(grid, call.tile, call.overlap, call.tile_frames, call.overlap_frames)
    chunk = stream_chunk(caps, grid[0], call.tile_frames, caps.stream_decode if call.decode else caps.stream_encode)
    chunks = None
    if chunk and call.decode:
        chunks = streaming.decode_chunks(grid[0], chunk, caps.temporal_ratio, lead=caps.stream_batches,
                                         frames=handle.frames_for(grid[0]))
    elif chunk:
        chunks = streaming.encode_chunks(grid[0], chunk, caps.temporal_ratio)
    cores = exact_cores(caps, grid[-2:], call.tile) if call.mode == "exact" else None
    engine = "exact" if cores else "streamed" if chunk else "tiled"
    return Route(call, axes, chunk, chunks, cores, engine)


def run(handle, g: guard.Guard, x: torch.Tensor, call: Call, progress: Optional[tiling.Progress],
        out_device, offload=None) -> torch.Tensor:
    """The one dispatch of both directions (see ``route``), through the NaN guard ``g``."""
    caps, r = handle.caps, handle.caps.spatial_ratio
    out_device = torch.device(out_device or "cpu")
    chosen = handle.route(call)
    latent_units, pixel_units = scales(caps)
    ins_u, outs_u = (latent_units, pixel_units) if call.decode else (pixel_units, latent_units)
    channels = caps.image_channels if call.decode else caps.latent_channels * (2 if call.posterior else 1)
    axes, chunks = chosen.plans, chosen.chunks
    if chosen.engine == "exact":
        units = (1, r) if call.decode else (r, 1)
        return g.whole(lambda f, m: exact.run_exact(f, m, x, chosen.cores, *units, out_device, chunks=chunks,
                                                    progress=progress, offload=offload and torch.device(offload),
                                                    body=handle._exact_body(call.decode, m)))
    if chosen.engine == "streamed":
        ins, outs = chunks
        frames = handle.frames_for(call.grid[0]) if call.decode else call.grid[0]
        return streaming.run_streamed(g.streamed(axes[1:], len(ins)), handle.model, x, ins, outs, axes[1:],
                                      ins_u[1:], outs_u[1:], channels, frames, out_device, progress)
    return tiling.run_tiled(g.tiled(axes), x, axes, ins_u, outs_u, channels, out_device, progress=progress)
