"""Frame-wise encode/decode: a clip runs chunk by chunk along time through the model's own causal
caches (``vae/nn/causal.py``: every causal conv keeps the frames its next window needs, up-samplers
keep their first-chunk rule), so the result equals one pass while the working set stays that of one
chunk. Finished frames go straight into one preallocated output on the intermediate device.

Which models can: those whose spec declares ``Capabilities.stream_decode`` / ``stream_encode``
(causal in time, with statistics per frame or per voxel). The handle sends a time axis here when it
needs tiling and the model declares it; others (whole-clip GroupNorm, non-causal decoders) get
overlapping temporal tiles from the tiling engine instead. Spatial tiles compose with streaming:
each spatial tile streams the whole clip, and its frames are blended into the output with the
tiling engine's ramps.
"""
from __future__ import annotations

import functools
import itertools
from typing import Callable, Optional, Sequence

import torch

from . import tiling
from .transfer import Transfers
from .. import run

Fn = Callable[[torch.Tensor], torch.Tensor]


def chunk_spans(length: int, first: int, size: int) -> list[tuple[int, int]]:
    """[start, end) chunks along time: the first of ``first`` elements, then ``size`` each."""
    spans, a = [], 0
    while a < length:
        b = min(length, a + (first if a == 0 else size))
        spans.append((a, b))
        a = b
    return spans


def run_streamed(fn: Fn, model: torch.nn.Module, x: torch.Tensor, in_chunks: Sequence[tuple[int, int]],
                 out_chunks: Sequence[tuple[int, int]], spatial: Sequence[tiling.AxisPlan],
                 in_scale: Sequence[int], out_scale: Sequence[int], out_channels: int, out_frames: int,
                 out_device: torch.device, progress: Optional[tiling.Progress] = None) -> torch.Tensor:
    """Stream ``fn`` over time chunks of ``x`` [B, C, T, H, W] (``in_chunks``), writing chunk i's frames
    at ``out_chunks[i]`` of a preallocated output, for each spatial tile of ``spatial`` (blended).

    Each spatial tile's stream keeps its caches in a memory of its own (``vae.run.stream``), held by
    this call only and dropped when the tile's stream ends, also on an interrupt (``progress``
    raising); the partial output is dropped with the exception. Its last chunk is marked
    (``run.FINAL``): the caches go as they are read. A chunk's frames are copied out
    (asynchronously from a GPU, vae/engine/transfer.py) while the next chunk runs."""
    b = x.shape[0]
    out = torch.zeros(b, out_channels, out_frames, *(p.length * s for p, s in zip(spatial, out_scale)),
                      device=out_device, dtype=torch.float32)
    weights = [tiling.axis_weights(p, s) for p, s in zip(spatial, out_scale)]
    tiles = list(itertools.product(*(range(len(p.spans)) for p in spatial)))
    total, done = len(tiles) * len(in_chunks), 0
    transfers = Transfers()
    for idx in tiles:
        spans = [p.spans[i] for p, i in zip(spatial, idx)]
        src_hw = tuple(slice(a * s, b_ * s) for (a, b_), s in zip(spans, in_scale))
        dst_hw = tuple(slice(a * s, b_ * s) for (a, b_), s in zip(spans, out_scale))
        w = weights[0][idx[0]].reshape(-1, 1) * weights[1][idx[1]].reshape(1, -1)
        memory: dict = {}
        with run.stream(memory):
            for i, ((a, b_), (oa, ob)) in enumerate(zip(in_chunks, out_chunks)):
                if i == len(in_chunks) - 1:
                    memory[run.FINAL] = True
                y = fn(x[(slice(None), slice(None), slice(a, b_)) + src_hw])
                if y.shape[2] != ob - oa:
                    raise RuntimeError(f"a chunk gave {y.shape[2]} frames, expected {ob - oa}")
                dst = out[(slice(None), slice(None), slice(oa, ob)) + dst_hw]
                transfers.to_host(y, out_device, functools.partial(tiling._add, dst, w.to(out_device)))
                del y
                done += 1
                if progress:
                    progress(done, total)
    transfers.wait()
    return out


def decode_chunks(latent_frames: int, chunk: int, r: int, lead: bool = False,
                  frames: Optional[int] = None) -> tuple[list, list]:
    """Latent chunks of ``chunk`` frames (with ``lead`` the first also takes the t % chunk left over: a
    model whose batches are its definition) and the pixel frames each decodes to: ``frames`` in all
    (default 1 + r(t-1)), r per latent frame after the first chunk, which gives the rest."""
    ins = chunk_spans(latent_frames, chunk + (latent_frames % chunk if lead else 0), chunk)
    total = 1 + r * (latent_frames - 1) if frames is None else frames
    outs = [(0 if a == 0 else total - r * (latent_frames - a), total - r * (latent_frames - b)) for a, b in ins]
    return ins, outs


def encode_chunks(latent_frames: int, chunk: int, r: int) -> tuple[list, list]:
    """Pixel chunks (the first frame alone, then ``chunk`` latent frames' worth: r*chunk frames) and
    the latent frames each encodes to."""
    outs = chunk_spans(latent_frames, 1, chunk)
    ins = [(0 if a == 0 else 1 + r * (a - 1), 1 + r * (b - 1)) for a, b in outs]
    return ins, outs
