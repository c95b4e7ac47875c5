"""Degenerate inputs at the library's door (VAE.decode / VAE.encode): one InputError naming the
input, with a fix that fits the numbers given; uint8 images converted, slight overshoot clamped."""
from __future__ import annotations

import logging
import math

import pytest
import torch

import vae
from vae import checks
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


# ---- the call's keywords: one check where they enter (vae/checks.py: call) ---------------------------

def test_an_unknown_keyword_is_a_type_error_naming_it_and_the_valid_ones(kl):
    z = torch.zeros(1, 4, 8, 8)
    with pytest.raises(TypeError) as e:
        kl.decode(z, budjet=1 << 30)                          # a typo: it used to decode without a word
    msg = str(e.value)
    assert "unexpected keyword argument 'budjet' (did you mean 'budget'?)" in msg
    assert "tile, overlap, progress, out_device, tile_frames, overlap_frames, mode, budget, offload" in msg
    assert "takes no decode options of its own" in msg
    with pytest.raises(TypeError, match="'seed'.*takes no encode options of its own"):
        kl.encode(torch.rand(1, 3, 16, 16), seed=1)            # encode goes through the same check
    with pytest.raises(TypeError, match="'timestep'.*takes no decode options"):
        kl.decode(z, timestep=0.05)                           # another family's option is no option here


def test_a_models_own_options_are_listed_and_taken(loaded):
    v = loaded["ltx_diffusion"]                               # declares decode_options=("seed",)
    z = torch.randn(1, v.caps.latent_channels, 1, 2, 2)
    with pytest.raises(TypeError, match="'sed' \\(did you mean 'seed'\\?\\).*this model's own decode options: seed"):
        v.decode(z, sed=3)
    assert torch.equal(v.decode(z, seed=3), v.decode(z, seed=3))


@pytest.mark.parametrize("given, expect", [
    ("4GB", 4 << 30), ("4 GB", 4 << 30), ("4gb", 4 << 30), ("4", 4 << 30), ("512MB", 512 << 20),
    ("1.5GiB", 3 << 29), (" 2 G ", 2 << 30), ("1e3 MB", 1000 << 20), (2.0, 2 << 30), (0.5, 1 << 29),
    (1 << 30, 1 << 30), (3 << 20, 3 << 20), (None, None),
])
def test_budget_forms_the_library_takes(given, expect):
    """One parser for the library, the CLI and the nodes; a GB is 2^30 bytes throughout (the nodes'
    tooltip and ComfyUI's unit); an int is bytes, a float GB, a string GB unless it names its unit."""
    assert checks.budget(given) == expect


@pytest.mark.parametrize("given, expect", [
    (-1, "a memory budget of -1 is negative"), ("-2GB", "is negative"), (float("nan"), "nan is not a size"),
    (math.inf, "inf is not a size"), ("inf GB", "is not a size"), ("four", "'four' is not a memory size"),
    ("4 XB", "is not a memory size"), (True, "True (a bool) is not a memory size"), ([4], "(a list)"),
    (0, "a memory budget of 0 fits nothing"), ("0GB", "fits nothing"),
    (4, "4 is 4 bytes, under 1 KiB: no VAE call fits in that. An int is bytes: for 4 GB pass 4.0 or '4GB'"),
])
def test_budgets_that_mean_nothing_are_refused_naming_the_value(kl, given, expect):
    msg = _error(lambda: kl.decode(torch.zeros(1, 4, 8, 8), budget=given))
    assert msg.startswith("input 'budget': ") and expect in msg and "Fix: " in msg
    assert "GiB" not in msg.split("Fix:")[0]                  # never "-0.00 GiB"


def test_the_nodes_read_every_number_as_gb_and_0_as_theirs():
    assert checks.budget(4, "max_memory", numbers_in_gb=True) == 4 << 30
    assert checks.budget(0.0, "max_memory", numbers_in_gb=True, zero=True) == 0
    assert "give GB, e.g. 4" in _error(lambda: checks.budget(-1.0, "max_memory", numbers_in_gb=True, zero=True))


def test_a_budget_given_as_text_plans_as_the_same_bytes(kl):
    z = torch.randn(1, 4, 8, 8)
    assert torch.equal(kl.decode(z, budget="1GB"), kl.decode(z, budget=1 << 30))
    x = torch.rand(1, 3, 16, 16)
    assert torch.equal(kl.encode(x, budget="512 MB"), kl.encode(x, budget=512 << 20))


@pytest.mark.parametrize("kw, expect", [
    (dict(tile="512"), "input 'tile': '512' is not a whole number of pixels"),
    (dict(tile=(64, 64, 64)), "input 'tile': (64, 64, 64) has 3 sizes; a tile is one size or (height, width)"),
    (dict(overlap=True), "input 'overlap': True is not a whole number of pixels"),
    (dict(tile_frames=-4), "input 'tile_frames': -4 frames is negative"),
    (dict(overlap_frames=1.5), "input 'overlap_frames': 1.5 is not a whole number of frames"),
    (dict(mode="exat"), "input 'mode': unknown tiling mode 'exat'. Fix: use one of fast, exact."),
    (dict(mode=None), "input 'mode': unknown tiling mode None"),
    (dict(out_device="gpu"), "input 'out_device': 'gpu' is not a device torch knows"),
    (dict(offload="meta"), "input 'offload': the meta device holds no data"),
])
def test_each_call_keyword_is_checked_where_it_enters(kl, video, kw, expect):
    """Checked before any work, for an image VAE and a video VAE alike (the same check)."""
    assert expect in _error(lambda: kl.decode(torch.zeros(1, 4, 8, 8), **kw))
    assert expect in _error(lambda: video.encode(torch.rand(1, 3, 5, 16, 16), **kw))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_on_a_machine_without_it(kl):
    """It was torch's raw AssertionError ("Torch not compiled with CUDA enabled") at the first copy."""
    for kw in (dict(out_device="cuda"), dict(offload="cuda:1")):
        msg = _error(lambda: kl.decode(torch.zeros(1, 4, 8, 8), **kw))
        assert "CUDA is not available here" in msg and "Fix: pass 'cpu', or leave it out for the default." in msg


# ---- a clip whose frame count misses the family's rule: encoded as core does, with a warning ---------

def _fits(v, frames: int) -> bool:
    r = v.caps.temporal_ratio
    return (frames - 1) % r == 0


@pytest.mark.parametrize("family, frames", [("wan", 6), ("mochi", 8), ("ltx", 10), ("hunyuan_video", 6),
                                            ("magvit", 2)])
def test_a_clip_that_misses_the_frame_rule_is_encoded_as_core_does_with_a_warning(loaded, caplog, family, frames):
    """One rule kind per temporal compression the families declare (4, 6, 8): the first 1 + r*k frames
    are encoded (core keeps the same frames: Wan's and HunyuanVideo's encoders walk 1 + r*k frames, LTX's
    crops to them, Mochi's strided convs never reach the rest) and the warning says how many frames were
    used and which counts fit."""
    v = loaded[family]
    r, s = v.caps.temporal_ratio, v.caps.spatial_ratio_packed
    x = torch.rand(1, 3, frames, 2 * s, 2 * s)
    keep = (frames - 1) // r * r + 1
    assert not _fits(v, frames) and _fits(v, keep) and _fits(v, keep + r)
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        z = v.encode(x)
    assert (f"the clip has {frames} frames; {v.name} encodes 1 + {r}*k frames" in caplog.text and
            f"the first {keep} are encoded and the last {frames - keep} dropped, as ComfyUI core does. "
            f"{keep} or {keep + r} frames fit." in caplog.text)
    assert torch.equal(z, v.encode(x[:, :, :keep]))


def test_a_model_with_its_own_clips_takes_every_frame_without_a_warning(loaded, caplog):
    """MiniMax H3 pads its own clips (its definition): every frame is encoded, nothing to warn about."""
    v = loaded["minimax"]
    s = v.caps.spatial_ratio_packed
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        v.encode(torch.rand(1, 3, 6, 2 * s, 2 * s))
    assert "frames fit" not in caplog.text
