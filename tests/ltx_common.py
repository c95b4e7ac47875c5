"""What the LTX-Video (0.9.x) and LTX-2 tests share: random per-channel statistics, the Lightricks
original / ComfyUI key layout rebuilt from ComfyUI's and Lightricks' source facts (independent of
ltx_layout.to_original), and diffusers' conversion-script renames applied as the scripts apply them."""
from __future__ import annotations

import json
import re

import torch

from helpers import jitter_norms
from vae import run
from vae.archs import ltx_layout


def randomize(m: torch.nn.Module, latent: int) -> torch.nn.Module:
    """Non-trivial statistics and noise scales (both default to no-ops) and norm weights."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        m.latents_mean.copy_(torch.randn(latent, generator=g) * 0.5)
        m.latents_std.copy_(torch.rand(latent, generator=g) + 0.5)
        for name, p in m.named_parameters():
            if "per_channel_scale" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return jitter_norms(m).eval()


LTX2_LATENT = 8
# what diffusers' scripts/convert_ltx2_to_diffusers.py sets and its defaults do not (they say causal
# decoder and compute 64x / 16x compression from four stride-2 stages)
LTX2_FLAGS = dict(decoder_causal=False, encoder_causal=True, spatial_compression_ratio=32,
                  temporal_compression_ratio=8, encoder_spatial_padding_mode="zeros")
LTX2_DEC_23 = dict(decoder_spatio_temporal_scaling=(True,) * 4, decoder_inject_noise=(False,) * 5,
                   upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
                   upsample_residual=(False,) * 4, upsample_factor=(2, 2, 1, 2), decoder_spatial_padding_mode="zeros")
# LTX-2 / LTX-2.3 at the published flags, narrow (tests/vae/test_ltx2.py)
LTX2_TINY = {
    "2.0": dict(block_out_channels=(8, 16, 32, 64), layers_per_block=(1,) * 5, decoder_block_out_channels=(16, 32, 64),
                decoder_layers_per_block=(1,) * 4, decoder_spatial_padding_mode="reflect", **LTX2_FLAGS),
    "2.3": dict(block_out_channels=(8, 16, 32, 32), layers_per_block=(1,) * 5,
                decoder_block_out_channels=(16, 32, 32, 64), decoder_layers_per_block=(1,) * 5, **LTX2_DEC_23,
                **LTX2_FLAGS),
}
LTX2_TINY["2.0t"] = dict(LTX2_TINY["2.0"], timestep_conditioning=True)      # a timestep-conditioned LTX-2 decoder


def ltx2_reference(version: str, **kw):
    """diffusers' LTX-2 VAE of ``version``'s tiny structure (``kw`` changed), statistics and norms random."""
    from diffusers import AutoencoderKLLTX2Video     # a test dependency: imported where a test needs it
    torch.manual_seed(0)
    return randomize(AutoencoderKLLTX2Video(latent_channels=LTX2_LATENT, **{**LTX2_TINY[version], **kw}), LTX2_LATENT)


def ltx2_metadata(vae_cfg: dict) -> dict:
    """Safetensors metadata as LTX-2 checkpoints carry it: the config of every part, JSON."""
    return {"config": json.dumps({"vae": {"_class_name": "CausalVideoAutoencoder", **vae_cfg},
                                  "audio_vae": {"model": {}}, "vocoder": {}})}


def stats(ref):
    """diffusers' latents_mean / latents_std as 5-D views: its decode takes z * std + mean."""
    return ref.latents_mean.view(1, -1, 1, 1, 1), ref.latents_std.view(1, -1, 1, 1, 1)


def original_layout(canonical: dict) -> dict:
    """The Lightricks original / ComfyUI layout: CausalConv3d holds an inner ``conv``, the shortcut is
    a plain 1x1x1 conv, the 0.9.x shortcut LayerNorm sits in a wrapper's ``norm``, and five statistics
    buffers are stored."""
    out = {}
    for k, v in canonical.items():
        if re.search(r"(conv_in|conv_out|conv1|conv2|down_blocks\.\d+|\.conv)\.(weight|bias)$", k):
            k = re.sub(r"\.(weight|bias)$", r".conv.\1", k)
        out[k.replace(".norm3.", ".norm3.norm.")] = v
    n = canonical[ltx_layout.STD].shape[0]
    for extra in ("mean-of-stds", "mean-of-stds_over_std-of-means", "channel"):
        out[f"per_channel_statistics.{extra}"] = torch.zeros(n)
    return out


def script_rename(original: dict, table: dict) -> set[str]:
    """diffusers' scripts/convert_ltx*_to_diffusers.py: str.replace in dict order; the scripts drop
    the statistics the VAE does not use."""
    out = set()
    for k in original:
        if k.startswith(ltx_layout.STATS) and k not in (ltx_layout.MEAN, ltx_layout.STD):
            continue
        for a, b in table.items():
            k = k.replace(a, b)
        out.add(k)
    return out


def meta_state_dict(cls, **kw) -> dict:
    with torch.device("meta"):
        return cls(**kw).state_dict()


def assert_encoder_streams(model) -> None:
    """Causal encoder: 1 + 8 frames, then 8 at a time, give the latents of one pass."""
    x = torch.rand(1, 3, 25, 32, 32) * 2 - 1
    with torch.no_grad():
        whole = model.encode(x)
        with run.stream():
            parts = [model.encode(x[:, :, a:b]) for a, b in ((0, 9), (9, 17), (17, 25))]
    assert [p.shape[2] for p in parts] == [2, 1, 1]
    assert (torch.cat(parts, 2) - whole).abs().max() <= 1e-5
