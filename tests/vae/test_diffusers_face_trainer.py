"""A trainer's own latent step with vae.diffusers' face in place of diffusers' VAE: finetrainers' latent
processors (``WanLatentEncodeProcessor``, ``LTXLatentEncodeProcessor``), each run once with diffusers' class
and once with the face on the same weights, with the same video and generator: the posterior's draw
(``compute_posterior=True``), the moments its precompute caches through the class's private ``_encode``
(``compute_posterior=False``, per batch item where slicing is on, as LTX's processor does), and the latent
its training step then draws from those moments (the model specification's own ``_normalize_latents``,
diffusers' ``DiagonalGaussianDistribution``).

finetrainers is not a test dependency (it installs accelerate, transformers, datasets, bitsandbytes, wandb,
...): install it (``pip install finetrainers==0.2.0``; its import needs a torchvision that matches torch)
to run these."""
from __future__ import annotations

import pytest
import torch

import vae
from diffusers_face_common import LTX_LATENT, close, ltx_reference, pixels, save
from helpers import jitter_gammas

diffusers = pytest.importorskip("diffusers")


def _finetrainers_specifications():
    """finetrainers' Wan and LTX-Video specification modules, or a skip naming why not. Its 0.2.0 wheel does
    not import as published: the package's ``__init__`` imports its trainers, which import
    ``finetrainers.patches.dependencies``, a package the wheel leaves out, and its dataset module names
    ``torchvision.io.video_reader.VideoReader``, which torchvision 0.29 no longer has. Neither is on the
    latent path: the modules are imported without the package's ``__init__``, the two missing names stand in
    as things that fail if used (a function that raises, a class nothing is an instance of)."""
    import importlib
    import importlib.util
    import sys
    import types
    spec = importlib.util.find_spec("finetrainers")
    if spec is None:
        pytest.skip("finetrainers is not installed (not a test dependency: it pulls in accelerate, transformers, "
                    "datasets, bitsandbytes, wandb); pip install finetrainers==0.2.0 to run these", allow_module_level=True)
    try:
        import torchvision.io
    except ImportError as e:
        pytest.skip(f"finetrainers imports torchvision, which does not import here: {e}", allow_module_level=True)
    if not hasattr(torchvision.io, "video_reader"):
        torchvision.io.video_reader = types.SimpleNamespace(VideoReader=type("VideoReader", (), {}))
    if "finetrainers" not in sys.modules:
        package = types.ModuleType("finetrainers")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["finetrainers"] = package

    def absent(*args, **kwargs):
        raise RuntimeError("not in finetrainers 0.2.0's wheel")
    for name in ("patches", "patches.dependencies", "patches.dependencies.diffusers",
                 "patches.dependencies.diffusers.control"):
        if f"finetrainers.{name}" not in sys.modules:
            stand_in = types.ModuleType(f"finetrainers.{name}")
            stand_in.__path__, stand_in.control_channel_concat, stand_in.load_lora_weights = [], absent, absent
            sys.modules[f"finetrainers.{name}"] = stand_in
    return (importlib.import_module("finetrainers.models.wan.base_specification"),
            importlib.import_module("finetrainers.models.ltx_video.base_specification"))


wan_spec, ltx_spec = _finetrainers_specifications()
pytestmark = pytest.mark.usefixtures("one_thread")


def _wan():
    torch.manual_seed(0)
    return jitter_gammas(diffusers.AutoencoderKLWan(base_dim=8, z_dim=16))


# name -> (diffusers model, file name the face loads, the processor and its output names, the model
# specification (its _normalize_latents), video [B, F, C, H, W] in [-1, 1])
CASES = {
    "wan": (_wan, "wan_2.1_vae.safetensors", lambda: wan_spec.WanLatentEncodeProcessor(["latents", "mean", "std"]),
            wan_spec.WanModelSpecification, (1, 5, 3, 16, 24)),
    "ltx": (lambda: ltx_reference("0.9.0"), "ltx-video-0.9.0_vae.safetensors",
            lambda: ltx_spec.LTXLatentEncodeProcessor(["latents", "frames", "height", "width", "mean", "std"]),
            ltx_spec.LTXVideoModelSpecification, (2, 9, 3, 32, 64)),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    make, name, processor, spec, shape = CASES[request.param]
    ref = make().eval().requires_grad_(False)
    face = vae.diffusers.load(save(ref, name, tmp_path_factory.mktemp(request.param)))
    return request.param, ref, face, processor(), spec, pixels(shape)


def _run(processor, model, video, compute_posterior: bool) -> dict:
    """The processor's call as finetrainers' precompute makes it (under no_grad), the generator seeded alike."""
    with torch.no_grad():
        return processor(vae=model, video=video, generator=torch.Generator().manual_seed(5),
                         compute_posterior=compute_posterior)


def _same(got: dict, want: dict) -> float:
    assert got.keys() == want.keys()
    worst = 0.0
    for key, w in want.items():
        g = got[key]
        if torch.is_tensor(w):
            worst = max(worst, close(g.to(w.dtype), w))
        else:
            assert g == w, key
    return worst


def test_the_posterior_draw_equals_diffusers_class(case):
    name, ref, face, processor, spec, video = case
    _same(_run(processor, face, video, True), _run(processor, ref, video, True))


@pytest.mark.parametrize("slicing", [False, True])
def test_the_cached_moments_and_the_training_draw_equal_diffusers_class(case, slicing):
    """``_encode``'s moments, then the training step's draw from them: each half normalised by the
    specification's own ``_normalize_latents`` with the statistics the processor gave, as its forward does."""
    name, ref, face, processor, spec, video = case
    for m in (ref, face):
        m.enable_slicing() if slicing else m.disable_slicing()
    want, got = _run(processor, ref, video, False), _run(processor, face, video, False)
    _same(got, want)
    assert got["latents"].shape[1] == 2 * (LTX_LATENT if name == "ltx" else 16)      # [mean; log-variance]

    close(_training_latent(name, spec, got), _training_latent(name, spec, want))


def _training_latent(name: str, spec, out: dict) -> torch.Tensor:
    """The latent a training step draws from the cached moments, as each specification's forward takes it:
    Wan normalises both halves, then draws; LTX draws, then normalises with the statistics its data loader
    stacks per batch item."""
    draw = lambda moments: wan_spec.DiagonalGaussianDistribution(moments).sample(       # noqa: E731
        generator=torch.Generator().manual_seed(9))
    if name == "wan":
        return draw(torch.cat([spec._normalize_latents(h, out["mean"], out["std"])
                               for h in out["latents"].chunk(2, dim=1)], dim=1))
    z = draw(out["latents"])
    per_item = lambda t: t.reshape(1, -1).repeat(z.shape[0], 1)      # noqa: E731
    return spec._normalize_latents(z, per_item(out["mean"]), per_item(out["std"]))
