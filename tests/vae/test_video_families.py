"""All the video families through the same doors: detection across families and layouts, the
handle's thresholds per axis at the min tile size, temporal tiling seams, and bad input."""
from __future__ import annotations

import pytest
import torch

import vae
from video_families import FAMILIES, OWN_TILES, RATIOS, SPEC_IDS, USER_TILED, tiny_state_dict


def test_each_family_is_detected_as_itself_in_every_layout_we_hold(loaded):
    from vae import registry
    for family, v in loaded.items():
        spec = SPEC_IDS.get(family, family)
        assert v.spec.id == spec and v.is_video
        assert (v.caps.spatial_ratio, v.caps.temporal_ratio) == RATIOS[family]
        for sd in (tiny_state_dict(family), v.state_dict()):        # diffusers, canonical
            found = [s.id for s in registry.REGISTRY if s.detect(sd)]
            assert found == [spec], f"{family}: detected by {found}"


def _count_tiles(v, z, **kw):
    calls = []
    out = v.decode(z, progress=lambda d, n: calls.append(n), **kw)
    return out, calls[-1]


@pytest.mark.parametrize("family", USER_TILED)
def test_threshold_at_min_tile_size_per_axis(loaded, family):
    """At min // ratio latents an axis is one pass (equal to the untiled decode); at +1 it is tiled.
    A model that streams in chunks of its own by default (Wan) runs those chunks when time is not
    asked for (the spatial axis is still one tile); one whose batches are its definition (CogVideoX: the
    first takes the odd frame) runs them always."""
    from vae.engine.streaming import decode_chunks
    v = loaded[family]
    s, r = RATIOS[family]
    z = torch.randn(1, v.caps.latent_channels, 3, 3, 3)
    full = v.decode(z)
    assert full.shape == (1, 3, 1 + 2 * r, 3 * s, 3 * s)
    own = v.caps.stream_chunk
    chunks = len(decode_chunks(3, own, r, lead=v.caps.stream_batches)[0]) if own else 1
    for kw, units in ((dict(tile=3 * s, overlap=s), chunks),
                      (dict(tile_frames=3 * r, overlap_frames=r), chunks if v.caps.stream_batches else 1)):
        out, n = _count_tiles(v, z, **kw)
        assert n == units and (out - full).abs().max() <= 1e-5, kw
    for kw in (dict(tile=2 * s, overlap=s), dict(tile_frames=2 * r, overlap_frames=r)):
        out, n = _count_tiles(v, z, **kw)
        if v.caps.stream_batches and "tile_frames" in kw:          # its batches, not the call's chunks
            assert n == chunks and (out - full).abs().max() <= 1e-5, kw
            continue
        assert n > 1 and out.shape == full.shape, kw


@pytest.mark.parametrize("family", OWN_TILES)
def test_own_tiles_are_not_tiled_again(loaded, family):
    """A family whose tiles are its definition runs its own units whatever tiles a call gives (the
    same result, the same number of units), in both directions and in either mode."""
    v = loaded[family]
    s, r = RATIOS[family]
    z = torch.randn(1, v.caps.latent_channels, 3, 3, 3)
    full, n_full = _count_tiles(v, z)
    for kw in (dict(tile=2 * s, overlap=s), dict(tile_frames=2 * r, overlap_frames=r), dict(tile=2 * s, mode="exact")):
        out, n = _count_tiles(v, z, **kw)
        assert n == n_full and torch.equal(out, full), kw
    x = torch.rand(1, 3, 9, 3 * s, 3 * s)
    assert torch.equal(v.encode(x, tile=2 * s, overlap=s, mode="exact"), v.encode(x))


@pytest.mark.parametrize("family", FAMILIES)
def test_temporal_tiling_seam_error_is_reported(loaded, family):
    """Real blocks: later tiles see only their own context, so seams are approximate (exact
    streaming is the Frame-wise Decode node). The error is printed and must stay finite."""
    v = loaded[family]
    s, r = RATIOS[family]
    z = torch.randn(1, v.caps.latent_channels, 6, 2, 2)
    full = v.decode(z)
    out, n = _count_tiles(v, z, tile_frames=3 * r, overlap_frames=2 * r)
    err = (out - full).abs()
    print(f"{family}: temporal tiles 3/2 latent frames ({n} tiles): max {err.max():.3g}, mean {err.mean():.3g}; "
          f"first tile's frames {err[:, :, :1 + 2 * r].max():.3g}")
    assert torch.isfinite(out).all() and out.shape == full.shape
    # the first tile covers frames 0 .. 2r alone (its blend weight there is 1): exactly the untiled frames
    # wherever the family is causal in time
    if v.caps.causal_decoder:
        assert err[:, :, : 1 + r].max() <= 1e-5


def test_bad_input_is_a_clear_error(loaded):
    ltx, mochi = loaded["ltx"], loaded["mochi"]
    with pytest.raises(vae.InputError, match=r"12 channels \(as Mochi latents do\).*takes 16") as e:
        ltx.decode(torch.randn(1, 12, 2, 2, 2))
    assert "load the VAE that belongs to the model" in str(e.value)
    with pytest.raises(vae.InputError, match="video VAE"):
        mochi.decode(torch.randn(1, 12, 4, 4))
    with pytest.raises(vae.InputError, match="the clip has 10 frames.*1 \\+ 6\\*k"):
        mochi.encode(torch.rand(1, 3, 10, 16, 16))
    with pytest.raises(vae.InputError, match="divisible by 32"):
        ltx.encode(torch.rand(1, 3, 9, 48, 64))


def test_magvit_tiled_encode_keeps_each_tiles_stride_part(loaded):
    """diffusers' Magvit tiled_encode keeps the full tile instead of its stride part (misplaced
    latents). Here, where a tile's blend weight is 1, the tiled latent is exactly that tile's own
    encoding at the tile's place."""
    v = loaded["magvit"]
    x = torch.rand(1, 3, 5, 64, 32)                        # latent 8 x 4
    tiled = v.encode(x, tile=32, overlap=16)               # rows: tiles [0, 5) and [3, 8) in latents
    first, second = v.encode(x[..., :40, :]), v.encode(x[..., 24:, :])
    assert (tiled[..., :3, :] - first[..., :3, :]).abs().max() <= 1e-6
    assert (tiled[..., 5:, :] - second[..., 2:, :]).abs().max() <= 1e-6
