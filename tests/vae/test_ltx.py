"""LTX-Video VAE 0.9.0 / 0.9.1 / 0.9.5: parity with diffusers on tiny random models of each version's
structure, every key layout, version detection at the published sizes (meta device), the seeded
decode noise, and the causal encoder streaming chunk by chunk.

Conventions under test (ComfyUI's VideoVAE): encode = (posterior mean - mean_of_means) / std_of_means;
decode un-normalises first, so diffusers is called with z * latents_std + latents_mean.

Exception to "same weights, same output": diffusers' 0.9.1 decoder draws its injected noise from the
GLOBAL torch RNG. Our model draws it from a generator seeded with ltx.inject_seed(seed); the parity
test seeds the global RNG with that value right before diffusers' decode, so both draw the same fields."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import vae
from ltx_common import assert_encoder_streams, meta_state_dict, original_layout, randomize, script_rename, stats
from vae import registry
from vae.archs import ltx, ltx_layout

diffusers = pytest.importorskip("diffusers")

VERSIONS = ("0.9.0", "0.9.1", "0.9.5")
LATENT = 8
_DEC_091 = dict(decoder_spatio_temporal_scaling=(True,) * 3, upsample_residual=(True,) * 3,
                upsample_factor=(2, 2, 2), timestep_conditioning=True)
TINY = {
    "0.9.0": dict(block_out_channels=(8, 16, 32, 32), decoder_block_out_channels=(8, 16, 32, 32),
                  layers_per_block=(1,) * 5, decoder_layers_per_block=(1,) * 5),
    "0.9.1": dict(block_out_channels=(8, 16, 32, 32), layers_per_block=(1,) * 5,
                  decoder_block_out_channels=(16, 32, 64), decoder_layers_per_block=(1, 1, 1, 2),
                  decoder_inject_noise=(True, True, True, False), **_DEC_091),
    "0.9.5": dict(block_out_channels=(8, 16, 32, 64, 128), down_block_types=("LTXVideo095DownBlock3D",) * 4,
                  layers_per_block=(1,) * 5, spatio_temporal_scaling=(True,) * 4,
                  downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
                  decoder_block_out_channels=(16, 32, 64), decoder_layers_per_block=(1, 1, 1, 2),
                  decoder_inject_noise=(False,) * 4, spatial_compression_ratio=32, temporal_compression_ratio=8,
                  **_DEC_091),
}
# published configs (diffusers scripts/convert_ltx_to_diffusers.py); 0.9.7's VAE is 0.9.5's
PUBLISHED = {
    "0.9.0": dict(),
    "0.9.1": dict(decoder_block_out_channels=(256, 512, 1024), decoder_layers_per_block=(5, 6, 7, 8),
                  decoder_inject_noise=(True, True, True, False), **_DEC_091),
    "0.9.5": dict(block_out_channels=(128, 256, 512, 1024, 2048), down_block_types=("LTXVideo095DownBlock3D",) * 4,
                  layers_per_block=(4, 6, 6, 2, 2), spatio_temporal_scaling=(True,) * 4,
                  downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
                  decoder_block_out_channels=(256, 512, 1024), decoder_layers_per_block=(5, 5, 5, 5),
                  decoder_inject_noise=(False,) * 4, spatial_compression_ratio=32, temporal_compression_ratio=8,
                  **_DEC_091),
}
PARAMS = {"0.9.0": 419_193_649, "0.9.1": 934_976_434, "0.9.5": 1_246_913_522}   # diffusers' counts


def _tiny(version: str):
    torch.manual_seed(0)
    return randomize(diffusers.AutoencoderKLLTXVideo(latent_channels=LATENT, **TINY[version]), LATENT)


def zero_padded(v):
    """diffusers' decoder pads with zeros; ours pads with reflect by default, as ComfyUI does."""
    assert v.model.config.decoder_spatial_pad == "reflect"
    ltx.set_decoder_padding(v.model, "zeros")
    return v


@pytest.fixture(scope="module", params=VERSIONS)
def pair(request):
    ref = _tiny(request.param)
    return request.param, ref, zero_padded(vae.from_state_dict(ref.state_dict()))


def test_default_decoder_padding_is_comfyuis_reflect():
    """Reflect and zeros differ (at frame borders only, with real weights); zeros is diffusers'."""
    ref = _tiny("0.9.0")
    comfy = vae.from_state_dict(ref.state_dict())
    diff = zero_padded(vae.from_state_dict(ref.state_dict()))
    z = torch.randn(1, LATENT, 2, 2, 2)
    with torch.no_grad():
        ref_img = ref.decode(z * ref.latents_std.view(1, -1, 1, 1, 1) + ref.latents_mean.view(1, -1, 1, 1, 1)).sample
        assert (diff.model.decode(z) - ref_img).abs().max() <= 1e-5
        assert (comfy.model.decode(z) - ref_img).abs().max() > 1e-3


def test_decode_encode_match_diffusers(pair):
    version, ref, ours = pair
    conditioned = version != "0.9.0"
    assert ours.name.startswith(f"LTX-Video {version}") and ours.model.config.version == version
    caps = ours.caps
    assert (caps.latent_channels, caps.spatial_ratio, caps.temporal_ratio) == (LATENT, 32, 8)
    assert caps.norm == "rms" and not caps.has_attention and caps.causal_encoder and not caps.causal_decoder
    assert caps.decode_options == (("timestep", "noise_scale", "seed") if conditioned else ())
    mean, std = stats(ref)
    z = torch.randn(2, LATENT, 2, 2, 1)
    x = torch.rand(2, 3, 9, 64, 32) * 2 - 1
    t = torch.tensor([0.05, 0.4])
    with torch.no_grad():
        torch.manual_seed(ltx.inject_seed(7))        # see the module docstring (0.9.1 only)
        ref_img = ref.decode(z * std + mean, temb=t if conditioned else None).sample
        img = ours.model.decode(z, timestep=t, seed=7)
        ref_lat = (ref.encode(x).latent_dist.mode() - mean) / std
    assert img.shape == (2, 3, 9, 64, 32)                            # 1 + 8 (t - 1) frames
    assert (img - ref_img).abs().max() <= 1e-5
    assert (ours.model.encode(x) - ref_lat).abs().max() <= 1e-5
    # through the handle: 0..1 in and out, noise mix off (0.9.0 takes none of these: the handle refuses them)
    opts = ours.decode_options(dict(timestep=0.05, noise_scale=0.0, seed=7))
    with torch.no_grad():
        torch.manual_seed(ltx.inject_seed(7))
        ref_one = ref.decode(z[:1] * std + mean, temb=torch.tensor([0.05]) if conditioned else None).sample
    assert (ours.decode(z[:1], **opts) - ((ref_one + 1) / 2).clamp(0, 1)).abs().max() <= 1e-5
    assert (ours.encode((x + 1) / 2) - ref_lat).abs().max() <= 1e-5


def test_prepare_decode_is_comfyui_noise_mix_seeded(pair):
    version, _, ours = pair
    z = torch.randn(1, LATENT, 2, 1, 1)
    mixed = ours.model.prepare_decode(z, noise_scale=0.025, seed=5)
    if version == "0.9.0":            # ComfyUI mixes noise only into timestep-conditioned decoders
        assert mixed is z
        return
    noise = torch.randn(z.shape, generator=torch.Generator().manual_seed(5))
    assert torch.allclose(mixed, 0.975 * z + 0.025 * noise, atol=1e-6)
    assert torch.equal(ours.decode(z, seed=5), ours.decode(z, seed=5))        # decodes repeat
    assert not torch.equal(ours.decode(z, seed=5), ours.decode(z, seed=6))


def test_bf16_runs_close_to_fp32(pair):
    version, ref, ours = pair
    half = zero_padded(vae.from_state_dict(ref.state_dict(), dtype=torch.bfloat16))
    z, x = torch.randn(1, LATENT, 2, 2, 1), torch.rand(1, 3, 9, 64, 32)
    assert (half.decode(z) - ours.decode(z)).abs().max() <= 0.05       # pixels in 0..1
    assert (half.encode(x) - ours.encode(x)).abs().max() <= 0.05


def test_injected_noise_is_seeded():
    m = vae.from_state_dict(_tiny("0.9.1").state_dict()).model
    z = torch.randn(1, LATENT, 2, 1, 1)
    with torch.no_grad():
        a, b, c = (m.decode(z, seed=s) for s in (1, 1, 2))
    assert torch.equal(a, b) and (a - c).abs().max() > 1e-3


# ---- key layouts -----------------------------------------------------------------------------

# diffusers scripts/convert_ltx_to_diffusers.py: original -> diffusers renames (applied as str.replace
# in dict order), per version; 0.9.1 and 0.9.5 update the 0.9.0 table.
_SCRIPT_090 = {
    "up_blocks.0": "mid_block", "up_blocks.1": "up_blocks.0", "up_blocks.2": "up_blocks.1.upsamplers.0",
    "up_blocks.3": "up_blocks.1", "up_blocks.4": "up_blocks.2.conv_in", "up_blocks.5": "up_blocks.2.upsamplers.0",
    "up_blocks.6": "up_blocks.2", "up_blocks.7": "up_blocks.3.conv_in", "up_blocks.8": "up_blocks.3.upsamplers.0",
    "up_blocks.9": "up_blocks.3",
    "down_blocks.0": "down_blocks.0", "down_blocks.1": "down_blocks.0.downsamplers.0",
    "down_blocks.2": "down_blocks.0.conv_out", "down_blocks.3": "down_blocks.1",
    "down_blocks.4": "down_blocks.1.downsamplers.0", "down_blocks.5": "down_blocks.1.conv_out",
    "down_blocks.6": "down_blocks.2", "down_blocks.7": "down_blocks.2.downsamplers.0", "down_blocks.8": "down_blocks.3",
    "down_blocks.9": "mid_block",
    "conv_shortcut": "conv_shortcut.conv", "res_blocks": "resnets", "norm3.norm": "norm3",
    "per_channel_statistics.mean-of-means": "latents_mean", "per_channel_statistics.std-of-means": "latents_std",
}
_UP_091 = {"up_blocks.0": "mid_block", "up_blocks.1": "up_blocks.0.upsamplers.0", "up_blocks.2": "up_blocks.0",
           "up_blocks.3": "up_blocks.1.upsamplers.0", "up_blocks.4": "up_blocks.1",
           "up_blocks.5": "up_blocks.2.upsamplers.0", "up_blocks.6": "up_blocks.2",
           "up_blocks.7": "up_blocks.3.upsamplers.0", "up_blocks.8": "up_blocks.3",
           "last_time_embedder": "time_embedder", "last_scale_shift_table": "scale_shift_table"}
_DOWN_095 = {"down_blocks.0": "down_blocks.0", "down_blocks.1": "down_blocks.0.downsamplers.0",
             "down_blocks.2": "down_blocks.1", "down_blocks.3": "down_blocks.1.downsamplers.0",
             "down_blocks.4": "down_blocks.2", "down_blocks.5": "down_blocks.2.downsamplers.0",
             "down_blocks.6": "down_blocks.3", "down_blocks.7": "down_blocks.3.downsamplers.0",
             "down_blocks.8": "mid_block"}
SCRIPT = {"0.9.0": _SCRIPT_090, "0.9.1": {**_SCRIPT_090, **_UP_091},
          "0.9.5": {**_SCRIPT_090, **_UP_091, **_DOWN_095}}


def test_original_layout_is_what_diffusers_converts_from(pair):
    """Our canonical numbering, wrapped as the original, converts to diffusers' exact key set with
    the conversion script's own tables; ltx_layout.to_original writes the same layout."""
    version, ref, ours = pair
    original = original_layout(ours.state_dict())
    assert script_rename(original, SCRIPT[version]) == set(ref.state_dict())
    unused = {k for k in original if k.startswith(ltx_layout.STATS) and k not in (ltx_layout.MEAN, ltx_layout.STD)}
    assert set(ltx_layout.to_original(ours.state_dict())) == set(original) - unused


def test_every_layout_gives_identical_output(pair, tmp_path):
    """Every layout loads to the same config and the same canonical tensors; the single-file form,
    read from disk, decodes and encodes as the diffusers-loaded model does."""
    version, ref, ours = pair
    canonical = ours.state_dict()
    original = original_layout(canonical)
    transformer = {"model.diffusion_model.transformer_blocks.0.attn1.to_q.weight": torch.zeros(4, 4)}
    layouts = {
        "diffusers": ref.state_dict(),
        "canonical": canonical,
        "original": original,
        "single-file vae. prefix": {**transformer, **{f"vae.{k}": v for k, v in original.items()}},
        "diffusers vae. prefix": {**transformer, **{f"vae.{k}": v for k, v in ref.state_dict().items()}},
    }
    for name, sd in layouts.items():
        assert registry.detect(vae.loading.unwrap(sd)) is ltx.SPEC, name
        other = vae.from_state_dict(sd)
        assert other.name == ours.name and other.config == ours.config, name
        got = other.state_dict()
        assert set(got) == set(canonical) and all(torch.equal(got[k], v) for k, v in canonical.items()), name
    path = tmp_path / "ltxv.safetensors"
    save_file({k: v.contiguous() for k, v in layouts["single-file vae. prefix"].items()}, str(path))
    loaded = zero_padded(vae.load(path))
    z, x = torch.randn(1, LATENT, 2, 1, 1), torch.rand(1, 3, 9, 32, 32)
    # not bit-equal: memory-mapped weights may take other (unaligned) conv kernels
    seed = ours.decode_options(dict(seed=3))              # 0.9.0 draws no noise and takes no seed
    assert (loaded.decode(z, **seed) - ours.decode(z, **seed)).abs().max() <= 1e-5
    assert (loaded.encode(x) - ours.encode(x)).abs().max() <= 1e-5


@pytest.mark.parametrize("version", VERSIONS)
def test_published_configs_detected(version):
    sd = meta_state_dict(diffusers.AutoencoderKLLTXVideo, **PUBLISHED[version])
    assert ltx_layout.detect(sd)
    canonical = ltx.SPEC.to_canonical(sd)
    cfg = ltx.config_from_state_dict(canonical)
    assert cfg.version == version and cfg.latent_channels == 128
    with torch.device("meta"):
        model = ltx.LTXVideoVAE(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in canonical.items()}
    assert sum(v.numel() for v in model.state_dict().values()) == PARAMS[version] + 2 * 128
    caps = ltx.capabilities(cfg)
    assert (caps.spatial_ratio, caps.temporal_ratio, caps.default_tile_frames % 8, caps.default_overlap_frames % 8) \
        == (32, 8, 0, 0)
    # ComfyUI's rule (comfy/sd.py): width of the first decoder resnet, then a 0.9.5-only encoder key
    original = ltx_layout.to_original(canonical)
    comfy = {512: "0.9.0", 1024: "0.9.1"}[original["decoder.up_blocks.0.res_blocks.0.conv1.conv.weight"].shape[0]]
    if "encoder.down_blocks.1.conv.conv.bias" in original:
        comfy = "0.9.5"
    assert comfy == version
    for side in ("encoder", "decoder"):     # half files load as encoder- or decoder-only VAEs
        half = {k: v for k, v in canonical.items() if not k.startswith("decoder" if side == "encoder" else "encoder")}
        c = ltx.config_from_state_dict(half)
        caps = ltx.capabilities(c)
        assert (caps.can_encode, caps.can_decode) == (side == "encoder", side == "decoder")
        assert (caps.spatial_ratio, caps.temporal_ratio) == (32, 8)
        # the 0.9.1 encoder is 0.9.0's: an encoder-only file cannot tell them apart
        want = {"0.9.0": "0.9.0/0.9.1", "0.9.1": "0.9.0/0.9.1"}.get(version, version) if side == "encoder" else version
        assert c.version == want


def test_other_families_are_not_ltx():
    models = {
        "kl": (diffusers.AutoencoderKL, {}),
        "tiny": (diffusers.AutoencoderTiny, {}),
        "mochi": (diffusers.AutoencoderKLMochi, {}),
        "hunyuan": (diffusers.AutoencoderKLHunyuanVideo, {}),
        "magvit": (diffusers.AutoencoderKLMagvit, {}),
    }
    for name, (cls, kw) in models.items():
        sd = meta_state_dict(cls, **kw)
        assert not ltx_layout.detect(sd), name
        for spec in registry.REGISTRY:        # and their own canonical layouts
            if spec is not ltx.SPEC and spec.detect(sd):
                assert not ltx_layout.detect(spec.to_canonical(sd)), (name, spec.id)
    assert not ltx_layout.detect({"encoder.down.0.block.0.conv1.conv.weight": torch.zeros(1, 1, 3, 3, 3),
                                  "decoder.conv_in.conv.weight": torch.zeros(1, 1, 3, 3, 3)})


# ---- time ------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ("0.9.0", "0.9.5"))
def test_encoder_streams_chunk_by_chunk(version):
    """Causal encoder: 1 + 8 frames, then 8 at a time, give the latents of one pass."""
    assert_encoder_streams(vae.from_state_dict(_tiny(version).state_dict()).model)


def test_decoder_is_not_causal():
    m = vae.from_state_dict(_tiny("0.9.0").state_dict()).model
    z = torch.randn(1, LATENT, 3, 1, 1)
    late = z.clone()
    late[:, :, 2] += 1
    with torch.no_grad():
        a, b = m.decode(z), m.decode(late)
    assert (a[:, :, 0] - b[:, :, 0]).abs().max() > 0      # the last latent reaches the first frame


# ---- published sizes (slow) ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_published_config_matches_diffusers(version):
    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLLTXVideo(**PUBLISHED[version]).eval()
    ours = zero_padded(vae.from_state_dict(ref.state_dict()))
    z = torch.randn(1, 128, 3, 8, 8) if version == "0.9.0" else torch.randn(1, 128, 2, 4, 4)
    x = torch.rand(1, 3, 9, 64, 64) * 2 - 1
    t = torch.tensor([0.05]) if version != "0.9.0" else None
    with torch.no_grad():
        torch.manual_seed(ltx.inject_seed(0))
        ref_img = ref.decode(z, temb=t).sample
        img = ours.model.decode(z)
        ref_lat = ref.encode(x).latent_dist.mode()
        lat = ours.model.encode(x)
    assert (img - ref_img).abs().max() <= 1e-4
    assert (lat - ref_lat).abs().max() <= 1e-4
