"""LTX-2 / LTX-2.3 video VAE (diffusers ``AutoencoderKLLTX2Video``): parity with diffusers from the same
file at the PUBLISHED flags (diffusers' defaults are not the published config: causal decoder, 64x/16x
compression), settings read from the file's metadata or the published fallback, full checkpoints read
for their VAE only, every key layout, exact tiles, the causal encoder (and a metadata-causal decoder)
streamed, and the temporal reach of the non-causal decoder, the number docs/families.md states.

Random weights only. Conventions (ComfyUI's and the original's): encode = (posterior mean - mean) /
std, decode un-normalises first; diffusers' decode is called with z * latents_std + latents_mean."""
from __future__ import annotations

import json
import logging
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

import vae
from helpers import ROOT, assert_layouts_agree, spy_tensor_reads
from ltx_common import (LTX2_DEC_23 as _DEC_23, LTX2_FLAGS as FLAGS, LTX2_LATENT, assert_encoder_streams, ltx2_metadata,
                        ltx2_reference, meta_state_dict, original_layout, randomize, script_rename, stats)
from vae import registry
from vae.engine import tiling
from vae.archs import ltx, ltx_layout

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

LATENT = LTX2_LATENT
# the published configs (the conversion script, versions "2.0" and "2.3")
PUBLISHED = {
    "2.0": dict(block_out_channels=(256, 512, 1024, 2048), layers_per_block=(4, 6, 6, 2, 2),
                decoder_block_out_channels=(256, 512, 1024), decoder_layers_per_block=(5, 5, 5, 5),
                decoder_spatial_padding_mode="reflect", **FLAGS),
    "2.3": dict(block_out_channels=(256, 512, 1024, 1024), layers_per_block=(4, 6, 4, 2, 2),
                decoder_block_out_channels=(256, 512, 512, 1024), decoder_layers_per_block=(4, 6, 4, 2, 2),
                **_DEC_23, **FLAGS),
}
# the original's block lists (the "vae" config in the checkpoints' metadata), encoder order
BLOCKS = {
    "2.0": [["res_x", {"num_layers": 5}]] + [["compress_all", {"residual": True, "multiplier": 2}],
                                            ["res_x", {"num_layers": 5}]] * 3,
    "2.3": [["res_x", {"num_layers": 4}], ["compress_space", {"multiplier": 2}], ["res_x", {"num_layers": 6}],
            ["compress_time", {"multiplier": 2}], ["res_x", {"num_layers": 4}], ["compress_all", {"multiplier": 1}],
            ["res_x", {"num_layers": 2}], ["compress_all", {"multiplier": 2}], ["res_x", {"num_layers": 2}]],
}
# diffusers' script: original -> diffusers renames (str.replace in dict order); 2.3 adds a fourth up block
_RENAME_20 = {
    "down_blocks.0": "down_blocks.0", "down_blocks.1": "down_blocks.0.downsamplers.0", "down_blocks.2": "down_blocks.1",
    "down_blocks.3": "down_blocks.1.downsamplers.0", "down_blocks.4": "down_blocks.2",
    "down_blocks.5": "down_blocks.2.downsamplers.0", "down_blocks.6": "down_blocks.3",
    "down_blocks.7": "down_blocks.3.downsamplers.0", "down_blocks.8": "mid_block",
    "up_blocks.0": "mid_block", "up_blocks.1": "up_blocks.0.upsamplers.0", "up_blocks.2": "up_blocks.0",
    "up_blocks.3": "up_blocks.1.upsamplers.0", "up_blocks.4": "up_blocks.1", "up_blocks.5": "up_blocks.2.upsamplers.0",
    "up_blocks.6": "up_blocks.2", "last_time_embedder": "time_embedder", "last_scale_shift_table": "scale_shift_table",
    "res_blocks": "resnets", "per_channel_statistics.mean-of-means": "latents_mean",
    "per_channel_statistics.std-of-means": "latents_std",
}
RENAME = {"2.0": _RENAME_20, "2.0t": _RENAME_20,
          "2.3": {**_RENAME_20, "up_blocks.7": "up_blocks.3.upsamplers.0", "up_blocks.8": "up_blocks.3"}}


_tiny = ltx2_reference


_metadata = ltx2_metadata


def _save(tmp_path, name: str, sd: dict, metadata=None):
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path), metadata=metadata)
    return path


def _reference(model, path):
    """diffusers' model with the weights read from ``path``: both sides from the same file."""
    model.load_state_dict(load_file(str(path)))
    return model.eval()


@pytest.fixture(scope="module", params=["2.0", "2.3", "2.0t"])
def pair(request, tmp_path_factory):
    """(version, diffusers model, ours), both read from one .safetensors file (diffusers layout)."""
    version = request.param
    ref = _tiny(version)
    tmp = tmp_path_factory.mktemp(f"ltx2_{version}")
    # LTX-2's timestep-conditioned decoder has 0.9.5's shapes: its metadata names it
    meta = _metadata({"decoder_base_channels": 8}) if version == "2.0t" else None
    path = _save(tmp, "vae.safetensors", ref.state_dict(), meta)
    return version, _reference(_tiny(version), path), vae.load(path)


# ---- parity ----------------------------------------------------------------------------------

def test_decode_encode_match_diffusers(pair):
    version, ref, ours = pair
    conditioned = version == "2.0t"
    assert ours.name.startswith(f"LTX-{version[:3]} VAE") and ours.model.config.version == version[:3]
    caps = ours.caps
    assert (caps.latent_channels, caps.spatial_ratio, caps.temporal_ratio) == (LATENT, 32, 8)
    assert caps.causal_encoder and caps.stream_encode and not caps.causal_decoder and not caps.stream_decode
    assert caps.decode_options == (("timestep", "noise_scale", "seed") if conditioned else ())
    mean, std = stats(ref)
    z = torch.randn(2, LATENT, 3, 2, 3)
    x = torch.rand(2, 3, 17, 64, 32) * 2 - 1
    t = torch.tensor([0.05, 0.4])
    with torch.no_grad():
        ref_img = ref.decode(z * std + mean, temb=t if conditioned else None).sample
        ref_lat = (ref.encode(x).latent_dist.mode() - mean) / std
        img, lat = ours.model.decode(z, timestep=t), ours.model.encode(x)
    assert img.shape == (2, 3, 17, 64, 96)
    assert (img - ref_img).abs().max() <= 1e-5 and (lat - ref_lat).abs().max() <= 1e-5
    # through the handle: 0..1 pixels, the latent noise mix off
    with torch.no_grad():
        ref_one = ref.decode(z[:1] * std + mean, temb=t[:1] if conditioned else None).sample
    off = ours.decode_options(dict(noise_scale=0.0))   # a version without the noise mix takes no such option
    err = (ours.decode(z[:1], **off) - ((ref_one + 1) / 2).clamp(0, 1)).abs().max()
    enc_err = (ours.encode((x + 1) / 2) - ref_lat).abs().max()
    print(f"LTX-{version} tiny: decode max abs {err:.2e} (0..1 pixels), encode {enc_err:.2e}")
    assert err <= 1e-4 and enc_err <= 1e-4


def test_published_flags_are_not_diffusers_defaults():
    """diffusers' default AutoencoderKLLTX2Video has the published 2.0 weights' shapes but says
    decoder_causal=True and compresses 64x / 16x by its own arithmetic; loaded from the weights
    alone, ours is the published VAE: non-causal decoder (reflect), zeros encoder, 32x / 8x."""
    default = diffusers.AutoencoderKLLTX2Video
    with torch.device("meta"):
        d = default()
    assert d.decoder.is_causal and (d.spatial_compression_ratio, d.temporal_compression_ratio) == (64, 16)
    cfg = ltx.config_from_state_dict(ltx.SPEC.to_canonical(d.state_dict()))
    caps = ltx.capabilities(cfg)
    assert cfg.version == "2.0" and not cfg.causal_decoder and not caps.causal_decoder
    assert (caps.spatial_ratio, caps.temporal_ratio) == (32, 8)
    assert (cfg.decoder_spatial_pad, cfg.encoder_spatial_pad) == ("reflect", "zeros")


@pytest.mark.parametrize("version", ["2.0", "2.3"])
def test_published_configs_detected(version):
    sd = meta_state_dict(diffusers.AutoencoderKLLTX2Video, **PUBLISHED[version])
    assert ltx_layout.detect(sd)
    canonical = ltx.SPEC.to_canonical(sd)
    cfg = ltx.config_from_state_dict(canonical)
    assert cfg.version == version and cfg.latent_channels == 128 and not cfg.timestep_conditioning
    assert cfg.decoder_spatial_pad == {"2.0": "reflect", "2.3": "zeros"}[version]
    ups = [b for b in cfg.decoder if b.kind == "up"]
    assert [(b.stride, b.residual) for b in ups] == {
        "2.0": [((2, 2, 2), True)] * 3,
        "2.3": [((2, 2, 2), False), ((2, 2, 2), False), ((2, 1, 1), False), ((1, 2, 2), False)]}[version]
    with torch.device("meta"):
        model = ltx.LTXVideoVAE(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in canonical.items()}
    caps = ltx.capabilities(cfg)
    assert (caps.spatial_ratio, caps.temporal_ratio) == (32, 8)
    # ComfyUI's rule (comfy/sd.py) calls both "version 2" (1024-wide first decoder resnet, 0.9.5-style
    # encoder) and needs the file's metadata for the rest; the weights tell them apart here
    original = ltx_layout.to_original(canonical)
    assert original["decoder.up_blocks.0.res_blocks.0.conv1.conv.weight"].shape[0] == 1024
    assert "encoder.down_blocks.1.conv.conv.bias" in original
    for side in ("encoder", "decoder"):
        half = {k: v for k, v in canonical.items() if not k.startswith("decoder" if side == "encoder" else "encoder")}
        c = ltx.config_from_state_dict(half)
        assert (ltx.capabilities(c).spatial_ratio, ltx.capabilities(c).temporal_ratio) == (32, 8)
        # LTX-2.0's encoder is 0.9.5's: an encoder-only file without metadata is named as 0.9.5's
        assert c.version == ("0.9.5" if (side, version) == ("encoder", "2.0") else version)


def test_timestep_conditioned_ltx2_is_told_from_095_by_its_metadata():
    sd = ltx.SPEC.to_canonical(_tiny("2.0t").state_dict())
    assert ltx.config_from_state_dict(sd).version == "0.9.5"          # the same shapes, the same computation
    assert ltx.config_from_state_dict(sd, metadata=_metadata({})).version == "2.0"


# ---- what the weights cannot tell -------------------------------------------------------------

def _decoder_blocks(version: str, residual: bool = True) -> list:
    blocks = [[n, dict(p, residual=residual) if n == "compress_all" and "residual" in p else p]
              for n, p in BLOCKS[version]]
    return blocks


def test_metadata_read_and_published_fallback(tmp_path, caplog):
    """The original reads ``spatial_padding_mode`` for both sides, ``causal_decoder`` and each
    ``compress_all``'s ``residual`` from the metadata: a file that has them is run as they say (parity
    with diffusers built with the same flags); one that has not gets the published values. The load
    log names where each came from."""
    ref = _tiny("2.0", upsample_residual=(False,) * 3, decoder_spatial_padding_mode="replicate",
                encoder_spatial_padding_mode="replicate")
    sd = ref.state_dict()
    meta = _metadata({"decoder_blocks": _decoder_blocks("2.0", residual=False), "spatial_padding_mode": "replicate"})
    with caplog.at_level(logging.INFO, logger="VAEKit"):
        with_meta = vae.load(_save(tmp_path, "with.safetensors", sd, meta))
    log = caplog.text
    assert "residual up-samplers none (metadata decoder_blocks)" in log
    assert "decoder padding replicate (metadata spatial_padding_mode)" in log
    assert "encoder padding replicate (metadata spatial_padding_mode)" in log
    cfg = with_meta.model.config
    assert (cfg.decoder_spatial_pad, cfg.encoder_spatial_pad) == ("replicate", "replicate")
    assert not any(b.residual for b in cfg.decoder)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="VAEKit"):
        without = vae.load(_save(tmp_path, "without.safetensors", sd))
    assert "residual up-samplers all (published 2.0)" in caplog.text
    assert "decoder padding reflect (published 2.0)" in caplog.text
    mean, std = stats(ref)
    z, x = torch.randn(1, LATENT, 2, 2, 2), torch.rand(1, 3, 9, 64, 64) * 2 - 1
    with torch.no_grad():
        want, want_lat = ref.decode(z * std + mean).sample, (ref.encode(x).latent_dist.mode() - mean) / std
        assert (with_meta.model.decode(z) - want).abs().max() <= 1e-5
        assert (with_meta.model.encode(x) - want_lat).abs().max() <= 1e-5
        assert (without.model.decode(z) - want).abs().max() > 1e-2      # the published 2.0 flags differ


def test_metadata_causal_decoder_streams_exactly(tmp_path):
    """A decoder the metadata calls causal (diffusers: decoder_causal=True) pads time in front only,
    so it streams chunk by chunk through its caches and frame-wise decode equals one pass."""
    ref = _tiny("2.3", decoder_causal=True)
    ours = vae.load(_save(tmp_path, "causal.safetensors", ref.state_dict(), _metadata({"causal_decoder": True})))
    assert ours.caps.causal_decoder and ours.caps.stream_decode and ours.model.config.causal_decoder
    assert ltx.decoder_reach(ours.model.config) == 0
    mean, std = stats(ref)
    z = torch.randn(1, LATENT, 5, 2, 2)
    with torch.no_grad():
        assert (ours.model.decode(z) - ref.decode(z * std + mean).sample).abs().max() <= 1e-5
    full = ours.decode(z)
    for chunk in (1, 2):
        calls = []
        out = ours.decode(z, tile_frames=chunk * 8, progress=lambda d, n: calls.append(n))
        assert calls[-1] == -(-5 // chunk) and (out - full).abs().max() <= 1e-5


def test_bad_or_foreign_metadata(caplog):
    sd = ltx.SPEC.to_canonical(_tiny("2.3").state_dict())
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        cfg = ltx.config_from_state_dict(sd, metadata={"config": "{not json"})
        assert "not JSON" in caplog.text and cfg.decoder_spatial_pad == "zeros"
        caplog.clear()
        cfg = ltx.config_from_state_dict(sd, metadata=_metadata({"decoder_blocks": BLOCKS["2.0"]}))
        assert "following the weights" in caplog.text
        assert [b.stride for b in cfg.decoder if b.kind == "up"] == [(2, 2, 2), (2, 2, 2), (2, 1, 1), (1, 2, 2)]
    with pytest.raises(vae.LoadError, match="CausalDiffusionVAE"):
        ltx.config_from_state_dict(sd, metadata={"config": json.dumps({"vae": {"_class_name": "CausalDiffusionVAE"}})})
    with pytest.raises(vae.LoadError, match="group_norm"):
        ltx.config_from_state_dict(sd, metadata=_metadata({"norm_layer": "group_norm"}))
    with pytest.raises(vae.LoadError, match="circular"):
        ltx.config_from_state_dict(sd, metadata=_metadata({"spatial_padding_mode": "circular"}))


# ---- files ---------------------------------------------------------------------------------

def _audio_vae(prefix: str = "") -> dict:
    """LTX-2's audio VAE and vocoder as their keys look: 2-D convs, its own per-channel statistics."""
    return {f"{prefix}decoder.conv_in.conv.weight": torch.randn(16, 8, 3, 3),
            f"{prefix}decoder.up.0.block.0.conv1.conv.weight": torch.randn(16, 16, 3, 3),
            f"{prefix}per_channel_statistics.mean-of-means": torch.zeros(16),
            f"{prefix}per_channel_statistics.std-of-means": torch.ones(16)}


def test_full_checkpoint_reads_only_the_video_vae(tmp_path, monkeypatch):
    """A full LTX-2 checkpoint: transformer, audio VAE, vocoder and text projection beside the video
    VAE under ``vae.``. Only the ``vae.`` tensors are ever read from the file."""
    ref = _tiny("2.3")
    canonical = vae.from_state_dict(ref.state_dict()).state_dict()
    video = original_layout(canonical)
    others = {"model.diffusion_model.transformer_blocks.0.attn1.to_q.weight": torch.randn(64, 64),
              "model.diffusion_model.audio_patchify_proj.weight": torch.randn(64, 16),
              "text_embedding_projection.aggregate_embed.weight": torch.randn(32, 64),
              "vocoder.conv_pre.weight": torch.randn(32, 16, 7), **_audio_vae("audio_vae.")}
    meta = _metadata({"decoder_blocks": BLOCKS["2.3"], "spatial_padding_mode": "zeros"})
    full = _save(tmp_path, "ltx-2.3-22b-dev.safetensors", {**others, **{f"vae.{k}": v for k, v in video.items()}}, meta)
    alone = _save(tmp_path, "ltx-2.3_video_vae.safetensors", video)
    read = spy_tensor_reads(monkeypatch)
    v = vae.load(full)
    assert sorted(read) == sorted(f"vae.{k}" for k in video) and v.name.startswith("LTX-2.3 VAE")
    assert v.model.config.sources[0][2] == "metadata decoder_blocks"
    z = torch.randn(1, LATENT, 2, 2, 2)
    assert torch.equal(v.decode(z), vae.load(alone).decode(z))
    # the audio VAE alone (its statistics and 2-D convs) is not taken for a video VAE
    assert not ltx_layout.detect(_audio_vae())
    with pytest.raises(vae.LoadError, match="not a VAE this pack knows"):
        vae.from_state_dict(_audio_vae())


@pytest.mark.parametrize("version", ["2.0", "2.3"])
def test_every_layout_gives_identical_output(version, tmp_path):
    """diffusers, the original / ComfyUI's split VAE file, our canonical one, the full checkpoint
    (``vae.`` prefix) and a training wrapper: the same model, bit-identical output."""
    ref = _tiny(version)
    diff = {k: v.contiguous() for k, v in ref.state_dict().items()}
    canonical = vae.from_state_dict(diff).state_dict()
    original = original_layout(canonical)
    assert script_rename(original, RENAME[version]) == set(diff)        # what diffusers converts from
    unused = {k for k in original if k.startswith(ltx_layout.STATS) and k not in (ltx_layout.MEAN, ltx_layout.STD)}
    assert set(ltx_layout.to_original(canonical)) == set(original) - unused
    layouts = {"diffusers": diff, "canonical": canonical, "original": original,
               "full checkpoint": {"model.diffusion_model.x.weight": torch.zeros(2, 2),
                                   **{f"vae.{k}": v for k, v in original.items()}},
               "wrapped": {"state_dict": diff}}
    z, x = torch.randn(1, LATENT, 2, 2, 1), torch.rand(1, 3, 9, 32, 32)
    assert_layouts_agree(layouts, tmp_path, "ltx", lambda v: torch.cat([v.decode(z).flatten(), v.encode(x).flatten()]))


def test_other_families_are_not_ltx2_and_ltx2_is_no_other_family():
    sd = meta_state_dict(diffusers.AutoencoderKLLTX2Video, **PUBLISHED["2.3"])
    assert [s.id for s in registry.REGISTRY if s.detect(sd)] == ["ltx"]
    canonical = ltx.SPEC.to_canonical(sd)
    assert [s.id for s in registry.REGISTRY if s.detect(canonical)] == ["ltx"]


# ---- engines -------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["2.0", "2.3"])
def test_exact_tiles_equal_one_pass_both_ways(version):
    v = vae.from_state_dict(_tiny(version).state_dict())
    z = torch.randn(1, LATENT, 2, 5, 4)
    full = v.decode(z)
    assert (v.decode(z, tile=64, mode="exact") - full).abs().max() <= 1e-4
    x = torch.rand(1, 3, 9, 160, 128)
    assert (v.encode(x, tile=64, mode="exact") - v.encode(x)).abs().max() <= 1e-4


@pytest.mark.parametrize("version", ["2.0", "2.3"])
def test_encoder_streams_chunk_by_chunk(version):
    assert_encoder_streams(vae.from_state_dict(_tiny(version).state_dict()).model)


def test_nan_guard_compile_and_interrupt():
    """The handle's engines on LTX-2.3: an fp16 decode whose activations overflow (the decoder's first
    conv scaled 1e5x; its RMS norms undo the scale in fp32) is recomputed upcast; a compiled handle
    (eager backend) decodes as the plain one; an interrupt mid-tiling leaves the model as it was."""
    from helpers import module_attrs
    from vae.compile import compile_vae
    sd = ltx.SPEC.to_canonical(_tiny("2.3").state_dict())
    sd["decoder.conv_in.weight"] = sd["decoder.conv_in.weight"] * 1e5
    sd["decoder.conv_in.bias"] = sd["decoder.conv_in.bias"] * 1e5
    v32, v16 = vae.from_state_dict(sd), vae.from_state_dict(sd, dtype=torch.float16)
    z = torch.randn(1, LATENT, 2, 2, 2)
    with torch.inference_mode():
        assert not torch.isfinite(v16.model.decode(v16._model_input(z))).all()
    out = v16.decode(z, tile=32, overlap=0)
    assert torch.isfinite(out).all() and v16.last_upcast is not None and v16.last_upcast.tiles
    assert (out - v32.decode(z, tile=32, overlap=0)).abs().max() <= 1e-2
    compiled, _ = compile_vae(v32, backend="eager")
    assert (compiled.decode(z) - v32.decode(z)).abs().max() <= 1e-5
    attrs, before = module_attrs(v32.model), v32.decode(z, tile=32, overlap=0)

    def stop(done, total):
        if done == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        v32.decode(z, tile=32, overlap=0, progress=stop)
    assert module_attrs(v32.model) == attrs and torch.equal(v32.decode(z, tile=32, overlap=0), before)


def _measured_reach(m, frames: int = 24) -> int:
    """Latent frames (either side) whose change reaches the output frames of the middle latent."""
    z = torch.randn(1, LATENT, frames, 2, 2)
    mid = frames // 2
    own = slice(1 + 8 * (mid - 1), 1 + 8 * mid)         # the 8 frames latent ``mid`` decodes to
    with torch.no_grad():
        base = m.decode(z)[:, :, own]
        far = 0
        for d in range(1, mid):
            for k in (mid - d, mid + d):
                moved = z.clone()
                moved[:, :, k] += 1
                if (m.decode(moved)[:, :, own] - base).abs().max() > 0:
                    far = d
    return far


@pytest.mark.parametrize("version", ["2.0", "2.3"])
def test_decoder_reach_and_the_temporal_seam(version):
    """The non-causal decoder's output frames see ``decoder_reach`` latent frames each way (measured
    by moving one latent frame). Temporal tiles are therefore exact only at least that far from a
    tile edge: frames there equal one pass, frames next to a seam do not."""
    v = vae.from_state_dict(_tiny(version).state_dict())
    reach = ltx.decoder_reach(v.model.config)
    assert _measured_reach(v.model) == reach
    n, tile, overlap = 3 * reach + 8, 2 * reach + 4, 2
    z = torch.randn(1, LATENT, n, 1, 1)
    full = v.decode(z)
    calls = []
    tiled = v.decode(z, tile_frames=tile * 8, overlap_frames=overlap * 8, progress=lambda d, k: calls.append(k))
    err = (tiled - full).abs().amax(dim=(0, 1, 3, 4))                   # per pixel frame

    plan = tiling.plan_frames(n, tile * 8, overlap * 8, 8)
    assert calls[-1] == len(plan.spans) >= 2
    edges = sorted({e for a, b in plan.spans for e in (a, b) if 0 < e < n})
    latent_of = [0] + [1 + (p - 1) // 8 for p in range(1, err.numel())]
    far = torch.tensor([min(abs(lat - e) for e in edges) > reach for lat in latent_of])
    near = torch.tensor([min(abs(lat - e) for e in edges) <= 1 for lat in latent_of])
    print(f"LTX-{version} tiny: reach {reach} latent frames; tiles {plan.spans}: max error far from seams "
          f"{err[far].max():.1e}, next to seams {err[near].max():.2e}")
    assert far.any() and err[far].max() <= 1e-5
    assert err[near].max() > 1e-4


def test_the_families_page_states_the_published_reach():
    """The seam statement of docs/families.md (the README's families table) is computed from the
    published configs."""
    text = (ROOT / "docs" / "families.md").read_text()
    for version in ("2.0", "2.3"):
        cfg = ltx.config_from_state_dict(ltx.SPEC.to_canonical(
            meta_state_dict(diffusers.AutoencoderKLLTX2Video, **PUBLISHED[version])))
        reach = ltx.decoder_reach(cfg)
        assert re.search(rf"LTX-{re.escape(version)}[^|\n]*? {reach} latent frames", text), (version, reach)


# ---- core's LTXV nodes ----------------------------------------------------------------------

def test_core_ltxv_nodes_calls(pack):
    """What core's LTXVImgToVideo / LTXVImgToVideoInplace / LTXVAddGuide call on a VAE: the
    (time, h, w) downscale formula and encode of an IMAGE batch (one frame, or 1 + 8k frames)."""
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    v = VAEKitVAE(from_state_dict(_tiny("2.3").state_dict()))
    assert v.downscale_index_formula == (8, 32, 32) and v.latent_channels == LATENT
    assert v.upscale_ratio[0](3) == 17 and v.downscale_ratio[0](17) == 3
    one = v.encode(torch.rand(1, 64, 96, 3))
    assert one.shape == (1, LATENT, 1, 2, 3)
    # LTXVAddGuide mid-video: prepends a throwaway frame so the clip is 1 + 8k, then drops its latent
    clip = torch.rand(8, 64, 96, 3)
    t = v.encode(torch.cat([clip[:1], clip], dim=0))
    assert t.shape == (1, LATENT, 2, 2, 3) and torch.isfinite(t[:, :, 1:]).all()


def test_a_core_ltx_vae_converts_with_what_core_built_it_with(pack):
    """A VAE from core's loaders arrives as weights (get_sd) without the checkpoint's metadata; the
    socket reads the block list, paddings and causality off core's model instead."""
    from vaekit.nodes.socket import as_engine
    ref = _tiny("2.0", upsample_residual=(False,) * 3, decoder_spatial_padding_mode="replicate")
    original = original_layout(vae.from_state_dict(ref.state_dict()).state_dict())

    def side(mode):
        m = torch.nn.Module()
        m.conv_in = torch.nn.Module()
        m.conv_in.conv = torch.nn.Conv3d(1, 1, 3, padding_mode=mode)
        return m

    VideoVAE = type("VideoVAE", (torch.nn.Module,), {"__module__": "comfy.ldm.lightricks.vae.causal_video_autoencoder"})
    core_model = VideoVAE()
    core_model.decoder, core_model.encoder = side("replicate"), side("zeros")
    core_model.decoder.causal, core_model.decoder.blocks_desc = False, _decoder_blocks("2.0", residual=False)
    core = type("CoreVAE", (), {"first_stage_model": core_model, "get_sd": lambda self: original})()
    v = as_engine(core, "test")
    assert (v.model.config.decoder_spatial_pad, v.model.config.encoder_spatial_pad) == ("replicate", "zeros")
    mean, std = stats(ref)
    z = torch.randn(1, LATENT, 2, 2, 2)
    with torch.no_grad():
        assert (v.model.decode(z) - ref.decode(z * std + mean).sample).abs().max() <= 1e-5


# ---- published sizes (slow) ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("version", ["2.0", "2.3"])
def test_published_config_matches_diffusers(version, tmp_path):
    torch.manual_seed(0)
    ref = randomize(diffusers.AutoencoderKLLTX2Video(**PUBLISHED[version]), 128)
    path = _save(tmp_path, "vae.safetensors", ref.state_dict())
    ours = vae.load(path)
    assert ours.model.config.version == version
    mean, std = stats(ref)
    z = torch.randn(1, 128, 2, 4, 4)
    x = torch.rand(1, 3, 9, 64, 64)
    with torch.no_grad():
        want = ((ref.decode(z * std + mean).sample + 1) / 2).clamp(0, 1)
        want_lat = (ref.encode(x * 2 - 1).latent_dist.mode() - mean) / std
    dec, enc = (ours.decode(z) - want).abs().max(), (ours.encode(x) - want_lat).abs().max()
    print(f"LTX-{version} published config: decode max abs {dec:.2e} (0..1 pixels), encode {enc:.2e}")
    assert dec <= 1e-4 and enc <= 1e-4
