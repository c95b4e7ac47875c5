"""LTX-2.5's video VAE (LTX-2.3's encoder, the diffusion decoder): parity with diffusers from the same file
(decode through ``LTX2VideoDiffusionDecoderModel``'s decoder with a brute-force stand-in for its
neighbourhood attention, see tests/ltx_diffusion_common.py; encode through ``AutoencoderKLLTX2Video``),
the seeded pixel noise, settings from the file's metadata, every key layout and the template's file
name, detection both ways, frame rules, exact tiles, gates and preview heads, fused q/k/v.

Random weights only; narrow widths, small windows (through the metadata, as the shipped file carries
its config) unless the published windows are the point. Published config: the slow tests at the end.
Conventions (ComfyUI's and the original's): encode = (posterior mean - mean) / std; decode
un-normalises first, then x0 in [-1, 1] -> (x0 + 1) / 2; diffusers' decoder takes the un-normalised
latent and a generator for its noise."""
from __future__ import annotations

import collections
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

import vae
from ltx_diffusion_common import (DECODER, ENCODER, LATENT, SMALL, SMALL_METADATA, ReferenceFile, brute_na,
                                  diffusers_state_dict, metadata, original_layout, reference, use_brute_attention)
from vae import registry
from vae.archs import ltx_diffusion, ltx_diffusion_layout
from vae.errors import InputError, LoadError
from vae.nn.qkv import fuse_qkv
from video_families import FAMILIES, tiny_state_dict

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

TEMPLATE = "ltx-2.5-video-vae-bf16.safetensors"      # the name ComfyUI's LTX-2.5 templates load (3 of them)


def _save(path, sd, meta=None):
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path), metadata=meta)
    return path


def _stats(ref):
    return ref.latents_mean.view(1, -1, 1, 1, 1), ref.latents_std.view(1, -1, 1, 1, 1)


def _ref_decode(ref, z, seed=0, steps=None):
    """diffusers' decoder on the un-normalised latent, its noise from a generator seeded ``seed``."""
    mean, std = _stats(ref)
    with torch.no_grad():
        x = ref.decoder(z * std + mean, generator=torch.Generator().manual_seed(seed), num_inference_steps=steps)
    return ((x + 1) / 2).clamp(0, 1)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(diffusers reference, ours) from one file: diffusers' layout, small windows in the metadata."""
    ref = use_brute_attention(reference(decoder={**DECODER, **SMALL}))
    path = _save(tmp_path_factory.mktemp("ltxd") / "vae.safetensors", diffusers_state_dict(ref),
                 metadata(decoder=SMALL_METADATA))
    ref.load_state_dict(load_file(str(path)))
    return ref, vae.load(path)


# ---- parity ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,seed", [((1, LATENT, 2, 3, 3), 0), ((2, LATENT, 3, 4, 5), 5)])
def test_decode_matches_diffusers(small, shape, seed):
    ref, ours = small
    assert ours.name == f"LTX-2.5 VAE (diffusion decoder, {LATENT} latent channels)"
    z = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    out = ours.decode(z, seed=seed)
    assert out.shape == (shape[0], 3, 8 * shape[2] - 7, 32 * shape[3], 32 * shape[4])
    assert (out - _ref_decode(ref, z, seed)).abs().max() <= 1e-4
    assert 0.05 < ((out > 0) & (out < 1)).float().mean()          # not saturated: the comparison means something


@pytest.mark.slow
def test_published_windows_match_diffusers():
    """The published windows (3x7x7 ... 11^3): diffusers needs 3 latent frames and 7x7 latents (it refuses
    a grid smaller than a window); ours at that size, narrow widths."""
    ref = use_brute_attention(reference())
    ours = vae.from_state_dict(diffusers_state_dict(ref))
    assert ours.model.config.kernel == (11, 11, 11) and ours.model.config.stages[0].kernel == (3, 7, 7)
    z = torch.randn(1, LATENT, 3, 7, 7, generator=torch.Generator().manual_seed(2))
    assert (ours.decode(z) - _ref_decode(ref, z)).abs().max() <= 1e-4


@pytest.mark.parametrize("output", ["x0", "v"])
def test_more_steps_match_diffusers(tmp_path, output):
    """A file whose config asks for 2 steps (and v prediction): Euler steps as diffusers' decoder takes them."""
    ref = use_brute_attention(reference(decoder={**DECODER, **SMALL, "decoder_model_output_type": output}))
    meta = metadata(decoder={**SMALL_METADATA, "default_num_inference_steps": 2}, model_output_type=output)
    ours = vae.load(_save(tmp_path / "v.safetensors", diffusers_state_dict(ref), meta))
    assert (ours.model.config.steps, ours.model.config.output) == (2, output)
    z = torch.randn(1, LATENT, 2, 3, 3)
    assert (ours.decode(z, seed=3) - _ref_decode(ref, z, 3, steps=2)).abs().max() <= 1e-4
    with pytest.raises(InputError, match="one-step"):      # its tiles would need the previous step's halo
        ours.decode(z, tile=64, mode="exact")


@pytest.mark.parametrize("frames", [1, 9])
def test_encode_matches_diffusers(small, frames):
    ref, ours = small
    ae = ref.autoencoder[0]
    x = torch.rand(1, 3, frames, 64, 96)
    mean, std = _stats(ref)
    with torch.no_grad():
        want = (ae.encode(x * 2 - 1).latent_dist.mean - mean) / std
    z = ours.encode(x)
    assert z.shape == (1, LATENT, 1 + (frames - 1) // 8, 2, 3)
    assert (z - want).abs().max() <= 1e-4 * max(1.0, want.abs().max().item())


# ---- the noise ----------------------------------------------------------------------------------

def test_seed_is_the_noise_and_never_random(small):
    _, ours = small
    z = torch.randn(1, LATENT, 2, 2, 3)
    a, b = ours.decode(z), ours.decode(z, seed=0)
    assert torch.equal(a, b)                                    # seed 0 by default, drawn afresh each call
    other = ours.decode(z, seed=7)
    assert (other - a).abs().max() > 1e-2                       # the noise matters


def test_noise_is_randn_of_the_pixel_clip_seeded_as_core(small, monkeypatch):
    """The field: ``randn([B, 3, T, H, W])`` from a generator seeded with ``seed``: ComfyUI's CPU draw
    (``Generator(latent.device).manual_seed(0)``) and diffusers' ``randn_tensor``."""
    _, ours = small
    seen = []
    real = ltx_diffusion.DiffusionDecoder._embed
    monkeypatch.setattr(ltx_diffusion.DiffusionDecoder, "_embed", lambda self, x_t, s: (seen.append(x_t), real(self, x_t, s))[1])
    ours.decode(torch.randn(2, LATENT, 2, 1, 2), seed=11)
    (x_t,) = seen
    assert torch.equal(x_t, torch.randn(2, 3, 9, 32, 64, generator=torch.Generator().manual_seed(11)))


# ---- layouts, detection, the template's file -----------------------------------------------------

def test_every_layout_loads_the_same_model(small, tmp_path):
    ref, ours = small
    sd = diffusers_state_dict(ref)
    z = torch.randn(1, LATENT, 2, 2, 2)
    want = ours.decode(z)
    meta = metadata(decoder=SMALL_METADATA)
    files = {
        "original": (original_layout(sd), meta),                           # the shipped file's / ComfyUI's
        "checkpoint": ({f"vae.{k}": v for k, v in original_layout(sd).items()}
                       | {"model.diffusion_model.x.weight": torch.zeros(1)}, meta),   # a whole checkpoint
        "canonical": (ours.state_dict(), meta),
        "decoder_only": ({k: v for k, v in sd.items() if not k.startswith("encoder.")}, meta),   # diffusers' model
    }
    for name, (weights, m) in files.items():
        v = vae.load(_save(tmp_path / f"{name}.safetensors", weights, m))
        assert v.spec.id == "ltx_diffusion" and v.caps.can_encode == (name != "decoder_only"), name
        assert (v.decode(z) - want).abs().max() <= 1e-6, name
        assert set(v.state_dict()) == set(ours.state_dict()) - (
            {k for k in ours.state_dict() if k.startswith("encoder.")} if name == "decoder_only" else set())
    with pytest.raises(InputError, match="no encoder"):
        vae.load(tmp_path / "decoder_only.safetensors").encode(torch.rand(1, 3, 1, 32, 32))


def test_the_templates_file_name_bf16_original_layout(small, tmp_path, pack, monkeypatch):
    """The official templates' VAE Loader name, in the shipped layout and dtype, with its metadata, through
    the loader and through VAE Load (the node's file listing, then its load)."""
    ref, ours = small
    weights = {k: v.to(torch.bfloat16) for k, v in original_layout(diffusers_state_dict(ref)).items()}
    (tmp_path / "vae").mkdir()
    path = _save(tmp_path / "vae" / TEMPLATE, weights, metadata(decoder=SMALL_METADATA))
    v = vae.load(path)
    assert v.spec.id == "ltx_diffusion" and v.dtype == torch.float32       # read as fp32 unless asked
    z = torch.randn(1, LATENT, 2, 2, 2)
    assert (v.decode(z) - ours.decode(z)).abs().max() <= 0.05               # bf16 weights
    monkeypatch.setenv("VAEKIT_MODEL_DIRS", str(tmp_path))
    load = pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]
    assert TEMPLATE in load.INPUT_TYPES()["required"]["vae_name"][0]
    (socket,) = load().load(TEMPLATE, "bf16", "cpu")
    assert socket.handle.spec.id == "ltx_diffusion" and socket.handle.dtype == torch.bfloat16


def test_detection_both_ways(small):
    ref, ours = small
    sd = diffusers_state_dict(ref)
    mine = [sd, original_layout(sd), ours.state_dict(), {k: v for k, v in sd.items() if not k.startswith("encoder.")}]
    for s in mine:
        assert [spec.id for spec in registry.REGISTRY if spec.detect(s)] == ["ltx_diffusion"]
    for family in FAMILIES:
        if family != "ltx_diffusion":
            other = vae.from_state_dict(tiny_state_dict(family))
            for s in (tiny_state_dict(family), other.state_dict()):
                assert not ltx_diffusion_layout.detect(s), family
    # the LTX-2.3 encoder alone is LTX's (the same encoder, the same latents)
    encoder_only = {k: v for k, v in original_layout(sd).items() if not k.startswith("decoder.")}
    assert vae.from_state_dict(encoder_only).spec.id == "ltx"


# ---- settings from the metadata ------------------------------------------------------------------

def test_settings_come_from_the_metadata_else_published(small, tmp_path, caplog):
    ref, _ = small
    sd = diffusers_state_dict(ref)
    with caplog.at_level(logging.INFO, logger="VAEKit"):
        cfg = vae.from_state_dict(sd).model.config
    assert [s.kernel for s in cfg.stages] == [(3, 7, 7), (3, 7, 7), (3, 5, 5), (3, 5, 5)]
    assert (cfg.kernel, cfg.steps, cfg.timestep_scale, cfg.output) == ((11, 11, 11), 1, 1000.0, "x0")
    assert [s.stride for s in cfg.stages] == [(1, 2, 2), (2, 1, 1), (2, 2, 2), (2, 2, 2)]     # from the weights
    assert "stage_kernels [[3, 7, 7]" in caplog.text and "(published)" in caplog.text
    meta = metadata(decoder={**SMALL_METADATA, "timestep_scale_multiplier": 500.0},
                    encoder={"spatial_padding_mode": "reflect"})
    cfg = vae.from_state_dict(sd, metadata=meta).model.config
    assert cfg.kernel == (3, 5, 5) and cfg.timestep_scale == 500.0 and cfg.encoder.encoder_spatial_pad == "reflect"
    bad = [({"stage_kernels": [[3, 7]] * 4}, "three positive window sizes"),
           ({"upsamples": [[[2, 2, 2], 2]] * 4}, "which no stride the metadata lists")]
    for dec, text in bad:
        with pytest.raises(LoadError, match=text):
            vae.from_state_dict(sd, metadata=metadata(decoder=dec))
    with pytest.raises(LoadError, match="pads with 'circular'"):
        vae.from_state_dict(sd, metadata=metadata(encoder={"spatial_padding_mode": "circular"}))


def test_gates_are_folded_and_preview_heads_dropped(small):
    """The conversion script's rules: static adaLN gates scale the linear they gate; ``coarse_*`` heads
    are not part of the decoder."""
    ref, ours = small
    sd = original_layout(diffusers_state_dict(ref))
    gated, g = dict(sd), torch.Generator().manual_seed(4)
    for i in range(DECODER["decoder_stage_depths"][-1]):
        p = f"decoder.diff_blocks.{i}."
        for gate, targets in (("gate_msa", ("attn.proj.weight", "attn.proj.bias")), ("gate_mlp", ("mlp.w_down.weight",)),
                              ("gate_ctx", ("context_proj.weight", "context_proj.bias"))):
            gated[p + gate] = torch.rand(sd[p + targets[0]].shape[0], generator=g) + 0.5
            for t in targets:       # what the gate does: scales that linear's outputs
                w = sd[p + t]
                sd[p + t] = w * (gated[p + gate][:, None] if w.dim() == 2 else gated[p + gate])
    gated["decoder.coarse_head.weight"] = torch.zeros(3, 8)
    a, b = vae.from_state_dict(gated), vae.from_state_dict(sd)
    z = torch.randn(1, LATENT, 1, 2, 2)
    assert (a.decode(z) - b.decode(z)).abs().max() <= 1e-6


# ---- frame rules, tiles, engines -----------------------------------------------------------------

def test_frame_rules_and_bad_input(small):
    _, ours = small
    caps = ours.caps
    assert (caps.spatial_ratio, caps.temporal_ratio, caps.latent_channels) == (32, 8, LATENT)
    assert caps.causal_encoder and caps.stream_encode and not caps.causal_decoder and not caps.stream_decode
    assert caps.decode_options == ("seed",)
    assert ours.decode(torch.randn(1, LATENT, 1, 1, 1)).shape == (1, 3, 1, 32, 32)     # one frame, windows shrink
    x = torch.rand(1, 3, 10, 32, 32)                   # as core: the first 1 + 8k frames, with a warning
    assert torch.equal(ours.encode(x), ours.encode(x[:, :, :9]))
    with pytest.raises(InputError, match="12 channels"):
        ours.decode(torch.randn(1, 12, 2, 2, 2))


def test_exact_tiles_are_the_untiled_decode():
    """Published windows, tiles of 4 latents (the narrowest edge tile stage 1's 7x7 window allows with
    a halo of 3): every stage's halo matters, and each tile's noise is its part of the untiled field
    (fast tiles, too, share that field: they differ by their context only)."""
    ours = vae.from_state_dict(tiny_state_dict("ltx_diffusion"))
    z = torch.randn(1, LATENT, 2, 8, 8)
    full = ours.decode(z, seed=2)
    calls = []
    exact = ours.decode(z, tile=128, mode="exact", seed=2, progress=lambda d, n: calls.append(n))
    fast = ours.decode(z, tile=128, overlap=32, seed=2)
    assert calls[-1] >= 4                              # 2x2 tiles
    assert (exact - full).abs().max() <= 1e-4
    assert 1e-2 < (fast - full).abs().max() < 0.5


def test_exact_tiles_meet_at_every_block_and_run_in_a_tiles_memory():
    """Every block is a separator at any resolution (``exact_boundary = SEPARATOR``): tiles that run one
    after the other meet at each block's input, so a tile carries one block's halo, not the sum over
    the high-resolution stages. Its device working set (meta measurement, live bytes) is then a tile's:
    4x4 latents of a 16x16 latent, under a third of one pass's; the maps wait on the offload device."""
    from vae.engine import budget, stages
    from vae.engine.receptive import probe
    ours = vae.from_state_dict(tiny_state_dict("ltx_diffusion"))
    blocks = [m for m in ours.model.modules() if isinstance(m, ltx_diffusion._Local)]
    with torch.inference_mode():
        events = probe(ours.decode_fn(), ours.model, torch.zeros(1, LATENT, 2, 4, 4))
    plan = stages.plan(events, (4, 4), 1, ours.caps.spatial_ratio)
    assert len(plan.stages) == len(blocks) + 1 and set(plan.roles.values()) == {"separator"}
    cpu, shape = torch.device("cpu"), (1, LATENT, 2, 16, 16)
    one = budget.predict(ours, ours.call_for("decode", shape), cpu, cpu)
    tiled = budget.predict(ours, ours.call_for("decode", shape, tile=4 * 32, mode="exact"), cpu, cpu)
    assert tiled.live < one.live / 3 and tiled.maps > 0


def test_a_tile_replays_the_blocks_before_its_stage_once_per_call():
    """A tile of a later stage re-enters the forward on a tiny input up to its stage's start; the blocks
    there keep their input's shape, so each runs on it once per call and is passed through after that
    (vae/engine/stages.py, ``_Stages.replay``), not once per tile and later stage (the first of these
    6 blocks: 4 x 5 times more). Each block runs once per tile (2 x 2), and once tiny but the last."""
    ours = vae.from_state_dict(tiny_state_dict("ltx_diffusion"))
    blocks = [m for m in ours.model.modules() if isinstance(m, ltx_diffusion._Local)]
    calls = collections.Counter()
    for block in blocks:
        block.register_forward_pre_hook(lambda m, args: calls.update([m]))
    z = torch.randn(1, LATENT, 2, 8, 8)
    full = ours.decode(z)
    calls.clear()
    tiled = ours.decode(z, tile=128, mode="exact")
    assert (tiled - full).abs().max() <= 1e-4
    assert calls[blocks[-1]] == 4 and max(calls.values()) == 4 + 1


def test_temporal_reach_is_measured():
    """Moving one latent frame changes the output frames within ``temporal_reach`` latent frames of its own
    (published: 17.5, the figure the nodes' tooltips give)."""
    ours = vae.from_state_dict(tiny_state_dict("ltx_diffusion"))
    reach = ltx_diffusion.temporal_reach(ours.model.config)
    assert reach == 4.0
    z = torch.randn(1, LATENT, 24, 1, 1)
    moved = z.clone()
    moved[:, :, 12] += 1
    changed = ((ours.decode(z) - ours.decode(moved)).abs().amax(dim=(0, 1, 3, 4)) > 0).nonzero().flatten()
    assert (changed.min().item(), changed.max().item()) == (8 * 12 - 7 - 8 * reach, 8 * 12 + 8 * reach)
    with torch.device("meta"):                     # the published decoder's shapes
        sd = ltx_diffusion_layout.to_canonical(ReferenceFile(decoder={}, with_encoder=False).state_dict())
    assert ltx_diffusion.temporal_reach(ltx_diffusion.config_from_state_dict(sd)) == 17.5


def test_neighbourhood_attention_reach_is_declared():
    """Half a window from a core away from the border; the whole window is kept for edge cores."""
    ours = vae.from_state_dict(tiny_state_dict("ltx_diffusion"))
    from vae.engine.receptive import reach
    blocks = [m for m in ours.model.modules() if isinstance(m, ltx_diffusion._Local)]
    assert reach(blocks[0]) == (3, 3) and reach(blocks[-1]) == (5, 5)
    assert blocks[0].exact_window == (7, 7) and blocks[-1].exact_window == (11, 11)
    assert all(b.exact_boundary for b in blocks)


def test_exact_tiles_narrower_than_a_window_at_the_border(small):
    """One-latent-pixel tiles (small windows: 3x3 in stages 1-4, 5x5 in stage 5): an edge core narrower
    than a window less its reach would miss the windows that shift inward at the map's border; the
    engine merges it into its neighbour. Every tile size gives the untiled decode."""
    from vae.engine import exact as engine
    from vae.engine.receptive import probe
    _, ours = small
    z = torch.randn(1, LATENT, 2, 6, 7)
    with torch.inference_mode():
        events = probe(ours.decode_fn(), ours.model, torch.zeros(1, LATENT, 2, 4, 4))
    cores = [[(i, i + 1) for i in range(6)], [(i, i + 1) for i in range(7)]]
    merged = engine.edge_cores(cores, events, (4, 4))
    assert merged == [[(0, 2), (2, 3), (3, 4), (4, 6)], [(0, 2), *cores[1][2:5], (5, 7)]]    # stage 1: 3 - 1
    full = ours.decode(z, seed=1)
    for tile in (32, 64):
        assert (ours.decode(z, tile=tile, mode="exact", seed=1) - full).abs().max() <= 1e-4


def test_fused_qkv_is_already_one_projection():
    ours = vae.from_state_dict(tiny_state_dict("ltx_diffusion"))
    report = fuse_qkv(ours.model, ours.name)
    assert report.fused == 0 and report.already == sum(DECODER["decoder_stage_depths"])


def test_memory_estimate_runs_on_the_meta_device():
    ours = vae.from_state_dict(tiny_state_dict("ltx_diffusion"))
    from vae.engine import memory
    fixed = memory.calibration(ours.device)[1]       # the calibration's fixed bytes: no clip length changes them
    small_clip, big_clip = ours.memory_needed((1, LATENT, 2, 4, 4)), ours.memory_needed((1, LATENT, 9, 4, 4))
    assert small_clip > fixed and big_clip - fixed > 3 * (small_clip - fixed)


@pytest.mark.parametrize("dims,kernel", [((4, 9, 6), (3, 7, 7)), ((13, 12, 14), (11, 11, 11))])
def test_brute_force_reference_attention_is_na3d(dims, kernel):
    """The tests' stand-in for diffusers' attention against the library's: two independent readings of
    NATTEN's rule, windows shifted at the borders and shrunk to short axes
    (bench/comfyui_checks/compare_core.py --family ltx_diffusion checks both against comfy_kitchen.na3d)."""
    from vae.nn.neighborhood import neighborhood_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, *dims, 2, 8, generator=g) for _ in range(3))
    assert (brute_na(q, k, v, kernel) - neighborhood_attention(q, k, v, kernel)).abs().max() <= 1e-5


# ---- published config (slow) ----------------------------------------------------------------------

PUBLISHED_ENCODER = dict(latent_channels=128, block_out_channels=(256, 512, 1024, 1024), layers_per_block=(4, 6, 4, 2, 2),
                         **{k: v for k, v in ENCODER.items() if k not in ("latent_channels", "block_out_channels",
                                                                          "layers_per_block")})


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """diffusers' defaults are the published decoder (its conversion script sets none); the encoder is
    LTX-2.3's published one. One file, diffusers' layout, read by both."""
    ref = use_brute_attention(reference(encoder=PUBLISHED_ENCODER, decoder={}))
    path = _save(tmp_path_factory.mktemp("ltxd_pub") / "vae.safetensors", diffusers_state_dict(ref))
    ref.load_state_dict(load_file(str(path)))
    ours = vae.load(path)
    assert [s.width for s in ours.model.config.stages] == [2048, 1024, 512, 512]
    return ref, ours


@pytest.mark.slow
def test_published_decode_matches_diffusers(published):
    ref, ours = published
    z = torch.randn(1, 128, 3, 7, 7, generator=torch.Generator().manual_seed(0))
    out = ours.decode(z)
    err = (out - _ref_decode(ref, z)).abs().max().item()
    print(f"published config, clip 3x7x7 latents -> {tuple(out.shape)}: max abs {err:.2e}")
    assert err <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("frames", [1, 9])
def test_published_encode_matches_diffusers(published, frames):
    ref, ours = published
    x = torch.rand(1, 3, frames, 128, 160, generator=torch.Generator().manual_seed(1))
    mean, std = _stats(ref)
    with torch.no_grad():
        want = (ref.autoencoder[0].encode(x * 2 - 1).latent_dist.mean - mean) / std
    err = (ours.encode(x) - want).abs().max().item()
    print(f"published config, encode {frames} frames: max abs {err:.2e} (latent range {want.abs().max():.2f})")
    assert err <= 1e-4 * max(1.0, want.abs().max().item())
