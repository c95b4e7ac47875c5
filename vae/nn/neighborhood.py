"""Neighbourhood attention over a (T, H, W) grid in plain PyTorch: NATTEN's ``na3d`` semantics
(non-causal, dilation 1), which LTX-2.5's diffusion decoder is defined with.

Along each axis a query at i attends the ``k`` positions starting at ``clamp(i - k // 2, 0, n - k)``:
a window centred on it, shifted inward at the grid's borders so that it always holds exactly ``k``
positions. A kernel longer than its axis shrinks to the axis (the window is then the whole axis).
The window of a 3-D query is the product of its three axis windows.

Memory and speed: queries run in blocks of a few positions per axis. The keys a block needs are the
union of its queries' windows (``b + k - 1`` positions per axis: more keys than a window, scored and
masked out), so no score matrix ever spans the clip. Away from the borders every block has the same
window geometry, hence one additive mask for all of them, and consecutive blocks along W read their
keys as one strided view (``unfold``): each batched call copies its queries once and its keys and
values once, as many blocks at a time as ``BUDGET`` allows. Blocks at the borders have masks of their
own (cached per geometry).
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

BUDGET = 1 << 25          # elements of one call's scores plus its copied keys and values
QUERIES = 512             # queries per block the shape search aims for


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


def block_shape(dims: Sequence[int], kernels: Sequence[int], queries: int = QUERIES) -> tuple[int, ...]:
    """Queries per block along each axis: doubled one axis at a time where that adds the fewest keys
    scored per query ((2b + k - 1) / (b + k - 1)), until a block holds ``queries``."""
    size = [1] * len(dims)
    while math.prod(size) < queries:
        grow = [(2 * b + k - 1) / (b + k - 1) if b < n else math.inf for b, k, n in zip(size, kernels, dims)]
        axis = min(range(len(dims)), key=grow.__getitem__)
        if grow[axis] == math.inf:
            break
        size[axis] = min(2 * size[axis], dims[axis])
    return tuple(size)


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
    block's queries are copied before its output is written, and blocks share no query) receives the
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
            qs, o = q[:, rows[0], rows[1]], out[:, rows[0], rows[1]]
            ks, vs = k[:, keys[0], keys[1]], v[:, keys[0], keys[1]]
            for run in w_runs:
                nq, nk = tb.nq * hb.nq * run[0].nq, tb.nk * hb.nk * run[0].nk
                per = batch * heads * (nq * nk + 2 * nk * dim + 2 * nq * dim)   # scores, keys, values, q, out
                step = max(1, BUDGET // per)
                largest = max(largest, per * min(step, len(run)))
                if q.device.type == "meta":
                    continue
                mask = _MASKS((tb, hb, run[0]), q.dtype, q.device)
                for g0 in range(0, len(run), step):
                    _attend(qs, ks, vs, o, run[g0:g0 + step], mask)
    if q.device.type == "meta":       # shapes only: the largest call's temporaries, for the memory tracker
        torch.empty(largest, dtype=q.dtype, device="meta")
    return out


def _attend(qs, ks, vs, o, run: list[_Block], mask: torch.Tensor) -> None:
    """Blocks ``run`` (evenly spaced along W, one geometry) of one (T, H) block row, in one call."""
    batch, bt, bh, _, heads, dim = qs.shape
    g, bw, lw = len(run), run[0].nq, run[0].nk
    w0, r0 = run[0].q, run[0].kv
    queries = qs[:, :, :, w0:w0 + g * bw].unflatten(3, (g, bw))               # [B, t, h, g, w, heads, dim]
    q_b = queries.permute(0, 3, 5, 1, 2, 4, 6).reshape(batch * g, heads, -1, dim)

    def keys(x):            # evenly spaced windows along W as one view, then one copy
        x = x[:, :, :, r0:r0 + (g - 1) * bw + lw].unfold(3, lw, bw)           # [B, t, h, g, heads, dim, w]
        return x.permute(0, 3, 4, 1, 2, 6, 5).reshape(batch * g, heads, -1, dim)
    y = F.scaled_dot_product_attention(q_b, keys(ks), keys(vs), attn_mask=mask, scale=1.0)
    y = y.view(batch, g, heads, bt, bh, bw, dim).permute(0, 3, 4, 1, 5, 2, 6)
    o[:, :, :, w0:w0 + g * bw].unflatten(3, (g, bw)).copy_(y)
