"""Video through the one tiling engine: the causal time axis (frame formula, first frame of later
tiles dropped), thresholds per axis at the min tile size, and encode/decode clip rules."""
from __future__ import annotations

import itertools

import pytest
import torch

import vae
from helpers import pointwise_video_vae
from vae.engine import tiling


@pytest.mark.parametrize("t,tile,overlap", list(itertools.product((2, 3, 5, 8, 13), (2, 3, 4), (1, 2))))
def test_causal_time_plan_covers_every_frame_once_in_weight(t, tile, overlap):
    plan = tiling.plan_axis(t, tile, overlap, causal=True)
    r = 4
    total = torch.zeros(1 + r * (t - 1))
    for (a, b), w in zip(tiling.out_spans(plan, tiling.Frames(r)), tiling.axis_weights(plan, tiling.Frames(r))):
        assert len(w) == b - a and w.min() > 0
        total[a:b] += w
    assert torch.allclose(total, torch.ones_like(total), atol=1e-6)
    for (a0, b0), (a1, b1) in zip(plan.spans, plan.spans[1:]):
        assert b0 - a1 >= 1, "causal tiles share at least one latent frame (the later tile's context)"


def test_a_later_tile_reproduces_frame_r_times_its_start():
    # tile [a, b) of latents decodes frames [r*a, r*(b-1)+1); its first frame (rebuilt from one
    # latent alone) is dropped, not its last (diffusers' LTX temporal tiling drops the last: off by one)
    plan = tiling.plan_axis(10, 4, 2, causal=True)
    spans = tiling.out_spans(plan, tiling.Frames(6))
    assert spans[0][0] == 0
    for (a, b), (lo, hi) in zip(plan.spans[1:], spans[1:]):
        assert (lo, hi) == (6 * a + 1, 6 * (b - 1) + 1)


@pytest.mark.parametrize("memory", [0, 1])
@pytest.mark.parametrize("tile_frames,overlap_frames,tile_px", [(8, 4, None), (12, 4, 64), (16, 8, 48), (8, 8, 32)])
def test_tiled_video_decode_equals_untiled_frame_for_frame(memory, tile_frames, overlap_frames, tile_px):
    """A stand-in decoder without spatial mixing: with memory 0 (identity-like) and with one latent
    of causal memory, tiles in time and space must reproduce the untiled decode exactly."""
    v = pointwise_video_vae(memory=memory)
    z = torch.randn(2, 4, 9, 10, 7)
    full = v.decode(z)
    assert full.shape == (2, 3, 33, 80, 56)
    calls = []
    tiled = v.decode(z, tile=tile_px, overlap=16, tile_frames=tile_frames, overlap_frames=overlap_frames,
                     progress=lambda d, n: calls.append(n))
    assert calls[-1] > 1
    assert (tiled - full).abs().max() <= 1e-6


@pytest.mark.parametrize("tile_frames,overlap_frames", [(8, 4), (12, 8), (16, 4)])
def test_tiled_video_encode_equals_untiled(tile_frames, overlap_frames):
    v = pointwise_video_vae()
    x = torch.rand(1, 3, 33, 48, 40)
    full = v.encode(x)
    assert full.shape == (1, 4, 9, 6, 5)
    tiled = v.encode(x, tile=24, overlap=8, tile_frames=tile_frames, overlap_frames=overlap_frames)
    assert (tiled - full).abs().max() <= 1e-6


def test_threshold_per_axis_is_the_min_tile_size():
    """At min // ratio latent size the decode is one pass; one more and it is tiled (each axis)."""
    v = pointwise_video_vae(r=4, s=8)
    count = lambda z, **kw: _tiles(v, z, **kw)
    # time: 16 frames per tile -> 4 latent frames
    assert count(torch.randn(1, 4, 4, 3, 3), tile_frames=16) == 1
    assert count(torch.randn(1, 4, 5, 3, 3), tile_frames=16) > 1
    # height and width: 64 px -> 8 latents
    assert count(torch.randn(1, 4, 2, 8, 8), tile=64) == 1
    assert count(torch.randn(1, 4, 2, 9, 8), tile=64) > 1
    assert count(torch.randn(1, 4, 2, 8, 9), tile=64) > 1


def _tiles(v, z, **kw):
    calls = []
    v.decode(z, overlap=16, overlap_frames=4, progress=lambda d, n: calls.append(n), **kw)
    return calls[-1]


def test_video_vae_refuses_image_latents_and_keeps_cores_frame_rule(caplog):
    v = pointwise_video_vae()
    with pytest.raises(vae.InputError, match=r"video VAE.*\[B, C, frames, h, w\]"):
        v.decode(torch.randn(1, 4, 8, 8))
    x = torch.rand(1, 3, 12, 16, 16)
    with caplog.at_level("WARNING", logger="VAEKit"):
        z = v.encode(x)                                     # as core: the first 1 + 4k frames, said in the log
    assert z.shape[2] == 3 and torch.equal(z, v.encode(x[:, :, :9]))
    assert "the clip has 12 frames" in caplog.text and "9 or 13 frames fit" in caplog.text
    with pytest.raises(vae.InputError, match="5 channels"):
        v.decode(torch.randn(1, 5, 2, 4, 4))
