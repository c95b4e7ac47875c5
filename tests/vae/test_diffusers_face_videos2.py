"""vae.diffusers' AutoencoderKLLTX2Video (LTX-2, LTX-2.3) and AutoencoderKLMagvit (EasyAnimate V5.1) against
diffusers' own classes on the same weights (tests/diffusers_face_common.py: decode, the posterior's
attributes and draws, forward, the config and the attributes pipelines read), what each refuses by name,
and each in its diffusers pipeline: LTX2Pipeline, LTX2ImageToVideoPipeline and EasyAnimatePipeline with
tiny random components, run once with diffusers' VAE and once with the face, the VAE's part compared."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import vae
from diffusers_face_common import (assert_decode_equal, assert_posterior_equal, close, conditioned_both,
                                   config_differences, pixels, run_both, same, save)
from ltx_common import LTX2_LATENT, ltx2_metadata, ltx2_reference
from video_families import tiny_reference
from vae.errors import InputError, LoadError

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

MAGVIT_LATENT = 16
# name -> (diffusers model, how the face is loaded: a file name or "folder", pixels, latent)
CASES = {
    "ltx-2.0": (lambda: ltx2_reference("2.0"), "ltx-2-19b_video_vae.safetensors", (2, 3, 9, 64, 96),
                (2, LTX2_LATENT, 2, 2, 3)),
    "ltx-2.3": (lambda: ltx2_reference("2.3"), "folder", (1, 3, 9, 64, 64), (2, LTX2_LATENT, 2, 2, 3)),
    # a timestep-conditioned decoder: 0.9.5's shapes, told apart by the folder's config.json
    "ltx-2.0t": (lambda: ltx2_reference("2.0t"), "folder", (2, 3, 9, 96, 64), (2, LTX2_LATENT, 2, 3, 2)),
    "magvit": (lambda: tiny_reference("magvit"), "folder", (2, 3, 9, 16, 24), (2, MAGVIT_LATENT, 3, 2, 3)),
    "magvit-file": (lambda: tiny_reference("magvit"), "easyanimate_v5.1_vae.safetensors", (1, 3, 5, 16, 16),
                    (1, MAGVIT_LATENT, 2, 2, 2)),
}


def _temb(ref, batch: int) -> tuple:
    """A decode timestep per item where the decoder is conditioned on one (as the LTX pipelines pass it)."""
    return (torch.linspace(0.05, 0.5, batch),) if ref.config.get("timestep_conditioning") else ()


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    make, how, px, lat = CASES[request.param]
    ref = make().eval()
    return request.param, ref, save(ref, how, tmp_path_factory.mktemp(request.param)), px, lat


def test_decode_and_encode_equal_the_diffusers_class(case):
    name, ref, path, px, lat = case
    face = vae.diffusers.load(path)
    assert face.config["_class_name"] == type(ref).__name__
    z = torch.randn(lat, generator=torch.Generator().manual_seed(1))
    dec = assert_decode_equal(face, ref, z, *_temb(ref, lat[0]))
    enc = assert_posterior_equal(face, ref, pixels(px))
    print(f"{name}: decode max abs {dec:.1e}, posterior {enc:.1e} (diffusers' {type(ref).__name__}, same weights)")


def test_config_and_forward_equal_the_diffusers_class(case):
    """The config keys and values, the buffers and ratios pipelines read, and forward (posterior draw or mode,
    then decode) as the class's."""
    name, ref, path, px, _ = case
    face = vae.diffusers.load(path)
    assert not config_differences(face, ref)
    assert (face.spatial_compression_ratio, face.temporal_compression_ratio) == \
           (ref.spatial_compression_ratio, ref.temporal_compression_ratio)
    buffers = dict(ref.named_buffers())
    for buffer in ("latents_mean", "latents_std"):         # LTX-2 pipelines (de)normalise with them
        if buffer in buffers:
            assert torch.equal(getattr(face, buffer), buffers[buffer])
    x, temb = pixels(px), _temb(ref, px[0])
    for draw in (True, False):
        kw = lambda: dict(sample_posterior=draw, generator=torch.Generator().manual_seed(5))  # noqa: E731
        with torch.no_grad():
            want = ref(x, *temb, **kw()).sample
        close(face(x, *temb, **kw()).sample, want)


def test_ltx2_causal_inputs(tmp_path):
    """``causal`` as the class takes it (``causal or is_causal``): the causal encoder whatever it says; the
    non-causal decoder as published unless asked to run causally, which is refused by name; a decoder its
    file's metadata calls causal takes causal=True. forward routes encoder_causal / decoder_causal alike."""
    ref = ltx2_reference("2.3")
    face = vae.diffusers.load(save(ref, "ltx-2.3_vae.safetensors", tmp_path))
    x, z = pixels((1, 3, 9, 32, 32)), torch.randn(1, LTX2_LATENT, 2, 1, 1)
    with torch.no_grad():
        for causal in (None, False, True):
            close(face.encode(x, causal).latent_dist.mean, ref.encode(x, causal).latent_dist.mean)
        want = ref.decode(z).sample
        close(face.decode(z, None, False).sample, want)
        close(face(x, encoder_causal=True, decoder_causal=False).sample, ref(x, encoder_causal=True).sample)
    for call in (lambda: face.decode(z, causal=True), lambda: face.decode(z, None, True),
                 lambda: face(x, decoder_causal=True)):
        with pytest.raises(InputError, match="causal=True") as e:
            call()
        assert e.value.input == "causal"
    causal_ref = ltx2_reference("2.3", decoder_causal=True)
    path = tmp_path / "ltx-2.3_causal.safetensors"
    save_file({k: v.contiguous() for k, v in causal_ref.state_dict().items()}, str(path),
              metadata=ltx2_metadata({"causal_decoder": True}))
    causal = vae.diffusers.load(path)
    assert causal.config.decoder_causal
    with torch.no_grad():
        close(causal.decode(z, causal=True).sample, causal_ref.decode(z, causal=True).sample)


def test_a_conditioned_ltx2_decoder_is_told_from_095_by_name_or_metadata(tmp_path):
    """Its weights are 0.9.5's shapes: an LTX-2 file name, or the checkpoint's metadata, makes it this class;
    an LTX-Video name (``2b`` is not ``2-``) the 0.9.x one."""
    sd = {k: v.contiguous() for k, v in ltx2_reference("2.0t").state_dict().items()}
    for name, metadata, cls in (("ltx-2-19b_vae.safetensors", None, "AutoencoderKLLTX2Video"),
                                ("vae.safetensors", ltx2_metadata({}), "AutoencoderKLLTX2Video"),
                                ("ltx-video-2b-v0.9.5_vae.safetensors", None, "AutoencoderKLLTXVideo")):
        save_file(sd, str(tmp_path / name), metadata=metadata)
        assert vae.diffusers.load(tmp_path / name).config["_class_name"] == cls, name


def test_ltx2_refusals(tmp_path):
    """A conditioned decoder without its timestep; keywords the class does not take; a config.json whose
    settings the weights' model does not run (diffusers' default causal decoder, another padding)."""
    ref = ltx2_reference("2.0t")
    face = vae.diffusers.load(save(ref, "folder", tmp_path / "t"))
    z = torch.randn(1, LTX2_LATENT, 2, 1, 1)
    with pytest.raises(InputError, match="temb"):
        face.decode(z)
    with pytest.raises(InputError, match="'generator'"):
        face.decode(z, torch.tensor([0.05]), generator=torch.Generator())
    with pytest.raises(InputError, match="'tiling'"):
        face.encode(pixels((1, 3, 1, 32, 32)), tiling=True)
    plain = ltx2_reference("2.0")
    published = dict(plain.config)
    for key, value in (("decoder_causal", True), ("decoder_spatial_padding_mode", "zeros"), ("encoder_causal", False)):
        plain.register_to_config(**{key: value})
        with pytest.raises(LoadError, match=f"{key}={value!r}"):
            vae.diffusers.load(save(plain, "folder", tmp_path / key))
        plain.register_to_config(**{key: published[key]})


def _v5_state_dict(ref) -> dict:
    """``ref``'s weights with EasyAnimate V5's mid-block attention added (keys as V5 files hold them)."""
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    c = ref.config.block_out_channels[-1]
    for side in ("encoder", "decoder"):
        p = f"{side}.mid_block.attentions.0."
        sd.update({p + "group_norm.weight": torch.ones(c), p + "group_norm.bias": torch.zeros(c)})
        for proj in ("to_q", "to_k", "to_v", "to_out"):
            sd.update({f"{p}{proj}.weight": torch.randn(c, c) / c, f"{p}{proj}.bias": torch.zeros(c)})
    return sd


def test_magvit_refusals(tmp_path):
    """V5's mid-block attention (diffusers' class drops it); a config.json the model does not run; a decode
    keyword the class does not take."""
    ref = diffusers.AutoencoderKLMagvit(block_out_channels=(32, 32, 32, 32), layers_per_block=2).eval()
    path = tmp_path / "easyanimate_v5_vae.safetensors"
    save_file(_v5_state_dict(ref), str(path))
    assert vae.load(path).model.config.mid_attention       # our handle keeps it
    with pytest.raises(LoadError, match="V5's mid-block attention"):
        vae.diffusers.load(path)
    ref.register_to_config(spatial_group_norm=False)
    with pytest.raises(LoadError, match="spatial_group_norm=False"):
        vae.diffusers.load(save(ref, "folder", tmp_path))
    face = vae.diffusers.load(save(tiny_reference("magvit"), "easyanimate_vae.safetensors", tmp_path))
    with pytest.raises(InputError, match="'generator'"):
        face.decode(torch.randn(1, MAGVIT_LATENT, 1, 1, 1), generator=torch.Generator())


# ---- in diffusers' pipelines ------------------------------------------------------------------------
def _ltx2_parts():
    """LTX-2's transformer, text connectors, audio VAE and vocoder, tiny (prompt embeddings given: no Gemma)."""
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    torch.manual_seed(0)
    transformer = diffusers.LTX2VideoTransformer3DModel(
        in_channels=LTX2_LATENT, out_channels=LTX2_LATENT, patch_size=1, patch_size_t=1, num_attention_heads=2,
        attention_head_dim=8, cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4,
        audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=1,
        qk_norm="rms_norm_across_heads", caption_channels=32, rope_double_precision=False, rope_type="split").eval()
    connectors = LTX2TextConnectors(
        caption_channels=32, text_proj_in_factor=2, video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_theta=10000.0,
        rope_double_precision=False, causal_temporal_positioning=False, rope_type="split").eval()
    audio_vae = diffusers.AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
        resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8).eval()
    vocoder = LTX2Vocoder(in_channels=16, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
                          upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
                          leaky_relu_negative_slope=0.1, output_sampling_rate=16000).eval()
    return dict(transformer=transformer, connectors=connectors, audio_vae=audio_vae, vocoder=vocoder,
                text_encoder=None, tokenizer=None)


# guidance off (one transformer pass a step); the decode timestep and noise reach the conditioned decoder
LTX2_CALL = dict(prompt_embeds=torch.randn(1, 8, 64, generator=torch.Generator().manual_seed(1)),
                 prompt_attention_mask=torch.ones(1, 8), height=64, width=64, num_frames=9, num_inference_steps=2,
                 guidance_scale=1.0, stg_scale=0.0, modality_scale=1.0, audio_guidance_scale=1.0, audio_stg_scale=0.0,
                 audio_modality_scale=1.0, decode_timestep=0.05, decode_noise_scale=0.025, output_type="pt")


@pytest.fixture(scope="module")
def ltx2_pair(tmp_path_factory):
    ref = ltx2_reference("2.0t")
    return ref, vae.diffusers.load(save(ref, "folder", tmp_path_factory.mktemp("ltx2"))), _ltx2_parts()


def test_ltx2_pipeline(ltx2_pair):
    ref, face, parts = ltx2_pair
    make = lambda v: diffusers.LTX2Pipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=v,  # noqa: E731
                                            **parts)
    a, b = run_both(make, ref, face, **LTX2_CALL)
    print(f"LTX2Pipeline: video max abs {same(a, b):.1e} (diffusers' VAE vs the face)")


def test_ltx2_image_to_video_pipeline(ltx2_pair):
    """The first frame's encode (latent_dist mode, normalised with the VAE's latents_mean/std) conditions
    every step: compared where it enters, then the video. ``image_crf=0``: no H.264 round trip."""
    ref, face, parts = ltx2_pair
    make = lambda v: diffusers.LTX2ImageToVideoPipeline(  # noqa: E731
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=v, **parts)
    image = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    same(*conditioned_both(make, ref, face, image, 1, LTX2_LATENT, 64, 64, 9, 0.0, torch.float32,
                           torch.device("cpu")))
    a, b = run_both(make, ref, face, image=image, image_crf=0, **LTX2_CALL)
    print(f"LTX2ImageToVideoPipeline: video max abs {same(a, b):.1e}")


def test_easyanimate_pipeline(tmp_path):
    ref = tiny_reference("magvit")
    face = vae.diffusers.load(save(ref, "folder", tmp_path))
    torch.manual_seed(0)
    transformer = diffusers.EasyAnimateTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=MAGVIT_LATENT, out_channels=MAGVIT_LATENT,
        time_embed_dim=2, text_embed_dim=16, num_layers=1, sample_width=16, sample_height=16, patch_size=2).eval()
    make = lambda v: diffusers.EasyAnimatePipeline(  # noqa: E731
        vae=v, text_encoder=None, tokenizer=None, transformer=transformer,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler())
    a, b = run_both(make, ref, face, prompt_embeds=torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(1)),
                    prompt_attention_mask=torch.ones(1, 8), height=16, width=16, num_frames=5, num_inference_steps=2,
                    guidance_scale=1.0, output_type="pt")
    print(f"EasyAnimatePipeline: video max abs {same(a, b):.1e}")
