"""Every branch of ComfyUI core's ``VAE.__init__`` (comfy/sd.py at 783545f6) that builds an image or video VAE,
against this pack: a tiny file in the layout that takes that branch in core loads here as the family the
branch stands for (docs/coverage.md, "Core's image and video VAE branches").

``CORE`` restates the tests core makes, in core's order (the keys and shapes it looks at, with sd.py's line;
audio and 3-D branches too, so that "the first branch a file takes" is core's). Each case builds its file
and checks (1) that core's first branch for it is the branch the case stands for, so the file is a
fair representative, and (2) that ``vae.load`` reads it as the expected family and builds it. With
COMFYUI_DIR + COMFYUI_PYTHON, bench/comfyui_checks/core_vae_branches.py runs core's own ``VAE.__init__`` on
the same files and names the class core builds, which checks ``CORE`` itself. Cases whose family
is not in ``vae/archs`` yet are skipped with the reason."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable, Mapping

import pytest
import torch
from safetensors.torch import save_file

import helpers
import vae
import video_families
from vae import registry

pytestmark = pytest.mark.usefixtures("one_thread")

Sd = Mapping[str, torch.Tensor]


def _has(*keys: str) -> Callable[[Sd], bool]:
    return lambda sd: all(k in sd for k in keys)


def _any(*keys: str) -> Callable[[Sd], bool]:
    return lambda sd: any(k in sd for k in keys)


def _shape(key: str, dim: int, value: int) -> Callable[[Sd], bool]:
    return lambda sd: key in sd and sd[key].dim() > dim and sd[key].shape[dim] == value


def _all(*tests: Callable[[Sd], bool]) -> Callable[[Sd], bool]:
    return lambda sd: all(t(sd) for t in tests)


_CONV_IN, _CONV_IN3 = "decoder.conv_in.weight", "decoder.conv_in.conv.weight"
_TAEHV_OUT = "decoder.22.bias"
_KL_X4 = lambda sd: ("encoder.down.2.downsample.conv.weight" not in sd       # noqa: E731
                     and "decoder.up.3.upsample.conv.weight" not in sd)

# (sd.py line, what core builds, kind, the test that selects it): core's order; sub-branches of one key
# follow their parent in the order core tries them. ``kind`` "image"/"video" rows are the ones this pack
# answers for; "audio", "3d" and "identity" are listed so the first-match order is core's.
CORE: list[tuple[int, str, str, Callable[[Sd], bool]]] = [
    (522, "MiniMaxMusic3DAV", "audio", _has("dec_in_proj.weight", "decoder.model.0.weight_g")),
    (537, "AutoencodingEngine + temporal_ae.VideoDecoder (SVD)", "image", _has("decoder.mid.block_1.mix_factor")),
    (545, "TAESD", "image", _has("taesd_decoder.1.weight")),
    (551, "StageA (Stable Cascade VQ-GAN)", "image", _has("vquantizer.codebook.weight")),
    (560, "StageC_coder (EfficientNet encoder)", "image", _has("backbone.1.0.block.0.1.num_batches_tracked")),
    (568, "StageC_coder (previewer)", "image", _has("blocks.11.num_batches_tracked")),
    (575, "StageC_coder (effnet + previewer)", "image", _has("encoder.backbone.1.0.block.0.1.num_batches_tracked")),
    (579, "Trellis 2 ShapeVae", "3d", _has("shape_dec.blocks.1.16.to_subdiv.weight")),
    (584, "Trellis 2 TextureVae", "3d", _has("txt_dec.blocks.3.4.conv2.weight")),
    (589, "SeedVR2 VideoAutoencoderKLWrapper", "video", _has("decoder.up_blocks.2.upsamplers.0.upscale_conv.weight")),
    (605, "MageVAE", "image", _has("student.dconv_encoder.proj_out.weight")),
    (616, "LTX CausalDiffusionVAE", "video", _has("decoder.conv_in_x_t.weight")),
    (633, "hunyuan_video.vae (HunyuanImage 2.1, 32x)", "image", _shape(_CONV_IN, 1, 64)),
    (645, "hunyuan_video.vae_refiner, 2-D latents (HunyuanImage 3.0)",
     "image", lambda sd: _shape(_CONV_IN, 1, 32)(sd) and sd[_CONV_IN].dim() == 5),
    (665, "AutoencoderKL, 3 levels (SD x4 upscaler)", "image", _all(_has(_CONV_IN), _KL_X4)),
    (674, "AutoencodingEngine, latent BatchNorm (Flux.2)", "image", _has(_CONV_IN, "bn.running_mean")),
    (689, "AutoencoderKL (SD 1.x/2.x, SDXL)", "image", _has(_CONV_IN, "post_quant_conv.weight")),
    (691, "AutoencodingEngine (Flux.1, SD3)", "image", _has(_CONV_IN)),
    (695, "AudioOobleckVAE", "audio", _has("decoder.layers.1.layers.0.beta")),
    (722, "genmo VideoVAE (Mochi)", "video", _any(
        "blocks.2.blocks.3.stack.5.weight", "decoder.blocks.2.blocks.3.stack.5.weight",
        "layers.4.layers.1.attn_block.attn.qkv.weight", "encoder.layers.4.layers.1.attn_block.attn.qkv.weight")),
    (737, "LTX VideoVAE", "video", _has("decoder.up_blocks.0.res_blocks.0.conv1.conv.weight")),
    (759, "hunyuan_video.vae_refiner (HunyuanVideo 1.5)", "video", _shape(_CONV_IN3, 1, 32)),
    (776, "AutoencoderKLCogVideoX", "video", _has(_CONV_IN3, "decoder.mid_block.resnets.0.norm1.norm_layer.weight")),
    (787, "AutoencoderKL conv3d (HunyuanVideo 1.0)", "video", _has(_CONV_IN3)),
    (803, "CausalContinuousVideoTokenizer (Cosmos-1)", "video", _has("decoder.unpatcher3d.wavelets")),
    (817, "WanVAE 2.2", "video", _has("decoder.middle.0.residual.0.gamma",
                                      "decoder.upsamples.0.upsamples.0.residual.2.weight")),
    (829, "WanVAE 2.1", "video", _has("decoder.middle.0.residual.0.gamma")),
    (848, "Hunyuan3D ShapeVAE", "3d", _has("geo_decoder.cross_attn_decoder.ln_1.bias")),
    (870, "ACE-Step MusicDCAE", "audio", _has("vocoder.backbone.channel_layers.0.0.bias")),
    (885, "PixelspaceConversionVAE", "identity", _has("pixel_space_vae")),
    (895, "MMAudio AudioAutoencoder", "audio", _has("vocoder.activation_post.downsample.lowpass.filter")),
    (922, "TAEHV, MiniMax H3 (taeh3)", "video", _all(_shape("decoder.1.weight", 1, 24), _shape(_TAEHV_OUT, 0, 12))),
    (929, "TAEHV, 48 / 128 ch (lighttaew2_2, taeltx_2)", "video",
     lambda sd: _TAEHV_OUT in sd and sd["decoder.1.weight"].shape[1] in (48, 128)),
    (934, "TAEHV, HunyuanVideo 1.5 (lighttaehy1_5)", "video",
     _all(_shape("decoder.1.weight", 1, 32), _shape(_TAEHV_OUT, 0, 12))),
    (936, "TAEHV, 16 ch (taehv if fp16, else lighttaew2_1)", "video", _has(_TAEHV_OUT)),
    (949, "LTX AudioVAE", "audio", _any("vocoder.resblocks.0.convs1.0.weight", "vocoder.vocoder.resblocks.0.convs1.0.weight")),
    (967, "SA3AudioVAE", "audio", _has("decoder.layers.3.transformers.0.pre_norm.alpha")),
    (995, "MiniMaxH3VideoVAE", "video", _has("decoder.transformer_blocks.0.scale1", "encoder.down.5.block.0.conv1.weight")),
    (1030, "MiniMaxH3AudioVAE", "audio", _has("pre_block.attn.zero_k_bias")),
    (1051, "TripoSplat OctreeGaussianDecoder", "3d", _has("gs.base_offset_scale", "octree.out_proj.weight")),
]


# what core's model (or its decoder) is, per image/video branch: the class name core's build reports
# (bench/comfyui_checks/core_vae_branches.py)
CORE_CLASS = {537: "temporal_ae.VideoDecoder", 545: "taesd.taesd.TAESD", 551: "stage_a.StageA", 560: "StageC_coder", 568: "StageC_coder", 575: "StageC_coder", 589: "seedvr.vae.VideoAutoencoderKLWrapper", 605: "mage_flow.vae.MageVAE", 616: "CausalDiffusionVAE", 633: "hunyuan_video.vae.Decoder", 645: "hunyuan_video.vae_refiner.Decoder", 665: "autoencoder.AutoencoderKL", 674: "diffusionmodules.model.Decoder", 689: "autoencoder.AutoencoderKL", 691: "diffusionmodules.model.Decoder", 722: "genmo.vae.model.VideoVAE", 737: "causal_video_autoencoder.VideoVAE", 759: "hunyuan_video.vae_refiner.Decoder", 776: "AutoencoderKLCogVideoX", 787: "autoencoder.AutoencoderKL", 803: "CausalContinuousVideoTokenizer", 817: "wan.vae2_2.WanVAE", 829: "wan.vae.WanVAE", 922: "taehv.TAEHV", 929: "taehv.TAEHV", 934: "taehv.TAEHV", 936: "taehv.TAEHV", 995: "MiniMaxH3VideoVAE"}


def core_branch(sd: Sd) -> int | None:
    """sd.py's line of the first branch core takes for ``sd`` (None: core's 'no VAE weights detected')."""
    for line, _, _, test in CORE:
        if test(sd):
            return line
    return None


# ---- one tiny file per branch, in the layout core reads there ---------------------------------------------

def _canonical(sd: Sd) -> dict:
    """Our canonical layout, which for these families is the original's = core's names."""
    return vae.from_state_dict(sd).state_dict()


def _row(name: str) -> Callable[[], dict]:
    def make():
        if name not in video_families.ROWS:
            pytest.skip(f"{name}: no row in tests/video_families.py (its family is not in this tree yet)")
        return video_families.tiny_state_dict(name)
    return make


def _taehv(latent: int, patch: int, **kw) -> Callable[[], dict]:
    def make():
        from vae.archs import taehv
        cfg = taehv.TAEHVConfig(latent, patch=patch, encoder_width=8, decoder_widths=(16, 8, 8, 8), **kw)
        return {k: v.contiguous() for k, v in video_families.taehv_model(cfg).state_dict().items()}
    return make


def _wan22() -> dict:
    torch.manual_seed(0)
    return pytest.importorskip("diffusers").AutoencoderKLWan(
        base_dim=8, decoder_base_dim=12, z_dim=12, is_residual=True, patch_size=2, in_channels=12, out_channels=12,
        scale_factor_spatial=16).state_dict()


def _helper(name: str, *args, **kw) -> Callable[[], dict]:
    def make():
        fn = getattr(helpers, name, None)
        if fn is None:
            pytest.skip(f"tests/helpers.py has no {name} (its family is not in this tree yet)")
        out = fn(*args, **kw)
        return out if isinstance(out, dict) else out.state_dict()
    return make


# core builds a KL decoder ``conv_in width / 4`` wide (its ch_mult ends in 4): 32, GroupNorm's group count
_KL_WIDTHS = (32, 64, 128, 128)


def _flux2() -> dict:
    import diffusers_flux2
    return diffusers_flux2.model(widths=_KL_WIDTHS).state_dict()


def _mage() -> dict:
    import mage_tiny
    return mage_tiny.file_layout(mage_tiny.canonical())


def _canon(make: Callable[[], dict], to_core: Callable[[dict], dict] = dict) -> Callable[[], dict]:
    """``make``'s file read by us, then written in core's names (``to_core``: our canonical -> core's)."""
    return lambda: to_core(_canonical(make()))


def _wan_core(nested: bool) -> Callable[[dict], dict]:
    from vae.archs import wan_layout
    return lambda sd: wan_layout.to_original(sd, nested=nested)


def _ltx_core(sd: dict) -> dict:
    from vae.archs import ltx_layout
    return ltx_layout.to_original(sd)


def _cosmos_core(sd: dict) -> dict:
    from vae.archs import cosmos_layout
    return cosmos_layout.to_original(sd)


def _sibling(name: str):
    """A test module beside this one, for its layout writer (core's names for its family)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"_core_branches_{name}", helpers.ROOT / "tests" / "vae" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hunyuan_video_core(sd: dict) -> dict:
    return _sibling("test_hunyuan_video").comfy_layout(sd)


def _hunyuan_video15_core() -> dict:
    return _sibling("test_hunyuan_video15").original_layout(_row("hunyuan_video15")(), comfyui=True)


# case -> (the tiny file in the layout core reads, core's branch line, our registry id)
CASES: dict[str, tuple[Callable[[], dict], int, str]] = {
    "svd": (_canon(_row("svd")), 537, "svd"),
    "taesd": (_canon(_helper("diffusers_tiny")), 545, "tiny"),
    "stage_a": (_canon(_helper("diffusers_paella")), 551, "stage_a"),
    "seedvr2": (_row("seedvr2"), 589, "seedvr2"),
    "mage": (_mage, 605, "mage"),
    "ltx_diffusion": (_canon(_row("ltx_diffusion")), 616, "ltx_diffusion"),
    "hunyuan_image21": (_canon(_helper("diffusers_hunyuan_image21")), 633, "hunyuan_image"),
    "hunyuan_image3": (_helper("hunyuan_image3_file"), 645, "hunyuan_image"),
    "kl_x4": (_canon(_helper("diffusers_kl", widths=_KL_WIDTHS[:3])), 665, "kl"),
    "flux2": (_canon(_flux2), 674, "flux2"),
    "kl_sd": (_canon(_helper("diffusers_kl", widths=_KL_WIDTHS)), 689, "kl"),
    "kl_flux1": (_canon(_helper("diffusers_kl", 16, quant=False, widths=_KL_WIDTHS)), 691, "kl"),
    "mochi": (_canon(_row("mochi")), 722, "mochi"),
    "ltx": (_canon(_row("ltx"), _ltx_core), 737, "ltx"),
    "ltx2": (_canon(_row("ltx2"), _ltx_core), 737, "ltx"),
    "hunyuan_video15": (_hunyuan_video15_core, 759, "hunyuan_video15"),
    "cogvideox": (_row("cogvideox"), 776, "cogvideox"),
    "hunyuan_video": (_canon(_row("hunyuan_video"), _hunyuan_video_core), 787, "hunyuan_video"),
    "cosmos": (_canon(_row("cosmos"), _cosmos_core), 803, "cosmos"),
    "wan22": (_canon(_wan22, _wan_core(True)), 817, "wan"),
    "wan21": (_canon(_row("wan"), _wan_core(False)), 829, "wan"),
    "taeh3": (_taehv(24, 2), 922, "taehv"),
    "lighttaew2_2": (_taehv(48, 2), 929, "taehv"),
    "taeltx_2": (_taehv(128, 4, encoder_time=(2, 2, 2), decoder_time=(2, 2, 2)), 929, "taehv"),
    "lighttaehy1_5": (_taehv(32, 2), 934, "taehv"),
    "taehv": (_taehv(16, 1), 936, "taehv"),
    "minimax": (_canon(_row("minimax")), 995, "minimax"),
}

# image/video branches this pack does not read, and why (docs/coverage.md says the same)
NOT_OURS = {560: "Stable Cascade's EfficientNet encoder (encoder only: it makes stage C's conditioning latents)",
            568: "Stable Cascade's previewer (a stage C latent-to-preview decoder)",
            575: "the two above in one file"}


def _needs_family(spec_id: str) -> None:
    if spec_id not in {s.id for s in registry.REGISTRY}:
        pytest.skip(f"{spec_id}: not in vae/archs yet")


def test_every_image_and_video_branch_has_a_case_or_a_reason():
    ours = {line for _, line, _ in CASES.values()}
    for line, what, kind, _ in CORE:
        if kind in ("image", "video"):
            assert line in ours or line in NOT_OURS, f"sd.py:{line} ({what}) has no case and no reason"
    assert not ours & set(NOT_OURS)


@pytest.mark.parametrize("case", CASES)
def test_core_branch_reads_as_our_family(case, tmp_path):
    make, line, spec_id = CASES[case]
    _needs_family(spec_id)
    sd = make()
    assert core_branch(sd) == line, f"core would take sd.py:{core_branch(sd)}, not {line}: the file is not {case}"
    path = tmp_path / f"{case}.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, path)
    v = vae.load(path)
    assert v.spec.id == spec_id


@pytest.mark.parametrize("key", ["backbone.1.0.block.0.1.num_batches_tracked", "blocks.11.num_batches_tracked",
                                 "encoder.backbone.1.0.block.0.1.num_batches_tracked"])
def test_the_branches_we_do_not_read_are_refused_not_misread(key):
    """Stable Cascade's stage C coders (only their marker key and a conv here) get a LoadError, not some
    other family's model."""
    with pytest.raises(vae.LoadError):
        vae.from_state_dict({key: torch.zeros((), dtype=torch.int64), "blocks.0.weight": torch.zeros(4, 4, 1, 1)})


@pytest.mark.skipif(not (os.environ.get("COMFYUI_DIR") and os.environ.get("COMFYUI_PYTHON")),
                    reason="set COMFYUI_DIR and COMFYUI_PYTHON to run core's own VAE.__init__ on the files")
def test_core_builds_what_the_table_says(tmp_path):
    lines = {}
    for case, (make, line, spec_id) in CASES.items():
        if spec_id not in {s.id for s in registry.REGISTRY}:
            continue
        try:
            sd = make()
        except pytest.skip.Exception:
            continue
        save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / f"{case}.safetensors")
        lines[case] = line
    script = helpers.ROOT / "bench" / "comfyui_checks" / "core_vae_branches.py"
    out = tmp_path / "core.json"
    proc = subprocess.run([os.environ["COMFYUI_PYTHON"], str(script), "--comfyui", os.environ["COMFYUI_DIR"],
                           "--json", str(out), str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(out.read_text())
    wrong = {case: (built.get(case), CORE_CLASS[line]) for case, line in lines.items()
             if not any(CORE_CLASS[line] in name for name in (built.get(case) or {}).get("classes", []))}
    assert not wrong, wrong
    ratios = {case: built[case]["downscale_ratio"] for case, line in lines.items() if line in (665, 689)}
    assert ratios == {case: 4 if lines[case] == 665 else 8 for case in ratios}     # SD x4 upscaler: 4x


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
