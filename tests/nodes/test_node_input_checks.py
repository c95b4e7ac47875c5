"""Degenerate inputs through the nodes: the error names the node and the node's own input (not the
library's argument name), and Frame-wise Decode gives an IMAGE or raises, never None."""
from __future__ import annotations

import pytest
import torch

from helpers import diffusers_tiny, pointwise_video_vae


@pytest.fixture(scope="module")
def image_vae(pack):
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    return VAEKitVAE(from_state_dict(diffusers_tiny().state_dict(), name_hint="taesd"))


@pytest.fixture(scope="module")
def video_vae(pack):
    from vaekit.nodes.socket import VAEKitVAE
    return VAEKitVAE(pointwise_video_vae(package="vaekit.vae"))


def _node(pack, name):
    return pack.NODE_CLASS_MAPPINGS[name]()


def _error(fn) -> str:
    with pytest.raises(ValueError) as e:
        fn()
    return str(e.value)


@pytest.mark.parametrize("kw, expect", [
    (dict(tile_size=-64), "Tiled Decode (VAEKit): input 'tile_size': -64 pixels is negative"),
    (dict(tile_size=512, overlap=-32), "Tiled Decode (VAEKit): input 'overlap': -32 pixels is negative"),
])
def test_tiled_decode_names_its_own_inputs(pack, image_vae, kw, expect):
    assert expect in _error(lambda: _node(pack, "VAEKitTiledDecode").decode({"samples": torch.randn(1, 4, 8, 8)},
                                                                           image_vae, **kw))


def test_tiled_decode_names_temporal_inputs(pack, video_vae):
    msg = _error(lambda: _node(pack, "VAEKitTiledDecode").decode({"samples": torch.randn(1, 4, 3, 2, 2)}, video_vae,
                                                                 temporal_size=-8))
    assert msg.startswith("Tiled Decode (VAEKit): input 'temporal_size': -8 frames is negative")


def test_empty_latent_batch(pack, image_vae):
    msg = _error(lambda: _node(pack, "VAEKitTiledDecode").decode({"samples": torch.zeros(0, 4, 8, 8)}, image_vae))
    assert msg.startswith("Tiled Decode (VAEKit): input 'samples': the latent holds no samples")


def test_tiled_encode_images(pack, image_vae):
    enc = _node(pack, "VAEKitTiledEncode")
    pixels = torch.randint(0, 256, (1, 16, 16, 3), dtype=torch.uint8)
    (latent,) = enc.encode(pixels, image_vae)
    (ref,) = enc.encode(pixels.float() / 255, image_vae)
    assert torch.equal(latent["samples"], ref["samples"])
    msg = _error(lambda: enc.encode(torch.rand(1, 16, 16, 3) * 255, image_vae))
    assert msg.startswith("Tiled Encode (VAEKit): input 'pixels': the image's values span") and "divide by 255" in msg
    assert "no images to encode" in _error(lambda: enc.encode(torch.rand(0, 16, 16, 3), image_vae))


def test_core_vae_encode_of_a_tiny_image_names_its_size(image_vae):
    msg = _error(lambda: image_vae.encode(torch.rand(1, 4, 6, 3)))        # core's VAE Encode call
    assert "is 6x4 pixels, smaller than one latent pixel (8x8)" in msg and "0x0" not in msg


@pytest.mark.parametrize("samples, kw, expect", [
    (torch.zeros(0, 4, 4, 4), {}, "input 'samples': the latent holds no samples"),
    (torch.zeros(0, 4, 3, 2, 2), {}, "input 'samples': the latent holds no samples"),
    (torch.zeros(2, 4, 4, 4), dict(frames_per_chunk=0), "input 'frames_per_chunk'"),
    (torch.zeros(2, 4, 4, 4), dict(tile_size=32), "input 'tile_size': tiles of 32 pixels. Fix: use 0 for whole"),
])
def test_framewise_decode_raises_instead_of_returning_nothing(pack, image_vae, video_vae, samples, kw, expect):
    node = _node(pack, "VAEKitFramewiseDecode")
    vae = video_vae if samples.dim() == 5 else image_vae
    msg = _error(lambda: node.decode({"samples": samples}, vae, **kw))
    assert msg.startswith("Frame-wise Decode (VAEKit): ") and expect in msg


def test_framewise_decode_returns_an_image_for_one_latent(pack, image_vae):
    (images,) = _node(pack, "VAEKitFramewiseDecode").decode({"samples": torch.randn(1, 4, 4, 4)}, image_vae,
                                                            frames_per_chunk=4)
    assert torch.is_tensor(images) and images.shape == (1, 32, 32, 3)
