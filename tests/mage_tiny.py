"""Tiny Mage-VAE weights for the tests (random, seeded), in the key layouts users have.

No reference implementation is installable in CI (ComfyUI core has the class, diffusers only in an
open pull request), so the weights come from our own model at a tiny config;
bench/comfyui_checks/compare_core.py --family mage checks the published config against core. Every 1-D parameter (norm affines, biases) is random too,
so a norm read as the identity or a bias dropped cannot pass unnoticed."""
from __future__ import annotations

import torch

from vae.archs import mage

# the published structure (2 plain + n modulated DiCo blocks, CoD resnet/attention/resnet/attention/resnet,
# pixel MLP blocks), narrow; patch 4 keeps images small (16 in the published file)
COD = ("resnet", "attention", "resnet", "attention", "resnet")
TINY = dict(latent=16, patch=4, hidden=32, head=32, ffn=64, pixel=8, blocks=2, pixel_blocks=2, freqs=4, freq=32)
PUBLISHED = dict(latent=128, patch=16, hidden=384, head=768, ffn=1536, pixel=32, blocks=21, pixel_blocks=3,
                 freqs=8, freq=256)
TEMPLATE_FILE = "mage_flow_vae_bf16.safetensors"       # what the official Mage-Flow templates load


def config(encoder: bool = True, decoder: bool = True, **kw) -> mage.MageConfig:
    c = {**TINY, **kw}
    enc = mage.EncoderConfig(image_channels=3, patch=c["patch"], head=c["head"], head_blocks=2, head_ffn=2 * c["head"],
                             hidden=c["hidden"], blocks=c["blocks"], ffn=c["ffn"], out_channels=2 * c["latent"],
                             freq=c["freq"])
    dec = mage.DecoderConfig(image_channels=3, patch=c["patch"], bottleneck=c["latent"], hidden=c["hidden"],
                             blocks=c["blocks"], ffn=c["ffn"], pixel=c["pixel"], pixel_blocks=c["pixel_blocks"],
                             freqs=c["freqs"], freq=c["freq"], cod=COD)
    return mage.MageConfig(c["latent"], enc if encoder else None, dec if decoder else None)


def model(seed: int = 0, **kw) -> mage.MageVAE:
    torch.manual_seed(seed)
    m = mage.MageVAE(config(**kw))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1:         # biases around 0, norm scales around 1
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
    return m.eval()


def canonical(seed: int = 0, **kw) -> dict[str, torch.Tensor]:
    """Core's in-memory layout (``dconv_encoder.*``, ``decoder_model.*``)."""
    return {k: v.contiguous() for k, v in model(seed, **kw).state_dict().items()}


def file_layout(sd: dict, anchor: bool = False) -> dict[str, torch.Tensor]:
    """The original checkpoint's / ComfyUI file's names; ``anchor``: with the Flux.2 encoder the CoD
    decoder was trained against (``pipeline.y_embedder.{encoder,bottleneck}``), which loaders drop."""
    out = {}
    for k, v in sd.items():
        if k.startswith("dconv_encoder."):
            out["student." + k] = v
        else:
            out["pipeline." + k[len("decoder_model."):]] = v
    if anchor and any(k.startswith("pipeline.") for k in out):
        g = torch.Generator().manual_seed(7)
        out["pipeline.y_embedder.encoder.conv_in.weight"] = torch.randn(8, 3, 3, 3, generator=g)
        out["pipeline.y_embedder.encoder.conv_in.bias"] = torch.randn(8, generator=g)
        out["pipeline.y_embedder.bottleneck.weight"] = torch.randn(4, 8, 1, 1, generator=g)
    return out


def diffusers_pr_layout(sd: dict) -> dict[str, torch.Tensor]:
    """diffusers pull request #14295 (AutoencoderMageVAE): ``encoder.*`` and ``decoder.*``."""
    return {("encoder." + k[len("dconv_encoder."):] if k.startswith("dconv_encoder.") else
             "decoder." + k[len("decoder_model."):]): v for k, v in sd.items()}


def set_window(v, window: int):
    """Attention windows of ``window`` latent pixels (published: 32, not in the weights), so that a
    tiny latent has several windows and padded ones."""
    for m in v.model.modules():
        if isinstance(m, mage.WindowAttention):
            m.window = window
    return v
