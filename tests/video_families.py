"""Tiny video VAEs (random weights; diffusers' where it has the class) for the tests that run every
family the same way: detection across families, handle-level tiling thresholds, the nodes and the
workflows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch

import ltx_diffusion_common
from helpers import jitter_norms

@dataclass(frozen=True)
class Row:
    """One family in the shared harness: its spatial and temporal ratios, the spec that must detect
    it, and the smallest reference model with the family's real structure (all resamplers present)
    whose state dict our loader reads (diffusers where it has the class)."""
    ratios: tuple[int, int]
    reference: Callable[[], torch.nn.Module]
    spec_id: Optional[str] = None          # default: the row's name
    # the family tiles as part of its definition (Capabilities.own_tiling): tile sizes a call gives
    # are not used, so the shared tests of user tiles do not apply (its own tests cover its tiles)
    own_tiles: bool = False
    # the reference's Gaussian posterior of pixels in 0..1, (mean, log-variance) in the LATENT's terms
    # (``posterior(reference, x)``); None where the reference gives none to compare with
    posterior: Optional[Callable[[torch.nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = None


def _diffusers():
    return pytest.importorskip("diffusers")


def diffusers_posterior(ref: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """diffusers' ``latent_dist`` (mean and the clamped log-variance) of one pass over the clip, for a
    family whose LATENT is the raw posterior mean (the tiny LTX rows keep diffusers' identity statistics)."""
    for flag in ("use_framewise_encoding", "use_tiling", "use_slicing"):
        if hasattr(ref, flag):
            setattr(ref, flag, False)
    with torch.no_grad():
        dist = ref.encode(x * 2 - 1).latent_dist
    return dist.mean, dist.logvar


class _InLayout(torch.nn.Module):
    """One of our models whose ``state_dict()`` is in a file layout users have (``convert``: canonical ->
    that layout): the reference of a family that diffusers does not implement."""

    def __init__(self, model: torch.nn.Module, convert: Callable[[dict], dict]):
        super().__init__()
        self.model, self._convert = model, convert

    def state_dict(self, *args, **kwargs):
        return self._convert(self.model.state_dict(*args, **kwargs))


def _seedvr2():
    """diffusers has no SeedVR2 class (and core's is fixed at the published widths): OUR model, random
    weights, saved in core's layout (the original's names). So this row checks our loader, engines and
    detection, not parity: that is bench/comfyui_checks/compare_core.py --family seedvr2, against core."""
    from vae.archs import seedvr2, seedvr2_layout
    cfg = seedvr2.SeedVR2Config(widths=(32, 32, 32, 32), layers_per_block=1, temporal=(False, True, True))
    return _InLayout(seedvr2.SeedVR2VAE(cfg), seedvr2_layout.to_original)


def _svd():
    """diffusers' SVD VAE, narrow; 2 resnets a level as published (diffusers' mid block has one resnet and
    no attention otherwise). Its mix factors start at 0, an even merge under which the image and
    temporal halves could be swapped unseen: random here, seeded."""
    m = _diffusers().AutoencoderKLTemporalDecoder(block_out_channels=(32,) * 4, layers_per_block=2,
                                                  down_block_types=("DownEncoderBlock2D",) * 4)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("mix_factor"):
                p.copy_(2 * torch.randn(p.shape, generator=g))
    return m


def _hunyuan_video():
    m = _diffusers().AutoencoderKLHunyuanVideo(block_out_channels=(32, 32, 32, 32), layers_per_block=1)
    m.use_framewise_decoding = m.use_framewise_encoding = False
    return m


def _minimax():
    """Its layer scales and register tokens start at zero in diffusers (the blocks would add nothing):
    random here, seeded, so the ViT's blocks are in every comparison."""
    m = _diffusers().AutoencoderKLMiniMaxH3(
        block_out_channels=(32,) * 6, layers_per_block=1, decoder_num_layers=2, decoder_num_attention_heads=2,
        decoder_attention_head_dim=64)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("scale1", "scale2", "register_tokens")):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return m


def taehv_model(cfg, seed: int = 0) -> torch.nn.Module:
    """OUR TAEHV model at ``cfg``, weights randn / sqrt(fan-in) (PyTorch's default init fades to black
    through the ReLU stacks: a random decoder would give flat frames that hide seams), the decoder's
    head scaled so frames sit mostly inside the pixel range rather than clamped."""
    from vae.archs import taehv
    m = taehv.TAEHV(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p[0].numel() if p.dim() > 1 else 10) ** 0.5)
        if cfg.has_decoder:
            head = m.decoder[-1]
            head.weight.mul_(0.4)
            head.bias.add_(sum(cfg.value_range) / 2)
    return m.eval()


def _taehv(latent: int, patch: int, **published):
    """No other implementation has these widths (core's and the original's are fixed at the published
    ones): ours, narrow, in the original's layout (= core's; canonical). Parity: tests/vae/test_taehv.py
    (the original taehv.py) and bench/comfyui_checks/compare_core.py --family taehv (core)."""
    from vae.archs import taehv
    cfg = taehv.TAEHVConfig(latent, patch=patch, encoder_width=8, decoder_widths=(16, 8, 8, 8), **published)
    return _InLayout(taehv_model(cfg), dict)


# Adding a family to every shared test is one row here.
ROWS: dict[str, Row] = {
    "mochi": Row((8, 6), lambda: _diffusers().AutoencoderKLMochi(
        encoder_block_out_channels=(32, 32, 32, 64), decoder_block_out_channels=(32, 32, 32, 64),
        layers_per_block=(1,) * 5), posterior=diffusers_posterior),
    "ltx": Row((32, 8), lambda: _diffusers().AutoencoderKLLTXVideo(
        latent_channels=16, block_out_channels=(8, 16, 32, 32), decoder_block_out_channels=(8, 16, 32, 32),
        layers_per_block=(1,) * 5, decoder_layers_per_block=(1,) * 5), posterior=diffusers_posterior),
    # LTX-2.3's shape (time-only and space-only up-samplers), published flags; LTX-2 extends the
    # LTX-Video family: one spec, its versions told apart by their shapes
    "ltx2": Row((32, 8), lambda: _diffusers().AutoencoderKLLTX2Video(
        latent_channels=16, block_out_channels=(8, 16, 32, 32), layers_per_block=(1,) * 5,
        decoder_block_out_channels=(16, 32, 32, 64), decoder_layers_per_block=(1,) * 5,
        decoder_spatio_temporal_scaling=(True,) * 4, decoder_inject_noise=(False,) * 5,
        upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"), upsample_residual=(False,) * 4,
        upsample_factor=(2, 2, 1, 2), decoder_causal=False, decoder_spatial_padding_mode="zeros",
        spatial_compression_ratio=32, temporal_compression_ratio=8), spec_id="ltx", posterior=diffusers_posterior),
    "hunyuan_video": Row((8, 4), _hunyuan_video, posterior=diffusers_posterior),
    "magvit": Row((8, 4), lambda: _diffusers().AutoencoderKLMagvit(block_out_channels=(32, 32, 32, 32),
                                                                   layers_per_block=1), posterior=diffusers_posterior),
    # Wan 2.1's published structure, narrow
    "wan": Row((8, 4), lambda: _diffusers().AutoencoderKLWan(base_dim=8, z_dim=16), posterior=diffusers_posterior),
    # the published structure (5 levels), narrow
    "hunyuan_video15": Row((16, 4), lambda: _diffusers().AutoencoderKLHunyuanVideo15(
        block_out_channels=(8, 16, 32, 64, 64), layers_per_block=1), posterior=diffusers_posterior),
    # LTX-2.5: LTX-2.3's encoder beside the diffusion decoder (4 + 1 stages), narrow, published windows;
    # its encoder's log-variance is the constant -30 (ComfyUI's config), not diffusers' uniform channel
    "ltx_diffusion": Row((32, 8), lambda: ltx_diffusion_common.reference(), posterior=ltx_diffusion_common.posterior),
    # the published structure (4 levels, time resampled in the middle two), narrow; not diffusers (see _seedvr2)
    "seedvr2": Row((8, 4), _seedvr2),
    # the published structure (6 encoder levels, 4 of them down-sampling), 32 wide (GroupNorm's 32
    # groups), and a 2-block ViT of 2 heads of 64
    "minimax": Row((16, 4), _minimax, own_tiles=True),
    # the published structure (4 levels, time resampled on the outer two), 32 wide (GroupNorm's 32 groups)
    "cogvideox": Row((8, 4), lambda: _diffusers().AutoencoderKLCogVideoX(block_out_channels=(32,) * 4,
                                                                         layers_per_block=1),
                     posterior=diffusers_posterior),
    # the TAEHV family at Wan 2.1's / HunyuanVideo's shapes (16 channels, 8x/4x), narrow; and taeh3 (MiniMax
    # H3's 24 channels, 2x2 patches), whose units are H3's clips
    "taehv": Row((8, 4), lambda: _taehv(16, 1)),
    "taeh3": Row((16, 4), lambda: _taehv(24, 2), spec_id="taehv", own_tiles=True),
    # the published structure (4 levels, 2 resnets each, temporal resnets and output conv), 32 wide; no
    # temporal compression; its LATENT keeps a clip's frames in the batch (Capabilities.frames_in_batch)
    "svd": Row((8, 1), _svd),
    # the published structure (3 levels; space and time halved on the first, doubled on the decoder's
    # mirror of it: 4x wavelet patch x 2 = 8x8x8), narrow
    "cosmos": Row((8, 8), lambda: _diffusers().AutoencoderKLCosmos(
        encoder_block_out_channels=(8, 8, 16, 16), decode_block_out_channels=(8, 16, 16, 16), num_layers=1)),
}
FAMILIES = tuple(ROWS)
RATIOS = {name: row.ratios for name, row in ROWS.items()}
SPEC_IDS = {name: row.spec_id for name, row in ROWS.items() if row.spec_id}
OWN_TILES = tuple(name for name, row in ROWS.items() if row.own_tiles)
USER_TILED = tuple(name for name in FAMILIES if name not in OWN_TILES)


def tiny_reference(family: str) -> torch.nn.Module:
    """The row's reference model, seeded, norms jittered (so a norm's affine is not the identity)."""
    torch.manual_seed(0)
    return jitter_norms(ROWS[family].reference()).eval()


def tiny_state_dict(family: str) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in tiny_reference(family).state_dict().items()}
