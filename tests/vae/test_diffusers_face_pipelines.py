"""vae.diffusers in diffusers' own pipelines: each pipeline, with tiny random components and prompt
embeddings given (no text encoder), runs once with diffusers' VAE and once with our face on the same
weights (the face read from a file or a folder saved from that VAE); the VAE part (the decoded images, and
what an image-conditioned pipeline's encode fed in) is compared."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import vae
from diffusers_face_common import LTX_LATENT, conditioned_both, ltx_reference
from diffusers_face_common import run_both as _run_both, same as _assert_same
from helpers import diffusers_kl
from video_families import tiny_reference

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")


def _file(ref, path):
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return path


def test_flux_pipeline(tmp_path):
    ref = diffusers_kl(latent_channels=16, quant=False)       # Flux.1's structure: 16 channels, no quant convs
    face = vae.diffusers.load(_file(ref, tmp_path / "flux1_ae.safetensors"))
    ref.register_to_config(scaling_factor=face.config.scaling_factor, shift_factor=face.config.shift_factor)
    torch.manual_seed(0)
    transformer = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]).eval()
    make = lambda v: diffusers.FluxPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=v,  # noqa: E731
                                            text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                                            transformer=transformer)
    a, b = _run_both(make, ref, face, prompt_embeds=torch.randn(1, 8, 32), pooled_prompt_embeds=torch.randn(1, 32),
                     height=32, width=32, num_inference_steps=2, guidance_scale=1.0, output_type="pt")
    _assert_same(a, b)


def _sdxl_unet():
    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, transformer_layers_per_block=(1, 1), projection_class_embeddings_input_dim=80,
        cross_attention_dim=64, norm_num_groups=1).eval()


def _sdxl(cls, unet):
    return lambda v: cls(vae=v, text_encoder=None, text_encoder_2=None, tokenizer=None, tokenizer_2=None, unet=unet,
                         scheduler=diffusers.EulerDiscreteScheduler(), add_watermarker=False)


SDXL_EMBEDS = dict(prompt_embeds=torch.randn(1, 4, 64), pooled_prompt_embeds=torch.randn(1, 32))


@pytest.fixture(scope="module")
def sdxl(tmp_path_factory):
    ref = diffusers_kl(latent_channels=4)
    folder = tmp_path_factory.mktemp("sdxl")
    ref.register_to_config(scaling_factor=0.13025)
    ref.save_pretrained(folder / "vae")
    return ref, vae.diffusers.load(folder), _sdxl_unet()


def test_sdxl_pipeline_decode(sdxl):
    ref, face, unet = sdxl
    a, b = _run_both(_sdxl(diffusers.StableDiffusionXLPipeline, unet), ref, face, **SDXL_EMBEDS, height=32, width=32,
                     num_inference_steps=2, guidance_scale=1.0, output_type="pt")
    _assert_same(a, b)


def test_sdxl_img2img_encode(sdxl):
    """img2img's encode (latent_dist.sample(generator)) fed the denoising: compared where it enters, then the image."""
    ref, face, unet = sdxl
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    fed = []
    for v in (ref, face):
        pipe = _sdxl(diffusers.StableDiffusionXLImg2ImgPipeline, unet)(v)
        pipe.set_progress_bar_config(disable=True)
        with torch.no_grad():
            fed.append(pipe.prepare_latents(pipe.image_processor.preprocess(image), None, 1, 1, torch.float32,
                                            torch.device("cpu"), torch.Generator().manual_seed(0), add_noise=False))
    _assert_same(*fed)
    a, b = _run_both(_sdxl(diffusers.StableDiffusionXLImg2ImgPipeline, unet), ref, face, image=image, strength=0.5,
                     **SDXL_EMBEDS, num_inference_steps=2, guidance_scale=1.0, output_type="pt")
    _assert_same(a, b)


def _wan_ref():
    torch.manual_seed(0)
    return diffusers.AutoencoderKLWan(base_dim=8, z_dim=16).eval()


def _wan_transformer(in_channels=16):
    torch.manual_seed(0)
    return diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=in_channels, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32).eval()


WAN_CALL = dict(prompt_embeds=torch.randn(1, 8, 32), height=16, width=16, num_frames=5, num_inference_steps=2,
                guidance_scale=1.0, output_type="pt")


def test_wan_pipeline(tmp_path):
    ref = _wan_ref()
    face = vae.diffusers.load(_file(ref, tmp_path / "wan_2.1_vae.safetensors"))
    transformer = _wan_transformer()
    make = lambda v: diffusers.WanPipeline(tokenizer=None, text_encoder=None, transformer=transformer, vae=v,  # noqa: E731
                                           scheduler=diffusers.UniPCMultistepScheduler(flow_shift=3.0))
    a, b = _run_both(make, ref, face, **WAN_CALL)
    _assert_same(a, b)


def test_wan_image_to_video_pipeline(tmp_path):
    """Wan 2.2 A14B's image-to-video form (no image encoder): the first frame's encode conditions every step."""
    ref = _wan_ref()
    face = vae.diffusers.load(_file(ref, tmp_path / "wan_2.1_vae.safetensors"))
    transformer = _wan_transformer(in_channels=36)          # noise, the encoded condition, the 4-channel mask
    make = lambda v: diffusers.WanImageToVideoPipeline(  # noqa: E731
        tokenizer=None, text_encoder=None, vae=v, scheduler=diffusers.UniPCMultistepScheduler(flow_shift=3.0),
        transformer=transformer)
    image = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    fed = []
    for v in (ref, face):
        pipe = make(v)
        with torch.no_grad():
            fed.append(pipe.prepare_latents(pipe.video_processor.preprocess(image, 16, 16), 1, 16, 16, 16, 5,
                                            torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))[1])
    _assert_same(*fed)
    a, b = _run_both(make, ref, face, image=image, **WAN_CALL)
    _assert_same(a, b)


def test_qwen_image_pipeline(tmp_path):
    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLQwenImage(base_dim=8, z_dim=16).eval()
    face = vae.diffusers.load(_file(ref, tmp_path / "qwen_image_vae.safetensors"))
    assert face.config["_class_name"] == "AutoencoderKLQwenImage"
    torch.manual_seed(0)
    transformer = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4)).eval()
    make = lambda v: diffusers.QwenImagePipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=v,  # noqa: E731
                                                 text_encoder=None, tokenizer=None, transformer=transformer)
    a, b = _run_both(make, ref, face, prompt_embeds=torch.randn(1, 6, 16), prompt_embeds_mask=torch.ones(1, 6),
                     height=32, width=32, num_inference_steps=2, true_cfg_scale=1.0, output_type="pt")
    _assert_same(a, b)


def test_the_swap_on_a_built_pipeline(sdxl):
    """``pipe.vae = face``: the pipeline registers it, moves it and reads its dtype and device."""
    ref, face, unet = sdxl
    pipe = _sdxl(diffusers.StableDiffusionXLPipeline, unet)(ref)
    pipe.vae = face
    pipe.to(torch.device("cpu"), torch.float32)
    assert pipe.vae is face and pipe.device == torch.device("cpu") and pipe.vae.dtype == torch.float32


def _ltx_transformer():
    torch.manual_seed(0)
    return diffusers.LTXVideoTransformer3DModel(
        in_channels=LTX_LATENT, out_channels=LTX_LATENT, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, num_layers=1, caption_channels=16).eval()


# 0.9.5's structure: a timestep-conditioned decoder, so the pipeline's decode timestep and noise reach the VAE
LTX_CALL = dict(prompt_embeds=torch.randn(1, 8, 16), prompt_attention_mask=torch.ones(1, 8), height=64, width=64,
                num_frames=9, num_inference_steps=2, guidance_scale=1.0, decode_timestep=0.05,
                decode_noise_scale=0.025, output_type="pt")


@pytest.fixture(scope="module")
def ltx_pair(tmp_path_factory):
    ref = ltx_reference("0.9.5")
    return ref, vae.diffusers.load(_file(ref, tmp_path_factory.mktemp("ltx") / "ltx-video-0.9.5_vae.safetensors"))


def test_ltx_pipeline(ltx_pair):
    ref, face = ltx_pair
    transformer = _ltx_transformer()
    make = lambda v: diffusers.LTXPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=v,  # noqa: E731
                                           text_encoder=None, tokenizer=None, transformer=transformer)
    a, b = _run_both(make, ref, face, **LTX_CALL)
    _assert_same(a, b)


def test_ltx_image_to_video_pipeline(ltx_pair):
    """The first frame's encode (latent_dist.sample(generator), normalised with the VAE's latents_mean/std)
    conditions every step: compared where it enters, then the video."""
    ref, face = ltx_pair
    transformer = _ltx_transformer()
    make = lambda v: diffusers.LTXImageToVideoPipeline(  # noqa: E731
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=v, text_encoder=None, tokenizer=None,
        transformer=transformer)
    image = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    _assert_same(*conditioned_both(make, ref, face, image, 1, LTX_LATENT, 64, 64, 9, torch.float32,
                                   torch.device("cpu")))
    a, b = _run_both(make, ref, face, image=image, **LTX_CALL)
    _assert_same(a, b)


def test_hunyuan_video_pipeline(tmp_path):
    ref = tiny_reference("hunyuan_video")
    face = vae.diffusers.load(_file(ref, tmp_path / "hunyuan_video_vae_bf16.safetensors"))
    torch.manual_seed(0)
    transformer = diffusers.HunyuanVideoTransformer3DModel(
        in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, text_embed_dim=16, pooled_projection_dim=8,
        rope_axes_dim=(2, 2, 4)).eval()
    make = lambda v: diffusers.HunyuanVideoPipeline(  # noqa: E731
        text_encoder=None, tokenizer=None, transformer=transformer, vae=v,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=None, tokenizer_2=None)
    a, b = _run_both(make, ref, face, prompt_embeds=torch.randn(1, 8, 16), pooled_prompt_embeds=torch.randn(1, 8),
                     prompt_attention_mask=torch.ones(1, 8), height=16, width=16, num_frames=5,
                     num_inference_steps=2, guidance_scale=1.0, output_type="pt")
    _assert_same(a, b)
