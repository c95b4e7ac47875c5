"""Every family's configuration as our own config classes, and random weights made for it on any device:
what a benchmark needs where diffusers (and the test modules that import it) is not installed, such as a
bare GPU machine.

``TEST`` holds each family at the tiny configuration its tests use (the state dicts of
tests/video_families.py and the family tests, read back by our loader: tests/bench/test_gpu_check.py
checks that they agree); ``PUBLISHED`` the published configs the GPU check decodes (Wan 2.1 =
diffusers' ``AutoencoderKLWan()``, an SDXL-shape ``AutoencoderKL``: bench/harness/families.py's KL_SHAPE).

``build`` makes the model on the target device (``torch.device`` as the default device while the modules
are built), so a published model's weights are drawn there, never first on the CPU, under a fixed seed."""
from __future__ import annotations

from typing import Optional

import torch

from vae import registry
from vae.archs import (cogvideox, consistency, cosmos, flux2, hunyuan_image, hunyuan_video, hunyuan_video15, kl, ltx_config,
                       ltx_diffusion, mage, magvit, minimax, mochi, seedvr2, svd, taehv, tiny, wan)
from vae.handle import VAE

_B = ltx_config.Block


def _res(c: int, layers: int = 1) -> ltx_config.Block:
    return _B("res", c, c, layers=layers)


def _ltx_encoder_23() -> tuple:
    """LTX-2.3's encoder at the tests' widths (16 -> 32, space-to-depth between levels)."""
    return (_res(16), _B("s2d", 16, 8, stride=(1, 2, 2)), _res(8), _B("s2d", 8, 16, stride=(2, 1, 1)), _res(16),
            _B("s2d", 16, 32), _res(32), _B("s2d", 32, 32), _res(32))


_TAEHV_SOURCE = "the default for these shapes (the file name names none)"     # as the loader reads the tests' files
_HI = hunyuan_image.Resample
_LTX2_SOURCES = (("residual up-samplers", "none", "published 2.3"), ("causal decoder", "False", "published 2.3"),
                 ("decoder padding", "zeros", "published 2.3"), ("encoder padding", "zeros", "published 2.3"))

# family -> (registry id, config): the tests' tiny configs
TEST = {
    "kl": ("kl", kl.KLConfig(ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=4, embed_dim=4)),
    "flux2": ("flux2", flux2.Flux2Config(ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=8, embed_dim=8, pack=2)),
    "tiny": ("tiny", tiny.TinyConfig(latent_channels=4, encoder_stages=((16, 1), (16, 2), (16, 2), (16, 2)),
                                     decoder_stages=((16, 2), (16, 2), (16, 2), (16, 1)), midblock_gn=False,
                                     image_channels=3, scale=0.18215, shift=0.0, pack=1, latent_space="taesd",
                                     patch=1)),
    "consistency": ("consistency", consistency.ConsistencyConfig(
        encoder=kl.KLConfig(ch=32, ch_mult=(1, 1, 1, 1), num_res_blocks=1, z_channels=4, embed_dim=4,
                            has_decoder=False),
        widths=(32, 64, 64), down_layers=1, up_layers=2, mid_layers=2, latent_channels=4, out_channels=6,
        time_steps=1024, time_dim=128)),
    "qwen21": ("wan", wan.WanConfig(latent_channels=64, image_channels=4, residual=True, enc_base=8,
                                    enc_widths=(8, 16, 32, 64, 64), enc_blocks=2, dec_mid=96,
                                    dec_widths=(12, 24, 48, 96, 96), dec_up=(0, 24, 48, 96, 96), dec_blocks=2,
                                    temporal=(False, True, True, True), image=True)),
    "mage": ("mage", mage.MageConfig(
        latent_channels=16,
        encoder=mage.EncoderConfig(image_channels=3, patch=4, head=32, head_blocks=2, head_ffn=64, hidden=32, blocks=2,
                                   ffn=64, out_channels=32, freq=32),
        decoder=mage.DecoderConfig(image_channels=3, patch=4, bottleneck=16, hidden=32, blocks=2, ffn=64, pixel=8,
                                   pixel_blocks=2, freqs=4, freq=32,
                                   cod=("resnet", "attention", "resnet", "attention", "resnet")))),
    "mochi": ("mochi", mochi.MochiConfig(latent_channels=12, enc_widths=(32, 32, 32, 64), enc_blocks=(1,) * 5,
                                         enc_attention=(False, True, True, True, True), dec_widths=(64, 32, 32, 32),
                                         dec_blocks=(1,) * 5, temporal=(1, 2, 3), spatial=(2, 2, 2))),
    "ltx": ("ltx", ltx_config.LTXConfig(
        latent_channels=16, patch_size=4,
        encoder=(_res(8), _B("down", 8, 8, layers=0), _B("res_xy", 8, 16, layers=0), _res(16),
                 _B("down", 16, 16, layers=0), _B("res_xy", 16, 32, layers=0), _res(32), _B("down", 32, 32, layers=0),
                 _res(32), _res(32)),
        encoder_out=17,
        decoder=(_res(32), _res(32), _B("up", 32, 32, layers=0), _res(32), _B("res_xy", 32, 16, layers=0),
                 _B("up", 16, 16, layers=0), _res(16), _B("res_xy", 16, 8, layers=0), _B("up", 8, 8, layers=0), _res(8)),
        timestep_conditioning=False, causal_decoder=False, decoder_spatial_pad="reflect", encoder_spatial_pad="zeros",
        version="0.9.0")),
    "ltx2": ("ltx", ltx_config.LTXConfig(
        latent_channels=16, patch_size=4, encoder=_ltx_encoder_23(), encoder_out=17,
        decoder=(_res(64), _B("up", 64, 32, layers=0), _res(32), _B("up", 32, 32, layers=0), _res(32),
                 _B("up", 32, 16, layers=0, stride=(2, 1, 1)), _res(16), _B("up", 16, 8, layers=0, stride=(1, 2, 2)),
                 _res(8)),
        timestep_conditioning=False, causal_decoder=False, decoder_spatial_pad="zeros", encoder_spatial_pad="zeros",
        version="2.3", sources=_LTX2_SOURCES)),
    "hunyuan_video": ("hunyuan_video", hunyuan_video.HunyuanVideoConfig(
        widths=(32, 32, 32, 32), layers_per_block=1, latent_channels=16,
        down=((1, 2, 2), (2, 2, 2), (2, 2, 2), None), up=(None, (2, 2, 2), (2, 2, 2), (1, 2, 2)))),
    "magvit": ("magvit", magvit.MagvitConfig(widths=(32, 32, 32, 32), layers_per_block=1, latent_channels=16,
                                             mid_attention=False)),
    "wan": ("wan", wan.WanConfig(latent_channels=16, enc_base=8, enc_widths=(8, 16, 32, 32), dec_mid=32,
                                 dec_widths=(8, 16, 32, 32), dec_up=(0, 8, 16, 16), temporal=(False, True, True))),
    "hunyuan_video15": ("hunyuan_video15", hunyuan_video15.HunyuanVideo15Config(
        widths=(8, 16, 32, 64, 64), layers_per_block=1, latent_channels=32,
        down=(hunyuan_video15.Resample(16, False), hunyuan_video15.Resample(32, False),
              hunyuan_video15.Resample(64, True), hunyuan_video15.Resample(64, True), None),
        up=(None, hunyuan_video15.Resample(8, False), hunyuan_video15.Resample(16, False),
            hunyuan_video15.Resample(32, True), hunyuan_video15.Resample(64, True)))),
    "ltx_diffusion": ("ltx_diffusion", ltx_diffusion.DiffusionConfig(
        encoder=ltx_config.LTXConfig(latent_channels=16, patch_size=4, encoder=_ltx_encoder_23(), encoder_out=17, log_var="constant",
                                     decoder=(), timestep_conditioning=False, causal_decoder=False,
                                     decoder_spatial_pad="reflect", encoder_spatial_pad="zeros", version="2.3"),
        latent_channels=16,
        stages=(ltx_diffusion.Stage(64, 1, 256, (3, 7, 7), (1, 2, 2), 32),
                ltx_diffusion.Stage(32, 1, 128, (3, 7, 7), (2, 1, 1), 16),
                ltx_diffusion.Stage(16, 1, 64, (3, 5, 5), (2, 2, 2), 16),
                ltx_diffusion.Stage(16, 1, 64, (3, 5, 5), (2, 2, 2), 8)),
        width=8, depth=2, hidden=32, kernel=(11, 11, 11), head_dim=8, time_dim=384, chunks=7, patch_size=4,
        out_channels=3, steps=1, timestep_scale=1000.0, output="x0")),
    "seedvr2": ("seedvr2", seedvr2.SeedVR2Config(widths=(32, 32, 32, 32), layers_per_block=1, latent_channels=16,
                                                 temporal=(False, True, True))),
    "minimax": ("minimax", minimax.MiniMaxConfig(latent_channels=24, enc_widths=(32,) * 6, enc_blocks=1,
                                                 enc_down=(True, True, True, True, False, False), dec_dim=128,
                                                 dec_depth=2, dec_ff=512, registers=4, patch=16, quantized=(),
                                                 tile=256, min_overlap=64)),
    "cogvideox": ("cogvideox", cogvideox.CogVideoXConfig(widths=(32, 32, 32, 32), layers_per_block=1,
                                                         latent_channels=16)),
    "taehv": ("taehv", taehv.TAEHVConfig(latent_channels=16, patch=1, encoder_width=8, encoder_time=(2, 2, 1),
                                         decoder="base", decoder_widths=(16, 8, 8, 8), decoder_space=(2, 2, 2),
                                         decoder_time=(1, 2, 2), act="relu", scale=1.0, shift=0.0,
                                         value_range=(0.0, 1.0), space="lighttaew2_1",
                                         space_source=_TAEHV_SOURCE)),
    "taeh3": ("taehv", taehv.TAEHVConfig(latent_channels=24, patch=2, encoder_width=8, encoder_time=(2, 2, 1),
                                         decoder="base", decoder_widths=(16, 8, 8, 8), decoder_space=(2, 2, 2),
                                         decoder_time=(1, 2, 2), act="relu", scale=1.0, shift=0.0,
                                         value_range=(0.0, 1.0), space="taeh3", space_source=_TAEHV_SOURCE)),
    "svd": ("svd", svd.SVDConfig(ch=32, ch_mult=(1, 1, 1, 1), num_res_blocks=2, z_channels=4, embed_dim=4)),
    "cosmos": ("cosmos", cosmos.CosmosConfig(widths=(8, 16, 16), decoder_widths=(8, 16, 16), base=8, layers_per_block=1,
                                             latent_channels=16, patch=4, resample_levels=1, statistics="published",
                                             stat_frames=16)),
    "hunyuan_image": ("hunyuan_image", hunyuan_image.HunyuanImageConfig(
        widths=(32, 32, 64, 64, 128, 128), layers_per_block=1, latent_channels=64, dims=2,
        down=(_HI(32, False), _HI(64, False), _HI(64, False), _HI(128, False), _HI(128, False), None),
        up=(None, _HI(32, False), _HI(32, False), _HI(64, False), _HI(64, False), _HI(128, False)))),
}

PUBLISHED = {
    "wan": ("wan", wan.WanConfig(latent_channels=16, enc_base=96, enc_widths=(96, 192, 384, 384), dec_mid=384,
                                 dec_widths=(96, 192, 384, 384), dec_up=(0, 96, 192, 192),
                                 temporal=(False, True, True))),
    "kl": ("kl", kl.KLConfig(ch=128, ch_mult=(1, 2, 4, 4), num_res_blocks=2, z_channels=4, embed_dim=4)),
}


def spec(family_id: str):
    return next(s for s in registry.REGISTRY if s.id == family_id)


def build(entry: tuple, device="cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
          init_dtype: Optional[torch.dtype] = None) -> VAE:
    """A handle on ``device`` in ``dtype`` with random weights (the modules' own initialisation) drawn on
    ``device`` under ``seed``; ``init_dtype`` (default float32) is the dtype they are drawn in."""
    family_id, config = entry
    s = spec(family_id)
    device = torch.device(device)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(init_dtype or torch.float32)
    try:
        with torch.device(device):
            model = s.build(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval().requires_grad_(False)
    _statistics(model)
    return VAE(s, config, model, dtype, device, source=f"random weights (seed {seed})")


def _statistics(model: torch.nn.Module) -> None:
    """Tensors a file always carries, which the modules leave empty or at the identity: per-channel
    latent statistics (LTX; BatchNorm's start as the identity) drawn as the tests draw them (means
    around 0, standard deviations in 0.5..1.5); LTX's timestep tables as diffusers draws them (randn /
    sqrt(width)), its noise scales as the tests do (randn * 0.1), its timestep multiplier the published 1000."""
    with torch.no_grad():
        for name, t in [*model.named_buffers(), *model.named_parameters()]:
            leaf = name.rpartition(".")[2]
            if not t.is_floating_point() or t.device.type == "meta":
                continue
            if "scale_shift_table" in leaf:
                t.copy_(torch.randn(t.shape, device=t.device) / t.shape[-1] ** 0.5)
            elif leaf.startswith("per_channel_scale"):
                t.copy_(torch.randn(t.shape, device=t.device) * 0.1)
            elif leaf == "timestep_scale_multiplier":
                t.fill_(1000.0)
            elif "std" in leaf or "var" in leaf:
                t.copy_(torch.rand(t.shape, device=t.device) + 0.5)
            elif "mean" in leaf:
                t.copy_(torch.randn(t.shape, device=t.device) * 0.5)
