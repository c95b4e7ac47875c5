"""Stable Cascade's stage A (Paella's VQ-GAN): parity with diffusers' ``PaellaVQModel`` on the same
weights (decode, encode, the codebook), both key layouts (ComfyUI's single file / the original's, and
diffusers'), hyperparameters from shapes, half files, detection both ways, the socket core's nodes
read, and the engines (exact tiles = untiled both ways, the budget).

Random weights at a narrow config of the published structure (tests/helpers.diffusers_paella); the
published config in the slow test. Parity with ComfyUI core (COMFYUI_DIR + COMFYUI_PYTHON):
bench/comfyui_checks/compare_core.py --family stage_a."""
from __future__ import annotations

import os

import pytest
import torch

import vae
from helpers import (assert_budget_plans_exact_tiles, assert_exact_tiles_both_ways, assert_layouts_agree,
                     core_parity_rows, diffusers_paella, reference_state_dicts)
from vae import registry
from vae.archs import stage_a
from vae.loading import unwrap

PARITY = 1e-4    # fp32, 0..1 pixels / latents
VISIBLE = 1e-3   # what fast tiles change: the case is not trivially seamless

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference():
    return diffusers_paella()


@pytest.fixture(scope="module")
def ours(reference):
    return vae.from_state_dict(reference.state_dict())


def core_layout(sd: dict) -> dict:
    """The original's / ComfyUI's single file: diffusers' keys with the codebook under its own name."""
    return {k.replace("vquantizer.embedding.", "vquantizer.codebook."): v for k, v in sd.items()}


def _latent(h: int, w: int, b: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, 4, h, w, generator=torch.Generator().manual_seed(seed))


def _images(h: int, w: int, b: int = 1, seed: int = 2) -> torch.Tensor:
    return torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


# ---- parity with diffusers ------------------------------------------------------------------------

def test_decode_and_encode_match_diffusers(reference, ours):
    """diffusers' decode (its default: the latent as given, not re-quantized) and encode (the latent
    BatchNorm's output, not quantized), as core runs them too; ours clamps the IMAGE to 0..1."""
    z, x = _latent(6, 10, b=2), _images(24, 40, b=2)
    with torch.inference_mode():
        want_y, want_z = reference.decode(z).sample, reference.encode(x).latents
        raw = ours.model.decode(z)
    assert (raw - want_y).abs().max() <= PARITY
    assert (ours.decode(z) - want_y.clamp(0, 1)).abs().max() <= PARITY
    assert (ours.encode(x) - want_z).abs().max() <= PARITY
    assert ours.encode(x).shape == (2, 4, 6, 10) and ours.decode(z).shape == (2, 3, 24, 40)


def test_quantize_is_diffusers_nearest_code(reference, ours):
    """The codebook: each latent pixel snapped to its nearest code, as diffusers' VectorQuantizer (and
    core's ``StageA.encode(quantize=True)``) does; decode never applies it."""
    z = reference.encode(_images(16, 24)).latents.detach()
    z = z + 0.05 * torch.randn(z.shape, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        want, _, _ = reference.vquantizer(z)
        assert (ours.model.quantize(z) - want).abs().max() <= PARITY
        assert (ours.model.decode(z) - ours.model.decode(ours.model.quantize(z))).abs().max() > VISIBLE


def test_bf16_runs_the_replicate_padding(reference, ours):
    """bf16, core's first working dtype: the depthwise convs' replicate padding runs in bf16 (core falls
    back to fp32 padding where a kernel lacks it); within bf16 rounding of fp32."""
    v = vae.from_state_dict(reference.state_dict(), dtype=torch.bfloat16)
    z, x = _latent(6, 8), _images(24, 32)
    assert v.dtype == torch.bfloat16
    assert (v.decode(z) - ours.decode(z)).abs().max() <= 2e-2
    assert (v.encode(x) - ours.encode(x)).abs().max() <= 2e-2


# ---- files ----------------------------------------------------------------------------------------

def _layouts(sd: dict) -> dict:
    core = core_layout(sd)
    return {"diffusers": sd, "comfyui": core, "prefixed": {f"first_stage_model.{k}": v for k, v in core.items()},
            "wrapped": {"state_dict": core}}


def test_every_layout_round_trips_through_the_loader(tmp_path, reference):
    z, x = _latent(3, 4), _images(12, 16)
    assert_layouts_agree(_layouts(reference.state_dict()), tmp_path, "stage_a",
                         lambda v: torch.cat([v.decode(z).flatten(), v.encode(x).flatten()]))


def test_widths_and_depths_come_from_the_weights():
    from diffusers.pipelines.deprecated.wuerstchen.modeling_paella_vq_model import PaellaVQModel
    torch.manual_seed(0)
    m = PaellaVQModel(levels=3, bottleneck_blocks=3, embed_dim=48, latent_channels=6, num_vq_embeddings=32).eval()
    v = vae.from_state_dict(m.state_dict())
    cfg = v.config
    assert (cfg.widths, cfg.bottleneck_blocks, cfg.latent_channels, cfg.codebook_size, cfg.hidden) == \
        ((12, 24, 48), 3, 6, 32, 4)
    assert v.caps.spatial_ratio == 8 and v.caps.latent_channels == 6
    z = torch.randn(1, 6, 3, 5)
    with torch.inference_mode():
        assert (v.model.decode(z) - m.decode(z).sample).abs().max() <= PARITY
    cfg = stage_a.config_from_state_dict(stage_a.SPEC.to_canonical(core_layout(diffusers_paella_meta_state_dict())))
    assert (cfg.widths, cfg.bottleneck_blocks, cfg.latent_channels, cfg.codebook_size) == ((192, 384), 12, 4, 8192)


def diffusers_paella_meta_state_dict() -> dict:
    """The published config's keys and shapes, without weights."""
    from diffusers.pipelines.deprecated.wuerstchen.modeling_paella_vq_model import PaellaVQModel
    with torch.device("meta"):
        return PaellaVQModel().state_dict()


def test_encoder_only_and_decoder_only_files(reference, ours):
    sd = core_layout(reference.state_dict())
    dec_keys = ("up_blocks.", "out_block.")
    enc = vae.from_state_dict({k: v for k, v in sd.items() if not k.startswith(dec_keys)})
    dec = vae.from_state_dict({k: v for k, v in sd.items() if k.startswith((*dec_keys, "vquantizer."))})
    assert enc.spec.id == dec.spec.id == "stage_a"
    assert enc.name.endswith("encoder only)") and dec.name.endswith("decoder only)")
    z, x = _latent(3, 4), _images(12, 16)
    assert torch.equal(dec.decode(z), ours.decode(z)) and torch.equal(enc.encode(x), ours.encode(x))
    with pytest.raises(vae.InputError, match="no encoder"):
        dec.encode(x)
    with pytest.raises(vae.InputError, match="no decoder"):
        enc.decode(z)
    without = {k: v for k, v in sd.items() if not k.startswith("vquantizer.")}
    with pytest.raises(vae.LoadError, match="vquantizer.codebook.weight"):
        vae.from_state_dict(without)
    # a saver that drops BatchNorm's counter: the VAE never reads it
    counter = "down_blocks.3.1.num_batches_tracked"
    assert torch.equal(vae.from_state_dict({k: v for k, v in sd.items() if k != counter}).encode(x), ours.encode(x))


def test_a_half_that_disagrees_is_refused(reference):
    from diffusers.pipelines.deprecated.wuerstchen.modeling_paella_vq_model import PaellaVQModel
    other = PaellaVQModel(bottleneck_blocks=2, embed_dim=64, num_vq_embeddings=64).state_dict()
    mixed = {**{k: v for k, v in reference.state_dict().items() if k.startswith(("in_block.", "down_blocks."))},
             **{k: v for k, v in other.items() if k.startswith(("up_blocks.", "out_block."))}}
    with pytest.raises(vae.LoadError, match="not one VAE"):
        vae.from_state_dict(mixed)


def test_detection_across_families(reference):
    """Stage A files are stage A in every layout, and no other family's detection claims them (each
    asked directly, not only in registry order); no other family's file is claimed by stage A."""
    for name, sd in _layouts(reference.state_dict()).items():
        sd = unwrap(sd.get("state_dict", sd))
        sd = {k.removeprefix("first_stage_model."): v for k, v in sd.items()}
        assert registry.detect(sd).id == "stage_a", name
        for spec in registry.REGISTRY:
            if spec.id != "stage_a":
                assert not spec.detect(sd), (name, spec.id)
    for name, other in reference_state_dicts().items():
        if name == "stage_a":
            continue
        assert not stage_a.SPEC.detect(other) and registry.detect(other).id != "stage_a", name


# ---- ComfyUI's view ---------------------------------------------------------------------------------

def test_what_core_reads_from_the_socket(pack, ours):
    """Core's stage A branch: 4x both ways, 4 latent channels, images in 0..1 as they are; its VAE
    Encode crops sides to multiples of 4; decode returns [B, H, W, 3]. Stable Cascade's LATENT
    (StableCascade_EmptyLatentImage's stage_b: [B, 4, H/4, W/4]) decodes as it is."""
    from vaekit.nodes.socket import VAEKitVAE
    v = VAEKitVAE(ours)
    assert v.latent_channels == 4 and v.latent_dim == 2
    assert v.spacial_compression_decode() == v.spacial_compression_encode() == v.downscale_ratio == v.upscale_ratio == 4
    image = torch.rand(1, 18, 23, 3)
    z = v.encode(image)
    assert z.shape == (1, 4, 4, 5)
    assert torch.equal(z, ours.encode(image[:, 1:17, 1:21].movedim(-1, 1)))
    assert v.decode(z).shape == (1, 16, 20, 3)


# ---- engines ------------------------------------------------------------------------------------

def test_exact_tiles_equal_untiled_both_ways(ours):
    """Tiles of 3 latent pixels, far narrower than the convs' reach through the bottleneck blocks:
    exact mode reproduces the untiled result; fast tiles visibly do not."""
    r = ours.caps.spatial_ratio
    z = _latent(13, 15)
    x = _images(13 * r, 15 * r)
    assert_exact_tiles_both_ways(ours, z, x, 3 * r, r, PARITY, VISIBLE)


def test_the_budget_planner_plans_smaller_exact_tiles_with_the_untiled_result(ours, caplog):
    """Measured on the meta device: below an untiled pass's prediction the planner picks smaller exact
    tiles, with the untiled result; planned for a GPU, tiles of a 128x128 latent need at most half the
    untiled pass."""
    assert_budget_plans_exact_tiles(ours, _latent(24, 24), (1, 4, 128, 128), (1, 3, 96, 96), caplog, tile=32)


@pytest.mark.slow
def test_published_config_parity_and_exact_tiles():
    """The published config (2 levels, 12 bottleneck blocks, 384 wide, 8192 codes), random weights:
    diffusers' decode and encode, exact 256 px tiles on a 96x80 latent (384x320 px)."""
    ref = diffusers_paella(published=True)
    v = vae.from_state_dict(core_layout(ref.state_dict()))
    z, x = _latent(96, 80), _images(384, 320)
    with torch.inference_mode():
        want_y, want_z = ref.decode(z).sample, ref.encode(x).latents
        raw = v.model.decode(z)
    untiled, lat = v.decode(z), v.encode(x)
    dec, enc = (raw - want_y).abs().max().item(), (lat - want_z).abs().max().item()
    assert (untiled - want_y.clamp(0, 1)).abs().max() <= PARITY
    exact = (v.decode(z, tile=256, mode="exact") - untiled).abs().max().item()
    exact_enc = (v.encode(x, tile=256, mode="exact") - lat).abs().max().item()
    print(f"stage A published config: vs diffusers decode (unclamped) {dec:.2e}, encode {enc:.2e}; exact vs untiled "
          f"decode {exact:.2e}, encode {exact_enc:.2e}")
    assert max(dec, enc, exact, exact_enc) <= PARITY


@pytest.mark.skipif(not (os.environ.get("COMFYUI_DIR") and os.environ.get("COMFYUI_PYTHON")),
                    reason="set COMFYUI_DIR and COMFYUI_PYTHON to compare with ComfyUI core's stage A")
def test_matches_comfyui_core(tmp_path):
    parity = core_parity_rows("stage_a", tmp_path)
    assert all(r["max"] <= PARITY for r in parity), [r for r in parity if r["max"] > PARITY]