"""Consistency decoder: parity with diffusers' ConsistencyDecoderVAE on the same random weights and
seed, OpenAI's sampler (x0 clamped), OpenAI's key layouts, and detection against every family."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from safetensors.torch import save_file

import vae
from helpers import diffusers_kl, diffusers_tiny, jitter_norms
from vae import registry
from vae.archs import consistency
from video_families import FAMILIES, tiny_state_dict

# SD's 4-level encoder (so the latent is upsampled 8x, as published, and a decoder-only file agrees)
# and a 3-level UNet whose last two widths are equal, as the published (320, 640, 1024, 1024)
TINY = dict(encoder_block_out_channels=(32,) * 4, encoder_down_block_types=("DownEncoderBlock2D",) * 4,
            encoder_layers_per_block=1, decoder_block_out_channels=(32, 64, 64), decoder_layers_per_block=1,
            decoder_down_block_types=("ResnetDownsampleBlock2D",) * 3,
            decoder_up_block_types=("ResnetUpsampleBlock2D",) * 3)


def diffusers_consistency(**config):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    return jitter_norms(diffusers.ConsistencyDecoderVAE(**config)).eval()


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def ref():
    return diffusers_consistency(**TINY)


@pytest.fixture(scope="module")
def ours(ref):
    return vae.from_state_dict(ref.state_dict())


def _diffusers_decode(ref, z, seed):
    with torch.no_grad():
        return ref.decode(z, generator=torch.Generator().manual_seed(seed)).sample


def test_decode_matches_diffusers_same_seed(ref, ours):
    caps = ours.caps
    assert ours.spec.id == "consistency" and caps.latent_channels == 4 and caps.spatial_ratio == 8
    assert caps.has_attention and caps.norm == "groupnorm" and caps.decode_options == ("seed",)
    z = torch.randn(2, 4, 4, 5)
    expect = _diffusers_decode(ref, z, seed=7)
    ours.model.clip_denoised = False           # diffusers does not clamp x0
    try:
        err = (ours.model.decode(z, seed=7) - expect).abs().max()
        via_handle = ours.decode(z, seed=7)    # the handle passes `seed` through decode_options
    finally:
        ours.model.clip_denoised = True
    print(f"decode vs diffusers, same seed: max abs {err:.3g}")
    assert err <= 1e-4
    assert (via_handle - ((expect + 1) / 2).clamp(0, 1)).abs().max() <= 1e-4


def test_seed_repeats_and_is_independent_of_the_global_rng(ours):
    z = torch.randn(1, 4, 4, 4)
    a = ours.decode(z, seed=3)
    torch.manual_seed(123)
    assert torch.equal(ours.decode(z, seed=3), a)
    assert (ours.decode(z, seed=4) - a).abs().max() > 1e-3


def _openai_sampler(unet, z, seed):
    """OpenAI's ConsistencyDecoder.__call__ (facts: diffusers scripts/convert_consistency_decoder.py)
    around diffusers' UNet: timesteps by rounding [1.0, 0.5] of 1024 to 64 distilled steps, noise
    from x_start = 0 at every step, x0 clamped to [-1, 1]."""
    ab = lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
    betas = torch.tensor([min(1 - ab((i + 1) / 1024) / ab(i / 1024), 0.999) for i in range(1024)])
    ac = torch.cumprod(1 - betas, 0)
    sigmas = torch.sqrt(1 / ac - 1)
    c_skip = torch.sqrt(1 / ac) * 0.25 / (sigmas ** 2 + 0.25)
    c_out, c_in = sigmas * 0.5 / (sigmas ** 2 + 0.25) ** 0.5, torch.sqrt(1 / ac) / (sigmas ** 2 + 0.25) ** 0.5
    space = 1024 // 64
    rounded = (torch.arange(1024) // space + 1) * space
    rounded[rounded == 1024] -= space
    features = (z * 0.18215 - torch.tensor([0.38862467, 0.02253063, 0.07381133, -0.0171294]).view(1, 4, 1, 1)) \
        / torch.tensor([0.9654121, 1.0440036, 0.76147926, 0.77022034]).view(1, 4, 1, 1)
    features = torch.nn.functional.interpolate(features, scale_factor=8, mode="nearest")
    gen = torch.Generator().manual_seed(seed)
    x = torch.zeros(z.shape[0], 3, *features.shape[2:])
    for s in (1.0, 0.5):
        t = int(rounded[int(1023 * s)])
        x = torch.sqrt(ac[t]) * x + torch.sqrt(1 - ac[t]) * torch.randn(x.shape, generator=gen)
        with torch.no_grad():
            out = unet(torch.cat([c_in[t] * x, features], 1), torch.tensor([t] * z.shape[0])).sample[:, :3]
        x = (c_out[t] * out + c_skip[t] * x).clamp(-1, 1)
    return x


def test_default_sampler_is_openais_with_clamped_x0(ref):
    assert consistency.TIMESTEPS == (1008, 512)
    loud = copy.deepcopy(ref)
    with torch.no_grad():
        loud.decoder_unet.conv_out.weight.mul_(8)     # so that the first x0 leaves [-1, 1]
    ours = vae.from_state_dict(loud.state_dict())
    z = torch.randn(1, 4, 4, 4)
    expect = _openai_sampler(loud.decoder_unet, z, seed=11)
    got = ours.model.decode(z, seed=11)
    assert (got - expect).abs().max() <= 1e-4
    # the clamp matters here: diffusers' unclamped sampler gives another image
    assert (got - _diffusers_decode(loud, z, seed=11).clamp(-1, 1)).abs().max() > 1e-2


def test_encode_matches_diffusers_posterior_mean(ref, ours):
    x = torch.rand(2, 3, 32, 24)
    with torch.no_grad():
        expect = ref.encode(x * 2 - 1).latent_dist.mean
    assert (ours.encode(x) - expect).abs().max() <= 1e-4


_OPENAI_PARTS = {"norm1": "gn_1", "conv1": "f_1", "norm2": "gn_2", "conv2": "f_2", "time_emb_proj": "f_t",
                 "conv_shortcut": "f_s"}
_OPENAI_TOP = {"conv_in": "embed_image.f", "time_proj": "embed_time.emb", "time_embedding.linear_1": "embed_time.f_1",
               "time_embedding.linear_2": "embed_time.f_2", "conv_norm_out": "output.gn", "conv_out": "output.f"}


def _to_openai_modules(sd, levels: int, layers: int) -> dict:
    """diffusers decoder_unet keys -> OpenAI's ConvUNetVAE names, written from the conversion
    script's tables (independently of the library's rules)."""
    out = {}
    for key, v in sd.items():
        if not key.startswith("decoder_unet."):
            continue
        key = key[len("decoder_unet."):]
        parts = key.split(".")
        if parts[0] in ("down_blocks", "up_blocks"):
            i, kind, j, p = int(parts[1]), parts[2], parts[3], parts[4]
            if parts[0] == "down_blocks":
                name = f"down.{i}.{j if kind == 'resnets' else layers}"
            else:
                name = f"up.{levels - 1 - i}.{j if kind == 'resnets' else layers + 1}"
            key = f"{name}.{_OPENAI_PARTS[p]}.{parts[-1]}"
        elif parts[0] == "mid_block":
            key = f"mid.{parts[2]}.{_OPENAI_PARTS[parts[3]]}.{parts[-1]}"
        else:
            top = key.rsplit(".", 1)[0]
            key = f"{_OPENAI_TOP[top]}.{parts[-1]}"
        out[key] = v
    return out


def _to_openai_torchscript(modules: dict, layers: int) -> dict:
    """OpenAI's module names -> the TorchScript archive's (the inverse of the script's renames);
    the timestep table stays apart from the archive, under its module name."""
    out = {}
    for key, v in modules.items():
        if key == "embed_time.emb.weight":
            out[key] = v
            continue
        parts = key.split(".")
        tensor = {"weight": "g" if parts[-2].startswith("gn") else "w", "bias": "b"}[parts[-1]]
        if parts[0] in ("down", "up"):
            i, j = parts[1], int(parts[2])
            last = layers if parts[0] == "down" else layers + 1
            block = {"down": "downsamp", "up": "upsamp"}[parts[0]] if j == last else f"conv_{j}"
            name = f"blocks.{parts[0]}_{i}_{block}.{parts[3]}"
        elif parts[0] == "mid":
            name = f"blocks.mid_{parts[1]}.{parts[2]}"
        else:
            name = ".".join(parts[:-1])
        out[f"{name}.{tensor}"] = v
    return out


def test_openai_layouts_give_identical_output(ref, ours, tmp_path):
    diff = ref.state_dict()
    modules = _to_openai_modules(diff, levels=3, layers=1)
    script = _to_openai_torchscript(modules, layers=1)
    assert "blocks.down_0_downsamp.f_1.w" in script and "blocks.up_2_conv_1.gn_2.g" in script
    ldm_encoder = {k: v for k, v in ours.state_dict().items() if not k.startswith("decoder_unet.")}
    layouts = {"diffusers": diff, "canonical": ours.state_dict(), "openai-modules": modules,
               "openai-torchscript-names": script, "openai-with-ldm-encoder": {**ldm_encoder, **modules},
               "checkpoint-vae-prefix": {f"vae.{k}": v for k, v in diff.items()}}
    z = torch.randn(1, 4, 3, 4)
    canonical, expect = ours.state_dict(), ours.decode(z, seed=2)
    for name, sd in layouts.items():
        path = tmp_path / f"{name}.safetensors"
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
        v = vae.load(path)
        assert v.spec.id == "consistency", name
        got = v.state_dict()
        want = canonical if v.caps.can_encode else {k: t for k, t in canonical.items() if k.startswith("decoder_unet.")}
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got), name
        # same weights; not bit-equal outputs: MKL's gemm (the timestep Linears) rounds by the
        # alignment of the memory-mapped weights, which differs from file to file (~1e-6)
        assert (v.decode(z, seed=2) - expect).abs().max() <= 1e-5, name
    only = vae.from_state_dict(script)
    assert not only.caps.can_encode and only.caps.spatial_ratio == 8 and not only.caps.has_attention
    with pytest.raises(vae.LoadError, match="timestep table"):     # the TorchScript archive keeps it apart
        vae.from_state_dict({k: v for k, v in script.items() if k != "embed_time.emb.weight"})


def test_detected_before_kl_and_claims_no_other_family(ref, ours):
    sd = ref.state_dict()
    assert registry.detect(sd).id == "consistency"
    assert registry.REGISTRY[0] is consistency.SPEC     # kl.detect alone would claim it: order settles it
    kl_ref = diffusers_kl()
    tiny_ref = diffusers_tiny()
    others = {"kl-diffusers": kl_ref.state_dict(), "kl-ldm": vae.from_state_dict(kl_ref.state_dict()).state_dict(),
              "taesd-diffusers": tiny_ref.state_dict(),
              "taesd-ours": vae.from_state_dict(tiny_ref.state_dict()).state_dict()}
    others.update({f: tiny_state_dict(f) for f in FAMILIES})
    for name, other in others.items():
        assert not consistency.SPEC.detect(other), name
        assert registry.detect(other).id != "consistency", name


@pytest.mark.slow
def test_published_config_parity_small_latent():
    ref = diffusers_consistency()
    ours = vae.from_state_dict(ref.state_dict())
    assert ours.config.widths == (320, 640, 1024, 1024) and ours.caps.spatial_ratio == 8
    z = torch.randn(1, 4, 8, 8)
    ours.model.clip_denoised = False
    err = (ours.model.decode(z, seed=0) - _diffusers_decode(ref, z, seed=0)).abs().max()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        enc_err = (ours.encode(x) - ref.encode(x * 2 - 1).latent_dist.mean).abs().max()
    print(f"published config: decode max abs {err:.3g}, encode {enc_err:.3g}")
    assert err <= 1e-4 and enc_err <= 1e-4
