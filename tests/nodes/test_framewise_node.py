"""Frame-wise Decode as ComfyUI calls it: IMAGE frames like core's VAE Decode, exact for a model
that streams, blended chunks for one that cannot, image latents chunked over the batch."""
from __future__ import annotations

import pytest
import torch

from video_families import tiny_state_dict


@pytest.fixture(scope="module")
def node(pack):
    return pack.NODE_CLASS_MAPPINGS["VAEKitFramewiseDecode"]()


def _vae(family):
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    return VAEKitVAE(from_state_dict(tiny_state_dict(family)))


def test_definition_states_exactness(pack, node):
    decl = type(node).INPUT_TYPES()["required"]
    assert "Exact" in decl["frames_per_chunk"][1]["tooltip"] and "HunyuanVideo" in decl["frames_per_chunk"][1]["tooltip"]


@pytest.mark.parametrize("family,exact", [("magvit", True), ("hunyuan_video", False)])
def test_framewise_decode_gives_core_frames(node, family, exact):
    vae = _vae(family)
    z = torch.randn(1, 16, 5, 3, 3)
    (images,) = node.decode({"samples": z}, vae, frames_per_chunk=1, overlap=1)
    full = vae.handle.decode(z)
    assert images.shape == (17, 24, 24, 3)
    want = full[0].permute(1, 2, 3, 0)
    err = (images - want).abs().max()
    if exact:
        assert err <= 1e-5
    else:
        print(f"{family} frame-wise (1 + 1 overlap) vs one pass: max {err:.3f}")
        assert 0 < err < 1


def test_image_latents_are_chunked_over_the_batch(pack, node):
    from helpers import diffusers_tiny
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    vae = VAEKitVAE(from_state_dict(diffusers_tiny().state_dict(), name_hint="taesd"))
    z = torch.randn(5, 4, 4, 4)
    (images,) = node.decode({"samples": z}, vae, frames_per_chunk=2)
    assert images.shape == (5, 32, 32, 3)
    assert torch.allclose(images, vae.decode(z), atol=1e-6)


def test_image_latent_into_video_vae_is_named(node):
    with pytest.raises(Exception, match=r"Frame-wise Decode \(VAEKit\): input 'samples'"):
        node.decode({"samples": torch.randn(1, 16, 4, 4)}, _vae("magvit"))
