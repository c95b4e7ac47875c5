"""Mage-VAE: the window attention against a loop over windows, the parts of the definition that tiles
cut (the whole-image channel gate, windows aligned to the whole image), every key layout (ComfyUI's
file with and without the Flux.2 anchor encoder, core's in-memory names, diffusers PR #14295, full
checkpoints, encoder-only and decoder-only files, the templates' bf16 file), detection both ways,
core's VAE contract through the socket, and every engine (fast and exact tiles, NaN guard, compile
with fused q/k/v; several devices: tests/vae/test_distributed.py).

Random weights of our own model at a tiny config (tests/mage_tiny.py): neither reference runs in CI
(ComfyUI core has the class, diffusers only in an open PR). Parity with core at the published config:
bench/comfyui_checks/compare_core.py --family mage (figures in docs/families/mage.md)."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import mage_tiny as T
import vae
from helpers import assert_exact_tiles_both_ways, assert_layouts_agree, reference_state_dicts
from vae import registry
from vae.engine import tiling
from vae.archs import mage
from vae.compile import compile_vae
from vae.loading import unwrap

PARITY = 1e-4    # fp32, 0..1 pixels / latents
VISIBLE = 1e-2   # what fast tiles change: the case is not trivially seamless

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sd():
    return T.canonical()


@pytest.fixture(scope="module")
def ours(sd):
    return T.set_window(vae.from_state_dict(sd), 4)


def _latent(h: int, w: int, b: int = 1, seed: int = 1, c: int = T.TINY["latent"]) -> torch.Tensor:
    return torch.randn(b, c, h, w, generator=torch.Generator().manual_seed(seed))


def _images(h: int, w: int, b: int = 1, seed: int = 2) -> torch.Tensor:
    return torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


# ---- the definition -----------------------------------------------------------------------------

def _windows_by_loop(attn: mage.WindowAttention, x: torch.Tensor) -> torch.Tensor:
    """Each window's softmax(q k^T / sqrt(C)) v, one window at a time; the map replicate-padded to whole
    windows at the bottom/right (the padded copies are keys too), then cropped."""
    d, (b, c, h, w) = attn.window, x.shape
    hn = attn.norm(x)
    q, k, v = (F.pad(conv(hn), (0, -w % d, 0, -h % d), mode="replicate") for conv in (attn.q, attn.k, attn.v))
    out = torch.zeros_like(q)
    for i in range(0, q.shape[2], d):
        for j in range(0, q.shape[3], d):
            qw, kw, vw = (t[:, :, i:i + d, j:j + d].flatten(2) for t in (q, k, v))      # [b, c, d*d]
            weights = torch.softmax(qw.transpose(1, 2) @ kw / c ** 0.5, dim=-1)      # [b, d*d, d*d]
            out[:, :, i:i + d, j:j + d] = (vw @ weights.transpose(1, 2)).reshape(b, c, d, d)
    return x + attn.proj_out(out[:, :, :h, :w])


def test_window_attention_is_attention_within_windows_of_the_whole_map():
    torch.manual_seed(0)
    attn = mage.WindowAttention(32, window=4).eval()
    x = torch.randn(2, 32, 9, 11)                         # 3x3 windows, the last row and column padded
    with torch.no_grad():
        want = _windows_by_loop(attn, x)
        assert (attn(x) - want).abs().max() <= 1e-5
        from vae.nn.qkv import fuse_qkv
        assert fuse_qkv(attn).fused == 1
        assert (attn(x) - want).abs().max() <= 1e-5


def test_decode_is_per_image_and_the_pixel_mlp_is_per_patch(ours, monkeypatch):
    """A batch decodes as its images one by one (the gates pool per image), and the pixel MLP gives the
    same pixels in chunks of one latent pixel as in one chunk."""
    z = _latent(5, 6, b=2)
    whole = ours.decode(z)
    assert (whole - torch.cat([ours.decode(z[:1]), ours.decode(z[1:])])).abs().max() <= 1e-5
    monkeypatch.setattr(mage, "HEAD_CHUNK", 1)
    assert (ours.decode(z) - whole).abs().max() <= 1e-5


def test_decode_and_encode_are_not_tile_local(ours):
    """Why exact tiles need whole-image steps: a latent pixel far beyond every convolution's reach (and
    in another attention window) still changes the decoded corner, through the pooled gates; likewise
    one image patch changes the far corner of the latent."""
    z = _latent(12, 12)
    far = z.clone()
    far[:, :, -1, -1] += 3.0
    assert (ours.decode(far) - ours.decode(z))[..., :4, :4].abs().max() > 1e-4
    x = _images(48, 48)
    far = x.clone()
    far[..., -4:, -4:] = 1 - far[..., -4:, -4:]
    assert (ours.encode(far) - ours.encode(x))[..., :1, :1].abs().max() > 1e-5


def test_value_ranges_and_the_posterior_mean(sd):
    """0..1 images go in as [-1, 1] (core's process_input); the LATENT is the first half of the encoder's
    output (the posterior mean; the second half is the log-variance), raw: no scaling, no packing."""
    v = vae.from_state_dict(sd)
    assert v.caps.value_range == (-1.0, 1.0) and v.caps.latent_pack == 1 and v.caps.spatial_ratio == 4
    seen = []
    v.model.dconv_encoder.proj_out.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    x = _images(16, 20)
    z = v.encode(x)
    (_, full), = seen
    assert full.shape[1] == 2 * T.TINY["latent"] and torch.equal(z, full[:, :T.TINY["latent"]].float())
    seen.clear()
    first = v.model.dconv_encoder.patch_cond_embed
    first.register_forward_pre_hook(lambda m, args: seen.append((args[0], None)))
    v.encode(x)
    assert (seen[0][0] - (x * 2 - 1)).abs().max() <= 1e-6


# ---- layouts, variants, detection ---------------------------------------------------------------

def _layouts(sd: dict) -> dict:
    comfy = T.file_layout(sd)
    unet_noise = {"model.diffusion_model.img_in.weight": torch.zeros(8, 16)}
    return {
        "comfyui-file": comfy,
        "original-with-anchor-encoder": T.file_layout(sd, anchor=True),
        "core-in-memory": sd,
        "diffusers-pr-14295": T.diffusers_pr_layout(sd),
        "checkpoint-vae-prefix": {**{f"vae.{k}": v for k, v in comfy.items()}, **unet_noise},
        "wrapped-state_dict": {"state_dict": T.file_layout(sd, anchor=True)},
    }


def test_every_layout_round_trips_through_the_loader(tmp_path, sd):
    z, x = _latent(3, 4), _images(12, 16)
    assert_layouts_agree(_layouts(sd), tmp_path, "mage", lambda v: torch.cat([v.decode(z).flatten(),
                                                                               v.encode(x).flatten()]))


def test_encoder_only_and_decoder_only_files(sd, ours):
    comfy = T.file_layout(sd, anchor=True)
    enc = vae.from_state_dict({k: v for k, v in comfy.items() if k.startswith("student.")})
    dec = vae.from_state_dict({k: v for k, v in comfy.items() if k.startswith("pipeline.")})
    assert enc.spec.id == dec.spec.id == "mage"
    assert enc.name.endswith("encoder only)") and dec.name.endswith("decoder only)")
    z, x = _latent(3, 4), _images(12, 16)
    full = vae.from_state_dict(sd)
    assert torch.equal(dec.decode(z), full.decode(z)) and torch.equal(enc.encode(x), full.encode(x))
    with pytest.raises(vae.InputError, match="no encoder"):
        dec.encode(x)
    with pytest.raises(vae.InputError, match="no decoder"):
        enc.decode(z)


def test_widths_and_depths_come_from_the_weights():
    v = vae.from_state_dict(T.file_layout(T.canonical(latent=8, hidden=64, blocks=3, pixel=4, pixel_blocks=1,
                                                      patch=8, freqs=3)))
    enc, dec = v.config.encoder, v.config.decoder
    assert v.config.latent_channels == 8 and v.caps.spatial_ratio == 8 and v.caps.latent_channels == 8
    assert (enc.hidden, enc.blocks, enc.head_blocks, enc.out_channels) == (64, 3, 2, 16)
    assert (dec.hidden, dec.blocks, dec.pixel, dec.pixel_blocks, dec.freqs, dec.cod) == (64, 3, 4, 1, 3, T.COD)
    assert v.decode(_latent(2, 3, c=8)).shape == (1, 3, 16, 24)


def test_a_half_that_disagrees_is_refused(sd):
    other = T.canonical(latent=8)
    mixed = {**{k: v for k, v in sd.items() if k.startswith("dconv_encoder.")},
             **{k: v for k, v in other.items() if k.startswith("decoder_model.")}}
    with pytest.raises(vae.LoadError, match="encoder and decoder disagree"):
        vae.from_state_dict(mixed)


def _other_families() -> dict:
    import diffusers_flux2
    return {**reference_state_dicts(), "flux2": diffusers_flux2.model().state_dict()}


def test_detection_across_families(sd):
    """Mage files are Mage in every layout, and no other family's detection claims them (each is asked
    directly, not only in registry order); no other family's file is claimed by Mage."""
    for name, layout in _layouts(sd).items():
        layout = unwrap(layout.get("state_dict", layout))
        assert registry.detect(layout).id == "mage", name
        for spec in registry.REGISTRY:
            if spec.id != "mage":
                assert not spec.detect(layout), (name, spec.id)
    for name, other in _other_families().items():
        assert not mage.SPEC.detect(other) and registry.detect(other).id != "mage", name


def test_the_templates_file_loads_through_the_vae_load_node(pack, tmp_path, monkeypatch, sd):
    """The official Mage-Flow templates load 'mage_flow_vae_bf16.safetensors' (ComfyUI's layout, bf16):
    listed by our VAE Load node and loaded as Mage-VAE, its bf16 weights decoding as they are."""
    from safetensors.torch import save_file
    (tmp_path / "vae").mkdir()
    bf16 = {k: v.to(torch.bfloat16) for k, v in T.file_layout(sd, anchor=True).items()}
    save_file(bf16, str(tmp_path / "vae" / T.TEMPLATE_FILE))
    monkeypatch.setenv("VAEKIT_MODEL_DIRS", str(tmp_path))
    node = pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]
    assert T.TEMPLATE_FILE in node.INPUT_TYPES()["required"]["vae_name"][0]
    (v,) = node().load(T.TEMPLATE_FILE, dtype="fp32", device="cpu")
    assert v.handle.spec.id == "mage" and v.handle.dtype == torch.float32
    z = _latent(3, 4)
    want = vae.from_state_dict({k: t.float() for k, t in bf16.items()}).decode(z)
    assert torch.equal(v.handle.decode(z), want)
    (v16,) = node().load(T.TEMPLATE_FILE, dtype="bf16", device="cpu")
    assert v16.handle.dtype == torch.bfloat16
    assert (v16.handle.decode(z) - want).abs().max() <= 0.1          # bf16 compute, same weights


def test_what_core_reads_from_the_socket(pack, sd):
    """Core's Mage-VAE branch: latent_channels 128 and ratio 16 at the published size (here: the tiny
    file's 16 and 4), images; its VAE Encode centre-crops sides to multiples of the ratio (TextEncode-
    MageFlowEdit calls encode(IMAGE[..., :3])), decode returns [B, H, W, 3]."""
    from vaekit.nodes.socket import VAEKitVAE
    v = VAEKitVAE(pack.vae.from_state_dict(sd))
    assert v.latent_channels == 16 and v.latent_dim == 2 and v.not_video
    assert v.spacial_compression_decode() == v.spacial_compression_encode() == v.downscale_ratio == v.upscale_ratio == 4
    image = torch.rand(1, 18, 23, 3)
    z = v.encode(image)
    assert z.shape == (1, 16, 4, 5)
    assert torch.equal(z, v.handle.encode(image[:, 1:17, 1:21].movedim(-1, 1)))
    assert v.decode(z).shape == (1, 16, 20, 3)
    with torch.device("meta"):
        published = mage.MageVAE(T.config(**T.PUBLISHED)).state_dict()
    caps = mage.capabilities(mage.config_from_state_dict(published))
    assert (caps.latent_channels, caps.spatial_ratio, caps.working_dtypes) == (128, 16, (torch.bfloat16, torch.float32))


def test_a_wrong_latent_names_the_models_it_fits(ours):
    with pytest.raises(vae.InputError, match="as Flux.2 \\(packed\\) or Mage-Flow latents do"):
        ours.decode(torch.zeros(1, 128, 4, 4))


# ---- engines ------------------------------------------------------------------------------------

def test_exact_tiles_equal_untiled_both_ways(ours):
    """Tiles of 3 latent pixels cut through 4-pixel attention windows, the pooled gates see the whole
    image: exact mode reproduces the untiled result; fast tiles visibly do not."""
    r = ours.caps.spatial_ratio
    z = _latent(9, 11)
    x = _images(9 * r, 11 * r)
    assert_exact_tiles_both_ways(ours, z, x, 3 * r, r, PARITY, VISIBLE)


def test_fast_tiles_cover_the_image(ours):
    """Independent tiles: each is a valid decode of its latent crop (their own windows and pooling),
    blended; every pixel written, the size of the untiled decode."""
    r = ours.caps.spatial_ratio
    z = _latent(9, 11, b=2)
    out = ours.decode(z, tile=5 * r, overlap=2 * r)
    assert out.shape == (2, 3, 9 * r, 11 * r) and torch.isfinite(out).all()
    assert (out - ours.decode(z)).abs().mean() < 0.2
    (rows, cols) = [p.spans for p in tiling.plan_grid((9, 11), 5 * r, 2 * r, r)]
    corner = ours.decode(z[..., :rows[0][1], :cols[0][1]])      # the first tile, alone up to the next one's start
    a, b = rows[1][0] * r, cols[1][0] * r
    assert (out[..., :a, :b] - corner[..., :a, :b]).abs().max() <= 1e-5


def test_nan_guard_recomputes_an_overflowing_decode(sd, caplog):
    """The CoD decoder's first conv feeds a residual stream ~3000x its input (the GroupNorms after it
    keep fp32 sane): large latent values overflow fp16, and the guard redoes the decode upcast."""
    big = dict(sd)
    for kind in ("weight", "bias"):
        key = f"decoder_model.y_embedder.decoder.conv_in.{kind}"
        big[key] = sd[key] * 3000
    v32, v16 = vae.from_state_dict(big), vae.from_state_dict(big, dtype=torch.float16)
    z = _latent(4, 4)
    z[..., 2:, 2:] *= 30
    with torch.inference_mode():
        assert not torch.isfinite(v16.model.decode(v16._model_input(z))).all()
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        out = v16.decode(z)
    assert torch.isfinite(out).all() and (out - v32.decode(z)).abs().max() <= 1e-2
    assert "overflowed in float16" in caplog.text


def test_compiled_handle_with_fused_qkv_matches_eager(ours):
    c, report = compile_vae(ours, backend="eager", fuse_qkv=True)
    assert "fused q/k/v in 2 attention block(s)" in report.message
    z, x = _latent(5, 6), _images(20, 24)
    assert (c.decode(z) - ours.decode(z)).abs().max() <= 1e-5
    assert (c.encode(x) - ours.encode(x)).abs().max() <= 1e-5
    assert not c.fallbacks()


def test_memory_estimate_runs_on_the_meta_device(ours):
    """The engines' device-memory estimate (vae/engine/memory.py) runs the model on the meta device."""
    assert ours.memory_needed((1, 16, 16, 16), "decode") > 0
    assert ours.memory_needed((1, 3, 64, 64), "encode") > 0


# ---- published config (slow) --------------------------------------------------------------------

@pytest.mark.slow
def test_published_config_exact_tiles_and_bf16():
    """The published structure (128 latent channels, 16x, 21 DiCo blocks a side, 32-latent-pixel windows),
    random weights: exact tiles of 512 px on a 48x40 latent (two windows a side, the second padded) equal
    the untiled decode and encode; a bf16 handle stays near fp32."""
    import os
    torch.set_num_threads(os.cpu_count() or 1)      # the module's one-thread fixture restores it
    v = vae.from_state_dict(T.file_layout(T.canonical(**T.PUBLISHED)))
    assert v.name == "Mage-VAE (128 latent channels, 16x)"
    z = _latent(48, 40, c=128)
    untiled = v.decode(z)
    exact = (v.decode(z, tile=512, mode="exact") - untiled).abs().max().item()
    x = _images(48 * 16, 40 * 16)
    lat = v.encode(x)
    exact_enc = (v.encode(x, tile=512, mode="exact") - lat).abs().max().item()
    bf = vae.from_state_dict(T.file_layout(T.canonical(**T.PUBLISHED)), dtype=torch.bfloat16)
    bf_dec = (bf.decode(z) - untiled).abs().mean().item()
    print(f"Mage-VAE published config: exact vs untiled decode {exact:.2e}, encode {exact_enc:.2e}; "
          f"bf16 vs fp32 decode mean {bf_dec:.2e}")
    assert exact <= PARITY and exact_enc <= PARITY and bf_dec <= 0.05
