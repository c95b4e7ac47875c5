"""HunyuanVideo 1.5 VAE: parity with diffusers' AutoencoderKLHunyuanVideo15 (= Tencent's one-pass
definition) on random weights, frame-wise and exact-mode streaming against one pass (the attention's
key/value cache), every key layout (Tencent's = ComfyUI's, diffusers', checkpoints, canonical), the
config read from the weights, detection across families, the HunyuanImage refiner, the latent-channel
hints, concurrent calls, and the calls core's HunyuanVideo 1.5 nodes make."""
from __future__ import annotations

import re

import pytest
import torch

import vae
from helpers import assert_layouts_agree, jitter_norms, module_attrs
from vae import registry, run
from vae.archs import hunyuan_video15 as hv15

diffusers = pytest.importorskip("diffusers")

pytestmark = pytest.mark.usefixtures("one_thread")

# the published structure (5 levels, spatial resamplers in 4, temporal in the middle 2), narrow widths
TINY = dict(block_out_channels=(8, 16, 32, 64, 64), layers_per_block=1)
# widths kept by the resamplers, so the resnets change width (nin_shortcut / conv_shortcut keys)
SHORTCUTS = dict(TINY, downsample_match_channel=False, upsample_match_channel=False)


def reference(**config) -> torch.nn.Module:
    torch.manual_seed(0)
    return jitter_norms(diffusers.AutoencoderKLHunyuanVideo15(**config), scale=0.2).eval()


@pytest.fixture(scope="module")
def ref():
    return reference(**TINY)


@pytest.fixture(scope="module")
def ours(ref):
    """Loaded from Tencent's names (the layout of the published files), compared with diffusers."""
    return vae.from_state_dict(original_layout(ref.state_dict()))


def pixels(y: torch.Tensor) -> torch.Tensor:
    return (y.clamp(-1, 1) + 1) / 2


@pytest.mark.parametrize("t", [1, 2, 5])
def test_decode_matches_diffusers(ref, ours, t):
    assert ours.spec is hv15.SPEC
    z = torch.randn(1, 32, t, 3, 4)
    with torch.no_grad():
        want = ref.decode(z).sample
        got = ours.model.decode(z)
    assert got.shape == want.shape == (1, 3, 1 + 4 * (t - 1), 48, 64)
    assert (got - want).abs().max() <= 1e-5
    # through the handle (0..1, clamped; streamed in its own chunks of 2 latent frames)
    assert (ours.decode(z) - pixels(want)).abs().max() <= 1e-5


@pytest.mark.parametrize("frames", [1, 5, 9])
def test_encode_matches_diffusers(ref, ours, frames):
    """A batch of two clips against diffusers one clip at a time: diffusers' attention mask does not
    broadcast over a batch (a batch of two fails inside its attention; Tencent's unsqueezes it)."""
    x = torch.rand(2, 3, frames, 48, 32)
    with torch.no_grad():
        want = torch.cat([ref.encode(c[None] * 2 - 1).latent_dist.mode() for c in x])
        assert (ours.model.encode(x * 2 - 1) - want).abs().max() <= 1e-5
    got = ours.encode(x)
    assert got.shape == want.shape == (2, 32, 1 + (frames - 1) // 4, 3, 2)
    assert (got - want).abs().max() <= 1e-5


def test_shortcut_variant_matches_diffusers():
    """Resamplers that keep the width: every resnet that changes width has a 1x1x1 shortcut."""
    ref = reference(**SHORTCUTS)
    v = vae.from_state_dict(ref.state_dict())
    assert any(".nin_shortcut." in k for k in v.state_dict())
    z, x = torch.randn(1, 32, 2, 2, 3), torch.rand(1, 3, 5, 32, 48)
    with torch.no_grad():
        assert (v.model.decode(z) - ref.decode(z).sample).abs().max() <= 1e-5
        assert (v.encode(x) - ref.encode(x * 2 - 1).latent_dist.mode()).abs().max() <= 1e-5


def test_attention_is_causal_over_frames_and_comfyui_is_not(ref, ours):
    """Our per-frame attention calls equal diffusers' dense (THW)^2 mask. ComfyUI's port runs the mid
    attention without a mask: emulated here (frame_causal off), its decode of more than one latent
    frame differs; one latent frame (an image) is the same."""
    theirs, mine = ref.decoder.mid_block.attentions[0], ours.model.decoder.mid.attn_1
    x = torch.randn(1, 64, 3, 4, 5)
    with torch.no_grad():
        assert (mine(x) - theirs(x)).abs().max() <= 1e-5
    z1, z3 = torch.randn(1, 32, 1, 3, 3), torch.randn(1, 32, 3, 3, 3)
    causal = [ours.decode(z) for z in (z1, z3)]
    attns = [ours.model.encoder.mid.attn_1, mine]
    try:
        for m in attns:
            m.frame_causal = False
        unmasked = [ours.decode(z) for z in (z1, z3)]
    finally:
        for m in attns:
            m.frame_causal = True
    assert (unmasked[0] - causal[0]).abs().max() <= 1e-6
    assert (unmasked[1] - causal[1]).abs().max() > 1e-2


def test_capabilities(ours):
    caps = ours.caps
    assert (caps.latent_channels, caps.spatial_ratio, caps.temporal_ratio) == (32, 16, 4)
    assert caps.norm == "rms" and caps.has_attention
    assert caps.causal_decoder and caps.causal_encoder and caps.stream_decode and caps.stream_encode
    assert caps.stream_chunk == 2                       # ComfyUI's rolling chunks
    assert ours.name == "HunyuanVideo 1.5 VAE (32 latent channels)"
    cfg = ours.config
    assert cfg.widths == (8, 16, 32, 64, 64) and cfg.layers_per_block == 1
    R = hv15.Resample
    assert cfg.down == (R(16, False), R(32, False), R(64, True), R(64, True), None)
    assert cfg.up == (None, R(8, False), R(16, False), R(32, True), R(64, True))


# ---- streaming and exact mode: equal to one pass -----------------------------------------------

@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_framewise_equals_one_pass(ours, chunk):
    z = torch.randn(1, 32, 5, 3, 2)
    with torch.no_grad():
        whole = pixels(ours.model.decode(z))
    steps = []
    out = ours.decode(z, tile_frames=4 * chunk, progress=lambda d, n: steps.append(n))
    assert steps[-1] == -(-5 // chunk) and (out - whole).abs().max() <= 1e-5
    x = torch.rand(1, 3, 13, 32, 32)
    with torch.no_grad():
        whole = ours.model.encode(x * 2 - 1)
    assert (ours.encode(x, tile_frames=4 * chunk) - whole).abs().max() <= 1e-5


@pytest.mark.parametrize("chunk", [None, 1])
def test_exact_tiles_equal_one_pass(ours, chunk):
    """2x2 spatial tiles, the whole clip per tile (None) or streamed one latent frame at a time, the
    attention on the assembled latent with its key/value cache; fast tiles are visibly off."""
    z = torch.randn(1, 32, 3, 4, 3)
    with torch.no_grad():
        whole = pixels(ours.model.decode(z))
    frames = 4 * chunk if chunk else 16
    steps = []
    out = ours.decode(z, tile=32, tile_frames=frames, mode="exact", progress=lambda d, n: steps.append(n))
    assert steps[-1] == 4 * (3 if chunk else 1) and (out - whole).abs().max() <= 1e-5    # tiles x chunks
    assert (ours.decode(z, tile=32, overlap=16, tile_frames=frames) - whole).abs().max() > 1e-2
    x = torch.rand(1, 3, 5, 64, 48)
    with torch.no_grad():
        whole = ours.model.encode(x * 2 - 1)
    assert (ours.encode(x, tile=32, tile_frames=frames, mode="exact") - whole).abs().max() <= 1e-5


def test_streams_keep_the_key_value_cache_in_the_call(ours):
    """Chunks through the model itself: the attention's keys and values live in the stream's memory
    (nothing on the modules); without them the later chunks would attend to their own frames only."""
    m = ours.model
    z = torch.randn(1, 32, 4, 2, 3)
    attrs = module_attrs(m)
    with torch.no_grad():
        whole = m.decode(z)
        with run.stream() as state:
            parts = [m.decode(z[:, :, a:b]) for a, b in ((0, 2), (2, 3), (3, 4))]
            k, v = state.memory[m.decoder.mid.attn_1]
        assert k.shape[2] == 4 * 2 * 3                     # every latent token seen so far
        assert [p.shape[2] for p in parts] == [5, 4, 4]
        assert (torch.cat(parts, 2) - whole).abs().max() <= 1e-5
        with run.stream() as state:
            first = m.decode(z[:, :, :2])
            state.memory.pop(m.decoder.mid.attn_1)         # forget the first chunk's keys
            forgot = m.decode(z[:, :, 2:])
        assert (torch.cat([first, forgot], 2) - whole).abs().max() > 1e-3
    assert module_attrs(m) == attrs


def test_concurrent_streams_and_exact_runs(ours):
    """The key/value cache belongs to each call: streamed, exact+streamed and plain decodes at once on
    one VAE give their sequential results (10 trials)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    z = torch.randn(1, 32, 3, 2, 2, generator=torch.Generator().manual_seed(1))
    x = torch.rand(1, 3, 9, 32, 32, generator=torch.Generator().manual_seed(2))
    calls = {"streamed": lambda: ours.decode(z, tile_frames=4),
             "exact+stream": lambda: ours.decode(z, tile=16, tile_frames=8, mode="exact"),
             "plain": lambda: ours.decode(z, tile_frames=16),
             "encode streamed": lambda: ours.encode(x, tile_frames=4)}
    alone = {k: c() for k, c in calls.items()}
    attrs = module_attrs(ours.model)
    for _ in range(10):
        barrier = threading.Barrier(len(calls))

        def go(call):
            barrier.wait()
            return call()
        with ThreadPoolExecutor(len(calls)) as pool:
            got = [f.result() for f in [pool.submit(go, c) for c in calls.values()]]
        for name, y in zip(calls, got):
            assert (y - alone[name]).abs().max() <= 1e-6, name
    assert module_attrs(ours.model) == attrs


def test_fused_qkv_and_nan_guard(ours):
    from vae.nn.qkv import fuse_qkv
    z = torch.randn(1, 32, 3, 2, 2)
    want = ours.decode(z, tile_frames=4)
    fused = vae.from_state_dict(ours.state_dict())
    assert fuse_qkv(fused.model).fused == 2                 # encoder and decoder mid attention
    assert (fused.decode(z, tile_frames=4) - want).abs().max() <= 1e-6
    # an fp16 overflow is recomputed in fp32: the streamed decode replays its stream upcast
    big = {k: t * 20000 if k.startswith("decoder.conv_in") else t for k, t in ours.state_dict().items()}
    half = vae.from_state_dict(big, dtype=torch.float16)
    out = half.decode(z, tile_frames=4)
    assert torch.isfinite(out).all() and half.last_upcast.tiles
    assert (out - vae.from_state_dict(big).decode(z, tile_frames=4)).abs().max() <= 1e-2


def test_frame_counts_are_checked(ours):
    with pytest.raises(vae.InputError, match=r"the clip has 7 frames.*1 \+ 4\*k"):
        ours.encode(torch.rand(1, 3, 7, 32, 32))
    with pytest.raises(vae.InputError, match="divisible by 16"):
        ours.encode(torch.rand(1, 3, 5, 40, 32))


# ---- layouts ------------------------------------------------------------------------------------

_TO_ORIGINAL = [
    (r"\.down_blocks\.(\d+)\.resnets\.(\d+)\.", r".down.\1.block.\2."),
    (r"\.down_blocks\.(\d+)\.downsamplers\.0\.", r".down.\1.downsample."),
    (r"\.up_blocks\.(\d+)\.resnets\.(\d+)\.", r".up.\1.block.\2."),          # same index: running order
    (r"\.up_blocks\.(\d+)\.upsamplers\.0\.", r".up.\1.upsample."),
    (r"\.mid_block\.resnets\.0\.", ".mid.block_1."), (r"\.mid_block\.resnets\.1\.", ".mid.block_2."),
    (r"\.mid_block\.attentions\.0\.to_([qkv])\.", r".mid.attn_1.\1."),
    (r"\.mid_block\.attentions\.0\.", ".mid.attn_1."),
]


def original_layout(diffusers_sd: dict, comfyui: bool = False) -> dict:
    """diffusers' names -> Tencent's (the inverse of diffusers' convert_hunyuan_video1_5_to_diffusers.py
    map). Width-changing resnets (none in the published model) have ``nin_shortcut``: a plain Conv3d in
    Tencent's code, wrapped (``nin_shortcut.conv.weight``) in ComfyUI's, which is otherwise the same."""
    out = {}
    for k, v in diffusers_sd.items():
        for pat, rep in _TO_ORIGINAL:
            k = re.sub(pat, rep, k)
        out[re.sub(r"\.conv_shortcut\.", ".nin_shortcut.conv." if comfyui else ".nin_shortcut.", k)] = v
    return out


def _layouts(sd: dict) -> dict:
    tencent = original_layout(sd)
    return {"diffusers": sd, "tencent": tencent, "comfyui": original_layout(sd, comfyui=True),
            "checkpoint-vae-prefix": {f"vae.{k}": v for k, v in tencent.items()},
            "canonical": vae.from_state_dict(sd).state_dict(),
            "wrapped-pickle": {"state_dict": tencent}}


@pytest.mark.parametrize("config", [TINY, SHORTCUTS], ids=["published-structure", "shortcuts"])
def test_every_layout_gives_identical_output(config, tmp_path):
    sd = reference(**config).state_dict()
    z = torch.randn(1, 32, 2, 2, 2)
    assert_layouts_agree(_layouts(sd), tmp_path, "hunyuan_video15", lambda v: v.decode(z))


def _meta(cls, **config) -> dict:
    with torch.device("meta"):
        return cls(**config).state_dict()


def test_published_config_is_read_from_shapes():
    sd = _meta(diffusers.AutoencoderKLHunyuanVideo15)
    tencent = original_layout(sd)
    assert len(tencent) == len(sd) == 218
    # representative keys and shapes of Tencent's / ComfyUI's file (diffusers' converter names)
    for key, shape in {"encoder.conv_in.conv.weight": (128, 3, 3, 3, 3),
                       "encoder.down.0.block.0.norm1.gamma": (128, 1, 1, 1),
                       "encoder.down.0.downsample.conv.conv.weight": (64, 128, 3, 3, 3),
                       "encoder.down.3.downsample.conv.conv.weight": (128, 1024, 3, 3, 3),
                       "encoder.mid.attn_1.q.weight": (1024, 1024, 1, 1, 1),
                       "encoder.conv_out.conv.weight": (64, 1024, 3, 3, 3),
                       "decoder.conv_in.conv.weight": (1024, 32, 3, 3, 3),
                       "decoder.mid.attn_1.k.bias": (1024,),
                       "decoder.up.0.upsample.conv.conv.weight": (8192, 1024, 3, 3, 3),
                       "decoder.up.3.upsample.conv.conv.weight": (512, 256, 3, 3, 3),
                       "decoder.up.4.block.2.conv2.conv.weight": (128, 128, 3, 3, 3),
                       "decoder.conv_out.conv.weight": (3, 128, 3, 3, 3)}.items():
        assert tuple(tencent[key].shape) == shape, key
    R = hv15.Resample
    for layout in (sd, tencent):
        assert registry.detect(layout) is hv15.SPEC
        cfg = hv15.SPEC.config_from_state_dict(hv15.SPEC.to_canonical(layout))
        assert cfg == hv15.HunyuanVideo15Config(
            widths=(128, 256, 512, 1024, 1024), layers_per_block=2, latent_channels=32,
            down=(R(256, False), R(512, False), R(1024, True), R(1024, True), None),
            up=(None, R(128, False), R(256, False), R(512, True), R(1024, True)))
        caps = hv15.capabilities(cfg)
        assert (caps.spatial_ratio, caps.temporal_ratio, caps.latent_channels) == (16, 4, 32)
    with torch.device("meta"):
        model = hv15.HunyuanVideo15VAE(cfg)
    assert sum(p.numel() for p in model.parameters()) == 1_260_634_115


def test_decoder_only_and_encoder_only_files(ref, ours):
    full = original_layout(ref.state_dict())
    dec = vae.from_state_dict({k: v for k, v in full.items() if k.startswith("decoder.")})
    enc = vae.from_state_dict({k: v for k, v in full.items() if k.startswith("encoder.")})
    assert dec.caps.can_decode and not dec.caps.can_encode and "decoder only" in dec.name
    assert enc.caps.can_encode and not enc.caps.can_decode and "encoder only" in enc.name
    for v in (dec, enc):
        assert (v.caps.spatial_ratio, v.caps.temporal_ratio) == (16, 4)
    z, x = torch.randn(1, 32, 2, 2, 2), torch.rand(1, 3, 5, 32, 32)
    assert torch.equal(dec.decode(z), ours.decode(z))
    assert torch.equal(enc.encode(x), ours.encode(x))


# ---- detection ----------------------------------------------------------------------------------

def test_the_hunyuanimage_refiner_vae_loads_as_hunyuan_video15(ref, tmp_path):
    """The HunyuanImage 2.1 refiner VAE is HunyuanVideo 1.5's model (Tencent's refiner_vae.py; ComfyUI builds
    both with one class): diffusers' refiner class at its default (published) config has exactly these keys and
    shapes, a file under the refiner's name loads as HunyuanVideo 1.5, and on one latent frame (images, the
    refiner's use) it decodes and encodes as diffusers' refiner class does. On more frames diffusers' class
    keeps the frame count (it never resamples time): not the original's definition."""
    from safetensors.torch import save_file
    hy15, refiner = _meta(diffusers.AutoencoderKLHunyuanVideo15), _meta(diffusers.AutoencoderKLHunyuanImageRefiner)
    assert {k: v.shape for k, v in hy15.items()} == {k: v.shape for k, v in refiner.items()}
    torch.manual_seed(0)
    theirs = jitter_norms(diffusers.AutoencoderKLHunyuanImageRefiner(**TINY), scale=0.2).eval()
    path = tmp_path / "hunyuan_image_refiner_vae_fp16.safetensors"        # Comfy-Org's file name
    save_file(original_layout(theirs.state_dict()), str(path))
    v = vae.load(path)
    assert v.spec is hv15.SPEC
    z, x = torch.randn(1, 32, 1, 3, 2), torch.rand(1, 3, 1, 48, 32)
    with torch.no_grad():
        assert (v.decode(z) - pixels(theirs.decode(z).sample)).abs().max() <= 1e-5
        assert (v.encode(x) - theirs.encode(x * 2 - 1).latent_dist.mode()).abs().max() <= 1e-5
        assert theirs.decode(torch.randn(1, 32, 2, 3, 2)).sample.shape[2] == 2      # 1 + 4(t-1) = 5 here


def _other_families() -> dict:
    """State dicts of every other family we implement (and look-alikes we do not), in their layouts."""
    from helpers import diffusers_kl, diffusers_tiny
    from video_families import FAMILIES, tiny_state_dict
    out = {f: tiny_state_dict(f) for f in FAMILIES if f != "hunyuan_video15"}
    out.update(kl=diffusers_kl().state_dict(), taesd=diffusers_tiny().state_dict())
    published = {"AutoencoderKLHunyuanImage": dict(     # HunyuanImage 2.1's 2-D, 32x VAE (64 channels)
        in_channels=3, out_channels=3, latent_channels=64, block_out_channels=(128, 256, 512, 512, 1024, 1024),
        layers_per_block=2, spatial_compression_ratio=32, sample_size=384)}
    for name in ("AutoencoderKLWan", "AutoencoderKLHunyuanImage", "AutoencoderKLCogVideoX", "AutoencoderKLLTX2Video",
                 "AutoencoderKLMiniMaxH3", "AutoencoderKLAllegro", "AutoencoderKLFlux2"):
        out[name] = _meta(getattr(diffusers, name), **published.get(name, {}))
    # ComfyUI's GroupNorm variant of vae_refiner.py (refiner_vae=False: plain Conv3d, GroupNorm)
    out["comfyui-groupnorm-vae_refiner"] = {k: torch.empty(s, device="meta") for k, s in {
        "decoder.conv_in.weight": (1024, 32, 3, 3, 3), "decoder.up.1.block.0.norm1.weight": (1024,),
        "decoder.up.1.upsample.conv.weight": (4096, 1024, 3, 3, 3)}.items()}
    return out


def test_no_other_family_claims_hunyuan_video15_and_it_claims_no_other(ref):
    sd = ref.state_dict()
    for name, layout in _layouts(sd).items():
        if name == "wrapped-pickle":
            continue
        from vae.loading import unwrap
        found = [s.id for s in registry.REGISTRY if s.detect(unwrap(layout))]
        assert found == ["hunyuan_video15"], (name, found)
    for name, other in _other_families().items():
        layouts = [other]
        spec = next((s for s in registry.REGISTRY if s.detect(other)), None)
        if spec is not None:                    # that family's canonical layout too
            layouts.append(spec.to_canonical(other))
        for layout in layouts:
            assert not hv15.SPEC.detect(layout), name


def test_latent_channel_hints_use_the_rank(ours):
    """32 channels: HunyuanVideo 1.5 (or HunyuanImage 3.0's one-frame LATENT) for a 5-D latent, Flux.2
    (unpacked) for an image latent."""
    from helpers import diffusers_kl
    kl = vae.from_state_dict(diffusers_kl().state_dict())
    with pytest.raises(vae.InputError, match=r"32 channels \(as Flux.2 \(unpacked\) latents do\)"):
        kl.decode(torch.randn(1, 32, 4, 4))
    with pytest.raises(vae.InputError, match=r"64 channels \(as HunyuanImage 2.1 .*\) latents do\)"):
        ours.decode(torch.randn(1, 64, 2, 2, 2))
    from video_families import tiny_state_dict
    magvit = vae.from_state_dict(tiny_state_dict("magvit"))
    with pytest.raises(vae.InputError, match=r"32 channels \(as HunyuanImage 3.0 or HunyuanVideo 1.5 latents do\)"):
        magvit.decode(torch.randn(1, 32, 2, 2, 2))


# ---- core's HunyuanVideo 1.5 nodes -------------------------------------------------------------

def test_core_hunyuan_video15_nodes_calls(pack, ref):
    """What core's HunyuanVideo15ImageToVideo / HunyuanVideo15SuperResolution ask of the VAE: the IMAGE
    batch encoded as one clip (a start image: one latent frame), 32 channels, 16x; core's VAE answers
    latent_channels 32, downscale (floor((a+3)/4), 16, 16), upscale (4a-3, 16, 16)."""
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    v = VAEKitVAE(from_state_dict(original_layout(ref.state_dict())))
    assert v.latent_channels == 32 and v.latent_dim == 3 and not v.not_video
    assert v.spacial_compression_encode() == v.spacial_compression_decode() == 16
    assert v.temporal_compression_decode() == 4
    assert [v.downscale_ratio[0](a) for a in (1, 33, 121)] == [1, 9, 31] and v.downscale_ratio[1:] == (16, 16)
    assert [v.upscale_ratio[0](a) for a in (1, 9, 31)] == [1, 33, 121]
    start_image = torch.rand(1, 64, 48, 3)                   # [N, H, W, C], as the node slices it
    encoded = v.encode(start_image[:, :, :, :3])
    assert encoded.shape == (1, 32, 1, 4, 3)
    concat = torch.zeros(1, 32, 9, 4, 3)                     # the node's 33-frame latent
    concat[:, :, :encoded.shape[2]] = encoded
    with torch.no_grad():
        want = ref.encode(start_image.movedim(-1, 0)[None] * 2 - 1).latent_dist.mode()
    assert (encoded - want).abs().max() <= 1e-5
    clip = v.encode(torch.rand(5, 64, 48, 3))                 # a batch of frames is one clip
    assert clip.shape == (1, 32, 2, 4, 3)


# ---- published config (slow) --------------------------------------------------------------------

@pytest.mark.slow
def test_published_config_parity_streaming_and_exact():
    """diffusers' default config (= the published VAE), random weights: parity, frame-wise chunks of 1, 2
    and 3 latent frames, exact 2x2 tiles (whole clip per tile, and streamed one latent frame at a time);
    every figure is printed (``-s``)."""
    ref = diffusers.AutoencoderKLHunyuanVideo15()
    torch.manual_seed(0)
    jitter_norms(ref, scale=0.2).eval()
    v = vae.from_state_dict(original_layout(ref.state_dict()))
    err = {}
    z = torch.randn(1, 32, 4, 4, 3)
    with torch.no_grad():
        want = pixels(ref.decode(z).sample)
        whole = pixels(v.model.decode(z))
    err["decode vs diffusers"] = (whole - want).abs().max().item()
    err["decode (own 2-frame chunks) vs diffusers"] = (v.decode(z) - want).abs().max().item()
    for chunk in (1, 2, 3):
        err[f"decode frame-wise {chunk} vs one pass"] = (v.decode(z, tile_frames=4 * chunk) - whole).abs().max().item()
    for frames in (16, 4):                     # whole clip per tile; streamed one latent frame at a time
        out = v.decode(z, tile=32, tile_frames=frames, mode="exact")
        err[f"decode exact 2x2, {frames} frames a chunk, vs one pass"] = (out - whole).abs().max().item()
    x = torch.rand(1, 3, 9, 64, 48)
    with torch.no_grad():
        want = ref.encode(x * 2 - 1).latent_dist.mode()
    err["encode vs diffusers"] = (v.encode(x, tile_frames=36) - want).abs().max().item()
    for chunk in (1, 2, 3):
        err[f"encode frame-wise {chunk} vs diffusers"] = (v.encode(x, tile_frames=4 * chunk) - want).abs().max().item()
    for frames in (36, 4):
        out = v.encode(x, tile=32, tile_frames=frames, mode="exact")
        err[f"encode exact 2x2, {frames} frames a chunk, vs diffusers"] = (out - want).abs().max().item()
    for name, e in err.items():
        print(f"HunyuanVideo 1.5 published config, fp32: {name}: max abs {e:.2e}")
    assert max(err.values()) <= 1e-4
