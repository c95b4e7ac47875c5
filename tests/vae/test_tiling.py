"""The one tiling engine: the threshold at its boundary, plans, blending, and the handle's use."""
from __future__ import annotations

import functools
import itertools

import pytest
import torch
import torch.nn.functional as F

import vae
from helpers import diffusers_kl, diffusers_tiny
from vae.engine import tiling


def test_threshold_is_the_min_tile_size_not_the_stride():
    # tile 64 latent, overlap 16: the stride band (49..64) must not tile (diffusers' old bug)
    for length in range(1, 65):
        assert not tiling.needs_tiling(length, 64)
        assert not tiling.plan_axis(length, 64, 16).tiled
    assert tiling.needs_tiling(65, 64) and tiling.plan_axis(65, 64, 16).tiled
    assert not tiling.needs_tiling(10_000, 0)      # tile 0: never tile


@pytest.mark.parametrize("length,tile,overlap", list(itertools.product((9, 33, 64, 65, 100, 257), (8, 16, 32, 64), (0, 2, 4, 8, 40))))
def test_plan_covers_with_equal_tiles_and_enough_overlap(length, tile, overlap):
    plan = tiling.plan_axis(length, tile, overlap)
    spans = plan.spans
    if length <= tile:
        assert spans == ((0, length),)
        return
    sizes = {b - a for a, b in spans}
    assert len(sizes) == 1, "every tile has the same shape"
    size = sizes.pop()
    ov = min(overlap, tile // 2)
    assert size <= tile + ov
    assert spans[0][0] == 0 and spans[-1][1] == length
    for (a0, b0), (a1, b1) in zip(spans, spans[1:]):
        assert a0 < a1 and b1 > b0
        assert b0 - a1 >= ov, "neighbours share at least the overlap"
    assert len(spans) == -(-length // tile), "fewest tiles"


@pytest.mark.parametrize("scale", [1, 8])
def test_blend_weights_are_a_partition_of_unity(scale):
    plan = tiling.plan_axis(100, 32, 6)
    total = torch.zeros(100 * scale)
    for (a, b), w in zip(plan.spans, tiling.axis_weights(plan, scale)):
        assert w.min() > 0
        total[a * scale: b * scale] += w
    assert torch.allclose(total, torch.ones_like(total), atol=1e-6)


def test_pointwise_model_is_reproduced_exactly_by_tiles():
    """With a model without spatial mixing, tiled output must equal untiled output: placement,
    scaling and blending are then the only things under test."""
    fn = lambda t: F.interpolate(t, scale_factor=8, mode="nearest") * 2 + 1
    x = torch.randn(2, 3, 37, 50)
    plans = [tiling.plan_axis(37, 10, 3), tiling.plan_axis(50, 16, 4)]
    calls = []
    out = tiling.run_tiled(fn, x, plans, (1, 1), (8, 8), 3, progress=lambda d, t: calls.append((d, t)))
    assert torch.allclose(out, fn(x), atol=1e-6)
    assert calls == [(i, tiling.tile_count(plans)) for i in range(1, tiling.tile_count(plans) + 1)]


def test_interrupt_leaves_no_output():
    def stop(done, total):
        if done == 2:
            raise KeyboardInterrupt
    plans = [tiling.plan_axis(40, 16, 4)] * 2
    with pytest.raises(KeyboardInterrupt):
        tiling.run_tiled(lambda t: t, torch.randn(1, 1, 40, 40), plans, (1, 1), (1, 1), 1, progress=stop)


class Counting:
    def __init__(self, model):
        self.model, self.calls = model, 0
        self._decode, self._encode = model.decode, model.encode

    def __enter__(self):
        def dec(z):
            self.calls += 1
            return self._decode(z)

        def enc(x):
            self.calls += 1
            return self._encode(x)
        self.model.decode, self.model.encode = dec, enc
        return self

    def __exit__(self, *exc):
        del self.model.decode, self.model.encode


@functools.lru_cache(maxsize=1)
def _families():
    return {"kl": vae.from_state_dict(diffusers_kl(widths=(32, 32, 32, 32)).state_dict()),
            "tiny": vae.from_state_dict(diffusers_tiny().state_dict(), name_hint="taesd")}


@pytest.mark.parametrize("family", ["kl", "tiny"])
@pytest.mark.parametrize("axis", [0, 1])
def test_handle_threshold_at_min_and_min_plus_one(family, axis):
    v = _families()[family]
    tile_px, r = 64, v.caps.spatial_ratio
    edge = tile_px // r                                # 8 latent pixels
    for length, expect_tiled in ((edge, False), (edge + 1, True)):
        hw = [5, 5]
        hw[axis] = length
        z = torch.randn(1, v.caps.latent_channels, *hw)
        with Counting(v.model) as c:
            tiled = v.decode(z, tile=tile_px, overlap=16)
        untiled = v.decode(z)
        if expect_tiled:
            assert c.calls > 1
            print(f"{family} axis {axis} latent {length}: fast-mode max abs error vs untiled "
                  f"{(tiled - untiled).abs().max():.4f}")
        else:
            assert c.calls == 1 and torch.equal(tiled, untiled)
        x = torch.rand(1, 3, *(n * r for n in hw))
        with Counting(v.model) as c:
            enc_tiled = v.encode(x, tile=tile_px, overlap=16)
        assert (c.calls > 1) == expect_tiled
        if not expect_tiled:
            assert torch.equal(enc_tiled, v.encode(x))


@pytest.mark.parametrize("family", ["kl", "tiny"])
def test_fast_mode_error_is_reported_and_bounded(family):
    v = _families()[family]
    z = torch.randn(1, v.caps.latent_channels, 24, 24) * 0.5
    untiled = v.decode(z)
    for tile, overlap in ((128, 32), (64, 16)):
        err = (v.decode(z, tile=tile, overlap=overlap) - untiled).abs()
        print(f"{family} fast tiled {tile}/{overlap}: max abs {err.max():.4f}, mean {err.mean():.5f}")
        # per-tile GroupNorm statistics differ from the whole image's (exact mode fixes that); a
        # misplaced or mis-weighted tile would push the mean error far above this
        assert err.mean() < 0.15
