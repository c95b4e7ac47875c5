"""CogVideoX VAE: parity with diffusers' ``AutoencoderKLCogVideoX`` on the same weights (tiny config here,
the published one under -m slow), the original's definition (decode in batches of latent frames, encode in
one pass) against diffusers' own code run both ways, key layouts (diffusers = ComfyUI's, the original's
SAT checkpoint, full checkpoints, one half), the config read from shapes, detection both ways, frame
rules (an even latent count decodes to 4t frames) and exact tiles streamed in the reference's batches.

Parity with ComfyUI core (its frame batches differ from the original's) is
bench/comfyui_checks/compare_core.py --family cogvideox, run by the last test when COMFYUI_DIR / COMFYUI_PYTHON
name a ComfyUI; its figures are in docs/families/cogvideox.md. The shared engines (tiles, streaming,
nodes, workflows) run this family through tests/video_families.py."""
from __future__ import annotations

import os

import pytest
import torch

import vae
from helpers import (assert_budget_plans_exact_tiles, assert_layouts_agree, halves, jitter_norms,
                     run_core_check)
from vae import registry
from vae.archs import cogvideox as cog
from vae.archs import cogvideox_layout as layout

pytestmark = pytest.mark.usefixtures("one_thread")

diffusers = pytest.importorskip("diffusers")

TINY = dict(block_out_channels=(32,) * 4, layers_per_block=1)
TEMPLATE_FILE = "cogvideox_vae.safetensors"          # the VAE the official (VOID) template loads


def reference(**config) -> torch.nn.Module:
    """diffusers' class, seeded, norms jittered (a norm's affine and the SpatialNorm convs are not the identity)."""
    torch.manual_seed(0)
    return jitter_norms(diffusers.AutoencoderKLCogVideoX(**{**TINY, **config}), scale=0.2).eval()


@pytest.fixture(scope="module")
def ref():
    return reference()


@pytest.fixture(scope="module")
def core_sd(ref) -> dict:
    """diffusers' keys: also ComfyUI's (its module tree is diffusers'), as ``cogvideox_vae.safetensors`` has them."""
    return {k: v.contiguous() for k, v in ref.state_dict().items()}


@pytest.fixture(scope="module")
def ours(core_sd):
    return vae.from_state_dict(core_sd)


def _diffusers_encode(ref, x: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """diffusers' encode (its 8-frame batches; ``batch`` >= T: one pass), the posterior mean."""
    old, ref.num_sample_frames_batch_size = ref.num_sample_frames_batch_size, batch
    try:
        with torch.no_grad():
            return ref.encode(x).latent_dist.mean
    finally:
        ref.num_sample_frames_batch_size = old


# ---- parity with diffusers -----------------------------------------------------------------------

@pytest.mark.parametrize("t", [1, 2, 3, 4, 5])
def test_decode_equals_diffusers(ref, ours, t):
    """diffusers decodes the original's batches (the first of 2 + t % 2 latent frames, then 2, caches
    carried): the model's decode, and the handle's (streamed in those batches), equal it."""
    z = torch.randn(1, 16, t, 3, 4)
    with torch.no_grad():
        want = ref.decode(z).sample
    got = ours.model.decode(z)
    assert got.shape == want.shape == (1, 3, ours.frames_for(t), 24, 32)
    assert (got - want).abs().max() <= 1e-5
    assert (ours.decode(z) - ((want + 1) / 2).clamp(0, 1)).abs().max() <= 1e-5


@pytest.mark.parametrize("frames", [1, 5, 9, 13])
def test_encode_equals_diffusers_where_its_batches_are_one_pass(ref, ours, frames):
    """Up to 15 frames diffusers' encode is one batch: the original's one pass."""
    x = torch.rand(1, 3, frames, 24, 16)
    want = _diffusers_encode(ref, x * 2 - 1)
    got = ours.encode(x)
    assert got.shape == want.shape == (1, 16, 1 + (frames - 1) // 4, 3, 2)
    assert (got - want).abs().max() <= 1e-5


def test_encode_is_one_pass_as_the_original_diffusers_batches_differ(ref, ours):
    """The original encodes a clip in one pass (GroupNorm over all its frames); diffusers encodes 8-frame
    batches (the first with T % 8 more) from 17 frames on. Ours equals diffusers' own code run as one
    batch, and differs from its batches by what the statistics of a batch change."""
    x = torch.rand(1, 3, 17, 24, 16)
    got = ours.encode(x)
    one_pass = _diffusers_encode(ref, x * 2 - 1, batch=17)
    batched = _diffusers_encode(ref, x * 2 - 1)
    assert (got - one_pass).abs().max() <= 1e-5
    gap = (batched - one_pass).abs().max().item()
    print(f"CogVideoX encode of 17 frames: diffusers' (9, 8) batches vs one pass: max {gap:.3g} "
          f"(latent range {one_pass.abs().max().item():.3g})")
    assert gap > 1e-2


def test_decode_batches_are_the_definition(ours):
    """A decode batch's GroupNorm sees only its frames: the same latent decoded as one pass differs, so
    the batches are part of the result (the engines stream exactly those)."""
    z = torch.randn(1, 16, 5, 3, 3)
    m = ours.model
    with torch.no_grad():
        batched = m.decode(z)
        whole = m.decoder(z)       # one pass over all 5 latent frames
    assert batched.shape == whole.shape == (1, 3, 17, 24, 24)
    assert (batched[:, :, :9] - m.decode(z[:, :, :3])).abs().max() <= 1e-5      # the first batch alone
    assert (batched - whole).abs().max() > 1e-2


# ---- frame rules and engines ---------------------------------------------------------------------

def test_frame_rules_and_the_template_socket(ours, pack, caplog):
    """An odd t decodes to 1 + 4(t-1) frames, an even t to 4t (no lone first frame: diffusers and core
    alike; the VOID template's latents are even); 1 + 4k frames encode to k + 1 latents (other counts: the first 1 + 4k, as core, with a warning). The socket core's
    nodes call states the decoded frame count."""
    from vaekit.nodes.socket import VAEKitVAE
    assert [ours.frames_for(t) for t in (1, 2, 3, 4, 13, 22)] == [1, 8, 9, 16, 49, 88]
    assert ours.decode(torch.randn(1, 16, 4, 2, 2)).shape == (1, 3, 16, 16, 16)
    assert ours.encode(torch.rand(1, 3, 9, 16, 16)).shape == (1, 16, 3, 2, 2)
    x8 = torch.rand(1, 3, 8, 16, 16)                    # as core: the first 1 + 4k frames, with a warning
    with caplog.at_level("WARNING"):
        assert torch.equal(ours.encode(x8), ours.encode(x8[:, :, :5]))
    assert "the clip has 8 frames" in caplog.text and "5 or 9 frames fit" in caplog.text
    sock = VAEKitVAE(ours)
    assert [sock.upscale_ratio[0](t) for t in (1, 2, 3, 22)] == [1, 8, 9, 88]
    assert [sock.downscale_ratio[0](t) for t in (1, 5, 9, 85)] == [1, 2, 3, 22]     # core's floor((T+3)/4)
    z = torch.randn(1, 16, 2, 2, 2)
    y = sock.decode(z)
    assert y.shape == (1, 8, 16, 16, 3) and torch.equal(y, ours.decode(z).movedim(1, -1))


def test_exact_tiles_stream_the_batches(ours):
    """Exact mode: 2x2 spatial tiles share each batch's GroupNorm statistics and stream the batches
    (3, 2) through their own caches; equal to the untiled decode. A call's temporal tile size does not
    change the batches."""
    z = torch.randn(1, 16, 5, 4, 4)
    calls = []
    out = ours.decode(z, tile=24, tile_frames=4, mode="exact", progress=lambda d, n: calls.append(n))
    assert calls[-1] == 4 * 2
    assert (out - ours.decode(z)).abs().max() <= 1e-5
    x = torch.rand(1, 3, 9, 32, 32)
    assert (ours.encode(x, tile=24, mode="exact") - ours.encode(x)).abs().max() <= 1e-5


def test_the_budget_planner_plans_smaller_exact_tiles_with_the_untiled_result(ours, caplog):
    """Measured on the meta device (a batch's GroupNorm: tiles meet in rounds, streamed in the batches):
    below an untiled pass's prediction the planner picks smaller exact tiles, with the untiled result;
    planned for a GPU the tiles of a batch of 2 latent frames need at most half the untiled pass."""
    assert_budget_plans_exact_tiles(ours, torch.randn(1, 16, 1, 16, 16), (1, 16, 2, 16, 16), (1, 3, 9, 64, 64),
                                    caplog, tile=32)


# ---- layouts, config, detection ------------------------------------------------------------------

def test_core_layout_names(core_sd):
    """The names ComfyUI detects the family by, the wrapped causal convs, 2-D resamplers."""
    assert "decoder.conv_in.conv.weight" in core_sd and "decoder.mid_block.resnets.0.norm1.norm_layer.weight" in core_sd
    assert core_sd["encoder.down_blocks.0.downsamplers.0.conv.weight"].dim() == 4
    assert core_sd["decoder.up_blocks.0.upsamplers.0.conv.weight"].dim() == 4
    assert "decoder.up_blocks.3.upsamplers.0.conv.weight" not in core_sd        # the finest level runs last
    assert core_sd["decoder.norm_out.conv_y.conv.weight"].shape == (32, 16, 1, 1, 1)


def test_every_layout_gives_identical_output(core_sd, ours, tmp_path):
    original = layout.to_original(ours.state_dict())
    assert "encoder.down.0.block.0.conv1.conv.weight" in original and "decoder.up.3.upsample.conv.weight" in original
    loss = {"loss.discriminator.main.0.weight": torch.randn(4, 3, 3, 3), "loss.logvar": torch.zeros(())}
    layouts = {"diffusers-core": core_sd, "checkpoint-vae-prefix": {f"vae.{k}": v for k, v in core_sd.items()},
               "checkpoint-first-stage": {f"first_stage_model.{k}": v for k, v in core_sd.items()},
               "canonical": ours.state_dict(), "original-sat-pt": {"state_dict": {**original, **loss}}}
    z = torch.randn(1, 16, 3, 2, 3)
    assert_layouts_agree(layouts, tmp_path, "cogvideox", lambda v: v.decode(z))


def test_published_config_is_read_from_shapes():
    """diffusers' default config is every published one (2B, 5B, 5B-I2V, 1.5-5B: widths 128/256/256/512,
    3 resnets, 16 latent channels; they differ in the latent scale only): 215,583,907 parameters."""
    with torch.device("meta"):
        published = diffusers.AutoencoderKLCogVideoX()
    sd = published.state_dict()
    assert registry.detect(sd) is cog.SPEC
    cfg = cog.SPEC.config_from_state_dict(cog.SPEC.to_canonical(sd))
    assert cfg == cog.CogVideoXConfig()
    with torch.device("meta"):
        ours = cog.CogVideoXVAE(cfg)
    n = sum(p.numel() for p in ours.parameters())
    assert n == sum(p.numel() for p in published.parameters()) == 215_583_907
    for half in halves(sd):
        read = cog.SPEC.config_from_state_dict(cog.SPEC.to_canonical(half))
        assert (read.widths, read.layers_per_block, read.latent_channels) == ((128, 256, 256, 512), 3, 16)
    caps = cog.capabilities(cfg)
    assert (caps.latent_channels, caps.spatial_ratio, caps.temporal_ratio) == (16, 8, 4)
    assert caps.stream_decode and caps.stream_batches and caps.stream_chunk == 2 and not caps.stream_encode
    assert caps.first_frame_odd_only and caps.norm == "groupnorm_clip"


def test_decoder_only_and_encoder_only_files(core_sd, ours):
    enc_sd, dec_sd = halves(core_sd)
    enc, dec = vae.from_state_dict(enc_sd), vae.from_state_dict(dec_sd)
    assert "decoder only" in dec.name and "encoder only" in enc.name
    z, x = torch.randn(1, 16, 3, 2, 2), torch.rand(1, 3, 5, 16, 16)
    assert torch.equal(dec.decode(z), ours.decode(z)) and torch.equal(enc.encode(x), ours.encode(x))


def _other_families() -> dict:
    from helpers import diffusers_kl, diffusers_tiny
    from video_families import FAMILIES, tiny_state_dict
    out = {f: tiny_state_dict(f) for f in FAMILIES if f != "cogvideox"}
    out.update(kl=diffusers_kl().state_dict(), taesd=diffusers_tiny().state_dict())
    return out


def test_detected_as_itself_in_every_layout_and_claims_no_other(core_sd, ours):
    canonical = ours.state_dict()
    for name, sd in {"core": core_sd, "canonical": canonical, "original": layout.to_original(canonical),
                     "core-decoder": halves(core_sd)[1], "core-encoder": halves(core_sd)[0]}.items():
        assert [s.id for s in registry.REGISTRY if s.detect(sd)] == ["cogvideox"], name
    for name, other in _other_families().items():
        spec = next((s for s in registry.REGISTRY if s.detect(other)), None)
        for sd in [other] + ([spec.to_canonical(other)] if spec else []):
            assert not cog.SPEC.detect(sd), name


def test_half_precision_file_under_the_templates_name(core_sd, ours, tmp_path, pack):
    """The template's file name through the VAE Load node, bf16 weights run in fp32."""
    from safetensors.torch import save_file
    from vaekit.nodes import _comfy
    from vaekit.nodes.loader import VAEKitLoad
    (tmp_path / "vae").mkdir()
    save_file({k: v.to(torch.bfloat16) for k, v in core_sd.items()}, str(tmp_path / "vae" / TEMPLATE_FILE))
    z = torch.randn(1, 16, 2, 2, 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VAEKIT_MODEL_DIRS", str(tmp_path))
        assert TEMPLATE_FILE in _comfy.vae_choices()
        (socket,) = VAEKitLoad().load(TEMPLATE_FILE, dtype="fp32", device="cpu")
    assert socket.handle.spec is cog.SPEC and socket.handle.dtype == torch.float32
    assert (socket.handle.decode(z) - ours.decode(z)).abs().max() <= 0.05          # bf16-rounded weights


# ---- published config and ComfyUI core (slow / optional) ------------------------------------------

@pytest.mark.slow
def test_published_config_equals_diffusers():
    """The published config, random weights, fp32: decode (a batch of 3, then 2) and encode (one batch)
    against diffusers, and exact tiles against the untiled decode."""
    torch.set_num_threads(2)
    ref = reference(block_out_channels=(128, 256, 256, 512), layers_per_block=3)
    v = vae.from_state_dict({k: t.contiguous() for k, t in ref.state_dict().items()})
    z = torch.randn(1, 16, 5, 4, 4)
    with torch.no_grad():
        want = ref.decode(z).sample
    got = v.decode(z)
    assert (got - ((want + 1) / 2).clamp(0, 1)).abs().max() <= 1e-4
    assert (v.decode(z, tile=16, mode="exact") - got).abs().max() <= 1e-4
    x = got[:, :, :9]
    assert (v.encode(x) - _diffusers_encode(ref, x * 2 - 1)).abs().max() <= 1e-4


@pytest.mark.skipif(not (os.environ.get("COMFYUI_DIR") and os.environ.get("COMFYUI_PYTHON")),
                    reason="set COMFYUI_DIR and COMFYUI_PYTHON to compare with ComfyUI core")
def test_parity_with_comfyui_core():
    """bench/comfyui_checks/compare_core.py --family cogvideox --quick on the published config: where core's frame
    grouping is the original's (one frame; a clip of at most 8 frames; core's own model run in the
    original's batches) ours equals core within 1e-4; its printed table has the rest."""
    run_core_check("cogvideox")
