"""Neighbourhood attention (vae/nn/neighborhood.py) against a brute-force reading of NATTEN's rule (each
query's window gathered by index): windows shifted inward at every border, kernels longer than an axis
shrunk to it, batches, heads, the output written over the queries, any batching budget, bf16."""
from __future__ import annotations

import pytest
import torch

from ltx_diffusion_common import brute_na
from vae.nn import neighborhood
from vae.nn.neighborhood import block_cost, block_shape, neighborhood_attention


def _qkv(shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("shape,kernel", [
    ((1, 3, 7, 9, 2, 8), (3, 7, 7)),        # kernel = axis (T, H)
    ((2, 1, 5, 6, 1, 8), (3, 7, 7)),        # one frame, every kernel longer than its axis
    ((1, 5, 13, 17, 3, 4), (3, 5, 5)),
    ((1, 12, 14, 23, 1, 8), (11, 11, 11)),  # W: several blocks, evenly spaced interior ones batched
    ((1, 2, 3, 30, 2, 8), (3, 7, 7)),
])
def test_matches_brute_force(shape, kernel):
    q, k, v = _qkv(shape)
    assert (neighborhood_attention(q, k, v, kernel) - brute_na(q, k, v, kernel)).abs().max() <= 1e-5


def test_output_over_the_queries_and_any_budget(monkeypatch):
    q, k, v = _qkv((1, 6, 11, 19, 2, 8), seed=1)
    want = brute_na(q, k, v, (3, 5, 5))
    into = q.clone()
    neighborhood_attention(into, k, v, (3, 5, 5), out=into)
    assert (into - want).abs().max() <= 1e-5
    monkeypatch.setattr(neighborhood, "BUDGET", 1)          # one block per call
    assert (neighborhood_attention(q, k, v, (3, 5, 5)) - want).abs().max() <= 1e-5


def test_bf16_and_meta():
    q, k, v = _qkv((1, 3, 9, 10, 2, 16), seed=2)
    want = brute_na(q, k, v, (3, 7, 7))
    got = neighborhood_attention(*(t.bfloat16() for t in (q, k, v)), (3, 7, 7))
    assert got.dtype == torch.bfloat16 and (got.float() - want).abs().max() <= 0.05
    meta = neighborhood_attention(*(t.to("meta") for t in (q, k, v)), (3, 7, 7))
    assert meta.shape == q.shape and meta.device.type == "meta"


def test_block_shape_is_the_cheapest_by_its_cost():
    """Keys scored per query (the union of a block's windows) against copying a block row's keys once
    and the cost of small calls: short clips take the whole time axis in a block, long ones do not."""
    dims, kernels = (17, 56, 56), (11, 11, 11)
    best = block_cost(block_shape(dims, kernels), dims, kernels)
    assert best <= min(block_cost(s, dims, kernels) for s in [(8, 8, 8), (4, 4, 4), (17, 8, 8), (1, 56, 56)])
    assert block_shape((1, 5, 6), (1, 5, 6)) == (1, 5, 6)          # the whole grid: one block
    assert block_shape((17, 96, 128), kernels)[0] == 17
    assert block_shape((121, 88, 160), kernels)[0] < 121
