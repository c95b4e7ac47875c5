"""AutoencoderKL: parity with diffusers on the same random weights, and every key layout."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import vae
from helpers import diffusers_kl

SHAPES = {"sd": dict(latent_channels=4, quant=True), "flux": dict(latent_channels=16, quant=False)}


@pytest.mark.parametrize("shape", SHAPES)
def test_decode_encode_match_diffusers(shape):
    ref = diffusers_kl(**SHAPES[shape])
    ours = vae.from_state_dict(ref.state_dict())
    lat = SHAPES[shape]["latent_channels"]
    assert ours.caps.latent_channels == lat and ours.caps.spatial_ratio == 2
    assert ours.caps.has_attention and ours.caps.norm == "groupnorm"
    z = torch.randn(2, lat, 8, 12)
    x = torch.rand(2, 3, 16, 24)
    with torch.no_grad():
        ref_img = ref.decode(z).sample
        ref_lat = ref.encode(x * 2 - 1).latent_dist.mode()
    img = ours.decode(z)                       # handle: 0..1 output
    assert (img - ((ref_img + 1) / 2).clamp(0, 1)).abs().max() <= 1e-5
    assert (ours.model.decode(z) - ref_img).abs().max() <= 1e-5
    assert (ours.encode(x) - ref_lat).abs().max() <= 1e-5


def _ldm_variants(ref):
    """The same weights in every layout users have: diffusers, LDM/ComfyUI (our canonical), full
    checkpoints with first_stage_model./vae. prefixes, diffusers' legacy attention names."""
    diff = ref.state_dict()
    ldm = vae.from_state_dict(diff).state_dict()
    legacy = {k.replace("to_q", "query").replace("to_k", "key").replace("to_v", "value")
              .replace("to_out.0", "proj_attn"): v for k, v in diff.items()}
    unet_noise = {"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(4, 4, 3, 3)}
    return {
        "diffusers": diff,
        "diffusers-legacy-attention": legacy,
        "ldm": ldm,
        "checkpoint-first_stage_model": {**{f"first_stage_model.{k}": v for k, v in ldm.items()}, **unet_noise},
        "checkpoint-vae-prefix": {f"vae.{k}": v for k, v in ldm.items()},
        "wrapped-state_dict": {"state_dict": ldm},
    }


@pytest.mark.parametrize("shape", SHAPES)
def test_every_layout_and_format_gives_identical_output(shape, tmp_path):
    ref = diffusers_kl(**SHAPES[shape])
    z = torch.randn(1, SHAPES[shape]["latent_channels"], 6, 6)
    outputs = {}
    for name, sd in _ldm_variants(ref).items():
        if name == "wrapped-state_dict":
            path = tmp_path / f"{name}.ckpt"
            torch.save(sd, path)
        else:
            path = tmp_path / f"{name}.safetensors"
            save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
        v = vae.load(path)
        assert v.spec.id == "kl", name
        outputs[name] = v.decode(z)
    first = outputs.pop("diffusers")
    for name, out in outputs.items():
        assert torch.equal(out, first), name


def test_decoder_only_file_loads_and_refuses_encode():
    ref = diffusers_kl()
    sd = {k: v for k, v in ref.state_dict().items() if not k.startswith(("encoder.", "quant_conv"))}
    v = vae.from_state_dict(sd)
    assert v.caps.can_decode and not v.caps.can_encode
    v.decode(torch.randn(1, 4, 4, 4))
    with pytest.raises(vae.InputError, match="no encoder"):
        v.encode(torch.rand(1, 3, 8, 8))


@pytest.mark.slow
def test_sd_shape_parity_full_size():
    ref = diffusers_kl(widths=(128, 256, 512, 512), layers=2)
    ours = vae.from_state_dict(ref.state_dict())
    z = torch.randn(1, 4, 16, 16)
    with torch.no_grad():
        assert (ours.model.decode(z) - ref.decode(z).sample).abs().max() <= 1e-4


def test_a_narrower_decoder_is_read_from_its_own_weights():
    """Encoder and decoder widths are independent (as core's newest KL loader allows: FLUX.2's small
    decoders); a decoder with another number of levels is not this encoder's."""
    from vae.archs import kl
    cfg = kl.KLConfig(ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=4, embed_dim=4,
                      decoder_widths=(32, 64 + 32), decoder_res_blocks=2)
    torch.manual_seed(0)
    sd = kl.AutoencoderKL(cfg).state_dict()
    v = vae.from_state_dict(sd)
    assert v.config == cfg
    assert v.decode(torch.randn(1, 4, 3, 3)).shape == (1, 3, 6, 6)
    three = kl.AutoencoderKL(kl.KLConfig(ch=32, ch_mult=(1, 1, 1), num_res_blocks=1, z_channels=4, embed_dim=4))
    mixed = {**{k: t for k, t in sd.items() if not k.startswith("decoder.")},
             **{k: t for k, t in three.state_dict().items() if k.startswith("decoder.")}}
    with pytest.raises(vae.LoadError, match="2 resolution levels but the decoder 3"):
        vae.from_state_dict(mixed)
