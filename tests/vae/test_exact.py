"""Exact tiling (vae/engine/exact.py): tiled encode/decode equal to the untiled pass, for every family, at tile
sizes where fast mode differs visibly; the halo comes from the layers and is needed; runs clean up."""
from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import vae
from helpers import diffusers_kl, module_attrs
from vae.engine import exact, receptive, tiling
from vae import run
from vae.errors import InputError
from vae.nn.norm import GroupNorm
from video_families import FAMILIES, USER_TILED

EXACT = 1e-4     # fp32, 0..1 pixels / latents
VISIBLE = 1e-2   # fast mode's error at the same tiles: the case is not trivially seamless


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def kl():
    # three levels (ratio 4), two resnets each, mid attention, jittered GroupNorm affines
    return vae.from_state_dict(diffusers_kl(widths=(32, 64, 64), layers=2).state_dict())


def _assert_exact(untiled, fast, exact_out):
    assert exact_out.shape == untiled.shape
    assert (fast - untiled).abs().max() > VISIBLE
    assert (exact_out - untiled).abs().max() <= EXACT


@pytest.mark.parametrize("shape,tile", [((1, 4, 24, 20), 64), ((2, 4, 17, 23), 32), ((1, 4, 9, 31), (36, 20))])
def test_kl_decode_exact(kl, shape, tile):
    z = torch.randn(shape)
    calls = []
    out = kl.decode(z, tile=tile, mode="exact", progress=lambda d, n: calls.append((d, n)))
    tiles = len(tiling.core_spans(shape[2], _side(tile, 0) // 4)) * len(tiling.core_spans(shape[3], _side(tile, 1) // 4))
    # progress counts tiles (as fast mode does), weighted by the work before each meeting round
    assert tiles > 1 and calls[-1] == (tiles, tiles) and all(n == tiles for _, n in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    _assert_exact(kl.decode(z), kl.decode(z, tile=tile, overlap=16), out)


def _side(tile, axis: int) -> int:
    return tile[axis] if isinstance(tile, tuple) else tile


@pytest.mark.parametrize("size,tile", [((96, 80), 32), ((68, 100), 40)])
def test_kl_encode_exact(kl, size, tile):
    x = torch.rand(1, 3, *size)
    _assert_exact(kl.encode(x), kl.encode(x, tile=tile, overlap=16), kl.encode(x, tile=tile, mode="exact"))


def test_real_taef2_exact_both_ways(shared_data):
    """Real weights (TAEF2: local convs plus a GroupNorm branch in its mid blocks)."""
    v = vae.load(shared_data / "taef2_decoder.pth")
    z = torch.randn(1, 32, 12, 10)       # even: its LATENTs pack 2x2 (encode takes multiples of 16 px)
    _assert_exact(v.decode(z), v.decode(z, tile=64, overlap=32), v.decode(z, tile=64, mode="exact"))
    x = v.decode(z)
    _assert_exact(v.encode(x), v.encode(x, tile=64, overlap=32), v.encode(x, tile=64, mode="exact"))


@pytest.mark.parametrize("family", USER_TILED)       # own tiles: exact = its definition (test_minimax.py)
def test_video_families_exact_both_ways(loaded, family):
    """Per-frame GroupNorm (Mochi, Magvit), clip-wide GroupNorm and attention (HunyuanVideo), local
    only (LTX-Video): every spatial tile runs the whole clip."""
    v = loaded[family]
    r = v.caps.spatial_ratio
    z = torch.randn(1, v.caps.latent_channels, 2, 7, 6)
    _assert_exact(v.decode(z), v.decode(z, tile=3 * r, overlap=r), v.decode(z, tile=3 * r, mode="exact"))
    x = torch.rand(1, 3, 1 + v.caps.temporal_ratio, 7 * r, 6 * r)      # a clip of two latent frames
    _assert_exact(v.encode(x), v.encode(x, tile=3 * r, overlap=r), v.encode(x, tile=3 * r, mode="exact"))


@pytest.mark.parametrize("family", [f for f in FAMILIES if f in ("mochi", "magvit", "hunyuan_video15", "seedvr2")])
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_exact_tiles_stream_time_for_causal_families(loaded, family, chunk):
    """Exact mode on a model that streams: 2x2 spatial tiles, each run chunk by chunk through its own
    causal caches (``chunk`` latent frames; the clip is not a multiple of it), equal one pass."""
    v = loaded[family]
    r, rt = v.caps.spatial_ratio, v.caps.temporal_ratio
    z = torch.randn(1, v.caps.latent_channels, 4, 5, 4)
    calls = []
    out = v.decode(z, tile=3 * r, tile_frames=chunk * rt, mode="exact", progress=lambda d, n: calls.append(n))
    assert calls and calls[-1] == 4 * (-(-4 // chunk))        # every tile, every chunk
    assert (out - v.decode(z)).abs().max() <= 1e-5
    x = torch.rand(1, 3, v.frames_for(4), 5 * r, 4 * r)
    assert (v.encode(x, tile=3 * r, tile_frames=chunk * rt, mode="exact") - v.encode(x)).abs().max() <= 1e-5


def _sibling(name: str):
    """Another test module of this folder (its tiny reference configs)."""
    spec = importlib.util.spec_from_file_location(f"exact_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ltx_injected_noise_is_the_untiled_field():
    """LTX-Video 0.9.1 injects seeded noise inside its decoder: exact tiles take their part of the
    field an untiled pass draws (fast tiles too: they differ only by their missing context)."""
    v = vae.from_state_dict(_sibling("test_ltx")._tiny("0.9.1").state_dict())
    z = torch.randn(1, v.caps.latent_channels, 2, 5, 4)
    _assert_exact(v.decode(z, seed=3), v.decode(z, tile=64, overlap=32, seed=3),
                  v.decode(z, tile=64, mode="exact", seed=3))


def test_consistency_decoder_sampler_noise_and_unet_skips():
    """The consistency decoder: seeded sampler noise at image size, a UNet whose skip connections
    span every level (one segment: the halo covers the whole UNet), GroupNorm in every block."""
    tests = _sibling("test_consistency")
    v = vae.from_state_dict(tests.diffusers_consistency(**tests.TINY).state_dict())
    z = torch.randn(1, 4, 12, 10)
    _assert_exact(v.decode(z, seed=5), v.decode(z, tile=32, overlap=8, seed=5),
                  v.decode(z, tile=32, mode="exact", seed=5))


# ---- the halo is computed from the layers, and it is needed ------------------------------------

def test_reach_reads_kernel_dilation_and_padding():
    assert receptive.reach(nn.Conv2d(1, 1, 3, padding=1)) == (1, 1)
    assert receptive.reach(nn.Conv2d(1, 1, 3, padding=0)) == (2, 2)           # caller pads one side (SD down)
    assert receptive.reach(nn.Conv2d(1, 1, (5, 3), padding=(2, 1), dilation=(2, 1))) == (6, 1)
    from vae.nn.causal import CausalConv3d
    assert receptive.reach(CausalConv3d(1, 1, 3, spatial_pad="replicate")) == (1, 1)


def test_segments_sum_reach_per_resolution_and_split_at_boundaries():
    up = run.boundary(nn.Upsample(scale_factor=2))
    net = nn.Sequential(nn.Conv2d(1, 1, 3, padding=1), nn.Conv2d(1, 1, 5, padding=2), up,
                        nn.Conv2d(1, 1, 3, padding=1), nn.Conv2d(1, 1, 3, padding=1))
    with torch.inference_mode():
        events = receptive.probe(lambda x, m: m(x), net, torch.zeros(1, 1, 4, 4))
    segs = receptive.segments(events, (4, 4), 1, 2)
    assert [s.halo for s in segs] == [(3, 3), (1, 1)]     # 1 + 2 at latent scale; 2 px at 2x = 1 latent
    assert all(s.align == (1, 1) for s in segs)


def test_a_halo_short_of_the_receptive_field_breaks_exactness(kl, monkeypatch):
    """The computed halo is not a generous constant: one latent pixel less and tiles disagree."""
    z = torch.randn(1, 4, 24, 20)
    real = exact.segments

    def short(*args):
        import dataclasses
        return [dataclasses.replace(s, halo=tuple(max(h - 1, 0) for h in s.halo)) for s in real(*args)]
    monkeypatch.setattr(exact, "segments", short)
    assert (kl.decode(z, tile=48, mode="exact") - kl.decode(z)).abs().max() > VISIBLE


def test_whole_tensor_statistics_not_averaged_tile_variances():
    """Tiles with different means: the pooled variance must include the spread of the tile means
    (multidiffusion's averaged tile variances drop it)."""
    norm = GroupNorm(1, 2, eps=0.0)
    net = nn.Sequential(norm)
    x = torch.cat([torch.randn(1, 2, 8, 4), 5 + torch.randn(1, 2, 8, 4)], dim=-1)
    with torch.inference_mode():
        out = exact.run_exact(lambda t, m: m(t), net, x, [[(0, 8)], [(0, 4), (4, 8)]], 1, 1, torch.device("cpu"))
        assert (out - net(x)).abs().max() < 1e-5


# ---- threshold, modes, interrupts ---------------------------------------------------------------

def test_one_tile_is_one_untiled_pass(kl):
    z = torch.randn(1, 4, 16, 16)
    assert tiling.core_spans(16, 16) == [(0, 16)] and len(tiling.core_spans(17, 16)) == 2
    assert torch.equal(kl.decode(z, tile=64, mode="exact"), kl.decode(z))


def test_core_spans_partition():
    for n in range(1, 40):
        for t in range(1, 12):
            spans = tiling.core_spans(n, t)
            assert spans[0][0] == 0 and spans[-1][1] == n
            assert all(b0 == a1 for (_, b0), (a1, _) in zip(spans, spans[1:]))
            assert max(b - a for a, b in spans) <= t


def test_unknown_mode_names_the_input(kl):
    with pytest.raises(InputError, match="mode"):
        kl.decode(torch.randn(1, 4, 8, 8), mode="precise")


def _clean(model: nn.Module, threads_before: int, attrs: dict) -> None:
    assert module_attrs(model) == attrs            # nothing left on the shared modules
    assert threading.active_count() == threads_before


def test_interrupt_stops_every_tile_and_restores_the_model(kl):
    z = torch.randn(1, 4, 24, 20)
    before, attrs = threading.active_count(), module_attrs(kl.model)

    def interrupt(done, total):
        if done > 7:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        kl.decode(z, tile=32, mode="exact", progress=interrupt)
    _clean(kl.model, before, attrs)
    assert (kl.decode(z, tile=32, mode="exact") - kl.decode(z)).abs().max() <= EXACT   # still usable


def test_an_error_inside_a_tile_reaches_the_caller(kl):
    before, attrs = threading.active_count(), module_attrs(kl.model)
    block = kl.model.decoder.up[0].block[0]
    forward = block.forward

    def broken(x):     # fine in the probe pass (main thread), fails inside the tiles
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("boom in a tile")
        return forward(x)
    block.forward = broken
    try:
        with pytest.raises(RuntimeError, match="boom in a tile"):
            kl.decode(torch.randn(1, 4, 24, 20), tile=32, mode="exact")
    finally:
        del block.forward
    _clean(kl.model, before, attrs)


# ---- published configs (slow) -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("model", ["sd", "hunyuan_video"])
def test_exact_at_published_configs(model):
    """SD-shape AutoencoderKL (mid attention, 4 levels) and HunyuanVideo (clip-wide GroupNorm,
    frame-causal attention), random weights: exact tiles equal the untiled decode and encode."""
    diffusers = pytest.importorskip("diffusers")
    torch.set_num_threads(os.cpu_count() or 1)      # the module's one-thread fixture restores it
    torch.manual_seed(0)
    if model == "sd":
        sd = diffusers.AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                                     block_out_channels=(128, 256, 512, 512), layers_per_block=2)
        v = vae.from_state_dict(sd.state_dict())
        z, lead = torch.randn(1, 4, 32, 24), ()
    else:
        v = vae.from_state_dict(diffusers.AutoencoderKLHunyuanVideo().state_dict())
        z, lead = torch.randn(1, 16, 2, 12, 10), (5,)
    _assert_exact(v.decode(z), v.decode(z, tile=64, overlap=16), v.decode(z, tile=64, mode="exact"))
    x = torch.rand(1, 3, *lead, 96, 64)
    _assert_exact(v.encode(x), v.encode(x, tile=64, overlap=16), v.encode(x, tile=64, mode="exact"))
