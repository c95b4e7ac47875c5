"""vae.diffusers' image classes beyond AutoencoderKL (Flux.2, Qwen-Image 2.1, HunyuanImage 2.1 and its
refiner, SVD's temporal decoder) against diffusers' own on the same weights: decode, the posterior's
attributes and draws, forward, the config and what pipelines read (tests/diffusers_face_common.py); each
class's own layout (Flux.2's raw latent, one-frame clips, SVD's frames in the batch and ``num_frames``);
and the pipelines' VAE steps run with the face in place of diffusers' VAE."""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

import vae
from diffusers_face_common import assert_decode_equal, assert_posterior_equal, close, config_differences, pixels, save
from diffusers_flux2 import model as flux2_reference
from helpers import diffusers_hunyuan_image21, diffusers_qwen21
from video_families import tiny_reference
from vae.errors import InputError

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")


def refiner():
    """AutoencoderKLHunyuanImageRefiner at HunyuanVideo 1.5's test structure, with its weights (the same keys)."""
    v15 = tiny_reference("hunyuan_video15")
    ref = diffusers.AutoencoderKLHunyuanImageRefiner(block_out_channels=tuple(v15.config.block_out_channels),
                                                     layers_per_block=v15.config.layers_per_block)
    ref.load_state_dict(v15.state_dict())
    return ref.eval()


# name -> (diffusers model, a file name or "folder", pixels, the class's latent, decode's own inputs)
CASES = {
    "flux2": (flux2_reference, "flux2-vae.safetensors", (2, 3, 16, 24), (2, 8, 8, 12), ()),
    "flux2-folder": (flux2_reference, "folder", (1, 3, 16, 16), (1, 8, 8, 8), ()),
    "qwen21": (diffusers_qwen21, "qwen_image_2.1_vae_bf16.safetensors", (2, 4, 1, 32, 48), (2, 64, 1, 2, 3), ()),
    "hunyuan_image21": (diffusers_hunyuan_image21, "hunyuan_image_2.1_vae_fp16.safetensors", (1, 3, 64, 96),
                        (1, 64, 2, 3), ()),
    "hunyuan_image_refiner": (refiner, "hunyuan_image_refiner_vae_fp16.safetensors", (2, 3, 1, 16, 16),
                              (2, 32, 1, 1, 1), ()),
    # a folder: its config.json names the class among the two that serve HunyuanVideo 1.5's model
    "hunyuan_image_refiner-folder": (refiner, "folder", (1, 3, 1, 16, 16), (1, 32, 1, 1, 1), ()),
    "svd": (lambda: tiny_reference("svd").eval(), "svd_xt_image_decoder.safetensors", (3, 3, 16, 16), (4, 4, 2, 2),
            (2,)),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    make, how, px, lat, inputs = CASES[request.param]
    ref = make()
    return request.param, ref, save(ref, how, tmp_path_factory.mktemp(request.param)), px, lat, inputs


def test_decode_encode_and_forward_equal_the_diffusers_class(case):
    name, ref, path, px, lat, inputs = case
    face = vae.diffusers.load(path)
    assert face.config["_class_name"] == type(ref).__name__ and type(face).__name__ == type(ref).__name__
    z = torch.randn(lat, generator=torch.Generator().manual_seed(1))
    assert_decode_equal(face, ref, z, *inputs)
    x = pixels(px)
    assert_posterior_equal(face, ref, x)
    with torch.no_grad():
        close(face(x).sample, ref(x).sample)
        close(face(x, sample_posterior=True, generator=torch.Generator().manual_seed(3)).sample,
              ref(x, sample_posterior=True, generator=torch.Generator().manual_seed(3)).sample)


def test_config_and_what_pipelines_read(case):
    name, ref, path, *_ = case
    face = vae.diffusers.load(path)
    differ = config_differences(face, ref)
    if name == "hunyuan_image21":       # the class has no default: the published (converter's) value
        assert differ.pop("scaling_factor") == (0.75289, None)
    assert not differ
    # the forward parameters pipelines inspect (StableVideoDiffusionPipeline: num_frames)
    assert list(inspect.signature(face.forward).parameters) == list(inspect.signature(ref.forward).parameters)
    if name.startswith("flux2"):        # the pipelines normalise with vae.bn's running statistics
        for buffer in ("running_mean", "running_var"):
            assert torch.equal(getattr(face.bn, buffer), getattr(ref.bn, buffer))


def test_layouts_the_classes_do_not_take_are_refused(tmp_path):
    ref = tiny_reference("svd").eval()
    face = vae.diffusers.load(save(ref, "svd_vae.safetensors", tmp_path))
    z = torch.randn(4, 4, 2, 2)
    with pytest.raises(InputError, match="num_frames"):
        face.decode(z)
    with pytest.raises(InputError, match="num_frames"):
        face.decode(z, num_frames=3)
    qwen = vae.diffusers.load(save(diffusers_qwen21(), "qwen_image_2.1_vae.safetensors", tmp_path))
    with pytest.raises(InputError, match="one-frame clips"):
        qwen.encode(pixels((1, 4, 32, 32)))
    with pytest.raises(InputError, match="one-frame clips"):
        qwen.decode(torch.randn(1, 64, 2, 2, 2))
    refined = vae.diffusers.load(save(refiner(), "hunyuan_image_refiner_vae.safetensors", tmp_path))
    with pytest.raises(InputError, match="one-frame clips"):       # where the class departs from the model
        refined.encode(pixels((1, 3, 5, 16, 16)))


# ---- the pipelines' VAE steps ------------------------------------------------------------------------------
def _assert_same(a, b):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    assert a.shape == b.shape and a.numel()
    assert (a - b).abs().max() <= 1e-4, (a - b).abs().max()


def test_flux2_pipeline_and_its_image_encode(tmp_path):
    """Flux2Pipeline: its decode (un-normalised with vae.bn, unpatchified) and its reference-image encode."""
    ref = flux2_reference()
    face = vae.diffusers.load(save(ref, "flux2-vae.safetensors", tmp_path))
    torch.manual_seed(0)
    transformer = diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=32, out_channels=32, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=16, timestep_guidance_channels=16, axes_dims_rope=(4, 4, 4, 4)).eval()
    make = lambda v: diffusers.Flux2Pipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=v,  # noqa: E731
                                             text_encoder=None, tokenizer=None, transformer=transformer)
    image = pixels((1, 3, 32, 32), seed=3)
    outs, fed = [], []
    for v in (ref, face):
        pipe = make(v)
        pipe.set_progress_bar_config(disable=True)
        with torch.no_grad():
            fed.append(pipe._encode_vae_image(image, torch.Generator().manual_seed(0)))
            outs.append(pipe(prompt_embeds=torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(2)),
                             height=32, width=32, num_inference_steps=2, guidance_scale=1.0, output_type="pt",
                             generator=torch.Generator().manual_seed(0))[0])
    _assert_same(*fed)
    _assert_same(*outs)


def test_svd_pipeline_encode_and_decode(tmp_path):
    """StableVideoDiffusionPipeline's _encode_vae_image and decode_latents (clips of decode_chunk_size
    frames, num_frames passed because the VAE's forward takes it)."""
    ref = tiny_reference("svd").eval()
    face = vae.diffusers.load(save(ref, "svd_vae.safetensors", tmp_path))
    image = pixels((1, 3, 16, 16), seed=3)
    latents = torch.randn(1, 5, 4, 2, 2, generator=torch.Generator().manual_seed(4))     # [B, F, C, h, w]
    fed, frames = [], []
    for v in (ref, face):
        pipe = diffusers.StableVideoDiffusionPipeline(vae=v, image_encoder=None, unet=None, scheduler=None,
                                                      feature_extractor=None)
        with torch.no_grad():
            fed.append(pipe._encode_vae_image(image, torch.device("cpu"), 1, False))
            frames.append(pipe.decode_latents(latents, num_frames=5, decode_chunk_size=3))
    _assert_same(*fed)
    _assert_same(*frames)


def test_qwen_image21_pipeline_image_encode(tmp_path):
    """QwenImage21Pipeline's image encode (one-frame clips, normalised with the config's latent statistics), the
    pipeline's own method on an object holding only the VAE (its constructor needs the Qwen3-VL processor)."""
    ref = diffusers_qwen21()
    face = vae.diffusers.load(save(ref, "qwen_image_2.1_vae.safetensors", tmp_path))
    image = pixels((2, 4, 1, 32, 32), seed=3)
    fed = []
    for v in (ref, face):
        pipe = SimpleNamespace(vae=v, latent_channels=v.config.z_dim)
        with torch.no_grad():
            fed.append(diffusers.QwenImage21Pipeline._encode_vae_image(
                pipe, image, [torch.Generator().manual_seed(s) for s in range(2)]))
    _assert_same(*fed)


def test_hunyuan_image_refiner_pipeline_image_encode(tmp_path):
    """HunyuanImageRefinerPipeline's image encode (a posterior sample per image from its generator, packed two
    frames to the channels, scaled), the pipeline's own methods on an object holding only the VAE."""
    cls = diffusers.HunyuanImageRefinerPipeline
    ref = refiner()
    face = vae.diffusers.load(save(ref, "hunyuan_image_refiner_vae_fp16.safetensors", tmp_path))
    image = pixels((2, 3, 1, 32, 32), seed=3)
    fed = []
    for v in (ref, face):
        with torch.no_grad():
            fed.append(cls._encode_vae_image(
                SimpleNamespace(vae=v, _reorder_image_tokens=cls._reorder_image_tokens), image, [torch.Generator().manual_seed(s) for s in range(2)]))
    _assert_same(*fed)
