"""Stable Video Diffusion's VAE: parity with diffusers (tiny published structure, random weights, mix
factors drawn), the clip rule (each clip decoded together; chunks as the original's ``decoding_t`` and
diffusers' ``decode_chunk_size``), every layout users have (the original's = core's, full checkpoints,
SV3D's decoder-only first stage, diffusers', fp16), the config and the 128 temporal tensors read from the
weights, detection both ways (SD's KL detection declines it), ComfyUI's [T, 4, h, w] layout in the
library and on the socket as core presents its own, exact tiles and the memory planner.

The engines (fast and exact tiles, temporal tiles, nodes, workflows) run through the shared harness
(tests/video_families.py). The comparison against ComfyUI core and the original code is
bench/comfyui_checks/compare_core.py --family svd (also run below when COMFYUI_DIR and COMFYUI_PYTHON name a
ComfyUI, and SVD_REFERENCE a Stability-AI/generative-models checkout)."""
from __future__ import annotations

import sys
import os
from pathlib import Path

import pytest
import torch

import vae
from helpers import ROOT, assert_layouts_agree, core_parity_rows
from vae import registry
from vae.archs import svd
from vae.archs import svd_layout as layout
from video_families import tiny_reference

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

PARITY = 1e-4          # the project's fp32 bar against a reference (observed here: ~1e-6)
TINY_Z = (4, 4, 3, 2)  # a LATENT [T, 4, h, w]: one clip of 4 frames


def _identity_quant(ref):
    """diffusers' quant conv (the conditioner encoder's) set to the identity: then diffusers' encoder and
    the original's first stage (no quant conv) are one function, and one set of weights serves both."""
    with torch.no_grad():
        ref.quant_conv.weight.copy_(torch.eye(8)[:, :, None, None])
        ref.quant_conv.bias.zero_()
    return ref


@pytest.fixture(scope="module")
def ref():
    return _identity_quant(tiny_reference("svd"))


@pytest.fixture(scope="module")
def original_sd(ref) -> dict:
    """The weights in the original's (= core's) names, as ``svd_xt.safetensors`` holds them under
    ``first_stage_model.``: no quant conv."""
    return {k: v.contiguous() for k, v in layout.to_canonical(ref.state_dict()).items() if not k.startswith("quant_conv.")}


@pytest.fixture(scope="module")
def ours(original_sd):
    return vae.from_state_dict(original_sd)


def _decode(ref, z: torch.Tensor, frames: int) -> torch.Tensor:
    with torch.no_grad():
        return ((ref.decode(z, num_frames=frames).sample + 1) / 2).clamp(0, 1)


# ---- parity and the clip rule ---------------------------------------------------------------------

def test_decode_and_encode_match_diffusers(ref, ours):
    """ComfyUI's LATENT [T, 4, h, w] is one clip (diffusers ``num_frames=T``); a [B, 4, T, h, w] latent is B
    clips (diffusers' batch of B clips); encode is frame by frame (the posterior mode)."""
    z = torch.randn(TINY_Z)
    out = ours.decode(z)
    assert out.shape == (4, 3, 24, 16)
    assert (out - _decode(ref, z, 4)).abs().max() <= PARITY
    clips = torch.randn(2, 4, 3, 2, 3)                         # two clips of 3 frames
    want = _decode(ref, clips.transpose(1, 2).flatten(0, 1), 3).unflatten(0, (2, 3)).transpose(1, 2)
    assert (ours.decode(clips) - want).abs().max() <= PARITY
    x = torch.rand(3, 3, 24, 16)
    with torch.no_grad():
        want = ref.encode(x * 2 - 1).latent_dist.mode()
    got = ours.encode(x)
    assert got.shape == (3, 4, 3, 2) and (got - want).abs().max() <= PARITY
    assert torch.equal(ours.encode(x.movedim(0, 1).unsqueeze(0))[0].movedim(1, 0), got)


def test_frames_of_a_clip_are_decoded_together(ref, ours):
    """The decoder mixes frames (its time convs and clip GroupNorms): frame 0 alone is not frame 0 of a
    clip. The original's ``decoding_t`` / diffusers' ``decode_chunk_size`` decode chunks as clips of their
    own: decoding each chunk alone is that definition; the clips of a batch are independent."""
    z = torch.randn(7, 4, 3, 2)
    one = ours.decode(z)
    alone = ours.decode(z[:1])
    assert (alone - one[:1]).abs().max() > 1e-3                  # a per-frame decoder would pass here
    chunked = torch.cat([ours.decode(z[i:i + 3]) for i in range(0, 7, 3)])
    want = torch.cat([_decode(ref, z[i:i + 3], len(z[i:i + 3])) for i in range(0, 7, 3)])
    assert (chunked - want).abs().max() <= PARITY
    assert (chunked - one).abs().max() > 1e-3
    pair = torch.stack([z[:3], z[3:6]]).transpose(1, 2)          # [2, 4, 3, h, w]
    both = ours.decode(pair)
    for i in range(2):
        assert (both[i] - ours.decode(pair[i:i + 1])[0]).abs().max() <= 1e-6


# ---- layouts, config, detection -------------------------------------------------------------------

def test_every_layout_gives_identical_output(ref, original_sd, tmp_path):
    """The original's VAE file, a full checkpoint (its VAE under ``first_stage_model.``, beside the UNet and
    the conditioner's own SD VAE, which is not read) as .safetensors and as a pickled ``state_dict``; and,
    with diffusers' quant conv, diffusers' file and the canonical file this pack writes."""
    other = {f"conditioner.embedders.3.encoder.{k}": torch.zeros(1) + 7 for k in ("encoder.conv_in.weight",
                                                                                 "quant_conv.weight")}
    full = {**{f"first_stage_model.{k}": v for k, v in original_sd.items()}, **other,
            "model.diffusion_model.input_blocks.0.0.weight": torch.zeros(2, 8, 3, 3)}
    z, x = torch.randn(TINY_Z), torch.rand(2, 3, 24, 16)
    run = lambda v: torch.cat([v.decode(z).flatten(), v.encode(x).flatten()])      # noqa: E731
    assert_layouts_agree({"original": original_sd, "checkpoint": full, "ckpt": {"state_dict": full}},
                         tmp_path, "svd", run)
    canonical = vae.from_state_dict(ref.state_dict()).state_dict()
    assert_layouts_agree({"diffusers": ref.state_dict(), "canonical": canonical}, tmp_path, "svd", run)
    # the same function either way (an identity quant conv)
    a, b = vae.from_state_dict(original_sd), vae.from_state_dict(ref.state_dict())
    assert (run(a) - run(b)).abs().max() <= 1e-6


def test_published_config_and_its_128_temporal_tensors_are_read_from_shapes():
    """svd_xt's published config (diffusers' config.json) on the meta device: the KL shapes, the (3, 1, 1)
    kernel, and the 128 tensors that an SD VAE lacks (the 'unexpected keys' an SD reading reports)."""
    with torch.device("meta"):
        m = diffusers.AutoencoderKLTemporalDecoder(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                                                   down_block_types=("DownEncoderBlock2D",) * 4)
    sd = layout.to_canonical(m.state_dict())
    cfg = svd.config_from_state_dict(sd)
    assert (cfg.ch, cfg.ch_mult, cfg.num_res_blocks, cfg.z_channels, cfg.time_kernel) == (128, (1, 2, 4, 4), 2, 4, 3)
    assert sum(bool(layout.TEMPORAL.match(k)) for k in sd) == 128
    with torch.device("meta"):
        built = svd.SVDVAE(cfg)
    assert set(built.state_dict()) == set(sd)


def test_decoder_only_files_and_an_encoder_alone(original_sd, ours):
    """SV3D's checkpoints hold only the decoder under ``first_stage_model.``: a decoder-only SVD VAE. An
    encoder alone is SD's KL encoder, loaded as such (the same latents)."""
    dec = vae.from_state_dict({k: v for k, v in original_sd.items() if k.startswith("decoder.")})
    assert dec.spec.id == "svd" and "decoder only" in dec.name and not dec.caps.can_encode
    z = torch.randn(TINY_Z)
    assert torch.equal(dec.decode(z), ours.decode(z))
    with pytest.raises(vae.InputError, match="no encoder"):
        dec.encode(torch.rand(1, 3, 16, 16))
    enc = vae.from_state_dict({k: v for k, v in original_sd.items() if k.startswith("encoder.")})
    assert enc.spec.id == "kl" and not enc.caps.can_decode
    x = torch.rand(2, 3, 24, 16)
    # the KL handle runs channels_last, a video one contiguous: other CPU kernels, float rounding apart
    assert (enc.encode(x) - ours.encode(x)).abs().max() <= 1e-5


def _other_families() -> dict:
    from helpers import reference_state_dicts
    return {k: v for k, v in reference_state_dicts().items() if k != "svd"}


def test_detected_as_itself_and_no_other_family_claims_it_or_is_claimed(ref, original_sd):
    """SVD in either layout is detected by SVD alone (SD's KL detection declines its temporal keys, so
    the file is no longer 'a damaged SD VAE with 128 unexpected keys'); no other family's file is SVD."""
    for sd in (original_sd, ref.state_dict()):
        assert [s.id for s in registry.REGISTRY if s.detect(sd)] == ["svd"]
    for name, sd in _other_families().items():
        assert not svd.SPEC.detect(sd), name


def test_unpublished_variants_are_refused_with_a_reason(original_sd):
    """The original's time_mode 'all' (attention that mixes frames) and an even temporal kernel."""
    extra = {**original_sd, "decoder.mid.attn_1.time_mix_block.attn1.to_q.weight": torch.zeros(32, 32)}
    with pytest.raises(vae.LoadError, match="time_mode 'all'"):
        vae.from_state_dict(extra)
    key = "decoder.conv_out.time_mix_conv.weight"
    even = {**original_sd, key: torch.zeros(3, 3, 2, 1, 1)}
    with pytest.raises(vae.LoadError, match="odd number of frames"):
        vae.from_state_dict(even)


# ---- ComfyUI's layout: library, socket, nodes --------------------------------------------------------

def test_comfyui_layout_is_one_clip_both_ways(ours):
    """[T, 4, h, w] in, [T, 3, H, W] out (and images [T, 3, H, W] -> [T, 4, h, w]); the same clip as
    [1, 4, T, h, w]. Other ranks and channel counts are named."""
    z = torch.randn(TINY_Z)
    assert torch.equal(ours.decode(z), ours.decode(z.movedim(0, 1).unsqueeze(0))[0].movedim(1, 0))
    assert ours.call_for("decode", z.shape).grid == (4, 3, 2)
    with pytest.raises(vae.InputError, match=r"one clip's frames \[frames, C, h, w\]"):
        ours.decode(torch.randn(4, 3, 2))
    with pytest.raises(vae.InputError, match=r"16 channels \(as SD3/Flux.1 latents do\)"):
        ours.decode(torch.randn(4, 16, 3, 2))
    assert "SVD" in registry.channel_hint(4, 4)


def test_socket_presents_it_as_core_presents_its_own(ours, pack):
    """Core builds SVD's VAE as an image-style VAE (latent_dim 2, ratio 8, no temporal compression): its
    SVD_img2vid_Conditioning encodes one frame to [1, 4, h, w] and its VAE Decode gets [T, 4, h, w]."""
    from vaekit.nodes.socket import VAEKitVAE
    s = VAEKitVAE(ours)
    assert (s.latent_dim, s.downscale_ratio, s.upscale_ratio, s.latent_channels) == (2, 8, 8, 4)
    assert s.temporal_compression_decode() is None and s.downscale_index_formula is None
    image = torch.rand(1, 20, 17, 3)                            # centre-cropped to 16x16, as core does
    t = s.encode(image)
    assert t.shape == (1, 4, 2, 2)
    assert torch.equal(t, ours.encode(image[:, 2:18, :16].movedim(-1, 1)))
    z = torch.randn(TINY_Z)
    frames = s.decode(z)
    assert frames.shape == (4, 24, 16, 3) and torch.equal(frames, ours.decode(z).movedim(1, -1))
    tiled = s.decode_tiled(z, tile_x=2, tile_y=2, overlap=1)    # core's VAE Decode (Tiled): tile_t None
    assert tiled.shape == frames.shape
    assert isinstance(s.memory_used_decode(z.shape), int) and s.memory_used_decode(z.shape) > 0


def test_nodes_take_comfyuis_layout_and_a_core_vae(original_sd, ours, pack):
    """Tiled Decode / Encode keep [T, 4, h, w]; Frame-wise Decode takes ``frames_per_chunk`` frames at a time,
    each its own clip (the original's ``decoding_t``); a core VAE of the same file becomes ours."""
    from vaekit.nodes.framewise import VAEKitFramewiseDecode
    from vaekit.nodes.socket import VAEKitVAE, as_engine
    from vaekit.nodes.tiled import VAEKitTiledDecode, VAEKitTiledEncode
    s = VAEKitVAE(ours)
    z = torch.randn(5, 4, 3, 2)
    (images,) = VAEKitTiledDecode().decode({"samples": z}, s, tile_size=512, overlap=64)
    assert torch.equal(images, ours.decode(z).movedim(1, -1))
    (latent,) = VAEKitTiledEncode().encode(images, s, tile_size=512, overlap=64)
    assert latent["samples"].shape == (5, 4, 3, 2)
    (chunks,) = VAEKitFramewiseDecode().decode({"samples": z}, s, frames_per_chunk=2)
    want = torch.cat([ours.decode(z[i:i + 2]) for i in range(0, 5, 2)]).movedim(1, -1)
    assert torch.equal(chunks, want)

    class CoreVAE:            # what core's Image Only Checkpoint Loader hands over: get_sd() in its names
        first_stage_model = None

        def get_sd(self):
            return original_sd
    engine = as_engine(CoreVAE(), "test")
    assert engine.spec.id == "svd" and torch.equal(engine.decode(z), ours.decode(z))


# ---- exact tiles and the planner --------------------------------------------------------------------

def test_exact_tiles_share_the_clip_statistics_and_the_planner_uses_them(ours):
    """The temporal layers are 1x1 in space: exact tiles with their halo give one pass once the clip
    GroupNorms' statistics are shared; fast tiles blend (seams). The tiles meet at every GroupNorm, so on a
    GPU the paused ones wait in host memory: planned for a GPU below an untiled pass, the planner picks
    smaller exact tiles (time is never cut: the clip stays whole), which give the untiled result."""
    from vae.engine import budget, memory
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    z = torch.randn(3, 4, 16, 16)
    full = ours.decode(z)
    assert (ours.decode(z, tile=64, mode="exact") - full).abs().max() <= 1e-5
    assert (ours.decode(z, tile=64, overlap=32) - full).abs().max() > 1e-3
    call = ours.call_for("decode", z.shape, mode="exact")
    fixed = memory.calibration(gpu)[1]          # the calibration's fixed bytes: no tile shrinks them
    whole = budget.plan(ours, call, 1 << 40, gpu, cpu, cpu)
    assert whole.call.tile >= 16 * 8 and whole.route.chunk == 0
    half = fixed + (whole.on_device() - fixed) // 2
    p = budget.plan(ours, call, half, gpu, cpu, cpu)
    assert p.call.tile < 16 * 8 and p.on_device() <= half and p.route.engine == "exact" and p.route.chunk == 0
    out = ours.decode(z, tile=p.call.tile, mode="exact")
    assert (out - full).abs().max() <= 1e-5
    assert isinstance(ours.memory_needed(z.shape, "decode", tile=64, mode="exact"), int)


# ---- references outside the suite's dependencies -------------------------------------------------

def _published_model():
    """The comparison's published-config model (bench/comfyui_checks/core_families.py)."""
    sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "bench" / "comfyui_checks")]
    from core_families import svd_model
    return svd_model()


@pytest.mark.skipif(not (os.environ.get("COMFYUI_DIR") and os.environ.get("COMFYUI_PYTHON")),
                    reason="set COMFYUI_DIR and COMFYUI_PYTHON (and SVD_REFERENCE for the original) to compare")
def test_parity_with_core_and_the_original_at_the_published_config(tmp_path):
    """Core's VideoDecoder (and the original's, from SVD_REFERENCE: a Stability-AI/generative-models
    checkout) on the same published-config file: every parity row of compare_core.py --family svd --quick."""
    original = os.environ.get("SVD_REFERENCE")
    flags = ["--quick"] + (["--original", original] if original and Path(original).is_dir() else [])
    for row in core_parity_rows("svd", tmp_path, *flags):
        assert row["max"] <= PARITY, row


@pytest.mark.slow
def test_published_config_matches_diffusers_and_tiles_exactly():
    """svd_xt's published config, random weights (mix factors drawn): decode of a 4-frame clip and encode
    against diffusers, and exact 64 px tiles against one pass."""
    torch.set_num_threads(2)
    ref = _published_model()
    v = vae.from_state_dict(ref.state_dict())
    z = torch.randn(4, 4, 12, 10)
    out = v.decode(z)
    assert (out - _decode(ref, z, 4)).abs().max() <= PARITY
    assert (v.decode(z, tile=64, mode="exact") - out).abs().max() <= PARITY
    x = out[:2]
    with torch.no_grad():
        want = ref.encode(x * 2 - 1).latent_dist.mode()
    assert (v.encode(x) - want).abs().max() <= PARITY
