"""Wan 2.1 and Wan 2.2 VAEs: parity with diffusers' AutoencoderKLWan (its chunked, cached definition) on
random weights, frame-wise and exact-mode streaming against one pass, every key layout (Wan's original =
ComfyUI's files, checked against diffusers' own converter; diffusers), variants read from the weights
(RGBA, pruned widths, encoder/decoder only), detection across families."""
from __future__ import annotations


import pytest
import torch

import vae
from helpers import assert_layouts_agree
from vae import registry, run
from vae.archs import wan, wan_layout

diffusers = pytest.importorskip("diffusers")

pytestmark = pytest.mark.usefixtures("one_thread")

# The published structure (4 levels, 2 resnets, temporal down in levels 1-2), narrow widths
TINY = {"2.1": dict(base_dim=8, z_dim=16),
        "2.2": dict(base_dim=8, decoder_base_dim=12, z_dim=12, is_residual=True, patch_size=2, in_channels=12,
                    out_channels=12, scale_factor_spatial=16)}
PUBLISHED = {"2.1": {}, "2.2": dict(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, patch_size=2,
                                    in_channels=12, out_channels=12, scale_factor_spatial=16)}


def reference(version: str = "2.1", published: bool = False, **over) -> torch.nn.Module:
    torch.manual_seed(0)
    m = diffusers.AutoencoderKLWan(**{**(PUBLISHED if published else TINY)[version], **over}).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():          # RMS gammas off 1, so the parity checks them too
        for name, p in m.named_parameters():
            if name.endswith("gamma"):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return m


@pytest.fixture(scope="module", params=["2.1", "2.2"])
def pair(request):
    ref = reference(request.param)
    return request.param, ref, vae.from_state_dict(ref.state_dict())


def pixels(y: torch.Tensor) -> torch.Tensor:
    return (y.clamp(-1, 1) + 1) / 2


@pytest.mark.parametrize("t", [1, 2, 4])
def test_decode_matches_diffusers(pair, t):
    version, ref, ours = pair
    z = torch.randn(1, ref.config.z_dim, t, 3, 5)
    with torch.no_grad():
        want = pixels(ref.decode(z).sample)
    got = ours.decode(z)                      # the handle streams one latent frame at a time, as Wan does
    assert got.shape == want.shape == (1, 3, 1 + 4 * (t - 1), 3 * ours.caps.spatial_ratio, 5 * ours.caps.spatial_ratio)
    assert (got - want).abs().max() <= 1e-5
    with torch.no_grad():                     # and so does one pass of the model's own forward
        assert (pixels(ours.model.decode(z)) - want).abs().max() <= 1e-5


@pytest.mark.parametrize("frames", [1, 5, 13])
def test_encode_matches_diffusers(pair, frames):
    version, ref, ours = pair
    s = ours.caps.spatial_ratio
    x = torch.rand(1, 3, frames, 2 * s, 3 * s)
    with torch.no_grad():
        want = ref.encode(x * 2 - 1).latent_dist.mode()
    got = ours.encode(x)
    assert got.shape == want.shape == (1, ref.config.z_dim, 1 + (frames - 1) // 4, 2, 3)
    assert (got - want).abs().max() <= 1e-5


def test_capabilities_and_description():
    v21 = vae.from_state_dict(reference("2.1").state_dict())
    v22 = vae.from_state_dict(reference("2.2").state_dict())
    assert (v21.caps.latent_channels, v21.caps.spatial_ratio, v21.caps.temporal_ratio) == (16, 8, 4)
    assert (v22.caps.latent_channels, v22.caps.spatial_ratio, v22.caps.temporal_ratio) == (12, 16, 4)
    for v in (v21, v22):
        assert v.caps.stream_decode and v.caps.stream_encode and v.caps.stream_chunk == 1
        assert v.caps.causal_decoder and v.caps.causal_encoder and v.caps.norm == "rms"
    assert v21.name.startswith("Wan 2.1 VAE") and v22.name.startswith("Wan 2.2 VAE")


# ---- streaming and exact mode: equal to one pass -----------------------------------------------

@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_framewise_equals_one_pass(pair, chunk):
    _, _, ours = pair
    z = torch.randn(1, ours.caps.latent_channels, 5, 3, 4)
    with torch.no_grad():
        whole = pixels(ours.model.decode(z))
    assert (ours.decode(z, tile_frames=4 * chunk) - whole).abs().max() <= 1e-5
    s = ours.caps.spatial_ratio
    x = torch.rand(1, 3, 17, 2 * s, 2 * s)
    with torch.no_grad():
        whole = ours.model.encode(x * 2 - 1)
    assert (ours.encode(x, tile_frames=4 * chunk) - whole).abs().max() <= 1e-5


@pytest.mark.parametrize("chunk", [1, 3])
def test_exact_tiles_stream_time_and_equal_one_pass(pair, chunk):
    """2x2 spatial tiles, each streamed chunk by chunk through its own caches (the attention runs on
    each chunk's assembled latent), against the model's one pass; fast tiles are visibly off."""
    _, _, ours = pair
    s = ours.caps.spatial_ratio
    z = torch.randn(1, ours.caps.latent_channels, 4, 6, 5)
    with torch.no_grad():
        whole = pixels(ours.model.decode(z))
    steps = []
    out = ours.decode(z, tile=3 * s, tile_frames=4 * chunk, mode="exact", progress=lambda d, n: steps.append(n))
    assert steps and (out - whole).abs().max() <= 1e-5
    assert (ours.decode(z, tile=3 * s, overlap=s, tile_frames=4 * chunk) - whole).abs().max() > 1e-3
    x = torch.rand(1, 3, 9, 6 * s, 5 * s)
    with torch.no_grad():
        whole = ours.model.encode(x * 2 - 1)
    assert (ours.encode(x, tile=3 * s, tile_frames=4 * chunk, mode="exact") - whole).abs().max() <= 1e-5


def test_streams_hold_their_state_in_the_call(pair):
    """Chunks through the model itself: the caches live in the stream's memory, nothing on modules."""
    _, _, ours = pair
    m = ours.model
    z = torch.randn(1, ours.caps.latent_channels, 4, 2, 3)
    with torch.no_grad():
        whole = m.decode(z)
        with run.stream() as state:
            parts = [m.decode(z[:, :, a:b]) for a, b in ((0, 1), (1, 3), (3, 4))]
        assert state.memory                   # the caches were the stream's
    assert [p.shape[2] for p in parts] == [1, 8, 4]
    assert (torch.cat(parts, 2) - whole).abs().max() <= 1e-5


# ---- layouts ------------------------------------------------------------------------------------

def original_layout(canonical: dict, version: str) -> dict:
    """Our canonical names -> Wan's original names (= ComfyUI's single files); checked below against
    diffusers' own single-file converter (2.1) and ComfyUI's published key names and shapes."""
    return wan_layout.to_original(canonical, nested=version == "2.2")


def test_original_layout_is_what_diffusers_converts():
    """diffusers' converter (Wan's original single files -> AutoencoderKLWan, 2.1 only) maps the
    original layout built here back to diffusers' own state dict, key for key and bit for bit."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
    ref = reference("2.1")
    sd = ref.state_dict()
    original = original_layout(wan.SPEC.to_canonical(sd), "2.1")
    assert "decoder.middle.0.residual.0.gamma" in original and "encoder.downsamples.5.time_conv.weight" in original
    back = convert_wan_vae_to_diffusers(original)
    assert back.keys() == sd.keys()
    assert all(torch.equal(back[k], sd[k]) for k in sd)


@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_every_layout_gives_identical_output(version, tmp_path):
    # weights that bf16 holds exactly, so a bf16 file (Wan2_1_VAE_bf16) must give the same output
    sd = {k: v.to(torch.bfloat16).float().contiguous() for k, v in reference(version).state_dict().items()}
    original = original_layout(wan.SPEC.to_canonical(sd), version)
    layouts = {"diffusers": sd, "original-comfyui": original,
               "checkpoint-vae-prefix": {f"vae.{k}": v for k, v in original.items()},
               "bf16-file": {k: v.to(torch.bfloat16) for k, v in original.items()},
               "wrapped-pickle": {"state_dict": original}}
    z = torch.randn(1, sd["decoder.conv_in.weight"].shape[1], 2, 2, 3)
    assert_layouts_agree(layouts, tmp_path, "wan", lambda v: v.decode(z))


def test_published_configs_are_read_from_shapes():
    for version, n_keys in (("2.1", 194), ("2.2", 196)):
        with torch.device("meta"):
            sd = reference(version, published=True).state_dict()
        original = original_layout(wan.SPEC.to_canonical(sd), version)
        assert len(original) == n_keys            # ComfyUI's file has 194 (2.1) / 196 (2.2) tensors
        for layout in (sd, original):
            assert registry.detect(layout) is wan.SPEC
            cfg = wan.SPEC.config_from_state_dict(wan.SPEC.to_canonical(layout))
            caps = wan.capabilities(cfg)
            if version == "2.1":
                assert cfg.enc_widths == (96, 192, 384, 384) and cfg.dec_widths == (96, 192, 384, 384)
                assert cfg.dec_up == (0, 96, 192, 192) and not cfg.residual and cfg.patch == 1
                assert (caps.latent_channels, caps.spatial_ratio) == (16, 8)
            else:
                assert cfg.enc_widths == (160, 320, 640, 640) and cfg.dec_widths == (256, 512, 1024, 1024)
                assert cfg.residual and cfg.patch == 2 and (caps.latent_channels, caps.spatial_ratio) == (48, 16)
            assert cfg.temporal == (False, True, True) and caps.temporal_ratio == 4


def test_comfyui_key_names_and_shapes():
    """Representative keys of ComfyUI's own files (comfy/ldm/wan/vae.py, vae2_2.py module trees)."""
    with torch.device("meta"):
        o21 = original_layout(wan.SPEC.to_canonical(reference("2.1", published=True).state_dict()), "2.1")
        o22 = original_layout(wan.SPEC.to_canonical(reference("2.2", published=True).state_dict()), "2.2")
    expect = [(o21, "encoder.conv1.weight", (96, 3, 3, 3, 3)), (o21, "encoder.downsamples.3.shortcut.weight", (192, 96, 1, 1, 1)),
              (o21, "encoder.downsamples.5.resample.1.weight", (192, 192, 3, 3)),
              (o21, "encoder.downsamples.5.time_conv.weight", (192, 192, 3, 1, 1)),
              (o21, "encoder.middle.1.to_qkv.weight", (1152, 384, 1, 1)), (o21, "encoder.head.2.weight", (32, 384, 3, 3, 3)),
              (o21, "conv1.weight", (32, 32, 1, 1, 1)), (o21, "conv2.weight", (16, 16, 1, 1, 1)),
              (o21, "decoder.middle.0.residual.0.gamma", (384, 1, 1, 1)), (o21, "decoder.head.0.gamma", (96, 1, 1, 1)),
              (o22, "encoder.conv1.weight", (160, 12, 3, 3, 3)),
              (o22, "encoder.downsamples.1.downsamples.2.time_conv.weight", (320, 320, 3, 1, 1)),
              (o22, "encoder.middle.1.to_qkv.weight", (1920, 640, 1, 1)), (o22, "encoder.head.2.weight", (96, 640, 3, 3, 3)),
              (o22, "conv1.weight", (96, 96, 1, 1, 1)), (o22, "conv2.weight", (48, 48, 1, 1, 1)),
              (o22, "decoder.conv1.weight", (1024, 48, 3, 3, 3)),
              (o22, "decoder.upsamples.0.upsamples.3.time_conv.weight", (2048, 1024, 3, 1, 1)),
              (o22, "decoder.head.0.gamma", (256, 1, 1, 1))]
    for sd, key, shape in expect:
        assert tuple(sd[key].shape) == shape, key
    assert "encoder.downsamples.0.downsamples.2.resample.1.weight" in o22
    assert "decoder.upsamples.0.upsamples.0.residual.2.weight" in o22        # ComfyUI's Wan 2.2 detection key


# ---- variants -----------------------------------------------------------------------------------

def test_rgba_variant():
    """Qwen-Image-Layered / Wan-Alpha: 4 image channels, read from the convs."""
    ref = reference("2.1", in_channels=4, out_channels=4)
    v = vae.from_state_dict(ref.state_dict())
    assert v.caps.image_channels == 4 and "4 image channels" in v.name
    z = torch.randn(1, 16, 2, 2, 3)
    with torch.no_grad():
        want = pixels(ref.decode(z).sample)
    assert v.decode(z).shape[1] == 4 and (v.decode(z) - want).abs().max() <= 1e-5


def test_pruned_widths_and_single_halves():
    """Every width from the weights (a narrower, lightvae-like model), and encoder- or decoder-only files."""
    ref = reference("2.1", base_dim=4)
    sd = ref.state_dict()
    v = vae.from_state_dict(sd)
    z = torch.randn(1, 16, 2, 2, 2)
    with torch.no_grad():
        assert (v.decode(z) - pixels(ref.decode(z).sample)).abs().max() <= 1e-5
    dec = vae.from_state_dict({k: t for k, t in sd.items() if k.startswith(("decoder.", "post_quant_conv."))})
    enc = vae.from_state_dict({k: t for k, t in sd.items() if k.startswith(("encoder.", "quant_conv."))})
    assert dec.caps.can_decode and not dec.caps.can_encode and "decoder only" in dec.name
    assert enc.caps.can_encode and not enc.caps.can_decode
    assert torch.equal(dec.decode(z), v.decode(z))
    x = torch.rand(1, 3, 5, 16, 16)
    assert torch.equal(enc.encode(x), v.encode(x))
    enc22 = vae.from_state_dict({k: t for k, t in reference("2.2").state_dict().items()
                                 if k.startswith(("encoder.", "quant_conv."))})
    assert enc22.caps.spatial_ratio == 16 and enc22.config.residual      # patches tell an encoder-only 2.2


def test_frame_counts_are_checked(caplog):
    """A clip off the 1 + 4k rule is encoded as core does (its first 1 + 4k frames), with a warning."""
    v = vae.from_state_dict(reference("2.1").state_dict())
    x = torch.rand(1, 3, 7, 16, 16)
    with caplog.at_level("WARNING"):
        assert torch.equal(v.encode(x), v.encode(x[:, :, :5]))
    assert "the clip has 7 frames" in caplog.text and "5 or 9 frames fit" in caplog.text


# ---- detection ----------------------------------------------------------------------------------

def test_no_other_family_claims_wan_and_wan_claims_no_other():
    from video_families import FAMILIES, tiny_state_dict
    from helpers import diffusers_kl
    sd = reference("2.1").state_dict()
    for layout in (sd, original_layout(wan.SPEC.to_canonical(sd), "2.1"), wan.SPEC.to_canonical(sd)):
        assert [s.id for s in registry.REGISTRY if s.detect(layout)] == ["wan"]
    others = [tiny_state_dict(f) for f in FAMILIES if f != "wan"] + [diffusers_kl().state_dict()]
    for other in others:
        assert not wan.SPEC.detect(other)


# ---- published configs (slow) -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_published_config_parity_streaming_and_exact(version):
    ref = reference(version, published=True)
    v = vae.from_state_dict(ref.state_dict())
    s = v.caps.spatial_ratio
    z = torch.randn(1, v.caps.latent_channels, 3, 4, 6)
    with torch.no_grad():
        want = pixels(ref.decode(z).sample)
        whole = pixels(v.model.decode(z))
    assert (v.decode(z) - want).abs().max() <= 1e-4 and (whole - want).abs().max() <= 1e-4
    assert (v.decode(z, tile_frames=8) - whole).abs().max() <= 1e-4
    assert (v.decode(z, tile=3 * s, tile_frames=4, mode="exact") - whole).abs().max() <= 1e-4
    x = torch.rand(1, 3, 5, 4 * s, 6 * s)
    with torch.no_grad():
        want = ref.encode(x * 2 - 1).latent_dist.mode()
    assert (v.encode(x) - want).abs().max() <= 1e-4
    assert (v.encode(x, tile=3 * s, mode="exact") - want).abs().max() <= 1e-4


def test_half_precision_overflow_is_recomputed(caplog):
    """The NaN guard on Wan's default path (streamed one latent frame at a time): an fp16 overflow
    replays the stream upcast and the result is the fp32 one."""
    sd = {k: v * 1e6 if k.startswith("decoder.conv_in") else v for k, v in reference("2.1").state_dict().items()}
    v32, v16 = vae.from_state_dict(sd), vae.from_state_dict(sd, dtype=torch.float16)
    z = torch.randn(1, 16, 3, 2, 2)
    with caplog.at_level("WARNING", logger="VAEKit"):
        out = v16.decode(z)
    assert v16.last_upcast.tiles and v16.last_upcast.streamed
    assert torch.isfinite(out).all() and (out - v32.decode(z)).abs().max() <= 1e-2
