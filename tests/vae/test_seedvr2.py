"""SeedVR2 VAE: key layouts (the original's = core's, full checkpoints, encoder- and decoder-only files,
fp16/bf16, the official templates' file name), the config read from the weights, detection both ways
across the registry, frame and latent conventions, and the reference's own chunking against one pass.

diffusers has no SeedVR2 class and CI has no ComfyUI: these run our own random-weight model saved in
core's layout. Parity with core's VAE (published config, decode and encode, one frame and a clip) is
bench/comfyui_checks/compare_core.py --family seedvr2; its figures are in docs/families/seedvr2.md. The engines (tiles, exact,
streaming, nodes, workflows) run through the shared harness (tests/video_families.py)."""
from __future__ import annotations

import pytest
import torch

import vae
from helpers import assert_budget_plans_exact_tiles, assert_layouts_agree, halves, jitter_norms
from vae import registry, run
from vae.archs import seedvr2 as s2
from vae.archs import seedvr2_layout as layout

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(widths=(32, 32, 32, 32), layers_per_block=1, temporal=(False, True, True))
PUBLISHED = dict(widths=(128, 256, 512, 512), layers_per_block=2, temporal=(False, True, True))
TEMPLATE_FILE = "seedvr2_ema_vae_fp16.safetensors"      # the VAE every SeedVR2 template loads


def model(**config) -> s2.SeedVR2VAE:
    torch.manual_seed(0)
    return jitter_norms(s2.SeedVR2VAE(s2.SeedVR2Config(**{**TINY, **config})), scale=0.2).eval()


@pytest.fixture(scope="module")
def core_sd() -> dict:
    """A file in core's layout (the original's names, as ``seedvr2_ema_vae_fp16.safetensors`` has them)."""
    return {k: v.contiguous() for k, v in layout.to_original(model().state_dict()).items()}


@pytest.fixture(scope="module")
def ours(core_sd):
    return vae.from_state_dict(core_sd)


# ---- layouts and config -------------------------------------------------------------------------

def test_core_layout_names(core_sd):
    """The names core's module tree has (and detects the family by), running order in the decoder."""
    assert "decoder.up_blocks.2.upsamplers.0.upscale_conv.weight" in core_sd           # core's detection key
    assert "decoder.up_blocks.3.resnets.1.conv2.weight" in core_sd and "decoder.up_blocks.3.upsamplers.0.conv.weight" \
        not in core_sd                                                                  # the finest level runs last
    assert core_sd["encoder.mid_block.attentions.0.to_q.weight"].dim() == 2               # Linear, as the original
    assert core_sd["encoder.down_blocks.0.downsamplers.0.conv.weight"].shape[2:] == (1, 3, 3)
    assert core_sd["encoder.down_blocks.1.downsamplers.0.conv.weight"].shape[2:] == (3, 3, 3)
    assert not any("quant_conv" in k for k in core_sd)


def test_every_layout_gives_identical_output(core_sd, ours, tmp_path):
    layouts = {"core": core_sd, "checkpoint-vae-prefix": {f"vae.{k}": v for k, v in core_sd.items()},
               "canonical": ours.state_dict(), "original-pth": {"state_dict": core_sd}}
    z = torch.randn(1, 16, 3, 2, 3)
    assert_layouts_agree(layouts, tmp_path, "seedvr2", lambda v: v.decode(z))


def test_published_config_is_read_from_shapes():
    """250,648,227 parameters = 478.1 MiB in fp16, the templates' file; core's model has the same keys and
    shapes (bench/comfyui_checks/compare_core.py --family seedvr2: 0 missing, 0 unexpected)."""
    cfg = s2.SeedVR2Config(**PUBLISHED)
    with torch.device("meta"):
        big = s2.SeedVR2VAE(cfg)
    assert sum(p.numel() for p in big.parameters()) == 250_648_227
    sd = layout.to_original(big.state_dict())
    assert len(sd) == 250 and registry.detect(sd) is s2.SPEC
    assert s2.SPEC.config_from_state_dict(s2.SPEC.to_canonical(sd)) == cfg
    enc, dec = halves(sd)
    for half, part in ((enc, "encoder"), (dec, "decoder")):
        read = s2.SPEC.config_from_state_dict(s2.SPEC.to_canonical(half))
        assert (read.widths, read.layers_per_block, read.temporal) == (cfg.widths, 2, cfg.temporal), part
    caps = s2.capabilities(cfg)
    assert (caps.latent_channels, caps.spatial_ratio, caps.temporal_ratio) == (16, 8, 4)
    assert caps.norm == "groupnorm_frame" and caps.stream_decode and caps.stream_encode and caps.stream_chunk == 1
    assert set(caps.working_dtypes) == {torch.float16, torch.bfloat16, torch.float32}     # core's


def test_which_levels_resample_time_is_read_from_the_weights():
    """A variant with time resampled on the finest level only (1 + 2(t-1) frames) loads as such."""
    v = vae.from_state_dict(layout.to_original(model(temporal=(True, False, False)).state_dict()))
    assert (v.caps.spatial_ratio, v.caps.temporal_ratio) == (8, 2)
    assert v.decode(torch.randn(1, 16, 3, 2, 2)).shape == (1, 3, 5, 16, 16)


def test_decoder_only_and_encoder_only_files(core_sd, ours):
    """Core loads a decoder-only file (warning about the encoder's keys) and does not detect an encoder-only
    one; both load here, as what they are."""
    enc_sd, dec_sd = halves(core_sd)
    enc, dec = vae.from_state_dict(enc_sd), vae.from_state_dict(dec_sd)
    assert "decoder only" in dec.name and not dec.caps.can_encode
    assert "encoder only" in enc.name and not enc.caps.can_decode
    z, x = torch.randn(1, 16, 2, 2, 2), torch.rand(1, 3, 5, 16, 16)
    assert torch.equal(dec.decode(z), ours.decode(z)) and torch.equal(enc.encode(x), ours.encode(x))
    with pytest.raises(vae.InputError, match="no encoder"):
        dec.encode(x)


def test_half_precision_files_and_the_templates_file_name(core_sd, ours, tmp_path, pack):
    """The templates' fp16 file (and a bf16 one) under its name, through the loader and the VAE Load node's
    listing: weights in the file's precision become the chosen working dtype."""
    from safetensors.torch import save_file
    from vaekit.nodes import _comfy
    from vaekit.nodes.loader import VAEKitLoad
    (tmp_path / "vae").mkdir()
    for name, dtype in ((TEMPLATE_FILE, torch.float16), ("seedvr2_ema_vae_bf16.safetensors", torch.bfloat16)):
        save_file({k: v.to(dtype) for k, v in core_sd.items()}, str(tmp_path / "vae" / name))
    z = torch.randn(1, 16, 2, 2, 2)
    want = ours.decode(z)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VAEKIT_MODEL_DIRS", str(tmp_path))
        assert TEMPLATE_FILE in _comfy.vae_choices()
        (socket,) = VAEKitLoad().load(TEMPLATE_FILE, dtype="fp32", device="cpu")
    assert socket.handle.spec is s2.SPEC and socket.handle.dtype == torch.float32
    assert (socket.handle.decode(z) - want).abs().max() <= 5e-3              # fp16-rounded weights
    bf16 = vae.load(tmp_path / "vae" / "seedvr2_ema_vae_bf16.safetensors", dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and (bf16.decode(z) - want).abs().max() <= 0.1


# ---- detection ----------------------------------------------------------------------------------

def _other_families() -> dict:
    from helpers import diffusers_kl, diffusers_tiny
    from video_families import FAMILIES, tiny_state_dict
    out = {f: tiny_state_dict(f) for f in FAMILIES if f != "seedvr2"}
    out.update(kl=diffusers_kl().state_dict(), taesd=diffusers_tiny().state_dict())
    return out


def test_detected_as_itself_in_every_layout_and_no_other_family_claims_it(core_sd, ours):
    from vae.loading import unwrap
    enc, dec = halves(core_sd)
    canonical = ours.state_dict()
    for name, sd in {"core": core_sd, "canonical": canonical, "core-decoder": dec, "core-encoder": enc,
                     "canonical-decoder": halves(canonical)[1], "canonical-encoder": halves(canonical)[0],
                     "checkpoint": unwrap({f"vae.{k}": v for k, v in core_sd.items()})}.items():
        found = [s.id for s in registry.REGISTRY if s.detect(sd)]
        assert found == ["seedvr2"], (name, found)


def test_it_claims_no_other_family():
    for name, other in _other_families().items():
        layouts = [other]
        spec = next((s for s in registry.REGISTRY if s.detect(other)), None)
        if spec is not None:
            layouts.append(spec.to_canonical(other))
        for sd in layouts:
            assert not s2.SPEC.detect(sd), name


def test_mismatched_halves_and_the_unpublished_half_receptive_field_are_refused(core_sd):
    enc, _ = halves(core_sd)
    _, dec = halves(layout.to_original(model(widths=(32, 32, 64, 64)).state_dict()))
    with pytest.raises(vae.LoadError, match="encoder and decoder differ"):
        vae.from_state_dict({**enc, **dec})
    half = dict(core_sd)
    key = "encoder.down_blocks.0.resnets.0.conv1.weight"
    half[key] = half[key][:, :, 2:]
    with pytest.raises(vae.LoadError, match="half' temporal receptive field"):
        vae.from_state_dict(half)


# ---- conventions ---------------------------------------------------------------------------------

def test_up_sampler_unfolds_channels_as_the_original():
    """The original's ``rearrange("b (x y z c) f h w -> b c (f z) (h x) (w y)")``, element by element."""
    c, st = 3, 2
    x = torch.randn(1, 4 * st * c, 2, 2, 3)
    y = s2._unfold(x, st)
    for xi in range(2):
        for yi in range(2):
            for zi in range(st):
                src = x[:, ((xi * 2 + yi) * st + zi) * c:((xi * 2 + yi) * st + zi + 1) * c]
                assert torch.equal(y[:, :, zi::st, xi::2, yi::2], src)


def test_latent_scale_lives_in_the_vae(ours):
    """Core's LATENT: encode = posterior mean x 0.9152, decode divides it back (shift 0)."""
    x = torch.rand(1, 3, 5, 16, 16) * 2 - 1
    with torch.no_grad():
        m = ours.model
        mean = m.encoder(x)[:, :16]
        assert torch.equal(m.encode(x), mean * 0.9152)
        assert torch.equal(m.decode(mean * 0.9152), m.decoder(mean * 0.9152 / 0.9152))


def test_frame_rules(ours, pack):
    """t latents -> 1 + 4(t-1) frames; 1 + 4k frames -> k + 1 latents. Other frame counts: the library and
    the VAE socket (what core's VAE Encode nodes call) keep the first 1 + 4k frames, with a warning, which is
    exactly what core's causal encoder makes of them (floor((T+3)/4) latents: later frames never reach an
    earlier latent)."""
    from vaekit.nodes.socket import VAEKitVAE
    assert ours.decode(torch.randn(1, 16, 3, 2, 2)).shape == (1, 3, 9, 16, 16)
    assert ours.encode(torch.rand(1, 3, 9, 16, 16)).shape == (1, 16, 3, 2, 2)
    seven = torch.rand(1, 3, 7, 16, 16)
    assert torch.equal(ours.encode(seven), ours.encode(seven[:, :, :5]))
    sock = VAEKitVAE(ours)
    assert [sock.downscale_ratio[0](t) for t in (1, 4, 5, 11, 17)] == [1, 1, 2, 3, 5]      # core's formulas
    assert [sock.upscale_ratio[0](t) for t in (1, 2, 5)] == [1, 5, 17]
    frames = torch.rand(11, 16, 16, 3)
    z = sock.encode(frames)
    assert z.shape == (1, 16, 3, 2, 2)
    assert torch.equal(z, ours.encode(frames[:9].movedim(-1, 0)[None]))
    # the templates' tiled nodes: VAE Encode (Tiled) 512/128 px, VAE Decode (Tiled) in latent units
    assert torch.equal(sock.encode_tiled(frames[:9], 512, 512, 128, 64, 8), z)
    y = sock.decode_tiled(z, 64, 64, 16, 16, 2)
    assert y.shape == (1, 9, 16, 16, 3) and torch.equal(y, ours.decode(z).movedim(1, -1))


def test_the_references_chunking_equals_one_pass(ours):
    """The definition runs decode as latent frames (0, 1) then one at a time, and encode as frames 0..4 then
    4 at a time, through causal caches; the up-samplers drop a frame in the first chunk only. Run that way
    through a stream here, it gives one pass's numbers (the per-frame norms and attention do not care)."""
    m = ours.model
    z, x = torch.randn(1, 16, 5, 3, 2), torch.rand(1, 3, 13, 24, 16) * 2 - 1
    with torch.no_grad():
        whole_z, whole_x = m.decode(z), m.encode(x)
        with run.stream():
            chunks = [m.decode(z[:, :, :2])] + [m.decode(z[:, :, i:i + 1]) for i in range(2, 5)]
        assert [c.shape[2] for c in chunks] == [5, 4, 4, 4]
        assert (torch.cat(chunks, 2) - whole_z).abs().max() <= 1e-5
        with run.stream():
            chunks = [m.encode(x[:, :, :5]), m.encode(x[:, :, 5:9]), m.encode(x[:, :, 9:13])]
        assert [c.shape[2] for c in chunks] == [2, 1, 1]
        assert (torch.cat(chunks, 2) - whole_x).abs().max() <= 1e-5


def test_fused_qkv_and_nan_guard(ours):
    from vae.nn.qkv import fuse_qkv
    z = torch.randn(1, 16, 3, 2, 2)
    want = ours.decode(z)
    fused = vae.from_state_dict(ours.state_dict())
    assert fuse_qkv(fused.model).fused == 2
    assert (fused.decode(z) - want).abs().max() <= 1e-6
    # an fp16 overflow is recomputed in fp32 (the default decode streams: the stream is replayed upcast)
    big = {k: t * 20000 if k.startswith("decoder.conv_in") else t for k, t in ours.state_dict().items()}
    half = vae.from_state_dict(big, dtype=torch.float16)
    out = half.decode(z)
    assert torch.isfinite(out).all() and half.last_upcast is not None
    assert (out - vae.from_state_dict(big).decode(z)).abs().max() <= 1e-2


def test_latent_channel_hints(ours):
    from video_families import tiny_state_dict
    wan = vae.from_state_dict(tiny_state_dict("wan"))
    with pytest.raises(vae.InputError, match=r"48 channels \(as Wan 2.2 latents do\)"):
        ours.decode(torch.randn(1, 48, 2, 2, 2))
    with pytest.raises(vae.InputError, match=r"32 channels"):
        wan.decode(torch.randn(1, 32, 2, 2, 2))
    from vae.registry import channel_hint
    assert "SeedVR2" in channel_hint(16, 5)


def test_the_budget_planner_plans_smaller_tiles_with_the_untiled_result(ours, caplog):
    """The planner (vae/engine/budget.py) measures SeedVR2 on the meta device (per-frame GroupNorm: tiles meet in
    rounds, streamed one latent frame at a time). Below an untiled pass's prediction it picks smaller exact
    tiles and gives the untiled result; planned for a GPU (paused tiles wait in host memory) the tiles
    need at most half the untiled pass; memory managers get a number both ways."""
    z = torch.randn(1, 16, 2, 16, 16)
    assert_budget_plans_exact_tiles(ours, z, (1, 16, 1, 24, 24), (1, 3, 5, 128, 128), caplog)


# ---- published config (slow) --------------------------------------------------------------------

@pytest.mark.slow
def test_published_config_streams_and_tiles_exactly():
    """Published widths, random weights: the default (streamed) decode/encode and exact tiles equal one pass."""
    torch.set_num_threads(2)
    v = vae.from_state_dict(layout.to_original(model(**PUBLISHED).state_dict()))
    z = torch.randn(1, 16, 3, 12, 10)
    one = ((v.model.decode(z) + 1) / 2).clamp(0, 1)
    assert (v.decode(z) - one).abs().max() <= 1e-4
    assert (v.decode(z, tile=64, mode="exact") - one).abs().max() <= 1e-4
    x = one
    with torch.no_grad():
        whole = v.model.encode(x * 2 - 1)
    assert (v.encode(x) - whole).abs().max() <= 1e-4
    assert (v.encode(x, tile=64, mode="exact") - whole).abs().max() <= 1e-4
