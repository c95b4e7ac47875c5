"""Video through the nodes: 5-D LATENTs in, IMAGE frames [B*T, H, W, 3] out (as core's VAE Decode),
an IMAGE batch encoded as one clip (as core's VAE Encode), core's nodes driving our video VAE."""
from __future__ import annotations

import pytest
import torch

from helpers import pointwise_video_vae


@pytest.fixture
def headless(pack):
    from vaekit.nodes import headless
    return headless


@pytest.fixture
def video(pack):
    from vaekit.nodes.socket import VAEKitVAE
    return VAEKitVAE(pointwise_video_vae(memory=1, package="vaekit.vae"))


def test_tiled_decode_gives_frames_like_core(pack, video, headless):
    dec = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]()
    z = torch.randn(2, 4, 5, 12, 10)
    (images,) = dec.decode({"samples": z}, video, tile_size=64, overlap=16, temporal_size=8, temporal_overlap=4)
    assert images.shape == (2 * 17, 96, 80, 3)
    full = video.handle.decode(z)                                    # [B, 3, T, H, W]
    assert torch.allclose(images, full.permute(0, 2, 3, 4, 1).reshape(-1, 96, 80, 3), atol=1e-6)
    (core_images,) = headless.VAEDecode().decode({"samples": z}, video)
    assert torch.equal(core_images, headless.VAEDecode().decode({"samples": z}, video)[0])
    assert torch.allclose(core_images, images, atol=1e-6)


def test_core_tiled_decode_converts_frames_to_latent_frames(pack, video, headless):
    assert video.temporal_compression_decode() == 4 and video.latent_dim == 3
    assert video.upscale_ratio[0](5) == 17 and video.downscale_ratio[0](17) == 5
    z = torch.randn(1, 4, 6, 5, 5)
    (a,) = headless.VAEDecodeTiled().decode({"samples": z}, video, tile_size=64, overlap=32,
                                                        temporal_size=8, temporal_overlap=4)
    (b,) = headless.VAEDecode().decode({"samples": z}, video)
    assert a.shape == b.shape == (21, 40, 40, 3)
    assert torch.allclose(a, b, atol=1e-6)


def test_tiled_encode_takes_the_image_batch_as_one_clip(pack, video, headless):
    enc = pack.NODE_CLASS_MAPPINGS["VAEKitTiledEncode"]()
    frames = torch.rand(9, 32, 24, 3)
    (latent,) = enc.encode(frames, video, tile_size=64, overlap=32, temporal_size=8, temporal_overlap=4)
    assert latent["samples"].shape == (1, 4, 3, 4, 3)
    (core,) = headless.VAEEncode().encode(frames, video)
    assert torch.allclose(core["samples"], latent["samples"], atol=1e-6)


def test_video_errors_name_node_input_and_fix(pack, video):
    dec = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]()
    with pytest.raises(Exception, match=r"Tiled Decode \(VAEKit\): input 'samples': .*video VAE.*Fix:"):
        dec.decode({"samples": torch.randn(1, 4, 8, 8)}, video)


def test_image_batches_are_cut_to_whole_frame_groups_as_core_does(pack, video, headless, caplog):
    """Core's VAE Encode gives N images 1 + (N-1)//r latent frames (the extra ones are dropped): the
    node and our VAE in core's node do the same, and say so in the log."""
    enc = pack.NODE_CLASS_MAPPINGS["VAEKitTiledEncode"]()
    frames = torch.rand(12, 16, 16, 3)
    with caplog.at_level("WARNING", logger="VAEKit"):
        (latent,) = enc.encode(frames, video, tile_size=64, overlap=32, temporal_size=64, temporal_overlap=4)
    assert latent["samples"].shape[2] == 3                   # the library keeps core's rule and says so once
    assert caplog.text.count("the clip has 12 frames") == 1 and "the last 3 dropped, as ComfyUI core does. 9 or " \
        "13 frames fit" in caplog.text
    (nine,) = enc.encode(frames[:9], video, tile_size=64, overlap=32, temporal_size=64, temporal_overlap=4)
    assert torch.equal(latent["samples"], nine["samples"])
    (core,) = headless.VAEEncode().encode(frames, video)
    assert torch.allclose(core["samples"], nine["samples"], atol=1e-6)
    # core's newer nodes ask for every image as its own one-frame clip
    each = video.encode(frames[:2], not_video=True)
    assert each.shape == (2, 4, 1, 2, 2)
    assert torch.allclose(each[1:], video.encode(frames[1:2]), atol=1e-6)
