"""Neighbourhood attention over a (T, H, W) grid in plain PyTorch: NATTEN's ``na3d`` semantics
(non-causal, dilation 1), which LTX-2.5's diffusion decoder is defined with.

Along each axis a query at i attends the ``k`` positions starting at ``clamp(i - k // 2, 0, n - k)``:
a window centred on it, shifted inward at the grid's borders so that it always holds exactly ``k``
positions. A kernel longer than its axis shrinks to the axis (the window is then the whole axis).
The window of a 3-D query is the product of its three axis windows.

Memory and speed: queries run in blocks of a few positions per axis. The keys a block needs are the
union of its queries' windows (``b + k - 1`` positions per axis: more keys than a window, scored and
masked out), so no score matrix ever spans the clip. Each block row (T, H) copies its queries, keys and
values once with the columns (W) outermost: a block's keys are then one stretch of the copy, and the
evenly spaced blocks along W of one geometry go into one call as an overlapping strided view (no copy
per block), as many at a time as ``BUDGET`` allows, with one additive mask per geometry (cached). The
block shape (``block_shape``) weighs the keys scored, the copies and the calls' size: on a 2-core CPU,
stage 5 of LTX-2.5 at 17 x 64 x 64 took 5.5 s against 8.3-9.5 s with blocks of 8^3 copied one by one.
"""
from __future__ import annotations

import itertools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

BUDGET = 1 << 25          # elements of one call's scores and outputs
SMALL = 96                # block_cost: queries a call at which a score costs twice
COPY = 100                # block_cost: scores that copying one key and its value (all heads) costs


def window_start(i: int, n: int, k: int) -> int:
    """First position of the window of query ``i`` on an axis of ``n`` with kernel ``k`` (<= n)."""
    return min(max(i - k // 2, 0), n - k)


@dataclass(frozen=True)
class _Block:
    q: int                         # first query
    nq: int                        # queries
    kv: int                        # first key of the union of their windows
    nk: int
    k: int                         # the window's length (the kernel, shrunk to the axis)
    starts: tuple[int, ...]        # each query's window start, relative to ``kv``


def _blocks(n: int, k: int, size: int) -> list[_Block]:
    """One axis in query blocks of ``size`` (the last may be shorter)."""
    out = []
    for a in range(0, n, size):
        nq = min(size, n - a)
        nk = min(n, nq + k - 1)
        lo = min(window_start(a, n, k), n - nk)       # holds every window of the block (they only move right)
        out.append(_Block(a, nq, lo, nk, k, tuple(window_start(i, n, k) - lo for i in range(a, a + nq))))
    return out


def block_shape(dims: Sequence[int], kernels: Sequence[int]) -> tuple[int, ...]:
    """Queries per block along each axis (T, H, W), the cheapest by ``block_cost`` among powers of two
    and whole axes."""
    options = [sorted({n, *(2 ** i for i in range(n.bit_length()) if 2 ** i < n)}) for n in dims]
    return min(itertools.product(*options), key=lambda b: (block_cost(b, dims, kernels), -math.prod(b)))


def block_cost(size: Sequence[int], dims: Sequence[int], kernels: Sequence[int]) -> float:
    """The time a block shape costs per query, in scored keys (measured on a 2-core CPU, stage 5's
    17 x 64 x 64 x 4 heads x 64: a score ~3.5 ns): the keys scored (the union of the block's windows,
    more for fewer queries a call: ``SMALL``), plus copying the keys and values of a block row (T, H)
    once (``COPY`` scores per key a query's share of them moves)."""
    keys = [min(n, b + k - 1) for b, k, n in zip(size, kernels, dims)]
    queries = math.prod(size)
    return math.prod(keys) * (1 + SMALL / queries) + COPY * keys[0] * keys[1] / (size[0] * size[1])


def _runs(blocks: list[_Block]) -> list[list[_Block]]:
    """Consecutive blocks of one geometry whose key ranges are evenly spaced (one strided view)."""
    runs: list[list[_Block]] = []
    for b in blocks:
        run = runs[-1] if runs else None
        if run and (b.nq, b.nk, b.starts) == (run[0].nq, run[0].nk, run[0].starts) and \
                b.q - run[-1].q == run[0].nq and b.kv - run[-1].kv == run[0].nq:
            run.append(b)
        else:
            runs.append([b])
    return runs


class _Masks:
    """Additive masks [nq, nk] of (T, H, W) block geometries: the sum of one 0 / -inf matrix per axis.
    Pure constants, shared by every call (the blocks of a stage repeat the same few geometries), the
    least recently used dropped past ``CACHE`` bytes."""

    CACHE = 64 << 20

    def __init__(self):
        self.made: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def __call__(self, axes: Sequence[_Block], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        key = (tuple((b.nk, b.k, b.starts) for b in axes), dtype, str(device))
        with self.lock:
            if key in self.made:
                self.made.move_to_end(key)
                return self.made[key]
        parts = []
        for i, b in enumerate(axes):
            s = torch.tensor(b.starts, device=device)[:, None]
            j = torch.arange(b.nk, device=device)
            m = torch.zeros(len(b.starts), b.nk, dtype=dtype, device=device)
            shape = [1] * 2 * len(axes)
            shape[i], shape[len(axes) + i] = m.shape
            parts.append(m.masked_fill_((j < s) | (j >= s + b.k), float("-inf")).view(shape))
        mask = sum(parts[1:], parts[0]).flatten(len(axes)).flatten(0, len(axes) - 1)
        with self.lock:
            self.made[key] = mask
            while sum(m.numel() * m.element_size() for m in self.made.values()) > self.CACHE and len(self.made) > 1:
                self.made.popitem(last=False)
        return mask


_MASKS = _Masks()


@torch.compiler.disable     # planning in Python, then batched calls: compiled graphs call it eagerly
def neighborhood_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: Sequence[int],
                           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention of each query to its (T, H, W) neighbourhood. ``q``, ``k``, ``v``: [B, T, H, W, heads,
    dim], the queries already scaled (scores are plain dot products). ``out`` (may be ``q`` itself: a
    block row's queries are copied before its output is written, and rows share no query) receives the
    result, else a new tensor."""
    batch, *dims, heads, dim = q.shape
    if out is None:
        out = torch.empty_like(v)
    kernels = [min(kk, n) for kk, n in zip(kernel, dims)]
    size = block_shape(dims, kernels)
    axes = [_blocks(n, kk, b) for n, kk, b in zip(dims, kernels, size)]
    w_runs = _runs(axes[2])
    largest = 0
    for tb in axes[0]:
        for hb in axes[1]:
            rows = (slice(tb.q, tb.q + tb.nq), slice(hb.q, hb.q + hb.nq))
            keys = (slice(tb.kv, tb.kv + tb.nk), slice(hb.kv, hb.kv + hb.nk))
            nq, nk = tb.nq * hb.nq, tb.nk * hb.nk                   # per column of W
            # the row's queries, keys and values once, columns outermost: a block's keys (its columns'
            # windows) are then one stretch of the row, and evenly spaced blocks one strided view
            region = 2 * batch * heads * dims[2] * (nq + nk) * dim
            if q.device.type == "meta":
                for run in w_runs:
                    per = batch * heads * (run[0].nq * nq * run[0].nk * nk + run[0].nq * nq * dim)
                    largest = max(largest, region + per * min(len(run), max(1, BUDGET // per)))
                continue
            qr, kr, vr = (_columns(x[:, r[0], r[1]]) for x, r in ((q, rows), (k, keys), (v, keys)))
            o = out[:, rows[0], rows[1]]              # [B, t, h, W, heads, dim]: written block by block
            for run in w_runs:
                mask = _MASKS((run[0], tb, hb), q.dtype, q.device)
                per = batch * heads * (run[0].nq * nq * run[0].nk * nk + run[0].nq * nq * dim)   # scores, out
                step = max(1, BUDGET // per)
                for g0 in range(0, len(run), step):
                    _attend(qr, kr, vr, o, run[g0:g0 + step], nq, nk, mask)
            del qr, kr, vr, o
    if q.device.type == "meta":       # shapes only: the largest call's temporaries, for the memory tracker
        torch.empty(largest, dtype=q.dtype, device="meta")
    return out


def _columns(x: torch.Tensor) -> torch.Tensor:
    """[B, t, h, W, heads, dim] -> [B, W * t * h, heads, dim]: columns outermost, one copy."""
    b, t, h, w, heads, dim = x.shape
    return x.permute(0, 3, 1, 2, 4, 5).reshape(b, w * t * h, heads, dim)


def _attend(qr, kr, vr, o, run: list[_Block], nq: int, nk: int, mask: torch.Tensor) -> None:
    """Blocks ``run`` (evenly spaced along W, one geometry) of one (T, H) block row, in one call per batch
    item: the queries' and the keys' columns are strided views of the row (``_columns``), the keys of
    neighbouring blocks overlapping. The outputs go straight to the row's place ``o`` [B, t, h, W, heads,
    dim] (a strided view of the result)."""
    g, bw, lw = len(run), run[0].nq, run[0].nk
    w0, r0 = run[0].q, run[0].kv
    _, t, h, _, heads, dim = o.shape
    for i in range(qr.shape[0]):
        def view(x, first, width, per):     # blocks of ``width`` columns every ``bw`` from ``first``
            return x[i].as_strided((g, heads, width * per, dim), (bw * per * heads * dim, dim, heads * dim, 1),
                                   x[i].storage_offset() + first * per * heads * dim)
        y = F.scaled_dot_product_attention(view(qr, w0, bw, nq), view(kr, r0, lw, nk), view(vr, r0, lw, nk),
                                           attn_mask=mask, scale=1.0)
        dst = o[i, :, :, w0:w0 + g * bw].unflatten(2, (g, bw)).permute(2, 4, 3, 0, 1, 5)    # [g, heads, bw, t, h, dim]
        dst.copy_(y.view(g, heads, bw, t, h, dim))
