"""TAEHV family: variants read from the weights in every layout, the latent space each file expects
(metadata, file name, shapes; never the dtype), streaming and exact tiles equal to one pass, MiniMax
H3's clip rule with warm-up units equal to the reference's one pass; parity with the original taehv.py
when a copy is given (TAEHV_REFERENCE) and with ComfyUI core's class when a ComfyUI is given
(COMFYUI_DIR + COMFYUI_PYTHON: bench/comfyui_checks/compare_core.py --family taehv). Tiny widths here; the
original's parity runs its published widths."""
from __future__ import annotations

import dataclasses
import os
from unittest import mock

import pytest
import torch
from safetensors.torch import save_file

import vae
from helpers import core_parity_rows, original_module
from video_families import taehv_model
from vae.archs import taehv
from vae.engine import defined

pytestmark = pytest.mark.usefixtures("one_thread")

# narrow versions of the published shapes (the layer structure is the published one)
TINY = dict(encoder_width=8, decoder_widths=(16, 8, 8, 8))
VARIANTS = {
    "taew2_1": taehv.TAEHVConfig(16, **TINY),
    "taew2_2": taehv.TAEHVConfig(48, patch=2, **TINY),
    "taehv1_5_super": taehv.TAEHVConfig(32, patch=2, decoder="super", decoder_space=(2, 2, 2), **TINY),
    "taeltx_2": taehv.TAEHVConfig(128, patch=4, encoder_time=(2, 2, 2), decoder_time=(2, 2, 2), **TINY),
    "taeh3": taehv.TAEHVConfig(24, patch=2, **TINY),
}


def tiny_state_dict(name: str, seed: int = 0) -> dict:
    return {k: v.contiguous() for k, v in taehv_model(VARIANTS[name], seed).state_dict().items()}


def load(name: str, file_name=None, **kw) -> vae.VAE:
    return vae.from_state_dict(tiny_state_dict(name), name_hint=file_name or f"{name}.safetensors", **kw)


# ---- what the weights tell ------------------------------------------------------------------------

@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_is_read_from_its_shapes(name):
    want = VARIANTS[name]
    v = load(name, "renamed.safetensors")         # no name to lean on
    got = v.config
    for field in ("latent_channels", "patch", "encoder_width", "encoder_time", "decoder", "decoder_widths",
                  "decoder_space", "decoder_time"):
        assert getattr(got, field) == getattr(want, field), field
    caps = v.caps
    assert caps.spatial_ratio == 8 * want.patch and caps.temporal_ratio == (8 if name == "taeltx_2" else 4)
    assert caps.stream_decode == (name != "taeh3") and (caps.own_tiling is not None) == (name == "taeh3")


def test_every_layout_users_have(tmp_path):
    """The original's keys (= core's = LightX2V's), a wrapper's ``taehv.`` prefix, a checkpoint's ``vae.``
    prefix, .pth and .safetensors, decoder-only and encoder-only files: the same model."""
    sd = tiny_state_dict("taew2_1")
    z, x = torch.randn(1, 16, 3, 2, 2), torch.rand(1, 3, 5, 16, 16)
    base = vae.from_state_dict(sd, name_hint="taew2_1")
    want_img, want_lat = base.decode(z), base.encode(x)
    torch.save(sd, tmp_path / "taew2_1.pth")
    save_file({f"taehv.{k}": v for k, v in sd.items()}, tmp_path / "taew2_1.safetensors")
    for v in (vae.load(tmp_path / "taew2_1.pth"), vae.load(tmp_path / "taew2_1.safetensors"),
              vae.from_state_dict({f"vae.{k}": t for k, t in sd.items()}, name_hint="taew2_1")):
        assert torch.equal(v.decode(z), want_img) and torch.equal(v.encode(x), want_lat)
    dec = vae.from_state_dict({k: t for k, t in sd.items() if k.startswith("decoder.")}, name_hint="taew2_1")
    enc = vae.from_state_dict({k: t for k, t in sd.items() if k.startswith("encoder.")}, name_hint="taew2_1")
    assert torch.equal(dec.decode(z), want_img) and torch.equal(enc.encode(x), want_lat)
    assert not dec.caps.can_encode and not enc.caps.can_decode
    assert "decoder only" in dec.name and "encoder only" in enc.name


def test_halves_of_different_models_are_refused():
    sd = {**{k: v for k, v in tiny_state_dict("taew2_1").items() if k.startswith("encoder.")},
          **{k: v for k, v in tiny_state_dict("taeltx_2").items() if k.startswith("decoder.")}}
    with pytest.raises(vae.LoadError, match="two halves of different models"):
        vae.from_state_dict(sd)
    sd = tiny_state_dict("taew2_1")
    sd["decoder.22.weight"] = sd["decoder.22.weight"][:2]          # 2 pixel channels: no RGB patch
    with pytest.raises(vae.LoadError, match="not 3 \\(RGB\\) times a square"):
        vae.from_state_dict(sd)


# ---- the latent space: metadata, file name, shapes; never the dtype --------------------------------

def test_latent_space_comes_from_metadata_then_name_then_shapes():
    sd = tiny_state_dict("taew2_1")
    rule = lambda hint=None, meta=None: vae.from_state_dict(sd, name_hint=hint, metadata=meta).config
    assert rule("taehv.safetensors").space == "taehv"
    assert rule("lighttaew2_1.safetensors").space == "lighttaew2_1"    # the longest name it contains
    assert rule("models/vae_approx/taew2_1.pth").space == "taew2_1"
    assert rule("lighttae_hy1_5.pth").space == "lighttaew2_1"          # a 32-channel name on 16 channels
    assert "says lighttaehy1_5 but the weights are 16-channel" in rule("lighttae_hy1_5.pth").space_source
    assert rule("my_preview_vae.safetensors").space == "lighttaew2_1"  # core's pick for these shapes
    cfg = rule("lighttaew2_1.safetensors", {"taehv_model": "taehv"})   # metadata first
    assert cfg.space == "taehv" and cfg.scale == 0.476986 and "metadata" in cfg.space_source
    with pytest.raises(vae.LoadError, match="taehv_model='taew2_2'.*16-channel"):
        rule(meta={"taehv_model": "taew2_2"})
    # the dtype says nothing: the same weights in fp16 under the same name are the same model
    half = vae.from_state_dict({k: v.half() for k, v in sd.items()}, name_hint="lighttaew2_1").config
    assert half.space == "lighttaew2_1" and half.scale == 1.0
    assert vae.from_state_dict(tiny_state_dict("taew2_2"), name_hint="x").config.space == "lighttaew2_2"
    lh = vae.from_state_dict(tiny_state_dict("taehv1_5_super"), name_hint="lighttaehy1_5").config
    assert (lh.act, lh.value_range) == ("leaky", (-1.0, 1.0))


def _network(v: vae.VAE, z: torch.Tensor) -> torch.Tensor:
    """The bare network on ``z`` (its own latent), trimmed, 0..1 as the handle maps it."""
    m, cfg = v.model, v.config
    y = m.from_patches(taehv.run(m.decoder, z.transpose(1, 2).flatten(0, 1), z.shape[0]))
    y = y.unflatten(0, (z.shape[0], -1)).transpose(1, 2)[:, :, cfg.temporal_ratio - 1:]
    lo, hi = cfg.value_range
    return ((y - lo) / (hi - lo)).clamp(0, 1)


def test_each_space_maps_the_raw_latent_to_its_network():
    """A LATENT is the VAE's raw latent (ComfyUI's); the network of a madebyollin file reads the diffusion
    model's (HunyuanVideo: x 0.476986; Wan: (z - mean) / std), of a LightX2V file the raw one."""
    sd = tiny_state_dict("taew2_1")
    z = torch.randn(1, 16, 3, 2, 2)
    mean = torch.tensor(taehv.WAN21_MEAN).view(1, -1, 1, 1, 1)
    std = torch.tensor(taehv.WAN21_STD).view(1, -1, 1, 1, 1)
    for name, net_in in (("taehv", z * 0.476986), ("taew2_1", (z - mean) / std), ("lighttaew2_1", z)):
        v = vae.from_state_dict(sd, name_hint=name)
        assert (v.decode(z) - _network(v, net_in)).abs().max() <= 1e-6, name
    a, b = (vae.from_state_dict(sd, name_hint=n).decode(z) for n in ("taehv", "lighttaew2_1"))
    assert (a - b).abs().max() > 1e-3           # the same weights, two models: the name matters
    x = torch.rand(1, 3, 5, 16, 16)
    v = vae.from_state_dict(sd, name_hint="taew2_1")
    raw = vae.from_state_dict(sd, name_hint="lighttaew2_1").encode(x)     # the network's own latent
    assert (v.encode(x) - (raw * std + mean)).abs().max() <= 1e-5


def test_lighttaehy1_5_is_leaky_and_works_in_minus_one_to_one():
    v = vae.from_state_dict(tiny_state_dict("taew2_2"), name_hint="lighttaew2_2")
    assert all(isinstance(m, torch.nn.ReLU) for m in v.model.modules() if "ReLU" in type(m).__name__)
    sd = taehv_model(dataclasses.replace(VARIANTS["taew2_2"], latent_channels=32)).state_dict()
    v = vae.from_state_dict(sd, name_hint="lighttaehy1_5.safetensors")
    assert any(isinstance(m, torch.nn.LeakyReLU) and m.negative_slope == 0.2 for m in v.model.modules())
    z = torch.randn(1, 32, 2, 2, 2)
    assert (v.decode(z) - _network(v, z)).abs().max() <= 1e-6           # (y + 1) / 2, clamped


# ---- streaming and exact tiles equal one pass ------------------------------------------------------

@pytest.mark.parametrize("name", ["taew2_1", "taehv1_5_super", "taeltx_2"])
def test_streamed_and_exact_equal_one_pass(name):
    v = load(name)
    s, r = v.caps.spatial_ratio, v.caps.temporal_ratio
    z = torch.randn(1, v.caps.latent_channels, 5, 6, 4)
    with torch.inference_mode():
        whole = v.model.decode(v._model_input(z))
    one = ((whole.float() - v.caps.value_range[0]) / (v.caps.value_range[1] - v.caps.value_range[0])).clamp(0, 1)
    assert one.shape[2] == 1 + r * 4
    for kw in (dict(tile_frames=r), dict(tile_frames=2 * r), {},                     # 1, 2, the default 4 latents
               dict(tile=2 * s, mode="exact"), dict(tile=2 * s, mode="exact", tile_frames=r)):
        # float order only: tiles and chunks run the same convs on the same values
        assert (v.decode(z, **kw) - one).abs().max() <= 1e-5, kw
    x = torch.rand(1, 3, 1 + r, 4 * s, 6 * s)
    assert (v.encode(x, tile=2 * s, mode="exact") - v.encode(x)).abs().max() <= 1e-5


def test_a_streamed_decode_keeps_nothing_on_the_modules():
    from helpers import module_attrs
    v = load("taew2_1")
    before = module_attrs(v.model)
    v.decode(torch.randn(1, 16, 5, 2, 2), tile_frames=4)
    assert module_attrs(v.model) == before


# ---- MiniMax H3's clips -------------------------------------------------------------------------------

def test_h3_frame_rules_are_cores():
    """ComfyUI core's ratios for taeh3 (comfy/sd.py): frames (a - 2) // 5 * 17 + 5, latents
    (a - 1) // 17 * 5 + 2, one frame for one latent and back."""
    own = load("taeh3").caps.own_tiling
    for a in range(2, 40, 5):                  # the latent counts H3's encoder makes: 5n - 3
        assert own.frames(a) == (a - 2) // 5 * 17 + 5
    for a in range(2, 60):
        assert own.latents(a) == (a - 1) // 17 * 5 + 2
    assert own.frames(1) == own.latents(1) == 1
    assert own.warmup == 8 == taehv.math.ceil(VARIANTS["taeh3"].memory_reach())


def test_h3_decode_units_equal_one_pass():
    """The reference decodes the whole latent in one pass and keeps frames by H3's rule; a unit here
    starts ``warmup`` latent frames early, which covers the decoder's memory (with none it is not
    exact). Units of 3 latent frames, so unit starts do not fall on the frames the rule drops."""
    v = load("taeh3")
    z = torch.randn(1, 24, 12, 2, 2)
    with torch.inference_mode():
        raw = v.model.decode(v._model_input(z)).clamp(0, 1)          # untrimmed, every decoder frame
    own = v.caps.own_tiling
    n = own.frames(12)
    keep = [f for f in range(raw.shape[2]) if own._slot(f, n) >= 0]
    want = raw[:, :, keep]
    assert want.shape[2] == n == 39
    for warmup, exact in ((own.warmup, True), (0, False)):
        plan = dataclasses.replace(own, unit=3, warmup=warmup).plan("decode", tuple(z.shape))
        with torch.inference_mode():
            got = defined.run(v.decode_fn(), z, plan, torch.device("cpu")).clamp(0, 1)
        err = (got - want).abs().max()
        assert (err <= 1e-5) if exact else (err > 1e-4), (warmup, err)
    assert (v.decode(z) - want).abs().max() <= 1e-5


def test_h3_encodes_clips_apart():
    v = load("taeh3")
    x = torch.rand(1, 3, 18, 32, 32)
    z = v.encode(x)
    assert z.shape[2] == 7
    clip = v.encode(x[:, :, :17])                          # the first clip alone: its 2 kept latents
    assert (z[:, :, :2] - clip).abs().max() <= 1e-5
    assert v.encode(x[:, :, :1]).shape[2] == 1


# ---- parity with the original taehv.py (madebyollin/taehv) ---------------------------------------------

def _reference():
    return original_module("TAEHV_REFERENCE", "madebyollin/taehv taehv.py (62f7591 or later: taeh3)")


def reference_file(ref, name: str, folder, seed: int = 1):
    """The original's model for ``name`` (it picks the variant from the file name) at the published
    config, random weights (scaled by fan-in; the head so frames are mostly inside 0..1), saved as
    ``name``.pth, and loaded back by the original's own loader."""
    path = str(folder / f"{name}.pth")
    with mock.patch.object(ref.torch, "load", lambda *a, **k: {}), \
            mock.patch.object(ref.TAEHV, "patch_tgrow_layers", lambda self, sd: self.state_dict()):
        blank = ref.TAEHV(checkpoint_path=path)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in blank.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p[0].numel() if p.dim() > 1 else 10) ** 0.5)
        blank.decoder[-1].weight.mul_(0.4)
        blank.decoder[-1].bias.add_(0.5)
    torch.save(blank.state_dict(), path)
    return ref.TAEHV(checkpoint_path=path).eval(), path


@pytest.mark.parametrize("name", ["taehv", "taew2_1", "taehv1_5_super", "taew2_2", "taeltx_2", "taeh3"])
def test_matches_the_original_at_the_published_config(tmp_path, name):
    ref = _reference()
    tae, path = reference_file(ref, name, tmp_path)
    ours = vae.load(path)
    cfg = ours.config
    assert ours.caps.latent_channels == tae.latent_channels and cfg.patch == tae.patch_size
    scale = torch.as_tensor(cfg.scale).reshape(1, -1, 1, 1, 1)
    shift = torch.as_tensor(cfg.shift).reshape(1, -1, 1, 1, 1)
    g = torch.Generator().manual_seed(2)
    t = 12 if name == "taeh3" else 3
    net_in = torch.randn(1, t, tae.latent_channels, 2, 2, generator=g)      # the original's NTCHW
    z = net_in.transpose(1, 2) / scale + shift                              # the raw LATENT
    frames = 18 if name == "taeh3" else 1 + 2 * ours.caps.temporal_ratio
    x = torch.rand(1, frames, 3, 2 * cfg.spatial_ratio, 2 * cfg.spatial_ratio, generator=g)
    with torch.no_grad():
        want_img = tae.decode_video(net_in, parallel=True, show_progress_bar=False).transpose(1, 2)
        want_seq = tae.decode_video(net_in, parallel=False, show_progress_bar=False).transpose(1, 2)
        want_lat = tae.encode_video(x, parallel=True, show_progress_bar=False).transpose(1, 2) / scale + shift
    # float order only (the original's own two modes differ by as much)
    print(f"{name}: the original parallel vs sequential {(want_img - want_seq).abs().max():.2e}")
    for kw in ({}, dict(tile_frames=ours.caps.temporal_ratio), dict(tile=cfg.spatial_ratio, mode="exact")):
        assert (ours.decode(z, **kw) - want_img).abs().max() <= 1e-5, kw
    got_lat = ours.encode(x.transpose(1, 2))
    assert (got_lat - want_lat).abs().max() <= 1e-5 * max(1.0, float(want_lat.abs().max()))


# ---- parity with ComfyUI core's class -------------------------------------------------------------------

@pytest.mark.skipif(not (os.environ.get("COMFYUI_DIR") and os.environ.get("COMFYUI_PYTHON")),
                    reason="set COMFYUI_DIR and COMFYUI_PYTHON to compare with ComfyUI core's TAEHV")
def test_matches_comfyui_core(tmp_path):
    parity = core_parity_rows("taehv", tmp_path)
    assert all(r["max"] <= 1e-4 for r in parity), [r for r in parity if r["max"] > 1e-4]