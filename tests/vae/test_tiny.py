"""TAESD family: parity with diffusers' AutoencoderTiny, every key layout, ComfyUI's latent
conventions, the real TAEF2 weights on a real photograph, and taeqi2_1 (Qwen-Image 2.1: 16x, RGBA) in every
layout, checked against the original taesd.py when a copy is given (TAESD_REFERENCE)."""
from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

import vae
from helpers import ROOT, diffusers_tiny, original_module, reference_state_dicts
from vae.files import latents
from vae.archs.tiny import LATENT_SPACES


def test_decode_encode_match_diffusers():
    ref = diffusers_tiny(latent_channels=4)
    ours = vae.from_state_dict(ref.state_dict(), name_hint="no-known-name")
    # no name: 4 channels default to SD1's latent space; compare the bare networks
    z = torch.randn(2, 4, 6, 5)
    x = torch.rand(2, 3, 48, 40)
    with torch.no_grad():
        ref_img = ref.decode(z).sample          # [-1, 1]
        ref_lat = ref.encode(x * 2 - 1).latents
    net_dec = ours.model.taesd_decoder(z)      # [0, 1]
    assert (net_dec * 2 - 1 - ref_img).abs().max() <= 1e-5
    assert (ours.model.taesd_encoder(x) - ref_lat).abs().max() <= 1e-5


def test_handle_matches_diffusers_with_unit_scale():
    ref = diffusers_tiny(latent_channels=16)
    sd = {**ref.state_dict()}
    ours = vae.from_state_dict(sd, name_hint="taef1")
    assert ours.config.latent_space == "taef1"
    scale, shift, *_ = LATENT_SPACES["taef1"]
    z = torch.randn(1, 16, 4, 4)
    with torch.no_grad():   # ComfyUI: decoder((z - shift) * scale), then [-1,1] -> [0,1]
        ref_img = ((ref.decode((z - shift) * scale).sample + 1) / 2).clamp(0, 1)
    assert (ours.decode(z) - ref_img).abs().max() <= 1e-5


def _layouts(ref_sd: dict) -> dict:
    comfy = vae.from_state_dict(ref_sd, name_hint="taesdxl").state_dict()   # canonical = ComfyUI's layout
    enc = {k[len("taesd_encoder."):]: v for k, v in comfy.items() if k.startswith("taesd_encoder.")}
    dec = {k[len("taesd_decoder."):]: v for k, v in comfy.items() if k.startswith("taesd_decoder.")}
    return {"diffusers": ref_sd, "comfyui": comfy, "pair": (enc, dec)}


def test_every_layout_gives_identical_output(tmp_path):
    ref = diffusers_tiny(latent_channels=4)
    outs = {}
    x = torch.rand(1, 3, 24, 24)
    for name, sd in _layouts(ref.state_dict()).items():
        if name == "pair":   # the original two files, loaded by either file or the shared stem
            save_file(sd[0], str(tmp_path / "taesdxl_encoder.safetensors"))
            torch.save(sd[1], tmp_path / "taesdxl_decoder.pth")
            paths = [tmp_path / "taesdxl_encoder.safetensors", tmp_path / "taesdxl_decoder.pth", tmp_path / "taesdxl"]
        else:
            paths = [tmp_path / f"{name}-taesdxl.safetensors"]
            save_file({k: v.contiguous() for k, v in sd.items()}, str(paths[0]))
        for p in paths:
            v = vae.load(p)
            assert v.spec.id == "tiny" and v.config.latent_space == "taesdxl", (name, p)
            assert v.caps.can_encode and v.caps.can_decode, (name, p)
            outs[f"{name}:{p.name}"] = (v.decode(torch.ones(1, 4, 3, 3) * 0.3), v.encode(x))
    first_dec, first_enc = outs.popitem()[1]
    for name, (dec, enc) in outs.items():
        assert torch.equal(dec, first_dec), name
        assert torch.equal(enc, first_enc), name


@pytest.mark.parametrize("hint,expected", [("taesd_decoder.pth", "taesd"), ("taesdxl_decoder.pth", "taesdxl"),
                                           ("taesd3_decoder.pth", "taesd3"), ("taef1_decoder.pth", "taef1")])
def test_latent_space_from_file_name(hint, expected):
    ch = 16 if expected in ("taesd3", "taef1") else 4
    v = vae.from_state_dict(diffusers_tiny(latent_channels=ch).state_dict(), name_hint=hint)
    assert v.config.latent_space == expected
    assert (float(v.model.vae_scale), float(v.model.vae_shift)) == pytest.approx(LATENT_SPACES[expected][:2])


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return 10 * math.log10(1.0 / float((a - b).square().mean()))


def photo() -> torch.Tensor:
    from vae.files.imageio import read_image
    return read_image(ROOT / "vae" / "demo" / "vaekit_sample.png").movedim(-1, 0)[None]


def test_real_taef2_weights_reconstruct_a_photograph(shared_data):
    v = vae.load(shared_data / "taef2_encoder.pth")      # finds the decoder beside it
    assert v.config.latent_space == "taef2" and v.config.midblock_gn and v.caps.latent_channels == 32
    x = photo()
    z = v.encode(x)
    assert z.shape == (1, 128, x.shape[2] // 16, x.shape[3] // 16)    # Flux.2 LATENT: packed 2x2
    y = v.decode(z)
    score = psnr(y, x)
    print(f"TAEF2 round trip PSNR {score:.2f} dB")
    # measured 31.19 dB on this photo (NASA's astronaut, 512x512), bit-identical to the upstream
    # reference implementation on the same weights; a 33 dB target is above what TAEF2 itself
    # reaches on detailed photos (29.6-32.8 dB on scikit-image's photographs)
    assert score >= 30.5
    # ComfyUI accepts the unpacked 32-channel layout too; both decode identically
    assert torch.equal(v.decode(latents.unpack(z, 2)), y)


# ---- taeqi2_1: Qwen-Image 2.1's tiny autoencoder (f16: 16x, RGBA, 2x2 patches) -----------------

TAEQI = dict(latent_channels=64, image_channels=4, patch=2, midblock_gn=False,
             encoder_stages=((8, 1), (8, 1), (16, 1), (16, 1)), decoder_stages=((16, 1), (16, 1), (8, 1), (8, 1)))


def _jitter(module: torch.nn.Module, seed: int = 3) -> None:
    """Every weight and bias random, scaled by fan-in so that activations stay O(1) through the
    stack (neither saturated nor vanishing pixels: the comparisons then say something)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            fan_in = p[0].numel() if p.dim() > 1 else 10
            p.copy_(torch.randn(p.shape, generator=g) * (1.2 / fan_in ** 0.5))


def _taeqi_model():
    from vae.archs.tiny import TinyAutoencoder, TinyConfig
    space = LATENT_SPACES["taeqi2_1"]
    model = TinyAutoencoder(TinyConfig(**TAEQI, scale=space.scale, shift=space.shift))
    _jitter(model)
    return model


def _halves(model) -> tuple[dict, dict]:
    """The original pair: bare nn.Sequential indices, fp16 as madebyollin publishes taeqi2_1."""
    sd = model.state_dict()
    cut = lambda prefix: {k[len(prefix):]: v.half() for k, v in sd.items() if k.startswith(prefix)}
    return cut("taesd_encoder."), cut("taesd_decoder.")


def _taeqi_layouts(tmp_path) -> dict:
    """Every layout a user has, written to disk under the names they come with."""
    enc, dec = _halves(_taeqi_model())
    torch.save(enc, tmp_path / "taeqi2_1_encoder.pth")
    torch.save(dec, tmp_path / "taeqi2_1_decoder.pth")
    enc_only, dec_only = tmp_path / "enc", tmp_path / "dec"     # each half without the other beside it
    enc_only.mkdir(), dec_only.mkdir()
    torch.save(enc, enc_only / "taeqi2_1_encoder.pth")
    save_file({k: v.contiguous() for k, v in dec.items()}, str(dec_only / "taeqi2_1_decoder.safetensors"))
    # the single file of the Hugging Face repo: diffusers' names (the decoder without its clamp at 0)
    diffusers = {f"encoder.layers.{k}": v for k, v in enc.items()}
    diffusers.update({f"decoder.layers.{int(k.split('.')[0]) - 1}.{k.split('.', 1)[1]}": v for k, v in dec.items()})
    save_file(diffusers, str(tmp_path / "taeqi2_1.safetensors"))
    pair = vae.load(tmp_path / "taeqi2_1_encoder.pth")
    save_file({k: v.contiguous() for k, v in pair.model.state_dict().items()}, str(tmp_path / "combined.safetensors"))
    return {"pair by encoder": tmp_path / "taeqi2_1_encoder.pth", "pair by decoder": tmp_path / "taeqi2_1_decoder.pth",
            "pair by stem": tmp_path / "taeqi2_1", "diffusers single file": tmp_path / "taeqi2_1.safetensors",
            "ours / ComfyUI combined": tmp_path / "combined.safetensors",
            "encoder alone": enc_only / "taeqi2_1_encoder.pth", "decoder alone": dec_only / "taeqi2_1_decoder.safetensors"}


def test_taeqi_every_layout_gives_identical_output(tmp_path):
    z = torch.randn(1, 64, 3, 2) * 3
    x = torch.rand(1, 4, 48, 32)
    dec, enc = {}, {}
    for name, path in _taeqi_layouts(tmp_path).items():
        v = vae.load(path, dtype=torch.float32)
        assert v.spec.id == "tiny" and v.config.latent_space == "taeqi2_1" and v.config.patch == 2, name
        assert (v.caps.spatial_ratio, v.caps.image_channels, v.caps.latent_channels) == (16, 4, 64), name
        assert (v.caps.can_encode, v.caps.can_decode) == (name != "decoder alone", name != "encoder alone"), name
        assert "taeqi2_1" in v.name and "16x" in v.name and "RGBA" in v.name, v.name
        if v.caps.can_decode:
            dec[name] = v.decode(z)
        if v.caps.can_encode:
            enc[name] = v.encode(x)
    assert len(dec) == 6 and len(enc) == 6
    first = next(iter(dec.values()))
    assert first.shape == (1, 4, 48, 32)
    assert all(torch.equal(d, first) for d in dec.values()), {k: float((d - first).abs().max()) for k, d in dec.items()}
    first = next(iter(enc.values()))
    assert first.shape == (1, 64, 3, 2)
    assert all(torch.equal(e, first) for e in enc.values())


def test_taeqi_latent_is_qwen_image_21s_raw_latent():
    """The network works in Qwen-Image 2.1's normalised latent ((z - mean) / std per channel, as its
    diffusion model and ComfyUI's previews feed it); the LATENT is the raw one its full VAE makes."""
    from vae.archs.tiny import QWEN21_MEAN, QWEN21_STD
    model = _taeqi_model()
    bare = {k: t for k, t in model.state_dict().items() if not k.startswith("vae_")}
    v = vae.from_state_dict(bare)       # no name, no stated scaling: 64 channels + f16 is taeqi2_1
    assert v.config.latent_space == "taeqi2_1"
    mean, std = torch.tensor(QWEN21_MEAN).view(1, -1, 1, 1), torch.tensor(QWEN21_STD).view(1, -1, 1, 1)
    z = torch.randn(2, 64, 2, 3) * std + mean
    x = torch.rand(2, 4, 32, 48)
    with torch.no_grad():
        want_img = model.taesd_decoder((z - mean) / std).clamp(0, 1)
        want_lat = model.taesd_encoder(x) * std + mean
    assert (v.decode(z) - want_img).abs().max() <= 1e-5
    assert (v.encode(x) - want_lat).abs().max() <= 1e-4
    # RGB in: an opaque alpha is added (as ComfyUI pads Qwen-Image 2.1's input, and taesd.py reads RGB)
    rgb = x[:, :3]
    assert torch.equal(v.encode(rgb), v.encode(torch.cat([rgb, torch.ones_like(rgb[:, :1])], 1)))
    # the statistics travel with the weights: our file holds them per channel and reads back the same
    again = vae.from_state_dict(v.model.state_dict(), name_hint="whatever")
    assert again.model.vae_scale.shape == (64,) and torch.equal(again.decode(z), v.decode(z))


def test_taeqi_detection_both_ways(tmp_path):
    from vae import registry
    from vae.archs import tiny_layout
    from vae.loading import read_vae_files, pair_paths
    for name, path in _taeqi_layouts(tmp_path).items():
        sd = read_vae_files(pair_paths(path))
        assert [s.id for s in registry.REGISTRY if s.detect(sd)] == ["tiny"], name
    for family, sd in reference_state_dicts().items():
        if family != "tiny":
            assert not tiny_layout.detect(sd), family
    # a plain 64-channel TAESD (no patches) is no Qwen-Image 2.1 model: no latent space is guessed
    plain = vae.from_state_dict(diffusers_tiny(latent_channels=64).state_dict(), name_hint="taeqi2_1_decoder.pth")
    assert plain.config.latent_space == "" and plain.caps.spatial_ratio == 8


def test_taeqi_mismatched_halves_are_refused(tmp_path):
    enc, _ = _halves(_taeqi_model())
    dec = {k[len("taesd_decoder."):]: v for k, v in
           vae.from_state_dict(diffusers_tiny(latent_channels=64).state_dict()).model.state_dict().items()
           if k.startswith("taesd_decoder.")}
    torch.save(enc, tmp_path / "mix_encoder.pth")
    torch.save(dec, tmp_path / "mix_decoder.pth")
    with pytest.raises(vae.LoadError, match="two halves of different models"):
        vae.load(tmp_path / "mix")


@pytest.mark.parametrize("op", ["decode", "encode"])
def test_taeqi_exact_tiles_equal_untiled(op):
    v = vae.from_state_dict(_taeqi_model().state_dict())
    if op == "decode":
        z = torch.randn(1, 64, 7, 6) * 3
        whole, tiled = v.decode(z), v.decode(z, tile=48, overlap=16, mode="exact")
        fast = v.decode(z, tile=48, overlap=16)
    else:
        x = torch.rand(1, 4, 112, 96)
        whole, tiled = v.encode(x), v.encode(x, tile=48, overlap=16, mode="exact")
        fast = v.encode(x, tile=48, overlap=16)
    assert tiled.shape == whole.shape == fast.shape
    assert (tiled - whole).abs().max() <= 1e-5
    assert (fast - whole).abs().max() > 1e-4        # the tiles are real: fast tiles differ at the seams


def test_taeqi_half_precision_follows_fp32():
    """The published weights are fp16: computing in fp16 (NaN guard on) stays near fp32."""
    sd = _taeqi_model().state_dict()
    v32, v16 = vae.from_state_dict(sd), vae.from_state_dict(sd, dtype=torch.float16)
    z, x = torch.randn(1, 64, 3, 4) * 3, torch.rand(1, 3, 48, 64)
    assert (v16.decode(z) - v32.decode(z)).abs().max() <= 2e-2
    lat = v32.encode(x)
    assert (v16.encode(x) - lat).abs().max() <= 2e-2 * lat.abs().max()


# ---- parity with the original taesd.py (madebyollin/taesd at 401ce45e) on the same files -----------

def _reference():
    return original_module("TAESD_REFERENCE", "madebyollin/taesd taesd.py (401ce45e or later)")


def test_taeqi_matches_the_original_at_the_published_config(tmp_path):
    ref = _reference()
    from vae.archs.tiny import QWEN21_MEAN, QWEN21_STD
    torch.manual_seed(0)
    enc, dec = ref.F16Encoder(64, 4), ref.F16Decoder(64, 4)
    _jitter(enc, 1), _jitter(dec, 2)
    torch.save(enc.state_dict(), tmp_path / "taeqi2_1_encoder.pth")
    torch.save(dec.state_dict(), tmp_path / "taeqi2_1_decoder.pth")
    # the original's own loader on the same files (it picks the variant from the file name)
    tae = ref.TAESD(tmp_path / "taeqi2_1_encoder.pth", tmp_path / "taeqi2_1_decoder.pth").eval()
    assert (tae.latent_channels, tae.image_channels) == (64, 4)
    ours = vae.load(tmp_path / "taeqi2_1_decoder.pth")
    assert ours.config.encoder_stages == ((64, 1), (64, 3), (128, 3), (256, 3))
    assert ours.config.decoder_stages == ((256, 3), (128, 3), (64, 3), (64, 1))
    mean, std = torch.tensor(QWEN21_MEAN).view(1, -1, 1, 1), torch.tensor(QWEN21_STD).view(1, -1, 1, 1)
    g = torch.Generator().manual_seed(5)
    z = torch.randn(2, 64, 5, 4, generator=g) * std + mean       # raw Qwen-Image 2.1 LATENT
    x = torch.rand(2, 4, 80, 64, generator=g)
    with torch.no_grad():
        want_img = tae.decoder((z - mean) / std).clamp(0, 1)
        want_lat = tae.encoder(x) * std + mean
    got_img, got_lat = ours.decode(z), ours.encode(x)
    err_img = float((got_img - want_img).abs().max())
    err_lat = float((got_lat - want_lat).abs().max() / want_lat.abs().max())
    print(f"taeqi2_1 vs taesd.py: decode max abs {err_img:.2e} (0..1 pixels, spread {float(want_img.std()):.3f}), "
          f"encode max abs / max |latent| {err_lat:.2e}")
    assert float(want_img.std()) > 0.05           # not a saturated image: the comparison says something
    assert err_img <= 1e-4 and err_lat <= 1e-4
