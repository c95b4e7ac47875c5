"""vae.diffusers' video classes against diffusers' own on the same weights (tests/diffusers_face_common.py:
decode, the posterior, the config and the attributes pipelines read, a budget below one pass), and what
each class's decode takes that the others do not (LTX-Video's ``temb``)."""
from __future__ import annotations

import pytest
import torch

import vae
from diffusers_face_common import (LTX, LTX_LATENT, assert_budget_gives_one_pass, assert_decode_equal,
                                   assert_posterior_equal, config_differences, ltx_reference, pixels, save)
from vae.archs import ltx
from vae.errors import InputError

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

def _temb(ref, batch: int):
    """The decode timestep a pipeline passes (one per item), None where the decoder takes none."""
    return (torch.full((batch,), 0.05),) if ref.config.timestep_conditioning else ()


def _seeded(ref):
    """diffusers' 0.9.1 decoder draws its injected noise from the global RNG; the face from a generator
    seeded from 0 (vae/archs/ltx.py: inject_seed): seed the global one so both draw the same fields."""
    torch.manual_seed(ltx.inject_seed(0))
    return ref


# name -> (diffusers model, how the face is loaded: a file name or "folder", pixels, latent)
CASES = {
    f"ltx-{v}": (lambda v=v: ltx_reference(v), "folder" if v == "0.9.5" else f"ltx-video-{v}_vae.safetensors",
                 (2, 3, 9, 32, 64), (2, LTX_LATENT, 2, 2, 3)) for v in LTX
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    make, how, px, lat = CASES[request.param]
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
    for buffer in ("latents_mean", "latents_std"):         # LTX pipelines (de)normalise with them
        if hasattr(ref, buffer):
            assert torch.equal(getattr(face, buffer), getattr(ref, buffer))


@pytest.mark.parametrize("op", ["decode", "encode"])
def test_a_budget_below_one_pass_gives_one_pass(case, op, caplog):
    """Frames 4x (decode) and 8x (encode: the planner's fixed share dwarfs a narrow encoder's working set
    below that) the case's, 17 frames to encode."""
    name, ref, path, px, lat = case
    if op == "decode":
        shape = tuple(lat[:-2]) + (lat[-2] * 4, lat[-1] * 4)
    else:
        shape = (1, px[1], 17, px[-2] * 8, px[-1] * 8)
    x = pixels(shape) if op == "encode" else torch.randn(shape)
    ratio = vae.diffusers.load(path).handle.caps.spatial_ratio
    assert_budget_gives_one_pass(path, op, x, 2 * ratio, caplog, *(_temb(ref, shape[0]) if op == "decode" else ()))


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
