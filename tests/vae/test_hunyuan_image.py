"""HunyuanImage 2.1's 32x VAE and HunyuanImage 3.0's VAE (one family, the conv rank tells the variant):
parity with diffusers' AutoencoderKLHunyuanImage (2.1) on random weights, and with Tencent's originals
when a copy is named (HUNYUAN_IMAGE21_REFERENCE: ``hyimage/models/vae/hunyuanimage_vae.py``;
HUNYUAN_IMAGE3_REFERENCE: ``hunyuan_image_3/autoencoder_kl_3d.py``; both import diffusers and einops),
every key layout, the config read from the weights, detection across families (HunyuanVideo 1.5 files,
the 2.1 refiner VAE among them, stay HunyuanVideo 1.5), the LATENTs core gives (2.1 ``[B, 64, h, w]``, 3.0
``[B, 32, 1, h, w]``), exact tiles, the budget. Against ComfyUI core: bench/comfyui_checks/
bench/comfyui_checks/compare_core.py --family hunyuan_image (run here when COMFYUI_DIR and COMFYUI_PYTHON name a ComfyUI)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import vae
from helpers import (ROOT, HUNYUAN_IMAGE3, assert_layouts_agree, diffusers_hunyuan_image21,
                     hunyuan_image3_file, reference_state_dicts)
from vae import registry
from vae.archs import hunyuan_image as hi
from vae.archs import hunyuan_image_layout as layout
from vae.errors import InputError, LoadError

pytestmark = pytest.mark.usefixtures("one_thread")
R = hi.Resample


@pytest.fixture(scope="module")
def v21():
    ref = diffusers_hunyuan_image21()
    return ref, vae.from_state_dict(ref.state_dict())


@pytest.fixture(scope="module")
def v3():
    return vae.from_state_dict(hunyuan_image3_file())


def pixels(y: torch.Tensor) -> torch.Tensor:
    return (y.clamp(-1, 1) + 1) / 2


# ---- parity -------------------------------------------------------------------------------------

def test_21_decode_matches_diffusers(v21):
    ref, ours = v21
    z = torch.randn(2, 64, 2, 3)
    with torch.no_grad():
        want = ref.decode(z).sample
        assert (ours.model.decode(z) - want).abs().max() <= 1e-5
    got = ours.decode(z)
    assert got.shape == want.shape == (2, 3, 64, 96)
    assert (got - pixels(want)).abs().max() <= 1e-5
    assert torch.equal(ours.decode(z.unsqueeze(2)), got)        # a one-frame 5-D LATENT: the same images


def test_21_encode_matches_diffusers(v21):
    ref, ours = v21
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        want = ref.encode(x * 2 - 1).latent_dist.mode()
    got = ours.encode(x)
    assert got.shape == want.shape == (2, 64, 2, 3)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def _original(env: str):
    """Tencent's module from the copy ``env`` names (it imports diffusers and einops), or skip."""
    path = os.environ.get(env)
    if not path or not os.path.isfile(path):
        pytest.skip(f"set {env} to a copy of Tencent's file (see the module doc)")
    if importlib.util.find_spec("einops") is None:
        pytest.skip("Tencent's VAE code imports einops")
    spec = importlib.util.spec_from_file_location(f"_{env.lower()}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_21_matches_the_original(v21):
    """Tencent's ``HunyuanVAE2D`` on the same weights in its own names (= ComfyUI's)."""
    mod = _original("HUNYUAN_IMAGE21_REFERENCE")
    _, ours = v21
    cfg = ours.config
    ref = mod.HunyuanVAE2D(in_channels=3, out_channels=3, latent_channels=64, block_out_channels=cfg.widths,
                           layers_per_block=cfg.layers_per_block, ffactor_spatial=32, sample_size=384, sample_tsize=1)
    ref.load_state_dict(layout.to_original(ours.state_dict()))
    z, x = torch.randn(1, 64, 3, 2), torch.rand(2, 3, 64, 32)
    with torch.no_grad():     # fp32 rounding through 6 levels of 3x3 convs: a few 1e-6 apart
        assert (ours.decode(z) - pixels(ref.decode(z).sample)).abs().max() <= 5e-5
        want = ref.encode(x * 2 - 1).latent_dist.mode()
    assert (ours.encode(x) - want).abs().max() <= 5e-5 * want.abs().max()


def test_3_matches_the_original(v3):
    """Tencent's ``AutoencoderKLConv3D`` on the same file: an image is one frame repeated to four, the
    last decoded frame kept (its ``encode``/``decode`` of one-frame clips)."""
    mod = _original("HUNYUAN_IMAGE3_REFERENCE")
    ref = mod.AutoencoderKLConv3D(in_channels=3, out_channels=3, ffactor_spatial=16, ffactor_temporal=4,
                                  sample_size=256, sample_tsize=64, **HUNYUAN_IMAGE3)
    ref.load_state_dict(hunyuan_image3_file())
    ref.eval()
    z, x = torch.randn(2, 32, 1, 3, 2), torch.rand(2, 3, 48, 32)
    with torch.no_grad():
        want = ref.decode(z).sample
        assert want.shape == (2, 3, 1, 48, 32)
        assert (v3.decode(z) - pixels(want[:, :, 0])).abs().max() <= 1e-5
        want = ref.encode(x.unsqueeze(2) * 2 - 1).latent_dist.mode()
    got = v3.encode(x)
    assert got.shape == want.shape == (2, 32, 1, 3, 2)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


# ---- what the weights tell ----------------------------------------------------------------------

def test_config_and_capabilities(v21, v3):
    _, a = v21
    assert a.config == hi.HunyuanImageConfig(
        widths=(32, 32, 64, 64, 128, 128), layers_per_block=1, latent_channels=64, dims=2,
        down=(R(32, False), R(64, False), R(64, False), R(128, False), R(128, False), None),
        up=(None, R(32, False), R(32, False), R(64, False), R(64, False), R(128, False)))
    assert a.name == "HunyuanImage 2.1 VAE (64 latent channels)"
    assert (a.caps.latent_channels, a.caps.spatial_ratio, a.caps.temporal_ratio) == (64, 32, None)
    assert not a.is_video and not a.caps.latent_frame_axis and a.caps.norm == "groupnorm"
    assert v3.config.dims == 3 and v3.config.frames == 4
    assert v3.config.down == (R(32, False), R(64, False), R(64, True), R(64, True), None)
    assert v3.config.up == (None, R(32, False), R(32, False), R(64, True), R(64, True))
    assert v3.name == "HunyuanImage 3.0 VAE (32 latent channels)"
    assert (v3.caps.latent_channels, v3.caps.spatial_ratio) == (32, 16) and v3.caps.latent_frame_axis
    assert not v3.is_video and not (v3.caps.stream_decode or v3.caps.stream_encode)


def test_width_keeping_resamplers_give_resnet_shortcuts():
    """``downsample_match_channel=False``: resamplers keep the width, so resnets change it (diffusers'
    ``conv_shortcut`` -> ``nin_shortcut``); the config still comes from the shapes. diffusers cannot run such
    a model (its resnet applies the shortcut to the block's output, not its input: a shape error; no
    published file has one), so its numbers are checked against Tencent's original when a copy is named."""
    cfg = dict(block_out_channels=(32, 64, 64, 128, 128, 128), downsample_match_channel=False,
               upsample_match_channel=False)
    v = vae.from_state_dict(diffusers_hunyuan_image21(**cfg).state_dict())
    assert any(".nin_shortcut." in k for k in v.state_dict())
    assert v.config.down[0] == R(32, False) and v.config.up[1] == R(64, False)
    mod = _original("HUNYUAN_IMAGE21_REFERENCE")
    ref = mod.HunyuanVAE2D(in_channels=3, out_channels=3, latent_channels=64, layers_per_block=1, ffactor_spatial=32,
                           sample_size=384, sample_tsize=1, **cfg)
    ref.load_state_dict(layout.to_original(v.state_dict()))
    z, x = torch.randn(1, 64, 2, 2), torch.rand(1, 3, 64, 64)
    with torch.no_grad():     # fp32 rounding through 6 levels of 3x3 convs: a few 1e-6 apart
        assert (v.model.decode(z) - ref.decode(z).sample).abs().max() <= 5e-5
        assert (v.model.encode(x) - ref.encode(x).latent_dist.mode()).abs().max() <= 5e-5


def test_every_layout_loads_the_same(v21, tmp_path):
    """2.1: diffusers' flat lists, Tencent's = ComfyUI's names, Tencent's checkpoint (a ``state_dict`` of
    ``vae.`` keys, kernels stored 5-D with time size 1 as diffusers' converter finds them), ours; 3.0:
    Tencent's = ComfyUI's, the ``vae.`` part of the full checkpoint, ours. Decoder- and encoder-only files."""
    ref, ours = v21
    original = layout.to_original(ours.state_dict())
    five = {k: v.unsqueeze(2) if v.dim() == 4 else v for k, v in original.items()}
    z = torch.randn(1, 64, 2, 2)
    assert_layouts_agree({"diffusers": ref.state_dict(), "original": original, "canonical": ours.state_dict(),
                          "checkpoint": {"state_dict": {f"vae.{k}": v for k, v in five.items()}}},
                         tmp_path, "hunyuan_image", lambda v: v.decode(z))
    sd3 = hunyuan_image3_file()
    assert "decoder.up.0.upsample.conv.weight" in sd3          # running order in the file
    z3 = torch.randn(1, 32, 1, 2, 3)
    assert_layouts_agree({"original": sd3, "canonical": layout.to_canonical(sd3),
                          "checkpoint": {f"vae.{k}": v for k, v in sd3.items()}, },
                         tmp_path, "hunyuan_image", lambda v: v.decode(z3))
    for sd in (original, sd3):
        dec = vae.from_state_dict({k: v for k, v in sd.items() if k.startswith("decoder.")})
        enc = vae.from_state_dict({k: v for k, v in sd.items() if k.startswith("encoder.")})
        assert dec.caps.can_decode and not dec.caps.can_encode and "decoder only" in dec.name
        assert enc.caps.can_encode and not enc.caps.can_decode and enc.config.ratios == dec.config.ratios


def test_detection_across_families(v21):
    """Every layout is HunyuanImage: no family ordered before it claims one (the KL family's loose test, after
    it, would: a 4-D conv_in with down/up levels); no other family's file is HunyuanImage (SD's and Flux.1's
    KL files keep their width in the resamplers). HunyuanVideo 1.5 files stay HunyuanVideo 1.5, under the 2.1
    refiner VAE's name too (it is HunyuanVideo 1.5's model: tests/vae/test_hunyuan_video15.py)."""
    ref, ours = v21
    mine = {"diffusers-2.1": ref.state_dict(), "original-2.1": layout.to_original(ours.state_dict()),
            "original-3.0": hunyuan_image3_file()}
    for name, sd in mine.items():
        claims = [s.id for s in registry.REGISTRY if s.detect(sd)]
        assert claims[0] == "hunyuan_image" and set(claims) <= {"hunyuan_image", "kl"}, (name, claims)
        assert registry.detect(sd) is hi.SPEC
    for name, sd in reference_state_dicts().items():
        if not name.startswith("hunyuan_image"):
            assert not hi.SPEC.detect(sd), name
    hv15 = reference_state_dicts()["hunyuan_video15"]
    assert vae.from_state_dict(hv15).spec.id == "hunyuan_video15"
    assert vae.from_state_dict(hv15, name_hint="hunyuan_image_refiner_vae_fp16.safetensors").spec.id == "hunyuan_video15"


def test_a_2d_file_with_temporal_resamplers_is_refused(v21):
    """A 2-D resampler conv with out/8 channels would be a temporal level: not a file either model makes."""
    sd = dict(v21[1].state_dict())
    w = sd["encoder.down.2.downsample.conv.weight"]
    sd["encoder.down.2.downsample.conv.weight"] = w[: w.shape[0] // 2]
    sd["encoder.down.2.downsample.conv.bias"] = sd["encoder.down.2.downsample.conv.bias"][: w.shape[0] // 2]
    with pytest.raises(LoadError, match="temporal level"):
        vae.from_state_dict(sd)


# ---- LATENTs as core gives them -----------------------------------------------------------------

def test_latents_as_core_gives_them(v3, pack):
    """3.0: core builds a 3-D VAE whose images are one-frame clips: VAE Encode gives [B, 32, 1, h, w]; both that
    and [B, 32, h, w] decode to the same images; a longer clip is refused. 2.1: [B, 64, h, w]."""
    from vaekit.nodes.socket import VAEKitVAE
    handle = pack.vae.from_state_dict(hunyuan_image3_file())
    sock = VAEKitVAE(handle)
    image = torch.rand(2, 48, 40, 3)        # IMAGE; sides centre-cropped to multiples of 16
    z = sock.encode(image)
    assert z.shape == (2, 32, 1, 3, 2) and sock.latent_channels == 32 and sock.spacial_compression_decode() == 16
    assert torch.equal(z, handle.encode(image[:, :, 4:36].movedim(-1, 1)))
    out = sock.decode(z)        # core's VAE.decode of its 3-D VAE: [B, 1, H, W, C] (its VAE Decode flattens it)
    assert out.shape == (2, 1, 48, 32, 3) and torch.equal(out[:, 0], sock.decode(z[:, :, 0]))
    with pytest.raises(InputError, match="image latent"):
        v3.decode(torch.randn(1, 32, 2, 3, 2))


def test_handle_runs_contiguous_3d_weights(v3):
    """3-D convs: no channels_last (4-D only) for the 3.0 model, though its inputs and outputs are images."""
    assert all(p.is_contiguous() for p in v3.model.parameters())
    assert v3.to("cpu", torch.bfloat16).dtype == torch.bfloat16
    v3.to("cpu", torch.float32)


# ---- exact tiles, the budget --------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["2.1", "3.0"])
def test_exact_tiles_equal_untiled_and_fast_tiles_do_not(v21, v3, variant):
    """The mid-block attention runs on the whole latent, GroupNorm statistics are shared (3.0: over its
    four frames); 3x2 tiles of 2 latent pixels."""
    v = v21[1] if variant == "2.1" else v3
    s, c = v.caps.spatial_ratio, v.caps.latent_channels
    z = torch.randn(1, c, 5, 4)
    untiled = v.decode(z)
    steps = []
    assert (v.decode(z, tile=2 * s, mode="exact", progress=lambda d, n: steps.append(n)) - untiled).abs().max() <= 1e-5
    assert steps[-1] == 6
    assert (v.decode(z, tile=2 * s, overlap=s) - untiled).abs().max() > 1e-3
    x = torch.rand(1, 3, 5 * s, 4 * s)
    untiled = v.encode(x)
    assert (v.encode(x, tile=2 * s, mode="exact") - untiled).abs().max() <= 1e-5 * untiled.abs().max()
    assert (v.encode(x, tile=2 * s, overlap=s) - untiled).abs().max() > 1e-3 * untiled.abs().max()


def test_the_budget_planner_plans_smaller_tiles_with_the_untiled_result(v21, v3):
    """Measured on the meta device: below an untiled pass's prediction the planner picks smaller exact tiles
    (tiles meet in rounds: GroupNorm), with the untiled result; memory managers get a number (3.0 too)."""
    from vae.engine import budget
    v, cpu = v21[1], torch.device("cpu")
    z = torch.randn(1, 64, 12, 12)
    call = v.call_for("decode", z.shape, mode="exact")
    untiled = budget.plan(v, call, 1 << 40, cpu, cpu, cpu)
    out = v.decode(z, mode="exact", budget=untiled.on_device() - 1)
    # fp32 rounding: the tiles' GroupNorm statistics are summed in fp64, one pass's by its kernel
    assert (out - v.decode(z)).abs().max() <= 5e-5
    for op, shape in (("decode", (1, 32, 1, 6, 6)), ("encode", (1, 3, 96, 96))):
        need = v3.memory_needed(shape, op, tile=64, mode="exact")
        assert isinstance(need, int) and need > 0, op


# ---- published config (slow) and core ------------------------------------------------------------

@pytest.mark.slow
def test_published_21_matches_diffusers_and_tiles_exactly():
    torch.set_num_threads(os.cpu_count() or 1)      # the module's one-thread fixture restores it
    ref = diffusers_hunyuan_image21(published=True)
    v = vae.from_state_dict(ref.state_dict())
    z, x = torch.randn(1, 64, 4, 3), torch.rand(1, 3, 128, 96)
    with torch.no_grad():
        want, lat = pixels(ref.decode(z).sample), ref.encode(x * 2 - 1).latent_dist.mode()
    dec, enc = (v.decode(z) - want).abs().max().item(), ((v.encode(x) - lat).abs().max() / lat.abs().max()).item()
    exact = (v.decode(z, tile=64, mode="exact") - v.decode(z)).abs().max().item()
    print(f"HunyuanImage 2.1 published config vs diffusers, fp32: decode {dec:.2e}, encode {enc:.2e} (relative), "
          f"exact tiles {exact:.2e}")
    assert dec <= 1e-4 and enc <= 1e-4 and exact <= 1e-4


@pytest.mark.slow
def test_published_3_matches_the_original_and_tiles_exactly():
    torch.set_num_threads(os.cpu_count() or 1)
    v = vae.from_state_dict(hunyuan_image3_file(published=True))      # 1.3 B parameters: one copy held at a time
    z = torch.randn(1, 32, 1, 4, 3)
    exact = (v.decode(z, tile=32, mode="exact") - v.decode(z)).abs().max().item()
    assert exact <= 1e-4
    mod = _original("HUNYUAN_IMAGE3_REFERENCE")
    ref = mod.AutoencoderKLConv3D(in_channels=3, out_channels=3, latent_channels=32,
                                  block_out_channels=(128, 256, 512, 1024, 1024), layers_per_block=2,
                                  ffactor_spatial=16, ffactor_temporal=4, sample_size=256, sample_tsize=64).eval()
    ref.load_state_dict(layout.to_original(v.state_dict()))
    with torch.no_grad():
        dec = (v.decode(z) - pixels(ref.decode(z).sample[:, :, 0])).abs().max().item()
    assert dec <= 1e-4


@pytest.mark.skipif(not (os.environ.get("COMFYUI_DIR") and os.environ.get("COMFYUI_PYTHON")),
                    reason="set COMFYUI_DIR and COMFYUI_PYTHON to compare with ComfyUI core")
def test_core_parity():
    """bench/comfyui_checks/compare_core.py --family hunyuan_image --quick --check: core's own classes at narrow
    configs against ours on the same files, fp32, every row within 1e-4."""
    script = ROOT / "bench" / "comfyui_checks" / "compare_core.py"
    proc = subprocess.run([sys.executable, str(script), "--family", "hunyuan_image", "--comfyui", os.environ["COMFYUI_DIR"], "--python",
                           os.environ["COMFYUI_PYTHON"], "--quick", "--check", "1e-4"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
