"""Every benchmarked family declared once: its published config (the diffusers class and the arguments that
make it, or the writer of the file where diffusers has none), the file ours and ComfyUI core load, its
latent shape, and the few calls where a reference is not called the common way (``Family`` fields).

The runners (bench/decode.py and the others) read these declarations and never branch on a family name.
Nothing heavy is imported here at module level: core's runs import this module under ComfyUI's python."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Callable, Optional

from harness import module_at, repo_on_path, save, save_files

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
SEED = 0


@dataclasses.dataclass(frozen=True)
class Family:
    title: str
    channels: int                            # latent channels
    spatial: int                             # pixels per latent pixel
    temporal: Optional[int] = None           # video: frames = 1 + temporal * (latent frames - 1); None: an image
    diffusers: Optional[str] = None          # the reference class in diffusers (its published config: ``kwargs``)
    kwargs: dict = dataclasses.field(default_factory=dict)
    file: str = "diffusers.safetensors"      # the file ours and core load
    layout: Optional[Callable] = None        # canonical state dict -> ``file`` (core's layout); None: diffusers'
    writer: Optional[Callable] = None        # folder -> writes ``file`` where diffusers makes no published model
    tile: int = 256                          # our spatial tile, pixels, where a run names none
    core_tiled: tuple = (512, 64, 64, 8)     # core's VAE Decode / Encode (Tiled): tile, overlap, frames, overlap
    size: str = "256x256x1"                  # the default HxWxT, pixels and frames
    plan_size: str = ""                      # the size whose plans `budget --plans` prints
    latent_frames: Optional[Callable] = None  # pixel frames -> latent frames, where not 1 + (T - 1) / temporal
    latent: Optional[Callable] = None        # the decode input from randn, where it is not the raw randn
    frames_on_batch: bool = False            # the LATENT holds the frames on its batch axis (SVD)
    diffusers_call: Optional[Callable] = None  # (model, op) -> the reference's call, where it is not the common one
    ours_setup: Optional[Callable] = None    # handle -> None: what the comparison with diffusers needs
    runs: dict = dataclasses.field(default_factory=dict)   # run name -> (args, folder) -> (model, call): its own
    core_patches: dict = dataclasses.field(default_factory=dict)  # core run name -> args -> None: core changed first


def write_weights(family: Family, folder: Path) -> Path:
    """The family's published config with random weights under ``SEED`` in ``folder`` (written once):
    diffusers' file (``diffusers.safetensors``) and the file ours and core load; returns the latter."""
    path = folder / family.file
    if path.exists():
        return path
    if family.writer is not None:
        family.writer(folder)
        return path
    import diffusers
    import torch
    torch.manual_seed(SEED)
    sd = getattr(diffusers, family.diffusers)(**family.kwargs).eval().state_dict()
    save(sd, folder / "diffusers.safetensors")
    if family.layout is not None:
        sys.path.insert(0, str(ROOT))
        import vae
        save(family.layout(vae.from_state_dict(sd).state_dict()), path)
    return path


def shape(family: Family, op: str, size: str) -> tuple:
    """The input of ``op`` at ``size`` (HxWxT pixels and frames): the latent of a decode, the pixels of an encode."""
    h, w, t = map(int, size.split("x"))
    c, s = (family.channels, family.spatial) if op == "decode" else (3, 1)
    if family.temporal is None:
        return (1, c, h // s, w // s)
    if family.frames_on_batch:
        return (t, c, h // s, w // s)
    if op == "decode":
        t = family.latent_frames(t) if family.latent_frames else 1 + (t - 1) // family.temporal
    return (1, c, t, h // s, w // s)


def write_input(family: Family, op: str, size: str, path: Path) -> None:
    import numpy as np
    rng = np.random.default_rng(SEED)
    dims = shape(family, op, size)
    if op == "encode":
        x = rng.random(dims, dtype=np.float32)
    else:
        x = rng.standard_normal(dims, dtype=np.float32)
        x = family.latent(x) if family.latent else x
    np.save(path, x.astype(np.float32))


def _to_original(nested: bool):
    def layout(sd):
        from vae.archs.wan_layout import to_original
        return to_original(sd, nested=nested)
    return layout


def _same(sd):           # our canonical layout is the original's, which core reads (SD's KL, HunyuanVideo)
    return sd


# ---- the references that are not called the common way --------------------------------------------------

def _rgba(x):
    import torch
    return torch.cat([x, torch.ones_like(x[:, :1])], 1)


def _qwen21_call(model, op):
    """AutoencoderKLQwenImage21 takes the image as a one-frame clip, RGBA."""
    if op == "decode":
        return lambda z: (model.decode(z.unsqueeze(2)).sample.squeeze(2) / 2 + 0.5).clamp_(0, 1)
    return lambda x: model.encode((_rgba(x) * 2 - 1).unsqueeze(2)).latent_dist.mode().squeeze(2)


def _compared(name: str):
    """The writer of the published file compare_core.py --family NAME compares against core (its ``files``):
    one builder of each such file."""
    def write(folder: Path) -> None:
        from types import SimpleNamespace
        from comfyui_checks.core_families import FAMILIES as COMPARED
        save_files(folder, COMPARED[name].files(SimpleNamespace(variant="published", quick=False, state={}, d=folder)))
    return write


def _flux2_writer(folder: Path) -> None:
    """The published FLUX.2 VAE with random BatchNorm statistics at a latent's scale (variances 0.25..4)."""
    repo_on_path()
    import diffusers_flux2
    save(diffusers_flux2.model(**diffusers_flux2.PUBLISHED, var=(0.25, 4.0)).state_dict(),
         folder / "diffusers.safetensors")


def _flux2_call(model, op):
    """The Flux.2 pipeline's own VAE steps around AutoencoderKLFlux2 (BatchNorm, 2x2 packing)."""
    repo_on_path()
    import diffusers_flux2
    pipe = diffusers_flux2.Pipeline()
    return (lambda t: pipe.decode(model, t)) if op == "decode" else (lambda t: pipe.encode(model, t))


def _ltx_zeros(v) -> None:
    """Ours pads LTX 0.9's decoder with reflect, as ComfyUI does; diffusers with zeros."""
    from vae.archs import ltx
    ltx.set_decoder_padding(v.model, "zeros")


def _minimax_ours(tiling: str):
    """Built in the file's fp16, then cast: never the fp16 file and the fp32 weights held at once."""
    def build(a, folder: Path):
        import torch
        import vae
        v = vae.load(folder / FAMILIES["minimax"].file, dtype=torch.float16).to(dtype=torch.float32)
        return v.model, ((lambda z: v.decode(z, tiling=tiling)) if a.op == "decode" else v.encode)
    return build


def _minimax_core_newer(a) -> None:
    """Core with core 0.38.1's tiled decode (``blend``) grafted from ``--newer-tiled-decode``."""
    from harness import comfy_core
    comfy_core.start(a.comfyui)
    import comfy.ldm.minimax.vae as mm
    from comfyui_checks.core_families import newer_tiled_decode
    newer_tiled_decode(mm, a.newer_tiled_decode)


def _qwen21_stats():
    import torch
    sys.path.insert(0, str(ROOT))
    from vae.archs.tiny import QWEN21_MEAN, QWEN21_STD
    return torch.tensor(QWEN21_MEAN).view(1, -1, 1, 1), torch.tensor(QWEN21_STD).view(1, -1, 1, 1)


def _taeqi_latent(x):
    """A raw Qwen-Image 2.1 LATENT: randn * std + mean per channel (ComfyUI's latent_formats.QwenImage21)."""
    mean, std = (t.numpy() for t in _qwen21_stats())
    return x * std + mean


def _taeqi_writer(folder: Path) -> None:
    """The original taesd.py's F16Encoder / F16Decoder(64, 4), randn * 1.2 / sqrt(fan-in), fp16 as published.
    Needs the original: TAESD_REFERENCE names its taesd.py (madebyollin/taesd 401ce45e or later)."""
    import os
    import torch
    ref = module_at(os.environ["TAESD_REFERENCE"], "_taesd_reference")
    g = torch.Generator().manual_seed(SEED)
    for name, net in (("encoder", ref.F16Encoder(64, 4)), ("decoder", ref.F16Decoder(64, 4))):
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (1.2 / (p[0].numel() if p.dim() > 1 else 10) ** 0.5))
        torch.save({k: v.half() for k, v in net.state_dict().items()}, folder / f"taeqi2_1_{name}.pth")


def _taeqi_reference(a, folder: Path):
    """The original's TAESD on the same files: its network works in the normalised latent, RGBA in."""
    import os
    mean, std = _qwen21_stats()
    tae = module_at(os.environ["TAESD_REFERENCE"], "_taesd_reference").TAESD(
        folder / "taeqi2_1_encoder.pth", folder / "taeqi2_1_decoder.pth").float().eval()
    if a.op == "decode":
        return tae, lambda z: tae.decoder((z - mean) / std).clamp_(0, 1)
    return tae, lambda x: tae.encoder(_rgba(x)) * std + mean


def _mage_writer(folder: Path) -> None:
    """The published Mage-VAE, every tensor drawn as compare_core.py --family mage draws core's, in the file
    layout the templates load (with the two anchor tensors loaders drop)."""
    import torch
    repo_on_path()
    import mage_tiny
    from comfyui_checks.core_families import drawn
    from vae.archs import mage
    cfg = mage_tiny.config(**mage_tiny.PUBLISHED)
    cfg = dataclasses.replace(cfg, encoder=dataclasses.replace(cfg.encoder, head_ffn=4 * cfg.encoder.head))  # core's
    with torch.device("meta"):
        shapes = {k: p.shape for k, p in mage.MageVAE(cfg).state_dict().items()}
    save(mage_tiny.file_layout(drawn(shapes), anchor=True), folder / "mage_flow_vae.safetensors")


# LTX-2's published flags (diffusers scripts/convert_ltx2_to_diffusers.py); its defaults say causal decoder
LTX2_FLAGS = dict(decoder_causal=False, spatial_compression_ratio=32, temporal_compression_ratio=8)
LTX23 = dict(block_out_channels=(256, 512, 1024, 1024), layers_per_block=(4, 6, 4, 2, 2),
             decoder_block_out_channels=(256, 512, 512, 1024), decoder_layers_per_block=(4, 6, 4, 2, 2),
             decoder_spatio_temporal_scaling=(True,) * 4, decoder_inject_noise=(False,) * 5,
             upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
             upsample_residual=(False,) * 4, upsample_factor=(2, 2, 1, 2), decoder_spatial_padding_mode="zeros")
# SD's VAE (diffusers' AutoencoderKL() defaults are a one-level toy)
KL_SHAPE = dict(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4, sample_size=512)

FAMILIES = {
    "kl": Family("SD-shape AutoencoderKL", 4, 8, diffusers="AutoencoderKL", kwargs=KL_SHAPE, file="kl.safetensors",
                 layout=_same, tile=512, size="512x512x1", plan_size="2048x2048x1"),
    "flux2": Family("Flux.2 VAE", 128, 16, diffusers="AutoencoderKLFlux2", writer=_flux2_writer,
                    diffusers_call=_flux2_call, size="512x512x1"),
    "qwen": Family("Qwen-Image VAE (Wan 2.1's, one-frame latents)", 16, 8, 4, diffusers="AutoencoderKLWan",
                   tile=512, size="1024x1024x1"),
    "qwen21": Family("Qwen-Image 2.1 VAE", 64, 16, diffusers="AutoencoderKLQwenImage21",
                     file="qwen_image_2.1_vae.safetensors", layout=_to_original(True), diffusers_call=_qwen21_call,
                     tile=512, size="1024x1024x1"),
    "wan": Family("Wan 2.1", 16, 8, 4, diffusers="AutoencoderKLWan", file="wan_2.1_vae.safetensors",
                  layout=_to_original(False), tile=128, size="128x192x33", plan_size="720x1280x81,1080x1920x241"),
    "hunyuan_video": Family("HunyuanVideo", 16, 8, 4, diffusers="AutoencoderKLHunyuanVideo", file="hv.safetensors",
                            layout=_same, tile=64, size="128x128x9"),
    "hunyuan_video15": Family("HunyuanVideo 1.5", 32, 16, 4, diffusers="AutoencoderKLHunyuanVideo15", tile=128,
                              size="192x192x17"),
    "ltx": Family("LTX-Video 0.9.0", 128, 32, 8, diffusers="AutoencoderKLLTXVideo", ours_setup=_ltx_zeros,
                  size="256x256x17"),
    "ltx2": Family("LTX-2.0", 128, 32, 8, diffusers="AutoencoderKLLTX2Video", kwargs=LTX2_FLAGS, size="256x256x17"),
    "ltx2.3": Family("LTX-2.3", 128, 32, 8, diffusers="AutoencoderKLLTX2Video", kwargs={**LTX23, **LTX2_FLAGS},
                     size="512x768x25", plan_size="1088x1920x121"),
    "ltx_diffusion": Family("LTX-2.5 diffusion decoder (the shipped layout and metadata)", 128, 32, 8,
                            file="ltx-2.5-video-vae.safetensors", writer=_compared("ltx_diffusion"), tile=128,
                            core_tiled=(512, 64, 64, 16), size="256x256x17", plan_size="704x1280x121"),
    "mage": Family("Mage-VAE", 128, 16, file="mage_flow_vae.safetensors", writer=_mage_writer, tile=512,
                   size="1024x1024x1"),
    "mochi": Family("Mochi", 12, 8, 6, diffusers="AutoencoderKLMochi", size="64x64x13"),
    "magvit": Family("EasyAnimate Magvit", 16, 8, 4, diffusers="AutoencoderKLMagvit", size="64x64x29"),
    "minimax": Family("MiniMax H3 (fp16 file, fp32 compute)", 24, 16, 17, file="minimax_h3_video_vae_fp16.safetensors",
                      writer=_compared("minimax"), latent_frames=lambda t: (t - 5) // 17 * 5 + 2, size="512x512x22",
                      runs={"default": _minimax_ours("blend"), "stitch": _minimax_ours("stitch")},
                      core_patches={"core_newer": _minimax_core_newer}),
    "seedvr2": Family("SeedVR2 VAE", 16, 8, 4, file="seedvr2_ema_vae.safetensors", writer=_compared("seedvr2"),
                      tile=128, core_tiled=(512, 128, 64, 8), size="256x256x17"),
    "svd": Family("SVD (svd_xt) VAE", 4, 8, 1, file="svd_xt_vae.safetensors", writer=_compared("svd"), tile=96,
                  frames_on_batch=True, size="192x192x6"),
    "taehv": Family("TAEHV (lighttaew2_1; taehv differs by its scale only)", 16, 8, 4, file="lighttaew2_1.safetensors",
                    writer=_compared("taehv"), tile=128, size="256x320x17"),
    "taeqi": Family("taeqi2_1 (set TAESD_REFERENCE to the original taesd.py)", 64, 16, file="taeqi2_1",
                    writer=_taeqi_writer, latent=_taeqi_latent, tile=512, size="1024x1024x1",
                    runs={"reference": _taeqi_reference}),
}
