"""Helpers shared by the tests: the pack imported as a package, tiny reference models."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def load_pack():
    """Import the repo root as the package 'vaekit', as ComfyUI imports a custom node folder."""
    if "vaekit" in sys.modules:
        return sys.modules["vaekit"]
    spec = importlib.util.spec_from_file_location("vaekit", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vaekit"] = mod
    spec.loader.exec_module(mod)
    return mod


def jitter_norms(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Random GroupNorm affine parameters, so a parity test also checks the norms' weights."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def diffusers_kl(latent_channels: int = 4, quant: bool = True, widths=(32, 64), layers: int = 1):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    n = len(widths)
    m = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=tuple(widths), layers_per_block=layers,
        latent_channels=latent_channels, norm_num_groups=32, use_quant_conv=quant, use_post_quant_conv=quant)
    return jitter_norms(m).eval()


def diffusers_tiny(latent_channels: int = 4, width: int = 16):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    return diffusers.AutoencoderTiny(
        encoder_block_out_channels=(width,) * 4, decoder_block_out_channels=(width,) * 4,
        num_encoder_blocks=(1, 2, 2, 2), num_decoder_blocks=(2, 2, 2, 1),
        latent_channels=latent_channels).eval()
