"""Cosmos-1 tokenizer (CV8x8x8): parity with diffusers' ``AutoencoderKLCosmos`` on the same weights (tiny
config here, the published one under -m slow), the LATENT rule (ComfyUI's and diffusers' pipelines': the
published per-channel, per-frame statistics and sigma_data 0.5), key layouts (the original's = ComfyUI's
file, diffusers', full checkpoints, one half), the config read from shapes, detection both ways, frame
rules, and exact tiles / streaming against the untiled pass.

Parity with ComfyUI core at the published config is bench/comfyui_checks/compare_core.py --family cosmos, run by the
last test when COMFYUI_DIR / COMFYUI_PYTHON name a ComfyUI; its figures are in docs/families/cosmos.md. The
shared engines (tiles, streaming, nodes, workflows) run this family through tests/video_families.py."""
from __future__ import annotations

import inspect
import os

import pytest
import torch

import vae
from helpers import (assert_budget_plans_exact_tiles, assert_layouts_agree, halves, jitter_norms,
                     run_core_check)
from vae import registry
from vae.archs import cosmos
from vae.archs import cosmos_layout as layout

pytestmark = pytest.mark.usefixtures("one_thread")

diffusers = pytest.importorskip("diffusers")

# the published structure (3 levels, the first resampling), narrow
TINY = dict(encoder_block_out_channels=(8, 8, 16, 16), decode_block_out_channels=(8, 16, 16, 16), num_layers=1)


def reference(**config) -> torch.nn.Module:
    torch.manual_seed(0)
    return jitter_norms(diffusers.AutoencoderKLCosmos(**{**TINY, **config}), scale=0.2).eval()


@pytest.fixture(scope="module")
def ref():
    return reference()


@pytest.fixture(scope="module")
def diffusers_sd(ref) -> dict:
    return {k: v.contiguous() for k, v in ref.state_dict().items()}


@pytest.fixture(scope="module")
def original_sd(diffusers_sd) -> dict:
    """ComfyUI's file: the original's names, the wavelet constants, the published statistics."""
    sd = layout.to_original(layout.to_canonical(diffusers_sd))
    sd.update(latent_mean=_published("latents_mean").flatten(), latent_std=_published("latents_std").flatten())
    return sd


@pytest.fixture(scope="module")
def ours(original_sd):
    return vae.from_state_dict(original_sd)


def _published(name: str) -> torch.Tensor:
    """diffusers' default config value (the published CV8x8x8-1.0 statistics), (1, 16, 16, 1, 1)."""
    return torch.tensor(inspect.signature(diffusers.AutoencoderKLCosmos).parameters[name].default).view(1, 16, -1, 1, 1)


def _table(name: str, t: int) -> torch.Tensor:
    """The statistics of t latent frames: frame i takes column i % 16 (ComfyUI repeats the table; diffusers'
    pipelines slice it, the same up to 16 latent frames)."""
    v = _published(name)
    return v[:, :, torch.arange(t) % v.shape[2]]


def _to_latent(z: torch.Tensor) -> torch.Tensor:
    t = z.shape[2]
    return (z - _table("latents_mean", t)) * 0.5 / _table("latents_std", t)


def _from_latent(x: torch.Tensor) -> torch.Tensor:
    t = x.shape[2]
    return x * _table("latents_std", t) / 0.5 + _table("latents_mean", t)


# ---- parity with diffusers -----------------------------------------------------------------------

@pytest.mark.parametrize("t", [1, 2, 3, 5])
def test_decode_equals_diffusers(ref, ours, t):
    z = torch.randn(1, 16, t, 3, 4)
    with torch.no_grad():
        want = ref.decode(z).sample
        want_latent = ref.decode(_from_latent(z)).sample
    got = ours.model.decode(z)
    assert got.shape == want.shape == (1, 3, 1 + 8 * (t - 1), 24, 32)
    scale = want.abs().max()
    assert (got - want).abs().max() <= 1e-5 * scale          # random weights: outputs far outside [-1, 1]
    assert (ours.decode(z) - ((want_latent + 1) / 2).clamp(0, 1)).abs().max() <= 1e-5


@pytest.mark.parametrize("frames", [1, 9, 17])
def test_encode_equals_diffusers(ref, ours, frames):
    x = torch.rand(1, 3, frames, 24, 16)
    with torch.no_grad():
        want = ref.encode(x * 2 - 1).latent_dist.mode()
    got = ours.model.encode(x * 2 - 1)
    assert got.shape == want.shape == (1, 16, 1 + (frames - 1) // 8, 3, 2)
    assert (got - want).abs().max() <= 1e-5
    assert (ours.encode(x) - _to_latent(want)).abs().max() <= 1e-5


def test_latent_statistics_repeat_every_16_latent_frames(ours):
    """ComfyUI's rule past the table (diffusers' pipelines stop at 16 latent frames): frame i uses column
    i % 16; LATENT -> z -> LATENT is the identity."""
    z = torch.randn(1, 16, 20, 1, 1)
    raw = ours.model.prepare_decode(z)
    assert (raw - _from_latent(z)).abs().max() <= 1e-6
    assert (raw[:, :, 16:] - (z[:, :, 16:] * _published("latents_std")[:, :, :4] / 0.5
                              + _published("latents_mean")[:, :, :4])).abs().max() <= 1e-6
    assert (ours.model.finish_encode(raw) - z).abs().max() <= 1e-5


def test_published_statistics_are_diffusers_defaults():
    assert torch.equal(torch.tensor(layout.PUBLISHED_MEAN, dtype=torch.float32).view(1, 16, 16, 1, 1),
                       _published("latents_mean").float())
    assert torch.equal(torch.tensor(layout.PUBLISHED_STD, dtype=torch.float32).view(1, 16, 16, 1, 1),
                       _published("latents_std").float())


def test_a_file_without_statistics_gets_the_published_ones(diffusers_sd, ours):
    """diffusers' weights (statistics in its config, not its file) decode the same LATENT as ComfyUI's file."""
    v = vae.from_state_dict(diffusers_sd)
    assert "published" in v.name
    z = torch.randn(1, 16, 2, 2, 2)
    assert (v.decode(z) - ours.decode(z)).abs().max() <= 1e-6


# ---- frame rules and engines ---------------------------------------------------------------------

def test_frame_rules_and_the_socket(ours, pack, caplog):
    """t latent frames decode to 1 + 8(t-1) frames; 1 + 8k frames encode to k + 1 latents (core's
    floor((T + 7) / 8)); other counts are encoded as core does (the first 1 + 8k frames) with a warning
    that says which counts fit."""
    from vaekit.nodes.socket import VAEKitVAE
    assert [ours.frames_for(t) for t in (1, 2, 3, 16)] == [1, 9, 17, 121]
    x = torch.rand(1, 3, 12, 16, 16)
    with caplog.at_level("WARNING"):
        assert torch.equal(ours.encode(x), ours.encode(x[:, :, :9]))
    assert "the clip has 12 frames" in caplog.text and "9 or 17 frames fit" in caplog.text
    sock = VAEKitVAE(ours)
    assert [sock.upscale_ratio[0](t) for t in (1, 2, 16)] == [1, 9, 121]
    assert [sock.downscale_ratio[0](t) for t in (1, 9, 121)] == [1, 2, 16]
    z = torch.randn(1, 16, 2, 2, 2)
    assert torch.equal(sock.decode(z), ours.decode(z).movedim(1, -1))


def test_exact_tiles_and_streams_equal_the_untiled_pass(ours):
    """Per-frame norms, causal convs and the causal time attention (keys and values cached) stream; the
    norms and the frame attention meet across spatial tiles in rounds."""
    z = torch.randn(1, 16, 4, 6, 6)
    full = ours.decode(z)
    for kw in (dict(tile=32, mode="exact"), dict(tile_frames=8), dict(tile=32, tile_frames=16, mode="exact")):
        assert (ours.decode(z, **kw) - full).abs().max() <= 1e-5, kw
    x = torch.rand(1, 3, 17, 48, 48)
    whole = ours.encode(x)
    for kw in (dict(tile=32, mode="exact"), dict(tile_frames=8), dict(tile=24, tile_frames=8, mode="exact")):
        assert (ours.encode(x, **kw) - whole).abs().max() <= 1e-5, kw


def test_the_budget_planner_plans_smaller_exact_tiles_with_the_untiled_result(ours, caplog):
    assert_budget_plans_exact_tiles(ours, torch.randn(1, 16, 1, 16, 16), (1, 16, 2, 48, 48), (1, 3, 9, 64, 64),
                                    caplog, tile=32)


# ---- layouts, config, detection ------------------------------------------------------------------

def test_every_layout_gives_identical_output(diffusers_sd, original_sd, ours, tmp_path):
    layouts = {"original-core": original_sd,
               "checkpoint-vae-prefix": {f"vae.{k}": v for k, v in original_sd.items()},
               "checkpoint-first-stage": {f"first_stage_model.{k}": v for k, v in original_sd.items()},
               "canonical": ours.state_dict(),
               "diffusers": {**diffusers_sd, **{k: original_sd[k] for k in layout.STATISTICS}}}
    z = torch.randn(1, 16, 2, 2, 3)
    assert_layouts_agree(layouts, tmp_path, "cosmos", lambda v: v.decode(z))


def test_published_config_is_read_from_shapes():
    """diffusers' default config is the published CV8x8x8-1.0 (core builds the same for ComfyUI's file)."""
    with torch.device("meta"):
        published = diffusers.AutoencoderKLCosmos()
    sd = published.state_dict()
    assert registry.detect(sd) is cosmos.SPEC
    cfg = cosmos.SPEC.config_from_state_dict(cosmos.SPEC.to_canonical(sd))
    assert cfg == cosmos.CosmosConfig()
    with torch.device("meta"):
        m = cosmos.CosmosVAE(cfg)
    n = sum(p.numel() for p in m.parameters())
    assert n == sum(p.numel() for p in published.parameters())
    for half in halves(sd):
        read = cosmos.SPEC.config_from_state_dict(cosmos.SPEC.to_canonical(half))
        assert (read.latent_channels, read.patch, read.resample_levels) == (16, 4, 1)
    caps = cosmos.capabilities(cfg)
    assert (caps.spatial_ratio, caps.temporal_ratio, caps.latent_channels) == (8, 8, 16)
    assert caps.stream_decode and caps.stream_encode


def test_decoder_only_and_encoder_only_files(original_sd, ours):
    """Each half with its 1x1x1 conv beside it and the statistics."""
    enc_sd, dec_sd = halves(original_sd)
    extra = lambda *names: {k: v for k, v in original_sd.items() if k.startswith(names)}      # noqa: E731
    enc = vae.from_state_dict({**enc_sd, **extra("quant_conv.", "latent_")})
    dec = vae.from_state_dict({**dec_sd, **extra("post_quant_conv.", "latent_")})
    assert "decoder only" in dec.name and "encoder only" in enc.name
    z, x = torch.randn(1, 16, 2, 2, 2), torch.rand(1, 3, 9, 16, 16)
    assert torch.equal(dec.decode(z), ours.decode(z)) and torch.equal(enc.encode(x), ours.encode(x))


def _other_families() -> dict:
    from helpers import diffusers_kl, diffusers_tiny
    from video_families import FAMILIES, tiny_state_dict
    out = {f: tiny_state_dict(f) for f in FAMILIES if f != "cosmos"}
    out.update(kl=diffusers_kl().state_dict(), taesd=diffusers_tiny().state_dict())
    return out


def test_detected_as_itself_in_every_layout_and_claims_no_other(diffusers_sd, original_sd, ours):
    for name, sd in {"diffusers": diffusers_sd, "original": original_sd, "canonical": ours.state_dict(),
                     "decoder": halves(original_sd)[1], "encoder": halves(original_sd)[0],
                     "diffusers-decoder": halves(diffusers_sd)[1]}.items():
        assert [s.id for s in registry.REGISTRY if s.detect(sd)] == ["cosmos"], name
    for name, other in _other_families().items():
        spec = next((s for s in registry.REGISTRY if s.detect(other)), None)
        for sd in [other] + ([spec.to_canonical(other)] if spec else []):
            assert not cosmos.SPEC.detect(sd), name


# ---- published config and ComfyUI core (slow / optional) ------------------------------------------

@pytest.mark.slow
def test_published_config_equals_diffusers():
    torch.set_num_threads(2)
    ref = reference(encoder_block_out_channels=(128, 256, 512, 512), decode_block_out_channels=(256, 512, 512, 512),
                    num_layers=2)
    v = vae.from_state_dict({k: t.contiguous() for k, t in ref.state_dict().items()})
    z = torch.randn(1, 16, 3, 4, 4)
    with torch.no_grad():
        want = ref.decode(_from_latent(z)).sample
    got = v.decode(z)
    assert (got - ((want + 1) / 2).clamp(0, 1)).abs().max() <= 1e-4
    assert (v.decode(z, tile=16, mode="exact") - got).abs().max() <= 1e-4
    x = got[:, :, :9]
    with torch.no_grad():
        want = _to_latent(ref.encode(x * 2 - 1).latent_dist.mode())
    assert (v.encode(x) - want).abs().max() <= 1e-4


@pytest.mark.skipif(not (os.environ.get("COMFYUI_DIR") and os.environ.get("COMFYUI_PYTHON")),
                    reason="set COMFYUI_DIR and COMFYUI_PYTHON to compare with ComfyUI core")
def test_parity_with_comfyui_core():
    """bench/comfyui_checks/compare_core.py --family cosmos --quick at the published config: ours equals core's VAE
    Decode / Encode and its tokenizer's modules within 1e-4."""
    run_core_check("cosmos")
