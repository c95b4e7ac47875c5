"""The nodes as ComfyUI calls them: definitions, VAE Load, Tiled Encode/Decode, both socket
directions (core nodes get our VAE; our nodes get a core VAE), and errors naming the node."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from helpers import diffusers_kl, diffusers_tiny


@pytest.fixture
def models(tmp_path, monkeypatch):
    """A models folder like ComfyUI's: an SD-shape (tiny) KL VAE in vae/, a TAESD pair in vae_approx/."""
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae_approx").mkdir()
    kl = diffusers_kl()
    save_file({k: v.contiguous() for k, v in kl.state_dict().items()}, str(tmp_path / "vae" / "tiny_kl.safetensors"))
    import vae
    tiny = vae.from_state_dict(diffusers_tiny().state_dict(), name_hint="taesd").state_dict()
    for part in ("encoder", "decoder"):
        pre = f"taesd_{part}."
        torch.save({k[len(pre):]: v for k, v in tiny.items() if k.startswith(pre)},
                   tmp_path / "vae_approx" / f"taesd_{part}.pth")
    monkeypatch.setenv("VAEKIT_MODEL_DIRS", str(tmp_path))
    return tmp_path


def test_definitions(pack):
    for node_id, cls in pack.NODE_CLASS_MAPPINGS.items():
        assert node_id.startswith("VAEKit") and cls.CATEGORY == "VAEKit"
        assert pack.NODE_DISPLAY_NAME_MAPPINGS[node_id] == cls.DISPLAY_NAME
        for name, decl in cls.INPUT_TYPES()["required"].items():
            assert decl[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
        assert callable(getattr(cls, cls.FUNCTION))


def test_load_lists_pairs_once_and_loads(pack, models):
    from vaekit.nodes._comfy import vae_choices
    choices = vae_choices()
    assert choices == ["tiny_kl.safetensors", "taesd"]
    assert pack.NODE_CLASS_MAPPINGS["VAEKitLoad"].INPUT_TYPES()["required"]["vae_name"][0] == choices
    load = pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]()
    (kl,) = load.load("tiny_kl.safetensors", "fp32", "cpu")
    (taesd,) = load.load("taesd", "fp16", "cpu")
    assert kl.latent_channels == 4 and kl.handle.spec.id == "kl"
    assert taesd.handle.config.latent_space == "taesd" and taesd.handle.dtype == torch.float16
    assert taesd.handle.caps.can_encode and taesd.handle.caps.can_decode


def test_tiled_nodes_roundtrip_shapes_and_untiled_equivalence(pack, models):
    (v,) = pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]().load("tiny_kl.safetensors", "fp32", "cpu")
    enc, dec = pack.NODE_CLASS_MAPPINGS["VAEKitTiledEncode"](), pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]()
    image = torch.rand(2, 96, 160, 3)
    (latent,) = enc.encode(image, v, tile_size=512, overlap=64)
    assert latent["samples"].shape == (2, 4, 48, 80)
    (out,) = dec.decode(latent, v, tile_size=512, overlap=64)
    assert out.shape == (2, 96, 160, 3) and out.dtype == torch.float32 and 0 <= out.min() and out.max() <= 1
    # tile >= image: one untiled pass, identical to the library's untiled decode
    assert torch.equal(out, v.handle.decode(latent["samples"]).movedim(1, -1))
    (tiled,) = dec.decode(latent, v, tile_size=64, overlap=32)
    assert tiled.shape == out.shape and not torch.equal(tiled, out)


def test_errors_name_the_node_the_input_and_the_fix(pack, models):
    (v,) = pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]().load("tiny_kl.safetensors", "fp32", "cpu")
    dec, enc = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"](), pack.NODE_CLASS_MAPPINGS["VAEKitTiledEncode"]()
    with pytest.raises(ValueError, match=r"^Tiled Decode \(VAEKit\): input 'samples': this latent has 16 channels.*Fix:"):
        dec.decode({"samples": torch.randn(1, 16, 8, 8)}, v)
    with pytest.raises(ValueError, match=r"^Tiled Encode \(VAEKit\): input 'pixels': the image is 33x32.*Fix: crop"):
        enc.encode(torch.rand(1, 32, 33, 3), v)
    nan = torch.randn(1, 4, 8, 8)
    nan[0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"^Tiled Decode \(VAEKit\): input 'samples': the latent contains 1 NaN/Inf"):
        dec.decode({"samples": nan}, v)
    with pytest.raises(ValueError, match=r"^VAE Load \(VAEKit\): input 'vae_name': VAE 'missing.safetensors' not found"):
        pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]().load("missing.safetensors")
    (models / "vae" / "broken.safetensors").write_bytes((models / "vae" / "tiny_kl.safetensors").read_bytes()[:5000])
    with pytest.raises(ValueError, match=r"^VAE Load \(VAEKit\): input 'vae_name': 'broken.safetensors' .*download it again"):
        pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]().load("broken.safetensors")


def test_core_style_calls_on_our_vae(pack, models):
    """What core's VAE Decode / VAE Decode (Tiled) / VAE Encode call on a VAE socket."""
    from vaekit.nodes.headless import VAEDecode, VAEDecodeTiled, VAEEncode
    (v,) = pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]().load("tiny_kl.safetensors", "fp32", "cpu")
    assert v.spacial_compression_decode() == v.spacial_compression_encode() == v.downscale_ratio == 2
    assert v.temporal_compression_decode() is None and v.latent_channels == 4
    (lat,) = VAEEncode().encode(torch.rand(1, 33, 35, 3), v)       # core crops to multiples of the ratio
    assert lat["samples"].shape == (1, 4, 16, 17)
    (img,) = VAEDecode().decode(lat, v)
    assert img.shape == (1, 32, 34, 3)
    (tiled,) = VAEDecodeTiled().decode(lat, v, tile_size=64, overlap=32)   # latent units under the hood
    assert tiled.shape == img.shape
    assert set(v.get_sd()) == set(v.first_stage_model.state_dict())


class FakeCoreVAE:
    """Duck-typed like comfy.sd.VAE: get_sd() and first_stage_model, decode() -> [B,H,W,C]."""

    def __init__(self, sd, decode_fn=None):
        self._sd, self.first_stage_model, self._decode = sd, torch.nn.Identity(), decode_fn
        self.output_channels, self.latent_channels = 3, 4

    def get_sd(self):
        return self._sd

    def spacial_compression_decode(self):
        return 8

    def decode(self, z):
        self.calls = getattr(self, "calls", 0) + 1
        return self._decode(z).movedim(1, -1)


def test_our_nodes_accept_a_core_vae(pack, models):
    import vae
    kl = vae.load(models / "vae" / "tiny_kl.safetensors")
    core = FakeCoreVAE(kl.state_dict())       # core keeps the LDM layout
    z = torch.randn(1, 4, 8, 8)
    dec = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]()
    (out,) = dec.decode({"samples": z}, core, tile_size=512, overlap=64)
    assert torch.equal(out, kl.decode(z).movedim(1, -1))


def test_unknown_core_vae_is_tiled_through_its_own_decode(pack):
    pointwise = lambda z: F.interpolate(z[:, :3], scale_factor=8, mode="nearest").sigmoid()
    core = FakeCoreVAE({"some.unknown.weight": torch.zeros(1)}, pointwise)
    z = torch.randn(1, 4, 20, 20)
    dec = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]()
    (out,) = dec.decode({"samples": z}, core, tile_size=64, overlap=16)
    assert core.calls > 1
    assert torch.allclose(out, pointwise(z).movedim(1, -1), atol=1e-6)


def test_exact_mode_through_the_nodes(pack, models):
    (v,) = pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]().load("tiny_kl.safetensors", "fp32", "cpu")
    enc, dec = pack.NODE_CLASS_MAPPINGS["VAEKitTiledEncode"](), pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]()
    for cls in (enc, dec):
        assert type(cls).INPUT_TYPES()["optional"]["mode"][0] == ["exact", "fast"]
    image = torch.rand(1, 96, 128, 3)
    (latent,) = enc.encode(image, v, tile_size=64, overlap=32, mode="exact")
    assert (latent["samples"] - v.handle.encode(image.movedim(-1, 1))).abs().max() <= 1e-4
    (out,) = dec.decode(latent, v, tile_size=64, overlap=32, mode="exact")
    assert (out - v.handle.decode(latent["samples"]).movedim(1, -1)).abs().max() <= 1e-4


def test_exact_mode_on_a_core_vae_we_cannot_convert_says_so(pack, caplog):
    """Exact is the default: a core VAE we tile through its own calls gets blended tiles, and the log
    says so."""
    core = FakeCoreVAE({"some.unknown.weight": torch.zeros(1)},
                       lambda z: z[:, :3].repeat_interleave(8, -1).repeat_interleave(8, -2).sigmoid())
    dec = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]()
    z = {"samples": torch.randn(1, 4, 20, 20)}
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        (out,) = dec.decode(z, core, tile_size=64, overlap=16, mode="exact")
    assert "exact tiles need a VAE VAEKit implements" in caplog.text and "blended (fast) tiles" in caplog.text
    (fast,) = dec.decode(z, core, tile_size=64, overlap=16, mode="fast")
    assert torch.equal(out, fast)
    with pytest.raises(Exception, match=r"input 'mode': 'best' is not one of its choices"):
        dec.decode(z, core, tile_size=64, overlap=16, mode="best")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_choice_without_cuda_is_a_clear_error(pack, models):
    with pytest.raises(ValueError, match=r"^VAE Load \(VAEKit\): input 'device': CUDA is not available.*Fix"):
        pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]().load("tiny_kl.safetensors", "auto", "cuda")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_weights_decode_close_to_fp32(pack, models, dtype):
    load = pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]()
    dec = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]()
    (ref,) = load.load("taesd", "fp32", "cpu")
    (half,) = load.load("taesd", dtype, "cpu")
    z = {"samples": torch.randn(1, 4, 8, 8)}
    (a,), (b,) = dec.decode(z, ref), dec.decode(z, half)
    assert b.dtype == torch.float32           # IMAGE is always float32, whatever the VAE runs in
    err = (a - b).abs().max()
    print(f"{dtype} vs fp32 decode: max abs {err:.4f}")
    assert err < 0.05
