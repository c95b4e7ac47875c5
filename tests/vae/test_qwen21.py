"""Qwen-Image 2.1's VAE (the Wan family's image variant: Wan 2.2's network with a temporal kernel of 1,
5 levels, 64 latent channels, 16x, RGBA): parity with diffusers' AutoencoderKLQwenImage21 on random
weights (decode and encode, batches of images), what core's VAE nodes read from it (an image VAE:
4-D LATENTs, an IMAGE batch is N images, RGB padded with opaque alpha), every key layout (ComfyUI's
file with its 5-D convs of time size 1, diffusers' 2-D ones) and the template's file name, detection
across families, exact and fast tiles, the NaN guard, fused q/k/v under Compile VAE."""
from __future__ import annotations

import logging
import os

import pytest
import torch

import vae
from helpers import assert_layouts_agree, diffusers_qwen21
from vae import registry
from vae.archs import wan, wan_layout

diffusers = pytest.importorskip("diffusers")

pytestmark = pytest.mark.usefixtures("one_thread")

TEMPLATE_FILE = "qwen_image_2.1_vae_bf16.safetensors"   # what the 5 official Qwen-Image 2.1 templates load


def reference(published: bool = False, **over) -> torch.nn.Module:
    return diffusers_qwen21(published, **over)


@pytest.fixture(scope="module")
def pair():
    ref = reference()
    return ref, vae.from_state_dict(ref.state_dict())


def ref_decode(ref, z: torch.Tensor) -> torch.Tensor:
    """diffusers on one-frame clips (its definition), as 0..1 pixels."""
    with torch.no_grad():
        return (ref.decode(z.unsqueeze(2)).sample.squeeze(2) + 1) / 2


def ref_encode(ref, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref.encode((x * 2 - 1).unsqueeze(2)).latent_dist.mode().squeeze(2)


def comfy_layout(sd: dict) -> dict:
    """ComfyUI's file: Wan 2.2's original names, causal convs 5-D with time size 1."""
    return wan_layout.to_original(wan.SPEC.to_canonical(sd), nested=True)


# ---- parity -------------------------------------------------------------------------------------

def test_decode_matches_diffusers(pair):
    ref, ours = pair
    z = torch.randn(2, 64, 3, 5)
    want = ref_decode(ref, z)
    got = ours.decode(z)
    assert got.shape == want.shape == (2, 4, 48, 80)
    assert (got - want).abs().max() <= 1e-5
    assert torch.equal(ours.decode(z.unsqueeze(2)), got)      # a one-frame 5-D latent is the same image


def test_encode_matches_diffusers_and_pads_rgb_with_opaque_alpha(pair):
    ref, ours = pair
    x = torch.rand(2, 4, 32, 48)
    want = ref_encode(ref, x)
    got = ours.encode(x)
    assert got.shape == want.shape == (2, 64, 2, 3)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    rgb = x[:, :3]
    assert torch.equal(ours.encode(rgb), ours.encode(torch.cat([rgb, torch.ones_like(x[:, :1])], 1)))


def test_capabilities_and_description(pair):
    _, v = pair
    caps = v.caps
    assert not v.is_video and caps.temporal_ratio is None and not (caps.stream_decode or caps.stream_encode)
    assert (caps.latent_channels, caps.spatial_ratio, caps.image_channels) == (64, 16, 4)
    assert caps.has_attention and caps.norm == "rms" and torch.float16 in caps.working_dtypes
    assert v.name == "Qwen-Image 2.1 VAE (64 latent channels, 4 image channels)"
    assert v.config.image and v.config.residual and v.config.patch == 1
    assert v.config.temporal == (False, True, True, True)


# ---- what core's VAE nodes see ------------------------------------------------------------------

def test_core_nodes_see_an_image_vae(pack):
    """As core's Qwen-Image 2.1 branch: latent_dim 2, 64 channels, 16x, RGBA out; VAE Encode takes an
    IMAGE batch as N images (not a clip), RGB padded with alpha 1, sides centre-cropped to 16."""
    from vaekit.nodes.socket import VAEKitVAE
    v = VAEKitVAE(pack.vae.from_state_dict(reference().state_dict()))
    assert v.latent_dim == 2 and v.not_video and v.latent_channels == 64 and v.output_channels == 4
    assert v.downscale_ratio == v.upscale_ratio == v.spacial_compression_encode() == 16
    assert v.temporal_compression_decode() is None
    images = torch.rand(3, 40, 52, 3)                      # three images, sides not multiples of 16
    z = v.encode(images)
    assert z.shape == (3, 64, 2, 3)
    crop = images[:, 4:36, 2:50].movedim(-1, 1)
    assert torch.equal(z, v.handle.encode(torch.cat([crop, torch.ones_like(crop[:, :1])], 1)))
    assert (v.encode(images[1:2])[0] - z[1]).abs().max() <= 1e-6   # each image alone: a batch is not a clip
    out = v.decode(z)
    assert out.shape == (3, 32, 48, 4)                      # IMAGE [N, H, W, 4], as core's VAE Decode gives
    tiled = v.decode_tiled(z, tile_x=2, tile_y=2, overlap=1)
    assert tiled.shape == out.shape


def test_wrong_latents_are_named():
    v = vae.from_state_dict(reference().state_dict())
    with pytest.raises(vae.InputError, match="as Wan 2.1/Qwen-Image, "):
        v.decode(torch.zeros(1, 16, 1, 4, 4))
    with pytest.raises(vae.InputError, match="expected an image latent"):
        v.decode(torch.zeros(1, 64, 3, 4, 4))              # a clip: this VAE decodes images
    wan21 = vae.from_state_dict(diffusers.AutoencoderKLWan(base_dim=8, z_dim=16).state_dict())
    with pytest.raises(vae.InputError, match="Qwen-Image 2.1 or HunyuanImage 2.1"):
        wan21.decode(torch.zeros(1, 64, 4, 4))
    assert registry.channel_hint(64, 4) == "Qwen-Image 2.1 or HunyuanImage 2.1"


# ---- layouts ------------------------------------------------------------------------------------

def test_every_layout_gives_identical_output(tmp_path):
    # weights that bf16 holds exactly, so the bf16 file (the template's) must give the same output
    sd = {k: v.to(torch.bfloat16).float().contiguous() for k, v in reference().state_dict().items()}
    original = comfy_layout(sd)
    layouts = {"diffusers": sd, "comfyui": original, "checkpoint-vae-prefix": {f"vae.{k}": v for k, v in original.items()},
               TEMPLATE_FILE[: -len(".safetensors")]: {k: v.to(torch.bfloat16) for k, v in original.items()},
               "wrapped-pickle": {"state_dict": original}}
    z = torch.randn(1, 64, 2, 3)
    assert_layouts_agree(layouts, tmp_path, "wan", lambda v: v.decode(z))


def test_template_file_name_loads_through_the_loader_and_the_node(pack, tmp_path, monkeypatch):
    from safetensors.torch import save_file
    (tmp_path / "vae").mkdir()
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in comfy_layout(reference().state_dict()).items()}
    save_file(sd, str(tmp_path / "vae" / TEMPLATE_FILE))
    v = vae.load(tmp_path / "vae" / TEMPLATE_FILE)
    assert v.name.startswith("Qwen-Image 2.1 VAE") and v.dtype == torch.float32
    monkeypatch.setenv("VAEKIT_MODEL_DIRS", str(tmp_path))
    loader = pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]
    assert TEMPLATE_FILE in loader.INPUT_TYPES()["required"]["vae_name"][0]
    (socket,) = loader().load(TEMPLATE_FILE, "fp32", "cpu")
    z = torch.randn(1, 64, 2, 2)
    assert torch.equal(socket.handle.decode(z), v.decode(z))


def test_comfyui_key_names_and_shapes():
    """ComfyUI's file at the published config: Wan 2.2's module tree (comfy/ldm/wan/vae2_2.py with
    temporal_kernel=1, patch_size=1, image_channels=4): what core's detection reads, and the shapes."""
    with torch.device("meta"):
        sd = reference(published=True).state_dict()
    o = comfy_layout(sd)
    assert len(o) == len(sd) == 238                # core's module tree at these widths has 238 tensors
    expect = {"encoder.conv1.weight": (96, 4, 1, 3, 3), "decoder.head.2.weight": (4, 144, 1, 3, 3),
              "decoder.head.0.gamma": (144, 1, 1, 1), "decoder.middle.0.residual.0.gamma": (1152, 1, 1, 1),
              "decoder.upsamples.0.upsamples.0.residual.2.weight": (1152, 1152, 1, 3, 3),
              "encoder.downsamples.1.downsamples.2.time_conv.weight": (192, 192, 1, 1, 1),
              "encoder.downsamples.0.downsamples.2.resample.1.weight": (96, 96, 3, 3),
              "decoder.upsamples.0.upsamples.3.time_conv.weight": (2304, 1152, 1, 1, 1),
              "decoder.upsamples.3.upsamples.3.resample.1.weight": (288, 288, 3, 3),
              "encoder.middle.1.to_qkv.weight": (2304, 768, 1, 1), "encoder.middle.1.norm.gamma": (768, 1, 1),
              "encoder.downsamples.1.downsamples.0.shortcut.weight": (192, 96, 1, 1, 1),
              "conv1.weight": (128, 128, 1, 1, 1), "conv2.weight": (64, 64, 1, 1, 1)}
    for key, shape in expect.items():
        assert tuple(o[key].shape) == shape, key
    assert "decoder.upsamples.3.upsamples.3.time_conv.weight" not in o        # the 4th up level is 2-D only
    for layout in (sd, o, wan.SPEC.to_canonical(sd)):
        assert registry.detect(layout) is wan.SPEC
        cfg = wan.SPEC.config_from_state_dict(wan.SPEC.to_canonical(layout))
        assert cfg.enc_widths == (96, 192, 384, 768, 768) and cfg.enc_base == 96
        assert cfg.dec_widths == (144, 288, 576, 1152, 1152) and cfg.dec_mid == 1152
        assert cfg.temporal == (False, True, True, True) and cfg.image and cfg.residual and cfg.patch == 1
        assert (cfg.latent_channels, cfg.image_channels, wan.capabilities(cfg).spatial_ratio) == (64, 4, 16)


def test_decoder_only_and_encoder_only_files(pair):
    ref, v = pair
    sd = ref.state_dict()
    dec = vae.from_state_dict({k: t for k, t in sd.items() if k.startswith(("decoder.", "post_quant_conv."))})
    enc = vae.from_state_dict({k: t for k, t in sd.items() if k.startswith(("encoder.", "quant_conv."))})
    assert "decoder only" in dec.name and not dec.caps.can_encode
    assert enc.config.residual and enc.config.image and not enc.caps.can_decode   # an image encoder is 2.2-style
    z, x = torch.randn(1, 64, 2, 2), torch.rand(1, 4, 32, 32)
    assert torch.equal(dec.decode(z), v.decode(z)) and torch.equal(enc.encode(x), v.encode(x))


def test_detection_across_families():
    """Every layout of this VAE is the Wan family's and no other family's; the Wan family claims no
    other family's test files (tests/vae/test_wan.py)."""
    from helpers import diffusers_kl
    from video_families import FAMILIES, tiny_state_dict
    sd = reference().state_dict()
    for layout in (sd, comfy_layout(sd), wan.SPEC.to_canonical(sd)):
        assert [s.id for s in registry.REGISTRY if s.detect(layout)] == ["wan"]
    for other in [tiny_state_dict(f) for f in FAMILIES if f != "wan"] + [diffusers_kl().state_dict()]:
        assert not wan.SPEC.detect(other)


# ---- engines ------------------------------------------------------------------------------------

def test_exact_tiles_equal_untiled_and_fast_tiles_do_not(pair):
    _, v = pair
    s = v.caps.spatial_ratio
    z = torch.randn(1, 64, 7, 6)
    untiled = v.decode(z)
    steps = []
    assert (v.decode(z, tile=3 * s, mode="exact", progress=lambda d, n: steps.append(n)) - untiled).abs().max() <= 1e-5
    assert steps and steps[-1] > 1
    assert (v.decode(z, tile=3 * s, overlap=s) - untiled).abs().max() > 1e-3
    x = torch.rand(1, 4, 7 * s, 6 * s)
    untiled = v.encode(x)
    assert (v.encode(x, tile=3 * s, mode="exact") - untiled).abs().max() <= 1e-5
    assert (v.encode(x, tile=3 * s, overlap=s) - untiled).abs().max() > 1e-3


def test_half_precision_overflow_is_recomputed(caplog):
    sd = {k: t * 1e6 if k.startswith("decoder.conv_in") else t for k, t in reference().state_dict().items()}
    v32, v16 = vae.from_state_dict(sd), vae.from_state_dict(sd, dtype=torch.float16)
    z = torch.randn(1, 64, 2, 2)
    with torch.inference_mode():
        assert not torch.isfinite(v16.model.decode(v16._model_input(z))).all()
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        out = v16.decode(z)
    assert v16.last_upcast is not None and "overflowed in float16" in caplog.text
    assert torch.isfinite(out).all() and (out - v32.decode(z)).abs().max() <= 1e-2


def test_compiled_handle_with_fused_qkv_matches_eager():
    from vae.compile import compile_vae
    # 3 levels, one block each (a spatial and a temporal level's shortcut): less for dynamo to trace
    v = vae.from_state_dict(reference(num_res_blocks=1, dim_mult=[1, 2, 2], temperal_downsample=[False, True]).state_dict())
    c, report = compile_vae(v, backend="eager", fuse_qkv=True)
    assert "fused q/k/v in 2 attention block(s)" in report.message
    z, x = torch.randn(1, 64, 2, 3), torch.rand(1, 3, 8, 12)
    assert (c.decode(z) - v.decode(z)).abs().max() <= 1e-5
    assert (c.encode(x) - v.encode(x)).abs().max() <= 1e-5
    assert c.graph_count() >= 2 and not c.fallbacks()


# ---- published config (slow) --------------------------------------------------------------------

@pytest.mark.slow
def test_published_config_parity_and_exact_tiles():
    """diffusers' default config is the published one (base 96, decoder base 144, z 64, RGBA)."""
    torch.set_num_threads(os.cpu_count() or 1)      # the module's one-thread fixture restores it
    ref = reference(published=True)
    v = vae.from_state_dict(ref.state_dict())
    s = v.caps.spatial_ratio
    z = torch.randn(1, 64, 6, 5)
    want = ref_decode(ref, z)
    dec = (v.decode(z) - want.clamp(0, 1)).abs().max().item()
    exact = (v.decode(z, tile=3 * s, mode="exact") - v.decode(z)).abs().max().item()
    x = torch.rand(1, 3, 6 * s, 5 * s)
    x4 = torch.cat([x, torch.ones_like(x[:, :1])], 1)
    want = ref_encode(ref, x4)
    enc = ((v.encode(x) - want).abs().max() / want.abs().max()).item()
    enc_exact = ((v.encode(x, tile=3 * s, mode="exact") - want).abs().max() / want.abs().max()).item()
    print(f"Qwen-Image 2.1 published config, ours vs diffusers, fp32: decode {dec:.2e} (0..1 pixels), "
          f"encode {enc:.2e} (relative to the latent's range), exact tiles: decode {exact:.2e}, encode {enc_exact:.2e}")
    assert dec <= 1e-4 and enc <= 1e-4 and exact <= 1e-4 and enc_exact <= 1e-4
