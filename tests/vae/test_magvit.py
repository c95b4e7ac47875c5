"""EasyAnimate Magvit VAE: parity with diffusers' AutoencoderKLMagvit (its chunked, cached
definition) on random weights, V5's mid-block attention against EasyAnimate's definition, streaming,
every key layout, detection and config of the published variants."""
from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

import vae
from helpers import assert_layouts_agree, jitter_norms
from vae.archs import magvit
from vae import run

diffusers = pytest.importorskip("diffusers")

LAT = 16


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors: thread hand-offs cost more than the maths (20x on a busy 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def diffusers_magvit(widths=(32, 32, 64, 64), layers=1, **kw):
    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLMagvit(block_out_channels=widths, layers_per_block=layers, norm_num_groups=32,
                                        latent_channels=LAT, **kw)
    return ref


class EasyAnimateAttention3D(torch.nn.Module):
    """EasyAnimate's V5 mid-block attention (vaemodules/attention.py Attention3D, one head): GroupNorm
    and attention over every token of the chunk it is given, residual added. Keys as in V5 files."""

    def __init__(self, c):
        super().__init__()
        self.group_norm = torch.nn.GroupNorm(32, c, eps=1e-6)
        self.to_q, self.to_k, self.to_v, self.to_out = (torch.nn.Linear(c, c) for _ in range(4))

    def forward(self, x):
        b, c, t, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        hn = self.group_norm(tokens.transpose(1, 2)).transpose(1, 2)
        q, k, v = (p(hn)[:, None] for p in (self.to_q, self.to_k, self.to_v))
        out = self.to_out(F.scaled_dot_product_attention(q, k, v)[:, 0]) + tokens
        return out.transpose(1, 2).reshape(b, c, t, h, w)


def _mid_with_attention(self, x):       # EasyAnimate's MidBlock3D.forward
    x = self.convs[0](x)
    for attn, conv in zip(self.attentions, self.convs[1:]):
        x = conv(attn(x))
    return x


def easyanimate_v5(widths=(32, 32, 64, 64)):
    """diffusers' model with EasyAnimate V5's mid-block attention put back (diffusers' class drops it)."""
    ref = diffusers_magvit(widths, layers=2)
    for mid in (ref.encoder.mid_block, ref.decoder.mid_block):
        mid.attentions = torch.nn.ModuleList([EasyAnimateAttention3D(widths[-1])])
        mid.forward = types.MethodType(_mid_with_attention, mid)
    return ref


@pytest.fixture(scope="module")
def v51():
    return jitter_norms(diffusers_magvit()).eval()


@pytest.fixture(scope="module")
def v5():
    return jitter_norms(easyanimate_v5()).eval()


def _parity(ref, dtype, hw, tol):
    ref = ref.to(dtype)
    ours = vae.from_state_dict(ref.state_dict(), dtype=dtype)
    assert ours.spec.id == "magvit"
    ref.num_latent_frames_batch_size, ref.num_sample_frames_batch_size = 1, 4   # the published chunking
    h, w = hw
    worst = 0.0
    with torch.no_grad():
        for t in (1, 2, 3):
            z = torch.randn(1, LAT, t, h, w, dtype=dtype)
            want, got = ref.decode(z).sample, ours.model.decode(z)
            assert got.shape == want.shape == (1, 3, 1 + 4 * (t - 1), 8 * h, 8 * w)
            worst = max(worst, (got - want).abs().max().item())
        for frames in (1, 5, 9):
            x = torch.randn(1, 3, frames, 8 * h, 8 * w, dtype=dtype)
            want, got = ref.encode(x).latent_dist.mode(), ours.model.encode(x)
            assert got.shape == want.shape == (1, LAT, 1 + (frames - 1) // 4, h, w)
            worst = max(worst, (got - want).abs().max().item())
    ref.float()
    assert worst <= tol
    return ours


def test_v51_matches_diffusers(v51):
    ours = _parity(v51, torch.float32, (3, 4), 1e-5)
    caps = ours.caps
    assert (caps.latent_channels, caps.spatial_ratio, caps.temporal_ratio) == (16, 8, 4)
    assert caps.norm == "groupnorm_frame" and not caps.has_attention
    assert caps.causal_encoder and caps.causal_decoder and caps.decode_options == ()
    assert "V5.1" in ours.name
    # through the handle: 0..1 in and out
    ours = vae.from_state_dict(v51.state_dict())
    z = torch.randn(1, LAT, 2, 3, 4)
    x = torch.rand(1, 3, 5, 24, 32)
    with torch.no_grad():
        want = ((v51.decode(z).sample + 1) / 2).clamp(0, 1)
        lat = v51.encode(x * 2 - 1).latent_dist.mode()
    assert (ours.decode(z) - want).abs().max() <= 1e-5
    assert (ours.encode(x) - lat).abs().max() <= 1e-5


# The following run in float64: per-frame GroupNorm over a few latent pixels amplifies fp32 rounding
# (convolution algorithms differ with the clip length) to ~5e-6, which would hide a real mistake.

def test_v5_mid_attention_matches_easyanimate(v5):
    ours = _parity(v5, torch.float64, (2, 3), 1e-9)
    assert ours.caps.has_attention and "V5," in ours.name


def test_one_pass_equals_any_chunking(v51):
    """The chunk sizes are not part of the result (diffusers' latent batch 2, sample batch 8)."""
    ref = v51.double()
    ours = vae.from_state_dict(ref.state_dict(), dtype=torch.float64).model
    ref.num_latent_frames_batch_size, ref.num_sample_frames_batch_size = 2, 8
    try:
        z = torch.randn(1, LAT, 4, 2, 2, dtype=torch.float64)
        x = torch.randn(1, 3, 13, 16, 16, dtype=torch.float64)
        with torch.no_grad():
            assert (ours.decode(z) - ref.decode(z).sample).abs().max() <= 1e-9
            assert (ours.encode(x) - ref.encode(x).latent_dist.mode()).abs().max() <= 1e-9
    finally:
        ref.num_latent_frames_batch_size, ref.num_sample_frames_batch_size = 1, 4
        ref.float()


def test_streaming_equals_one_pass(v5):
    """Chunks fed through the causal caches (and the up-samplers' first-frame state) give the frames
    of one pass, for chunks of any length."""
    m = vae.from_state_dict(v5.state_dict(), dtype=torch.float64).model
    z = torch.randn(1, LAT, 5, 2, 3, dtype=torch.float64)
    x = torch.randn(1, 3, 17, 16, 24, dtype=torch.float64)
    with torch.no_grad():
        for fn, data, cuts in ((m.decode, z, (1, 2, 5)), (m.encode, x, (1, 9, 13, 17))):
            whole = fn(data)
            with run.stream():
                chunks = [fn(data[:, :, a:b]) for a, b in zip((0,) + cuts[:-1], cuts)]
            assert (torch.cat(chunks, 2) - whole).abs().max() <= 1e-9


def _layouts(ref) -> dict[str, dict]:
    original = ref.state_dict()      # diffusers' names = EasyAnimate's own (V5 adds to_q/.../to_out)
    canonical = vae.from_state_dict(original).state_dict()
    return {"original": original, "canonical": canonical,
            "vae-prefix": {f"vae.{k}": v for k, v in original.items()},
            "wrapped-state_dict": {"state_dict": original}}


@pytest.mark.parametrize("variant", ["v51", "v5"])
def test_every_layout_gives_identical_output(variant, request, tmp_path):
    z = torch.randn(1, LAT, 2, 1, 2)
    assert_layouts_agree(_layouts(request.getfixturevalue(variant)), tmp_path, "magvit", lambda v: v.decode(z))


def test_canonical_keys(v51, v5):
    keys = vae.from_state_dict(v51.state_dict()).state_dict()
    assert "encoder.down_blocks.2.convs.0.nin_shortcut.weight" in keys
    assert "decoder.up_blocks.0.upsampler.conv.weight" in keys
    keys = vae.from_state_dict(v5.state_dict()).state_dict()
    assert keys["decoder.mid_block.attentions.0.q.weight"].shape == (64, 64, 1, 1)


def _published(attention: bool) -> dict:
    """The V5.1 (diffusers' default config) or V5 (plus the mid-block attention) key set, on meta."""
    with torch.device("meta"):
        sd = diffusers.AutoencoderKLMagvit().state_dict()
        if attention:
            for side in ("encoder", "decoder"):
                for name in ("to_q", "to_k", "to_v", "to_out"):
                    sd[f"{side}.mid_block.attentions.0.{name}.weight"] = torch.empty(512, 512)
                    sd[f"{side}.mid_block.attentions.0.{name}.bias"] = torch.empty(512)
                sd[f"{side}.mid_block.attentions.0.group_norm.weight"] = torch.empty(512)
                sd[f"{side}.mid_block.attentions.0.group_norm.bias"] = torch.empty(512)
    return sd


@pytest.mark.parametrize("attention", [False, True], ids=["V5.1", "V5"])
@pytest.mark.parametrize("part", ["full", "encoder", "decoder"])
def test_published_config_from_weights(attention, part):
    sd = _published(attention)
    if part != "full":
        drop = ("decoder.", "post_quant_conv") if part == "encoder" else ("encoder.", "quant_conv")
        sd = {k: v for k, v in sd.items() if not k.startswith(drop)}
    assert magvit.detect(sd)
    canon = magvit.to_canonical(sd)
    assert magvit.detect(canon)
    cfg = magvit.config_from_state_dict(canon)
    assert cfg.widths == (128, 256, 512, 512) and cfg.layers_per_block == 2 and cfg.latent_channels == 16
    assert cfg.mid_attention == attention
    assert (cfg.has_encoder, cfg.has_decoder) == (part != "decoder", part != "encoder")
    with torch.device("meta"):
        model = magvit.AutoencoderKLMagvit(cfg)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert want == {k: tuple(v.shape) for k, v in canon.items()}
    caps = magvit.capabilities(cfg)
    assert (caps.spatial_ratio, caps.temporal_ratio, caps.default_tile, caps.default_tile_frames) == (8, 4, 512, 64)


def _other_layouts() -> dict[str, dict]:
    from helpers import diffusers_kl, diffusers_tiny
    out = {"kl": diffusers_kl().state_dict(), "tiny": diffusers_tiny().state_dict()}
    with torch.device("meta"):
        for name in ("Mochi", "LTXVideo", "HunyuanVideo", "Wan", "CogVideoX"):
            out[name] = getattr(diffusers, f"AutoencoderKL{name}")().state_dict()
        t5 = torch.empty(8, 8, 3, 3, 3)
        out["genmo-mochi"] = {"encoder.layers.1.layers.0.stack.2.weight": t5, "decoder.blocks.0.0.stack.2.weight": t5}
        out["lightricks-ltx"] = {"encoder.down_blocks.0.res_blocks.0.conv1.conv.weight": t5}
        out["comfy-hunyuan"] = {"encoder.down.0.block.0.conv1.conv.weight": t5,
                                "decoder.up.0.block.0.conv1.conv.weight": t5}
    return out


def test_detect_refuses_other_families():
    for name, sd in _other_layouts().items():
        assert not magvit.detect(sd), name


def test_refuses_bad_frame_counts_and_old_vaes(v51):
    ours = vae.from_state_dict(v51.state_dict())
    with pytest.raises(vae.InputError, match="1 \\+ 4\\*k"):
        ours.model.encode(torch.randn(1, 3, 6, 16, 16))
    x = torch.rand(1, 3, 6, 16, 16)           # the handle keeps core's rule: the first 1 + 4k frames, with a warning
    assert torch.equal(ours.encode(x), ours.encode(x[:, :, :5]))
    torch.manual_seed(0)
    four = diffusers.AutoencoderKLMagvit(block_out_channels=(32,) * 4, layers_per_block=1, latent_channels=4)
    with pytest.raises(vae.LoadError, match="V5/V5.1"):
        vae.from_state_dict(four.state_dict())


@pytest.mark.slow
def test_default_config_parity():
    ref = diffusers_magvit(widths=(128, 256, 512, 512), layers=2)
    ref = jitter_norms(ref).eval()
    ours = vae.from_state_dict(ref.state_dict()).model
    z, x = torch.randn(1, LAT, 3, 8, 8), torch.randn(1, 3, 9, 32, 32)
    with torch.no_grad():
        assert (ours.decode(z) - ref.decode(z).sample).abs().max() <= 1e-4
        assert (ours.encode(x) - ref.encode(x).latent_dist.mode()).abs().max() <= 1e-4
