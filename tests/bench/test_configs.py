"""bench/harness/configs.py: the configs the GPU check builds without diffusers are the ones the tests'
reference models give (read back by our loader), and ``build`` makes a working handle of each."""
from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from helpers import ROOT, diffusers_hunyuan_image21, diffusers_kl, diffusers_qwen21, diffusers_tiny

sys.path.insert(0, str(ROOT / "bench"))
from harness import configs  # noqa: E402


def _references() -> dict:
    """The tests' reference state dicts per family of configs.TEST."""
    pytest.importorskip("diffusers")
    import diffusers_flux2
    import mage_tiny
    from video_families import FAMILIES, tiny_state_dict
    from vae.archs import mage
    out = {f: tiny_state_dict(f) for f in FAMILIES}
    out["kl"] = diffusers_kl().state_dict()
    out["flux2"] = diffusers_flux2.model().state_dict()
    out["tiny"] = diffusers_tiny().state_dict()
    out["qwen21"] = diffusers_qwen21().state_dict()
    out["hunyuan_image"] = diffusers_hunyuan_image21().state_dict()
    out["mage"] = mage.MageVAE(mage_tiny.config()).state_dict()
    spec = importlib.util.spec_from_file_location("_consistency", ROOT / "tests" / "vae" / "test_consistency.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out["consistency"] = mod.diffusers_consistency(**mod.TINY).state_dict()
    return out


def test_test_configs_are_the_tests_references():
    import vae
    refs = _references()
    assert set(refs) == set(configs.TEST)
    for family, sd in refs.items():
        v = vae.from_state_dict(sd)
        family_id, config = configs.TEST[family]
        assert (v.spec.id, v.config) == (family_id, config), family


def test_published_configs_are_diffusers_defaults():
    """Read from the shapes of diffusers' published models (built on the meta device: shapes only)."""
    diffusers = pytest.importorskip("diffusers")
    from vae import registry
    from harness.families import FAMILIES
    with torch.device("meta"):       # the benchmarks' declarations of the same published models
        refs = {name: getattr(diffusers, FAMILIES[name].diffusers)(**FAMILIES[name].kwargs) for name in configs.PUBLISHED}
    for name, ref in refs.items():
        sd = ref.state_dict()
        spec = registry.detect(sd)
        assert (spec.id, spec.config_from_state_dict(spec.to_canonical(sd), None)) == configs.PUBLISHED[name], name


def test_build_draws_weights_on_the_device_under_the_seed():
    a = configs.build(configs.TEST["wan"], "cpu", seed=3)
    b = configs.build(configs.TEST["wan"], "cpu", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    big = configs.build(configs.PUBLISHED["wan"], "meta")        # as on a GPU: nothing drawn on the CPU first
    assert big.device.type == "meta" and torch.get_default_dtype() == torch.float32
    assert a.decode(torch.randn(1, 16, 2, 4, 4)).shape == (1, 3, 5, 32, 32)
