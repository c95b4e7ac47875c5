"""vae.diffusers' video classes against diffusers' own on the same weights (tests/diffusers_face_common.py:
decode, the posterior, the config and the attributes pipelines read, a budget below one pass), and what
each class's decode takes that the others do not (LTX-Video's ``temb``)."""
from __future__ import annotations

import pytest
import torch

import vae
from diffusers_face_common import (LTX, LTX_LATENT, assert_budget_gives_one_pass, assert_decode_equal,
                                   assert_posterior_equal, config_differences, ltx_reference, pixels, save)
from video_families import tiny_reference
from vae.archs import ltx
from vae.errors import InputError

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

def _temb(ref, batch: int):
    """The decode timestep a pipeline passes (one per item), None where the decoder takes none."""
    return (torch.full((batch,), 0.05),) if ref.config.get("timestep_conditioning") else ()


def _seeded(ref):
    """diffusers' 0.9.1 decoder draws its injected noise from the global RNG; the face from a generator
    seeded from 0 (vae/archs/ltx.py: inject_seed): seed the global one so both draw the same fields."""
    torch.manual_seed(ltx.inject_seed(0))
    return ref


# name -> (diffusers model, how the face is loaded: a file name or "folder", pixels, latent, the pixels the budget
# test encodes: large enough that a plan below one pass exists beside the planner's fixed share)
CASES = {
    f"ltx-{v}": (lambda v=v: ltx_reference(v), "folder" if v == "0.9.5" else f"ltx-video-{v}_vae.safetensors",
                 (2, 3, 9, 32, 64), (2, LTX_LATENT, 2, 2, 3), (1, 3, 17, 256, 512)) for v in LTX
} | {
    "hunyuan_video": (lambda: tiny_reference("hunyuan_video"), "hunyuan_video_vae_bf16.safetensors",
                      (1, 3, 5, 16, 24), (1, 16, 2, 2, 3), None),
    "hunyuan_video15": (lambda: tiny_reference("hunyuan_video15"), "folder", (1, 3, 5, 32, 32), (1, 32, 2, 2, 2),
                        (1, 3, 9, 128, 128)),
    "cogvideox": (lambda: tiny_reference("cogvideox"), "folder", (1, 3, 5, 16, 16), (1, 16, 2, 2, 2), None),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    make, how, px, lat, _ = CASES[request.param]
    ref = make().eval()
    return request.param, ref, save(ref, how, tmp_path_factory.mktemp(request.param)), px, lat


def test_decode_and_encode_equal_the_diffusers_class(case):
    name, ref, path, px, lat = case
    face = vae.diffusers.load(path)
    z = torch.randn(lat, generator=torch.Generator().manual_seed(1))
    assert_decode_equal(face, _seeded(ref), z, *_temb(ref, lat[0]))
    assert_posterior_equal(face, ref, pixels(px))


def test_config_has_the_class_keys_and_values(case):
    name, ref, path, *_ = case
    face = vae.diffusers.load(path)
    assert not config_differences(face, ref)
    buffers = dict(ref.named_buffers())
    for buffer in ("latents_mean", "latents_std"):         # LTX pipelines (de)normalise with them
        if buffer in buffers:
            assert torch.equal(getattr(face, buffer), buffers[buffer])


@pytest.mark.parametrize("op", ["decode", "encode"])
def test_a_budget_below_one_pass_gives_one_pass(case, op, caplog):
    """A latent 4x the case's to decode; the case's own pixels to encode."""
    name, ref, path, px, lat = case
    h = vae.diffusers.load(path).handle
    if h.caps.norm.startswith("groupnorm"):
        pytest.skip("tiles that share GroupNorm statistics all stay alive on the CPU (paused ones wait in host "
                    "memory): a budget saves memory on a GPU only (tests/vae/test_budget.py)")
    shape = tuple(lat[:-2]) + (lat[-2] * 4, lat[-1] * 4) if op == "decode" else CASES[name][-1]
    x = pixels(shape) if op == "encode" else torch.randn(shape)
    tile = max(2 * h.caps.spatial_ratio, 64)        # the tiling engine's smallest tile
    assert_budget_gives_one_pass(path, op, x, tile, caplog, *(_temb(ref, shape[0]) if op == "decode" else ()))


def test_ltx_decode_timestep_per_item_and_refusals(tmp_path):
    """A timestep per batch item conditions each item as diffusers' does; a conditioned decoder without one
    is refused by name (diffusers' own fails inside), a keyword the class does not take too."""
    ref = ltx_reference("0.9.5")
    face = vae.diffusers.load(save(ref, "ltx-video-0.9.5_vae.safetensors", tmp_path))
    z = torch.randn(2, LTX_LATENT, 2, 2, 2, generator=torch.Generator().manual_seed(1))
    assert_decode_equal(face, ref, z, torch.tensor([0.05, 0.5]))
    with pytest.raises(InputError, match="temb"):
        face.decode(z)
    with pytest.raises(InputError, match="'generator'"):
        face.decode(z, torch.tensor([0.05]), generator=torch.Generator())
