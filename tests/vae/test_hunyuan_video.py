"""HunyuanVideo 1.0 VAE: parity with diffusers on the same random weights (one-shot, framewise tiling
off), every key layout, config detection, and no false detection of the other families."""
from __future__ import annotations

import re

import pytest
import torch

import vae
from helpers import assert_layouts_agree, jitter_norms
from vae import registry
from vae.archs import hunyuan_video as hv

diffusers = pytest.importorskip("diffusers")

TINY = dict(block_out_channels=(32, 32, 64, 64), layers_per_block=1, norm_num_groups=32)


def reference(**config) -> torch.nn.Module:
    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLHunyuanVideo(**config)
    # diffusers decodes/encodes long clips in overlapping temporal tiles by default; compare one pass
    ref.use_framewise_decoding = ref.use_framewise_encoding = False
    return jitter_norms(ref).eval()


@pytest.fixture(scope="module")
def ref():
    return reference(**TINY)


@pytest.fixture(scope="module")
def ours(ref):
    return vae.from_state_dict(ref.state_dict())


@pytest.mark.parametrize("t", [1, 2, 5])
def test_decode_matches_diffusers(ref, ours, t):
    assert ours.spec.id == "hunyuan_video"
    z = torch.randn(1, 16, t, 4, 6)
    with torch.no_grad():
        want = ref.decode(z).sample
        got = ours.model.decode(z)
    assert got.shape == (1, 3, 1 + 4 * (t - 1), 32, 48)
    assert (got - want).abs().max() <= 1e-5
    # through the handle: 0..1, clamped
    assert (ours.decode(z) - ((want + 1) / 2).clamp(0, 1)).abs().max() <= 1e-5


@pytest.mark.parametrize("frames", [1, 9])
def test_encode_matches_diffusers(ref, ours, frames):
    x = torch.rand(2, 3, frames, 32, 24)
    with torch.no_grad():
        want = ref.encode(x * 2 - 1).latent_dist.mode()
    got = ours.encode(x)
    assert got.shape == (2, 16, (frames - 1) // 4 + 1, 4, 3)
    assert (got - want).abs().max() <= 1e-5


def test_frame_causal_attention_equals_dense_mask(ref, ours):
    """Our per-frame attention calls vs diffusers' dense (THW)^2 mask, on 3 frames so the mask matters."""
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import prepare_causal_attention_mask
    theirs, mine = ref.decoder.mid_block.attentions[0], ours.model.decoder.mid.attn_1
    b, c, t, h, w = 2, 64, 3, 4, 5
    x = torch.randn(b, c, t, h, w)
    tokens = x.permute(0, 2, 3, 4, 1).flatten(1, 3)
    with torch.no_grad():
        mask = prepare_causal_attention_mask(t, h * w, x.dtype, x.device, batch_size=b)
        want = theirs(tokens, attention_mask=mask).unflatten(1, (t, h, w)).permute(0, 4, 1, 2, 3)
        unmasked = theirs(tokens).unflatten(1, (t, h, w)).permute(0, 4, 1, 2, 3)
        got = mine(x)
    assert (got - want).abs().max() <= 1e-5
    assert (unmasked - want)[:, :, :-1].abs().max() > 1e-2     # earlier frames: the mask changed them
    assert torch.allclose(unmasked[:, :, -1], want[:, :, -1], atol=1e-5)   # the last frame sees all


def test_capabilities(ours):
    caps = ours.caps
    assert (caps.latent_channels, caps.spatial_ratio, caps.temporal_ratio) == (16, 8, 4)
    assert caps.norm == "groupnorm_clip" and caps.has_attention
    assert not caps.causal_encoder and not caps.causal_decoder
    assert (caps.default_tile, caps.default_overlap, caps.default_tile_frames, caps.default_overlap_frames) == \
        (256, 64, 16, 4)
    assert set(caps.working_dtypes) == {torch.bfloat16, torch.float16, torch.float32}
    assert ours.name == "HunyuanVideo VAE (16 latent channels)"


# ---- layouts -----------------------------------------------------------------------------------

# ComfyUI wraps each causal conv (VideoConv3d) in a module whose own conv is ``.conv``
_COMFY_WRAP = re.compile(r"\.(conv_in|conv_out|conv1|conv2|nin_shortcut|downsample\.conv|upsample\.conv)\.(weight|bias)$")


def comfy_layout(canonical: dict) -> dict:
    return {_COMFY_WRAP.sub(r".\1.conv.\2", k): v for k, v in canonical.items()}


def _layouts(ref) -> dict:
    diff = ref.state_dict()
    canonical = vae.from_state_dict(diff).state_dict()
    comfy = comfy_layout(canonical)
    return {
        "diffusers": diff,
        # Tencent's pytorch_model.pt: diffusers' keys (empty rename dict in diffusers' converter), maybe
        # under "state_dict" and a "vae." prefix, which their loader strips
        "tencent-original": {"state_dict": {f"vae.{k}": v for k, v in diff.items()}},
        "canonical": canonical,
        "comfyui": comfy,
        "comfyui-checkpoint-vae-prefix": {f"vae.{k}": v for k, v in comfy.items()},
        "ldm-first_stage_model": {f"first_stage_model.{k}": v for k, v in comfy.items()},
    }


def test_comfy_layout_has_the_published_keys(ref):
    """The ComfyUI form built here has the key names and shapes of ComfyUI's own module."""
    comfy = _layouts(ref)["comfyui"]
    for key, shape in {"encoder.conv_in.conv.weight": (32, 3, 3, 3, 3),
                       "encoder.down.0.block.0.conv2.conv.bias": (32,),
                       "encoder.down.0.downsample.conv.conv.weight": (32, 32, 3, 3, 3),
                       "encoder.down.2.block.0.nin_shortcut.conv.weight": (64, 32, 1, 1, 1),
                       "encoder.mid.attn_1.q.weight": (64, 64, 1, 1, 1),
                       "encoder.norm_out.weight": (64,),
                       "decoder.conv_in.conv.weight": (64, 16, 3, 3, 3),
                       "decoder.up.3.upsample.conv.conv.weight": (64, 64, 3, 3, 3),
                       "quant_conv.weight": (32, 32, 1, 1, 1), "post_quant_conv.weight": (16, 16, 1, 1, 1)}.items():
        assert tuple(comfy[key].shape) == shape, key
    assert "decoder.up.0.upsample.conv.conv.weight" not in comfy and "encoder.down.3.downsample.conv.conv.weight" not in comfy


def test_every_layout_gives_identical_output(ref, tmp_path):
    z = torch.randn(1, 16, 2, 2, 2)
    assert_layouts_agree(_layouts(ref), tmp_path, "hunyuan_video", lambda v: v.decode(z))


def test_decoder_only_and_encoder_only_files(ref, ours):
    full = ref.state_dict()
    dec = vae.from_state_dict({k: v for k, v in full.items() if not k.startswith(("encoder.", "quant_conv"))})
    enc = vae.from_state_dict({k: v for k, v in full.items() if not k.startswith(("decoder.", "post_quant_conv"))})
    assert dec.caps.can_decode and not dec.caps.can_encode
    assert enc.caps.can_encode and not enc.caps.can_decode
    assert (dec.caps.spatial_ratio, dec.caps.temporal_ratio) == (enc.caps.spatial_ratio, enc.caps.temporal_ratio) == (8, 4)
    z, x = torch.randn(1, 16, 2, 2, 2), torch.rand(1, 3, 5, 16, 16)
    assert torch.equal(dec.decode(z), ours.decode(z))
    assert torch.equal(enc.encode(x), ours.encode(x))
    with pytest.raises(vae.InputError, match="no encoder"):
        dec.encode(x)


# ---- config detection --------------------------------------------------------------------------

def _meta(cls, **config) -> dict:
    with torch.device("meta"):
        return cls(**config).state_dict()


def test_published_config_is_read_from_shapes():
    sd = _meta(diffusers.AutoencoderKLHunyuanVideo)
    for layout in (sd, comfy_layout(hv.to_canonical(sd))):
        assert hv.detect(layout) and registry.detect(layout) is hv.SPEC
        cfg = hv.config_from_state_dict(hv.to_canonical(layout))
        assert cfg == hv.HunyuanVideoConfig(
            widths=(128, 256, 512, 512), layers_per_block=2, latent_channels=16,
            down=((1, 2, 2), (2, 2, 2), (2, 2, 2), None), up=(None, (2, 2, 2), (2, 2, 2), (1, 2, 2)))
        assert (hv.capabilities(cfg).spatial_ratio, hv.capabilities(cfg).temporal_ratio) == (8, 4)
    with torch.device("meta"):
        model = hv.HunyuanVideoVAE(cfg)
    assert sum(p.numel() for p in model.parameters()) == 246_478_803


def _keys(shapes: dict) -> dict:
    return {k: torch.empty(s, device="meta") for k, s in shapes.items()}


OTHER_ORIGINAL_LAYOUTS = {
    "lightricks-ltx": {"encoder.conv_in.conv.weight": (128, 48, 3, 3, 3),
                       "encoder.down_blocks.0.res_blocks.0.conv1.conv.weight": (128, 128, 3, 3, 3),
                       "decoder.conv_in.conv.weight": (512, 128, 3, 3, 3),
                       "decoder.up_blocks.0.res_blocks.0.conv1.conv.weight": (512, 512, 3, 3, 3),
                       "per_channel_statistics.std-of-means": (128,)},
    "genmo-mochi": {"decoder.blocks.0.0.weight": (768, 12, 1, 1, 1),
                    "decoder.blocks.1.blocks.0.stack.5.weight": (768, 768, 3, 3, 3),
                    "encoder.layers.0.weight": (64, 15)},
    "comfyui-hunyuanvideo-1.5": {"decoder.conv_in.conv.weight": (1024, 32, 3, 3, 3),
                                 "decoder.up.0.block.0.norm1.gamma": (1024, 1, 1, 1),
                                 "decoder.up.0.upsample.conv.conv.weight": (8192, 1024, 3, 3, 3)},
    "comfyui-hunyuanimage-refiner": {"decoder.conv_in.weight": (1024, 32, 3, 3, 3),
                                     "decoder.up.1.block.0.norm1.weight": (1024,),
                                     "decoder.up.1.upsample.conv.weight": (4096, 1024, 3, 3, 3)},
}
OTHER_DIFFUSERS = ["AutoencoderKL", "AutoencoderTiny", "AutoencoderKLMochi", "AutoencoderKLLTXVideo",
                   "AutoencoderKLMagvit", "AutoencoderKLCogVideoX", "AutoencoderKLWan", "AutoencoderKLHunyuanVideo15",
                   "AutoencoderKLHunyuanImageRefiner", "AutoencoderKLMiniMaxH3"]


@pytest.mark.parametrize("name", OTHER_DIFFUSERS + list(OTHER_ORIGINAL_LAYOUTS))
def test_other_families_are_not_detected(name):
    if name in OTHER_ORIGINAL_LAYOUTS:
        layouts = [_keys(OTHER_ORIGINAL_LAYOUTS[name])]
    else:
        cls = getattr(diffusers, name, None)
        if cls is None:
            pytest.skip(f"diffusers has no {name}")
        sd = _meta(cls)
        layouts = [sd]
        other = next((s for s in registry.REGISTRY if s is not hv.SPEC and s.detect(sd)), None)
        if other is not None:      # the family's own canonical (original) layout too
            layouts.append(other.to_canonical(sd))
    for sd in layouts:
        assert not hv.detect(sd)


# ---- default config ----------------------------------------------------------------------------

@pytest.mark.slow
def test_default_config_matches_diffusers():
    ref = reference()
    ours = vae.from_state_dict(ref.state_dict())
    assert (ours.caps.spatial_ratio, ours.caps.temporal_ratio) == (8, 4)
    z = torch.randn(1, 16, 3, 8, 8)
    x = torch.rand(1, 3, 9, 64, 64) * 2 - 1
    with torch.no_grad():
        want = ref.decode(z).sample
        got = ours.model.decode(z)
        assert got.shape == (1, 3, 9, 64, 64)
        assert (got - want).abs().max() <= 1e-4
        want = ref.encode(x).latent_dist.mode()
        got = ours.model.encode(x)
        assert got.shape == (1, 16, 3, 8, 8)
        assert (got - want).abs().max() <= 1e-4
