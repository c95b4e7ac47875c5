"""Fused q/k/v: identical outputs where a family has attention, a clear message where it has none,
and unfusing gives back the original state dict bit for bit."""
from __future__ import annotations

import pytest
import torch

import vae
from helpers import diffusers_hunyuan_image21, diffusers_qwen21, diffusers_tiny, hunyuan_image3_file
from vae.archs import kl, magvit
from vae.nn.attention import SpatialSelfAttention
from vae.nn.qkv import fuse_qkv, unfuse_qkv
from video_families import tiny_state_dict

NO_ATTENTION = "has no attention blocks: nothing to fuse; continuing unfused"


def _built(spec, cfg) -> vae.VAE:
    """A handle on randomly initialised weights of ``cfg`` (through the loader, as users get it)."""
    torch.manual_seed(0)
    return vae.from_state_dict(spec.build(cfg).state_dict())


def _kl() -> vae.VAE:
    return _built(kl.SPEC, kl.KLConfig(ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=4, embed_dim=4))


def _magvit_v5() -> vae.VAE:
    # two mid resnets per side, one attention between them
    return _built(magvit.SPEC, magvit.MagvitConfig(widths=(32,) * 4, layers_per_block=2, mid_attention=True))


def _consistency() -> vae.VAE:
    pytest.importorskip("vae.archs.consistency")
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    ref = diffusers.ConsistencyDecoderVAE(
        encoder_block_out_channels=(32,) * 4, encoder_down_block_types=("DownEncoderBlock2D",) * 4,
        encoder_layers_per_block=1, decoder_block_out_channels=(32, 64, 64), decoder_layers_per_block=1,
        decoder_down_block_types=("ResnetDownsampleBlock2D",) * 3, decoder_up_block_types=("ResnetUpsampleBlock2D",) * 3)
    return vae.from_state_dict(ref.state_dict())


def _run(v: vae.VAE, decode: bool = True) -> list[torch.Tensor]:
    """Encode (and decode) small inputs: both sides' attention blocks run."""
    g = torch.Generator().manual_seed(5)
    r, c = v.caps.spatial_ratio_packed, v.caps.latent_channels      # images: whole packed latent pixels
    if v.is_video:      # one frame to encode (cheap), two latent frames to decode (frame-causal attention)
        x, z = torch.rand(1, 3, 1, 2 * r, 2 * r, generator=g), torch.randn(1, c, 2, 2, 2, generator=g)
    else:
        x, z = torch.rand(1, 3, 2 * r, 3 * r, generator=g), torch.randn(1, c, 2, 3, generator=g)
    return [v.encode(x)] + ([v.decode(z)] if decode else [])


def _flux2() -> vae.VAE:
    import diffusers_flux2
    return vae.from_state_dict(diffusers_flux2.model().state_dict())


FUSABLE = {"kl": (_kl, 2), "flux2": (_flux2, 2), "magvit_v5": (_magvit_v5, 2),
           "hunyuan_video": (lambda: vae.from_state_dict(tiny_state_dict("hunyuan_video")), 2),
           "consistency": (_consistency, 1),     # its KL encoder's mid block; the UNet has no attention
           "qwen21": (lambda: vae.from_state_dict(diffusers_qwen21().state_dict()), 2),
           "hunyuan_image21": (lambda: vae.from_state_dict(diffusers_hunyuan_image21().state_dict()), 2),
           "hunyuan_image3": (lambda: vae.from_state_dict(hunyuan_image3_file()), 2)}


@pytest.mark.parametrize("family", FUSABLE)
def test_fused_outputs_match_and_unfuse_is_bit_exact(family):
    make, n_attn = FUSABLE[family]
    v = make()
    decode = family != "consistency"             # its decoder (a UNet sampler) has nothing to fuse
    before = {k: t.clone() for k, t in v.model.state_dict().items()}
    ref = _run(v, decode)
    report = fuse_qkv(v.model, v.name)
    assert (report.fused, report.already) == (n_attn, 0)
    assert report.message == f"fused q/k/v in {n_attn} attention block(s)"
    attns = [m for m in v.model.modules() if isinstance(m, SpatialSelfAttention)]
    assert attns and all(m.qkv is not None and not hasattr(m, "q") for m in attns)
    for a, b in zip(ref, _run(v, decode)):
        assert (a - b).abs().max() <= 1e-5
    # the fused model still shows (and loads) the canonical keys
    shown = v.model.state_dict()
    assert list(shown) == list(before) and all(torch.equal(before[k], shown[k]) for k in before)
    v.model.load_state_dict(before)
    # fusing twice is a no-op
    again = fuse_qkv(v.model)
    assert (again.fused, again.already) == (0, n_attn) and "nothing to fuse" in again.message
    unfuse_qkv(v.model)
    after = v.model.state_dict()
    assert list(after) == list(before) and all(torch.equal(before[k], after[k]) for k in before)
    assert all(m.qkv is None and isinstance(m.q, torch.nn.Module) for m in attns)
    for a, b in zip(ref, _run(v, decode)):
        assert torch.equal(a, b)


def test_mochi_attention_is_already_one_projection():
    v = vae.from_state_dict(tiny_state_dict("mochi"))
    before = {k: t.clone() for k, t in v.model.state_dict().items()}
    report = fuse_qkv(v.model, v.name)
    assert report.fused == 0 and report.already > 0
    assert report.message == f"q/k/v already one projection in {report.already} attention block(s): nothing to fuse"
    after = v.model.state_dict()
    assert list(after) == list(before) and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("family", ["taesd", "ltx", "magvit"])
def test_no_attention_gives_the_message(family):
    if family == "taesd":
        v = vae.from_state_dict(diffusers_tiny().state_dict(), name_hint="taesd_decoder.safetensors")
    else:
        v = vae.from_state_dict(tiny_state_dict(family))
    before = {k: t.clone() for k, t in v.model.state_dict().items()}
    report = fuse_qkv(v.model, v.name)
    assert (report.fused, report.already) == (0, 0)
    assert report.message == f"this VAE ({v.name}) {NO_ATTENTION}"
    unfuse_qkv(v.model)                           # harmless too
    assert all(torch.equal(before[k], t) for k, t in v.model.state_dict().items())
