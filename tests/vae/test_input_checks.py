"""Degenerate inputs at the library's door (VAE.decode / VAE.encode): one InputError naming the
input, with a fix that fits the numbers given; uint8 images converted, slight overshoot clamped."""
from __future__ import annotations

import logging

import pytest
import torch

import vae
from helpers import diffusers_kl, pointwise_video_vae

pytestmark = pytest.mark.usefixtures("one_thread")     # tests/conftest.py


@pytest.fixture(scope="module")
def kl():
    return vae.from_state_dict(diffusers_kl().state_dict())      # ratio 2 (two levels), 4 channels


@pytest.fixture(scope="module")
def video():
    return pointwise_video_vae()                                  # spatial 8, temporal 4


def _error(fn) -> str:
    with pytest.raises(vae.InputError) as e:
        fn()
    return str(e.value)


@pytest.mark.parametrize("shape, expect", [
    ((0, 4, 8, 8), "input 'samples': the latent holds no samples (batch 0"),
    ((1, 4, 8, 0), "the latent is empty: 0 width"),
    ((1, 4, 0, 0), "0 height and 0 width"),
    ((1, 4), "expected an image latent [B, C, h, w]"),
])
def test_degenerate_latent_shapes(kl, shape, expect):
    assert expect in _error(lambda: kl.decode(torch.zeros(shape)))


def test_video_latent_without_frames(video):
    msg = _error(lambda: video.decode(torch.zeros(1, 4, 0, 2, 2)))
    assert "the latent is empty: 0 frames" in msg and "Fix: check the node that made it" in msg


@pytest.mark.parametrize("z, expect", [
    (torch.empty(1, 4, 8, 8, device="meta"), "meta tensor: it has a shape (1, 4, 8, 8) but no data"),
    (torch.zeros(1, 4, 8, 8, dtype=torch.complex64), "complex values"),
    (torch.zeros(1, 4, 8, 8, dtype=torch.int64), "the latent is int64; latents are floating point"),
    ([[0.0]], "expected latent tensor, got a list"),
])
def test_latent_kinds(kl, z, expect):
    assert expect in _error(lambda: kl.decode(z))


def test_image_degenerate_sizes(kl, video):
    assert "no images to encode (batch 0" in _error(lambda: kl.encode(torch.rand(0, 3, 8, 8)))
    msg = _error(lambda: kl.encode(torch.rand(1, 3, 1, 9)))     # ratio 2: not even one latent row
    assert "is 9x1 pixels, smaller than one latent pixel (2x2)" in msg and "resize it to at least 10x2" in msg
    assert "0x0" not in msg
    msg = _error(lambda: video.encode(torch.rand(1, 3, 0, 16, 16)))
    assert "the clip has 0 frames" in msg and "-3" not in msg
    msg = _error(lambda: video.encode(torch.rand(1, 3, 3, 16, 16)))      # the nearest valid counts: 1 and 5
    assert "use 1 frames (drop the last 2) or 5" in msg


def test_uint8_images_are_converted(kl):
    x = torch.randint(0, 256, (1, 3, 8, 8), dtype=torch.uint8)
    assert torch.equal(kl.encode(x), kl.encode(x.float() / 255))


@pytest.mark.parametrize("dtype, expect", [(torch.int16, "int16 integers, whose pixel range is not known"),
                                           (torch.bool, "Convert Mask to Image")])
def test_other_integer_images_are_refused(kl, dtype, expect):
    assert expect in _error(lambda: kl.encode(torch.zeros(1, 3, 8, 8, dtype=dtype)))


@pytest.mark.parametrize("scale, expect", [(lambda x: x * 255, "look like 0..255 values). Fix: divide by 255"),
                                           (lambda x: x * 2 - 1, "look like -1..1 values). Fix: map them to 0..1")])
def test_images_in_another_convention_are_refused(kl, scale, expect):
    x = torch.rand(1, 3, 8, 8)
    x[0, 0, 0, :2] = torch.tensor([0.0, 1.0])
    assert expect in _error(lambda: kl.encode(scale(x)))


def test_slight_overshoot_is_clamped_with_a_warning(kl, caplog):
    x = torch.rand(1, 3, 8, 8)
    x[0, 0, 0, 0], x[0, 1, 0, 0] = -0.02, 1.03
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        z = kl.encode(x)
    assert torch.equal(z, kl.encode(x.clamp(0, 1)))
    assert "2 pixel values outside 0..1 (-0.02..1.03) clamped" in caplog.text


@pytest.mark.parametrize("kw, expect", [
    (dict(tile=-64), "input 'tile': -64 pixels is negative"),
    (dict(tile=12.5), "12.5 is not a whole number of pixels"),
    (dict(tile=16, overlap=-4), "input 'overlap': -4 pixels is negative"),
])
def test_tile_arguments(kl, kw, expect):
    assert expect in _error(lambda: kl.decode(torch.zeros(1, 4, 8, 8), **kw))


def test_small_tiles_run_while_they_are_few(kl):
    z = torch.randn(1, 4, 8, 8)                           # 16x16 px: 4 px tiles make 4x4 = 16 tiles
    assert torch.equal(kl.decode(z, tile=4.0, overlap=2.0), kl.decode(z, tile=4, overlap=2))
    with pytest.raises(vae.InputError, match="tiles of 2 pixels cut this 16x48-pixel image into 96 tiles"):
        kl.decode(torch.randn(1, 4, 8, 24), tile=(4, 2))
    with pytest.raises(vae.InputError, match="into 65 tiles"):
        kl.decode(torch.randn(1, 4, 65, 1), tile=2)


def test_frame_tile_arguments(video):
    z = torch.zeros(1, 4, 3, 2, 2)
    assert "input 'tile_frames': -8 frames is negative" in _error(lambda: video.decode(z, tile_frames=-8))
    assert "input 'overlap_frames'" in _error(lambda: video.decode(z, tile_frames=8, overlap_frames=-1))


# ---- tile inputs: every combination runs or is refused with a fix, never an engine-internal error ----

def _tile_grid(caps, video: bool, n: int = 10):
    """A deterministic sample of small values (the default run; every combination: ``n=None``)."""
    import random
    r = caps.spatial_ratio_packed
    tiles = (0, 2 * r, 2 * r + 3, 3 * r, (2 * r, 3 * r))                # at least two latent pixels a tile
    overlaps = (None, 0, 1, r, 3 * r, 64)
    frames = ((None, None), (1, 0), (caps.temporal_ratio, None), (2 * caps.temporal_ratio + 1, 1),
              (3, caps.temporal_ratio)) if video else ((None, None),)
    every = [(t, o, tf, of) for t in tiles for o in overlaps for tf, of in frames]
    return every if n is None else random.Random(0).sample(every, min(n, len(every)))


@pytest.mark.parametrize("family, full", [(f, False) for f in ("kl", "tiny", "flux2", "wan", "ltx2")] +
                         [pytest.param(f, True, marks=pytest.mark.slow) for f in ("kl", "tiny", "flux2", "consistency",
                                                                                   "wan", "ltx2", "hunyuan_video15")])
def test_tile_combinations_run_or_are_refused_with_a_fix(family, full):
    """Small tile/overlap/tile_frames/overlap_frames values, fast and exact, decode and encode: the
    result has the untiled shape, or the error is the library's with a fix (tests/fuzz_cases.py holds
    the families' tiny state dicts)."""
    from fuzz_cases import families
    v = vae.from_state_dict(families()[family]())
    c, video = v.caps, v.is_video
    grid = (3, 2, 3) if video else (4, 5)
    z = torch.randn(1, c.latent_channels_packed, *grid)
    r = c.spatial_ratio_packed
    x = torch.rand(1, 3, *(((1 + c.temporal_ratio * (grid[0] - 1),) if video else ()) + (grid[-2] * r, grid[-1] * r)))
    shapes = {"decode": tuple(v.decode(z).shape), "encode": tuple(v.encode(x).shape)}
    bad = []
    for i, (tile, overlap, tf, of) in enumerate(_tile_grid(c, video, None if full else 5 if video else 10)):
        mode = ("fast", "exact")[i % 2]
        for op, inp in (("decode", z), ("encode", x)):
            try:
                out = getattr(v, op)(inp, tile=tile, overlap=overlap, tile_frames=tf, overlap_frames=of, mode=mode)
            except vae.VAEKitError as e:
                if "Fix:" not in str(e) or "this model does not take tiles of this size" in str(e):  # the net
                    bad.append((op, mode, tile, overlap, tf, of, str(e)))
                continue
            except Exception as e:      # noqa: BLE001 - the point: nothing else may escape
                bad.append((op, mode, tile, overlap, tf, of, f"{type(e).__name__}: {e}"))
                continue
            if tuple(out.shape) != shapes[op]:
                bad.append((op, mode, tile, overlap, tf, of, f"shape {tuple(out.shape)}"))
    assert bad == []


def test_a_model_that_misfits_a_tile_is_refused_with_a_way_out():
    """The net under the planner: a tile function whose output is not the planned size (none of ours,
    see above) ends in the library's error with a fix, not in an error from inside the engine."""
    from vae.engine import tiling
    plans = tiling.plan_grid((8, 8), 32, 8, 8)
    with pytest.raises(vae.VAEKitError) as e:
        tiling.run_tiled(lambda t: torch.zeros(1, 3, 7, 7), torch.zeros(1, 4, 8, 8), plans, (1, 1), (8, 8), 3)
    assert "this model does not take tiles of this size" in str(e.value) and "Fix: run untiled (tile 0)" in str(e.value)
