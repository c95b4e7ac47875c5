"""vae.diffusers' AutoencoderKLCosmos against diffusers' own on the same weights (tiny random config, fp32),
read from a diffusers folder, from ComfyUI's file (the original's key names and NVIDIA's latent statistics)
and from diffusers' weights as one file: encode's ``IdentityDistribution`` (the raw latent; the pipelines
normalise it per channel and latent frame themselves), decode, forward, ``_encode``, the config the
pipelines read, a budget below one pass, and CosmosVideoToWorldPipeline's VAE steps with either VAE."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import vae
from diffusers_face_common import (assert_budget_gives_one_pass, assert_decode_equal, close, config_differences,
                                   pixels, same)
from helpers import jitter_norms
from video_families import tiny_reference
from vae.archs import cosmos_layout as layout
from vae.engine import budget as planner
from vae.errors import InputError, LoadError

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

COMFY_FILE = "cosmos_cv8x8x8_1.0.safetensors"


def _comfy_sd(ref, mean=None, std=None) -> dict:
    """ComfyUI's file of ``ref``: the original's names, the wavelet constants, the latent statistics
    (default: ``ref``'s, diffusers' default config: the published ones, NVIDIA's mean_std.pt)."""
    sd = layout.to_original(layout.to_canonical({k: v.contiguous() for k, v in ref.state_dict().items()}))
    sd.update(latent_mean=torch.tensor(ref.config.latents_mean) if mean is None else mean.flatten().contiguous(),
              latent_std=torch.tensor(ref.config.latents_std) if std is None else std.flatten().contiguous())
    return sd


@pytest.fixture(scope="module")
def ref():
    return tiny_reference("cosmos")


@pytest.fixture(scope="module", params=["folder", "comfyui", "diffusers-file"])
def source(request, ref, tmp_path_factory):
    """Where the face reads ``ref``'s weights from."""
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "folder":
        ref.save_pretrained(tmp / "pipe" / "vae")
        return tmp / "pipe"
    sd = _comfy_sd(ref) if request.param == "comfyui" else {k: v.contiguous() for k, v in ref.state_dict().items()}
    name = COMFY_FILE if request.param == "comfyui" else "cosmos_vae.safetensors"
    save_file(sd, str(tmp / name))
    return tmp / name


@pytest.fixture(scope="module")
def face(source):
    return vae.diffusers.load(source)


@pytest.mark.parametrize("shape", [(1, 3, 1, 24, 16), (2, 3, 9, 16, 24), (1, 3, 17, 24, 16)])
def test_encode_gives_the_class_identity_distribution(face, ref, shape):
    x = pixels(shape)
    with torch.no_grad():
        want = ref.encode(x).latent_dist
    got = face.encode(x).latent_dist
    assert type(got).__name__ == type(want).__name__ == "IdentityDistribution"
    worst = close(got.mode(), want.mode())
    close(got.parameters, want.parameters)
    close(got.sample(torch.Generator().manual_seed(7)), want.sample(torch.Generator().manual_seed(7)))
    close(face.encode(x, return_dict=False)[0].mode(), want.mode())
    close(face._encode(x), ref._encode(x).detach())
    print(f"encode {shape}: max abs {worst:.1e}")


def test_clip_lengths(ref, tmp_path):
    """Clips of other lengths: where the class ignores the frames past the last group of 8 (1-4 of them), the
    face agrees (dropping them, as ComfyUI does); where it makes them a latent frame (5-7), the face refuses."""
    ref.save_pretrained(tmp_path / "vae")
    face = vae.diffusers.load(tmp_path)
    for frames in (5, 10, 13):
        x = pixels((1, 3, frames, 16, 16))
        with torch.no_grad():
            close(face.encode(x).latent_dist.mode(), ref.encode(x).latent_dist.mode())
    for frames in (6, 8, 16):
        x = pixels((1, 3, frames, 16, 16))
        with torch.no_grad():
            assert ref.encode(x).latent_dist.mode().shape[2] == 2 + (frames - 1) // 8
        with pytest.raises(InputError, match=f"a clip of {frames} frames"):
            face.encode(x)


@pytest.mark.parametrize("t", [1, 2, 3])
def test_decode_equals_the_class(face, ref, t):
    """Raw latents in (random weights: outputs far outside [-1, 1], not clamped by either)."""
    z = torch.randn(2, 16, t, 3, 2, generator=torch.Generator().manual_seed(t))
    print(f"decode t={t}: max abs {assert_decode_equal(face, ref, z):.1e}")


def test_forward_equals_the_class(face, ref):
    x = pixels((1, 3, 9, 16, 16))
    with torch.no_grad():
        want = ref(x).sample
        drawn = ref(x, sample_posterior=True, generator=torch.Generator().manual_seed(1)).sample
    close(face(x).sample, want)
    close(face(x, True, False, torch.Generator().manual_seed(1))[0], drawn)


def test_config_has_the_class_keys_and_values(face, ref):
    """Every key of diffusers' config, the latent statistics and compression ratios the pipelines read included."""
    assert not config_differences(face, ref)
    assert face.config.latents_mean == ref.config.latents_mean and len(face.config.latents_std) == 16 * 16
    assert (face.config.temporal_compression_ratio, face.config.spatial_compression_ratio) == (8, 8)


def test_the_file_and_the_folder_give_their_statistics(ref, tmp_path):
    """A file's own statistics, a folder's config.json's: in the config for the pipelines, while the latents
    (raw, statistics-free) stay the class's. The published ones as diffusers lists them in any dtype (our model
    holds them in its own)."""
    save_file(_comfy_sd(ref), str(tmp_path / "published.safetensors"))
    half = vae.diffusers.load(tmp_path / "published.safetensors", dtype=torch.bfloat16)
    assert half.config.latents_mean == ref.config.latents_mean and half.config.latents_std == ref.config.latents_std
    mean, std = torch.rand(16, 16) - 0.5, torch.rand(16, 16) + 0.5
    save_file(_comfy_sd(ref, mean, std), str(tmp_path / COMFY_FILE))
    face = vae.diffusers.load(tmp_path / COMFY_FILE)
    assert torch.equal(torch.tensor(face.config.latents_mean), mean.flatten())
    assert torch.equal(torch.tensor(face.config.latents_std), std.flatten())
    x = pixels((1, 3, 9, 16, 16))
    with torch.no_grad():
        close(face.encode(x).latent_dist.mode(), ref.encode(x).latent_dist.mode())
    other = diffusers.AutoencoderKLCosmos.from_config({**ref.config, "latents_mean": mean.flatten().tolist()})
    other.load_state_dict(ref.state_dict())
    other.save_pretrained(tmp_path / "vae")
    assert vae.diffusers.load(tmp_path).config.latents_mean == other.config.latents_mean


def test_a_file_without_statistics_for_its_width_needs_them(tmp_path):
    """8 latent channels: no published statistics; a folder's config.json or ``config=`` gives them."""
    torch.manual_seed(0)
    ref = jitter_norms(diffusers.AutoencoderKLCosmos(
        encoder_block_out_channels=(8, 8, 16, 16), decode_block_out_channels=(8, 16, 16, 16), num_layers=1,
        latent_channels=8, latents_mean=[0.0] * 8, latents_std=[1.0] * 8)).eval()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "cosmos8.safetensors"))
    with pytest.raises(LoadError, match="latents_mean"):
        vae.diffusers.load(tmp_path / "cosmos8.safetensors")
    face = vae.diffusers.load(tmp_path / "cosmos8.safetensors", config=dict(latents_mean=[0.0] * 8,
                                                                          latents_std=[1.0] * 8))
    assert not config_differences(face, ref)
    assert_decode_equal(face, ref, torch.randn(1, 8, 2, 2, 2))


def test_call_forms_and_refusals(face, ref):
    """The class's decode takes no generator (the face refuses it by name); its tiling switches are accepted."""
    z = torch.randn(1, 16, 2, 2, 2)
    with pytest.raises(InputError, match="'generator'"):
        face.decode(z, generator=torch.Generator())
    face.enable_tiling(tile_sample_min_height=256, tile_sample_min_width=256)
    face.enable_slicing()
    assert face.use_tiling and face.use_slicing
    assert_decode_equal(face, ref, z)
    face.disable_tiling()
    face.disable_slicing()


def test_a_budget_below_one_pass_gives_one_pass(ref, tmp_path, caplog):
    """decode within a budget between one pass and exact 64 px tiles one latent frame a chunk: planned in tiles
    or time chunks, the result the one pass's (the raw latent: no statistics per frame to cut across)."""
    ref.save_pretrained(tmp_path / "vae")
    assert_budget_gives_one_pass(tmp_path, "decode", torch.randn(1, 16, 3, 16, 16), 64, caplog)


def test_a_budget_near_the_smallest_plan_equals_the_class(ref, tmp_path, caplog):
    """33 frames of 384x384 within a budget a tenth of the way from the smallest plan (64 px tiles, one latent
    frame a chunk) to one pass: streamed a latent frame at a time, the result diffusers' class's. On the CPU
    both predictions include the planner's fixed allowance (vae/engine/memory.py), so the budget is 0.7x one
    pass in all, 0.3x of what one pass needs above it."""
    ref.save_pretrained(tmp_path / "vae")
    h, cpu, shape = vae.diffusers.load(tmp_path).handle, torch.device("cpu"), (1, 3, 33, 384, 384)
    need = lambda **kw: planner.on_device(planner.predict(h, h.call_for("encode", shape, mode="exact", **kw), cpu,  # noqa: E731
                                                          cpu), cpu, cpu, cpu)
    one, smallest = need(), need(tile=64, tile_frames=8)
    budget = smallest + (one - smallest) // 10
    assert budget < 0.75 * one
    x = pixels(shape)
    with caplog.at_level(logging.INFO, logger="VAEKit"):
        got = vae.diffusers.load(tmp_path, budget=budget).encode(x).latent_dist.mode()
    assert any("a chunk" in r.message or "px tiles" in r.message for r in caplog.records)
    with torch.no_grad():
        worst = close(got, ref.encode(x).latent_dist.mode())
    print(f"encode {shape} within {budget / 2 ** 20:.0f} MiB ({budget / one:.2f}x one pass): max abs {worst:.1e}")


# ---- CosmosVideoToWorldPipeline -------------------------------------------------------------------------------

class _Checker(diffusers.ModelMixin, diffusers.ConfigMixin):
    """Stands in for CosmosSafetyChecker (cosmos_guardrail is not a test dependency): lets everything through."""

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def check_text_safety(self, prompt) -> bool:
        return True

    def check_video_safety(self, frames):
        return frames


def _transformer():
    torch.manual_seed(0)
    # concat_padding_mask needs torchvision, not a test dependency
    return diffusers.CosmosTransformer3DModel(
        in_channels=17, out_channels=16, num_attention_heads=2, attention_head_dim=16, num_layers=1, mlp_ratio=2,
        text_embed_dim=32, adaln_lora_dim=4, max_size=(4, 32, 32), patch_size=(1, 2, 2), rope_scale=(2.0, 1.0, 1.0),
        concat_padding_mask=False, extra_pos_embed_type="learnable").eval()


def _pipeline(v, transformer):
    scheduler = diffusers.EDMEulerScheduler(sigma_min=0.002, sigma_max=80, sigma_data=0.5, sigma_schedule="karras",
                                            num_train_timesteps=1000, prediction_type="epsilon", rho=7.0,
                                            final_sigmas_type="sigma_min")
    pipe = diffusers.CosmosVideoToWorldPipeline(text_encoder=None, tokenizer=None, transformer=transformer, vae=v,
                                                scheduler=scheduler, safety_checker=_Checker())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_video_to_world_pipeline(ref, face, monkeypatch):
    """The image's encode (``retrieve_latents(vae.encode(...), generator)``: the IdentityDistribution's sample,
    normalised with ``config.latents_mean/std`` per channel and latent frame) compared where it enters the
    denoising; then the whole pipeline, with what its ``vae.decode`` was given and gave recorded. The frames it
    returns pass the safety checker's 8-bit round trip (``(video * 255).astype(np.uint8)``, which truncates), so
    they may differ by one step, 1/255."""
    transformer, image = _transformer(), torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    fed, decoded, frames = [], [], []
    for v in (ref, face):
        pipe = _pipeline(v, transformer)
        with torch.no_grad():
            video = pipe.video_processor.preprocess(image, 32, 32).unsqueeze(2)
            fed.append(pipe.prepare_latents(video, 1, 16, 32, 32, 9, False, False, torch.float32, torch.device("cpu"),
                                            torch.Generator().manual_seed(0))[1])
        calls = []
        decode = v.decode
        monkeypatch.setattr(v, "decode", lambda z, *a, **k: calls.append((z, decode(z, *a, **k)[0])) or (calls[-1][1],))
        with torch.no_grad():
            out = pipe(image=image, prompt_embeds=torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1)),
                       height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=1.0, output_type="pt",
                       generator=torch.Generator().manual_seed(0)).frames
        monkeypatch.undo()
        assert len(calls) == 1
        decoded.append(calls[0])
        frames.append(np.asarray(out))
    assert fed[0].shape == (1, 16, 2, 4, 4)
    print(f"CosmosVideoToWorldPipeline: conditioning latents max abs {same(*fed):.1e}, "
          f"decode input {same(decoded[0][0], decoded[1][0]):.1e}, output {same(decoded[0][1], decoded[1][1]):.1e}, "
          f"frames {same(*frames, tol=1 / 255 + 1e-6):.1e}")
