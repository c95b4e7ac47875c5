"""Flux.2 VAE: parity with the diffusers Flux.2 pipeline (its own BatchNorm + 2x2 packing steps around
AutoencoderKLFlux2) on the same random weights, the 32-channel convention, every key layout, the small
decoder, detection, core's VAE contract both ways, and every engine (fast and exact tiles, NaN guard,
compile with fused q/k/v; inductor runs in test_compile.py's slow family list).

Random weights only: no real Flux.2 weights are used (none are in this repository). The BatchNorm
statistics are random too, per channel, so a wrong packing order or a tile that un-normalises with
the wrong cell position cannot pass."""
from __future__ import annotations

import logging
import os

import pytest
import torch

import diffusers_flux2 as F2
import vae
from helpers import assert_layouts_agree, diffusers_kl, reference_state_dicts
from vae.files import latents
from vae import registry
from vae.engine import tiling
from vae.archs import flux2
from vae.compile import compile_vae
from vae.loading import unwrap
from video_families import tiny_state_dict

PARITY = 1e-4    # fp32, 0..1 pixels / latents
VISIBLE = 1e-2   # fast tiles' error at the same tiles: the case is not trivially seamless

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

CONFIGS = {"full": {}, "small-decoder": dict(decoder_widths=(32, 32))}


@pytest.fixture(scope="module")
def pipe():
    return F2.Pipeline()


@pytest.fixture(scope="module")
def ref():
    return F2.model()


@pytest.fixture(scope="module")
def ours(ref):
    return vae.from_state_dict(ref.state_dict())


@pytest.fixture(scope="module")
def deep():
    """Three levels (ratio 4, 8 packed), two resnets per level: tiles with real halos."""
    ref = F2.model(widths=(32, 64, 64), layers=2)
    return ref, vae.from_state_dict(ref.state_dict())


def _latent(c: int, h: int, w: int, b: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, c, h, w, generator=torch.Generator().manual_seed(seed))


def _images(h: int, w: int, b: int = 2, seed: int = 2) -> torch.Tensor:
    return torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


def _raw(ref, pipe, z: torch.Tensor) -> torch.Tensor:
    """The pipeline's un-normalised, unpatchified latent (what AutoencoderKLFlux2.decode takes)."""
    std = torch.sqrt(ref.bn.running_var.view(1, -1, 1, 1) + ref.config.batch_norm_eps)
    return pipe.unpatchify(z * std + ref.bn.running_mean.view(1, -1, 1, 1))


# ---- parity with the diffusers pipeline ---------------------------------------------------------

@pytest.mark.parametrize("config", CONFIGS)
def test_decode_and_encode_match_the_diffusers_pipeline(pipe, config):
    ref = F2.model(**CONFIGS[config])
    v = vae.from_state_dict(ref.state_dict())
    assert v.spec.id == "flux2" and v.caps.latent_pack == 2 and v.caps.latent_channels == 8
    assert v.caps.has_attention and v.caps.norm == "groupnorm" and v.caps.value_range == (-1.0, 1.0)
    assert v.config.decoder_widths == CONFIGS[config].get("decoder_widths")
    z = _latent(32, 5, 6)                   # a Flux.2 LATENT: packed 2x2, normalised
    assert (v.decode(z) - pipe.decode(ref, z)).abs().max() <= PARITY
    x = _images(20, 24)
    assert (v.encode(x) - pipe.encode(ref, x)).abs().max() <= PARITY


def test_a_32_channel_latent_is_the_normalised_latent_unpacked(ours, ref, pipe):
    """taef2's space (what core's TAESD path makes and takes): unpacked but still normalised. Odd sizes
    decode too: each latent pixel is un-normalised by its place in its 2x2 cell."""
    z = _latent(32, 5, 6)
    u = latents.unpack(z, 2)
    assert torch.equal(ours.decode(u), ours.decode(z))
    with torch.no_grad():
        want = (ref.decode(_raw(ref, pipe, z)[..., :9, :11]).sample / 2 + 0.5).clamp(0, 1)
    assert (ours.decode(u[..., :9, :11]) - want).abs().max() <= PARITY
    # read as a raw z instead (diffusers' decode input), it would decode to something else
    with torch.no_grad():
        as_raw = (ref.decode(u).sample / 2 + 0.5).clamp(0, 1)
    assert (ours.decode(u) - as_raw).abs().max() > VISIBLE


# ---- layouts, variants, detection ---------------------------------------------------------------

def _bfl(sd: dict) -> dict:
    """BFL's original layout (flux2 repo, src/flux2/autoencoder.py): the quant convs live inside the
    encoder and decoder."""
    out = {}
    for k, v in sd.items():
        if k.startswith("quant_conv."):
            k = "encoder." + k
        elif k.startswith("post_quant_conv."):
            k = "decoder." + k
        out[k] = v
    return out


def _layouts(ref) -> dict:
    diff = ref.state_dict()
    comfy = vae.from_state_dict(diff).state_dict()       # canonical = ComfyUI's (first_stage_model) keys
    unet_noise = {"model.diffusion_model.img_in.weight": torch.zeros(8, 128)}
    return {
        "diffusers": diff,
        "bfl-original": _bfl(comfy),
        "comfyui": comfy,
        "checkpoint-first_stage_model": {**{f"first_stage_model.{k}": v for k, v in comfy.items()}, **unet_noise},
        "checkpoint-vae-prefix": {**{f"vae.{k}": v for k, v in _bfl(comfy).items()}, **unet_noise},
        "diffusers-without-bn-counter": {k: v for k, v in diff.items() if k != "bn.num_batches_tracked"},
        "wrapped-state_dict": {"state_dict": comfy},
    }


@pytest.mark.parametrize("config", CONFIGS)
def test_every_layout_round_trips_through_the_loader(tmp_path, config):
    ref = F2.model(**CONFIGS[config])
    z, x = _latent(32, 3, 4, b=1), _images(12, 16, b=1)
    assert_layouts_agree(_layouts(ref), tmp_path, "flux2", lambda v: torch.cat([v.decode(z).flatten(),
                                                                                  v.encode(x).flatten()]))


def test_decoder_only_and_encoder_only_files(ref, ours):
    sd = ours.state_dict()
    dec = vae.from_state_dict({k: t for k, t in _bfl(sd).items() if not k.startswith("encoder.")})
    enc = vae.from_state_dict({k: t for k, t in sd.items() if not k.startswith(("decoder.", "post_quant_conv."))})
    assert dec.spec.id == enc.spec.id == "flux2"
    assert "decoder only" in dec.name and "encoder only" in enc.name
    z, x = _latent(32, 3, 4), _images(12, 16)
    assert torch.equal(dec.decode(z), ours.decode(z)) and torch.equal(enc.encode(x), ours.encode(x))
    with pytest.raises(vae.InputError, match="no encoder"):
        dec.encode(x)


def test_small_decoder_widths_come_from_the_weights():
    """Encoder and decoder widths are read independently (FLUX.2's small decoders are narrower)."""
    v = vae.from_state_dict(F2.model(widths=(32, 64), decoder_widths=(32, 96)).state_dict())
    assert v.config.widths == (32, 64) and v.config.decoder_widths == (32, 96)
    assert "decoder widths 32/96" in v.name


def _other_families() -> dict:
    return reference_state_dicts()


def test_detection_across_families(ref):
    """Flux.2 files are Flux.2 in every layout; no other family's file is (SD/Flux.1 KL files have
    no bn.*), and every other family keeps its own files."""
    for name, sd in _layouts(ref).items():
        if name != "wrapped-state_dict":
            assert registry.detect(unwrap(sd)).id == "flux2", name
    for name, sd in _other_families().items():
        assert not flux2.detect(sd) and registry.detect(sd).id != "flux2", name
    assert registry.detect(diffusers_kl().state_dict()).id == "kl"


def test_what_core_reads_from_the_socket(pack):
    """Core's Flux.2 VAE reports latent_channels 128 and ratio 16 (comfy/sd.py: z_channels * 4, ratio
    8 * 2); the published config through our spec, and a tiny model through our socket."""
    from vaekit.nodes.socket import VAEKitVAE
    diffusers = pytest.importorskip("diffusers")
    with torch.device("meta"):
        published = diffusers.AutoencoderKLFlux2().state_dict()
    cfg = flux2.config_from_state_dict(flux2.to_canonical(published))
    caps = flux2.capabilities(cfg)
    assert (caps.latent_channels_packed, caps.spatial_ratio_packed, caps.latent_channels) == (128, 16, 32)
    assert cfg.widths == (128, 256, 512, 512) and cfg.num_res_blocks == 2 and cfg.embed_dim == 32

    v = VAEKitVAE(pack.vae.from_state_dict(F2.model().state_dict()))
    assert v.latent_channels == 32 and v.latent_dim == 2 and v.not_video
    assert v.spacial_compression_decode() == v.spacial_compression_encode() == v.downscale_ratio == v.upscale_ratio == 4
    assert v.temporal_compression_decode() is None
    image = torch.rand(1, 20, 24, 3)                     # core's VAE Encode (reference latents) calls encode(IMAGE)
    z = v.encode(image)
    assert z.shape == (1, 32, 5, 6) and torch.equal(z, v.handle.encode(image.movedim(-1, 1)))
    assert v.decode(z).shape == (1, 20, 24, 3)


def test_our_nodes_take_cores_flux2_vae(pack, ours):
    """A Flux.2 VAE from core's Load VAE (duck-typed comfy.sd.VAE: its first_stage_model's state dict
    is ComfyUI's layout) is converted and decoded by our implementation."""
    class CoreVAE:
        first_stage_model = torch.nn.Identity()

        def get_sd(self):
            return ours.state_dict()
    z = _latent(32, 5, 6, b=1)
    (out,) = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]().decode({"samples": z}, CoreVAE(), tile_size=512,
                                                                     overlap=64)
    assert torch.equal(out, ours.decode(z).movedim(1, -1))


def test_channel_hints_use_the_latents_rank():
    kl_sd = vae.from_state_dict(diffusers_kl().state_dict())
    mochi = vae.from_state_dict(tiny_state_dict("mochi"))
    cases = [(kl_sd, (1, 128, 4, 4), "as Flux.2 \\(packed\\)"), (kl_sd, (1, 32, 4, 4), "Flux.2 \\(unpacked"),
             (mochi, (1, 128, 2, 4, 4), "as LTX-Video/LTX-2 latents do"),
             (mochi, (1, 32, 2, 4, 4), "as HunyuanImage 3.0 or HunyuanVideo 1.5 latents do")]
    for v, shape, text in cases:
        with pytest.raises(vae.InputError, match=text):
            v.decode(torch.zeros(shape))


# ---- engines ------------------------------------------------------------------------------------

def test_fast_tiles_normalise_the_whole_latent(deep, pipe):
    """Fast tiles at odd latent offsets give exactly what the plain KL model gives on the
    un-normalised latent with the same tiles: the BatchNorm step never sees a tile's cut."""
    ref, v = deep
    plain = vae.from_state_dict({k: t for k, t in v.state_dict().items() if not k.startswith("bn.")})
    assert plain.spec.id == "kl"
    r = v.caps.spatial_ratio
    tile, overlap = 7 * r, 2 * r
    z = _latent(32, 9, 8, b=1)                           # unpacked 18 x 16
    starts = [a for p in tiling.plan_grid((18, 16), tile, overlap, r) for a, _ in p.spans]
    assert any(a % 2 for a in starts), "some tile starts mid-cell"
    out = v.decode(z, tile=tile, overlap=overlap)
    assert (out - v.decode(z)).abs().max() > VISIBLE
    assert (out - plain.decode(_raw(ref, pipe, z), tile=tile, overlap=overlap)).abs().max() <= 1e-5
    x = _images(18 * r, 16 * r, b=1)
    std = torch.sqrt(ref.bn.running_var.view(1, -1, 1, 1) + ref.config.batch_norm_eps)
    want = (latents.pack(plain.encode(x, tile=tile, overlap=overlap), 2) - ref.bn.running_mean.view(1, -1, 1, 1)) / std
    assert (v.encode(x, tile=tile, overlap=overlap) - want).abs().max() <= 1e-5


def test_exact_tiles_equal_untiled_both_ways(deep):
    _, v = deep
    r = v.caps.spatial_ratio
    z = _latent(32, 9, 7, b=1)                           # unpacked 18 x 14: cores start mid-cell
    untiled = v.decode(z)
    assert (v.decode(z, tile=5 * r, overlap=r) - untiled).abs().max() > VISIBLE
    assert (v.decode(z, tile=5 * r, mode="exact") - untiled).abs().max() <= PARITY
    x = _images(18 * r, 14 * r, b=1)
    untiled = v.encode(x)
    assert (v.encode(x, tile=5 * r, overlap=r) - untiled).abs().max() > VISIBLE
    assert (v.encode(x, tile=5 * r, mode="exact") - untiled).abs().max() <= PARITY


def _overflowing(side: str) -> tuple[vae.VAE, vae.VAE]:
    """fp32 and fp16 handles whose conv_in feeds a residual stream ~3000x the input (as SDXL's VAE
    overflows in fp16); the GroupNorms after it keep fp32 sane."""
    torch.manual_seed(0)
    model = flux2.Flux2VAE(flux2.Flux2Config(ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=4, embed_dim=4))
    with torch.no_grad():
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2.0)
        conv = getattr(model, side).conv_in
        conv.weight.mul_(3000.0 if side == "decoder" else 9e4)
        conv.bias.mul_(3000.0) if side == "decoder" else conv.bias.zero_()
    sd = model.state_dict()
    return vae.from_state_dict(sd), vae.from_state_dict(sd, dtype=torch.float16)


def test_nan_guard_recomputes_the_overflowing_tiles(caplog):
    v32, v16 = _overflowing("decoder")
    z = _latent(16, 8, 8, b=1)
    z[:, :, 1:3, 5:7] *= 30                              # large values in the top-right quarter only
    with torch.inference_mode():
        assert not torch.isfinite(v16.model.decode(v16.model.prepare_decode(v16._model_input(latents.unpack(z, 2))))).all()
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        out = v16.decode(z, tile=16)
    assert torch.isfinite(out).all() and (out - v32.decode(z, tile=16)).abs().max() <= 1e-2
    assert v16.last_upcast.tiles == ((0, 1),) and "overflowed in float16" in caplog.text
    out = v16.decode(z, tile=16, mode="exact")
    assert torch.isfinite(out).all() and v16.last_upcast.whole
    e32, e16 = _overflowing("encoder")
    x = torch.full((1, 3, 32, 32), 0.5)
    x[:, :, :8, :8] = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    ref = e32.encode(x, tile=16)
    out = e16.encode(x, tile=16)
    assert torch.isfinite(out).all() and (out - ref).abs().max() <= 1e-2 * ref.abs().max()
    assert e16.last_upcast.tiles == ((0, 0),)


def test_compiled_handle_with_fused_qkv_matches_eager(ours):
    c, report = compile_vae(ours, backend="eager", fuse_qkv=True)
    assert "fused q/k/v in 2 attention block(s)" in report.message
    z, x = _latent(32, 5, 6), _images(20, 24)
    assert (c.decode(z) - ours.decode(z)).abs().max() <= 1e-5
    assert (c.encode(x) - ours.encode(x)).abs().max() <= 1e-5
    assert c.graph_count() >= 2 and not c.fallbacks()


# ---- published config (slow) --------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("decoder_widths", [None, (96, 192, 384, 384)])
def test_published_config_parity(pipe, decoder_widths):
    """FLUX.2's published VAE (and a narrower decoder beside its encoder), random weights. BatchNorm
    variances at a latent's scale (0.25..4): dividing by a tiny std only magnifies the fp32 rounding
    both sides share (3e-6 in the raw latent reads as 1e-4 at var 1e-3); the tiny tests cover eps."""
    torch.set_num_threads(os.cpu_count() or 1)      # the module's one-thread fixture restores it
    ref = F2.model(**F2.PUBLISHED, decoder_widths=decoder_widths, var=(0.25, 4.0))
    v = vae.from_state_dict(ref.state_dict())
    z = _latent(128, 4, 5, b=1)
    dec = (v.decode(z) - pipe.decode(ref, z)).abs().max().item()
    x = _images(64, 80, b=1)
    enc = (v.encode(x) - pipe.encode(ref, x)).abs().max().item()
    print(f"Flux.2 published config{' (narrow decoder)' if decoder_widths else ''}: ours vs diffusers "
          f"pipeline, fp32: decode {dec:.2e}, encode {enc:.2e}")
    assert dec <= PARITY and enc <= PARITY
    if decoder_widths is None:
        assert (v.decode(z, tile=32, mode="exact") - v.decode(z)).abs().max() <= PARITY

