"""What the LTX-2.5 diffusion VAE tests share: the reference file (diffusers' LTX-2 encoder beside diffusers'
diffusion decoder, random weights), the original (ComfyUI) layout rebuilt from the conversion script's
renames, and a stand-in for the neighbourhood attention diffusers calls.

diffusers runs neighbourhood attention through NATTEN (GPU only, fetched from the Hub) or FlexAttention,
whose eager path (no torch.compile, as on this CPU) materialises the score matrix of the whole clip
(hundreds of GiB at the published config). The stand-in keeps diffusers' projections, norms and rotary
embedding (``attn.project_qkv``) and its output projection, and computes the attention itself by
brute force: each query's window gathered by index, softmax in float64. Written from NATTEN's rule
(``start = clamp(i - k // 2, 0, n - k)``, kernels clamped to the axis), independently of
vae/nn/neighborhood.py; bench/comfyui_checks/compare_core.py --family ltx_diffusion checks it against ComfyUI's
``comfy_kitchen.na3d``."""
from __future__ import annotations

import json

import pytest
import torch

from helpers import jitter_norms

LATENT = 16
# LTX-2.3's encoder shape (LTX-2.5 keeps it), narrow, with the flags diffusers' script sets
ENCODER = dict(latent_channels=LATENT, block_out_channels=(8, 16, 32, 32), layers_per_block=(1,) * 5,
               encoder_causal=True, spatial_compression_ratio=32, temporal_compression_ratio=8,
               encoder_spatial_padding_mode="zeros")
DECODER = dict(latent_channels=LATENT, decoder_head_dim=8, decoder_stage_channels=(64, 32, 16, 16, 8),
               decoder_stage_depths=(1, 1, 1, 1, 2))
# the autoencoder's own decoder, unused (the file keeps only its encoder): small
AE_DECODER = dict(decoder_block_out_channels=(8, 8, 8), decoder_layers_per_block=(1,) * 4)
# small windows (a file's metadata carries them): diffusers refuses a grid smaller than its window
SMALL = dict(decoder_stage_kernels=((3, 3, 3),) * 4, decoder_stage5_kernel=(3, 5, 5))
# the original's names where diffusers' differ (its script's RENAMES, reversed) and the fused q/k/v
RENAMES = {"t_embedder.timestep_embedder.linear_1.": "t_embedder.mlp.0.",
           "t_embedder.timestep_embedder.linear_2.": "t_embedder.mlp.2.",
           ".attn.to_out.0.": ".attn.proj.", ".attn.norm_q.": ".attn.q_norm.", ".attn.norm_k.": ".attn.k_norm."}


def _diffusers():
    return pytest.importorskip("diffusers")


class ReferenceFile(torch.nn.Module):
    """One LTX-2.5 VAE file in diffusers' layout: ``encoder.*`` (``AutoencoderKLLTX2Video``'s), ``decoder.*``
    (``LTX2VideoDiffusionDecoderModel``'s) and ``latents_mean`` / ``latents_std``."""

    def __init__(self, encoder: dict = ENCODER, decoder: dict = DECODER, with_encoder: bool = True):
        super().__init__()
        d = _diffusers()
        if with_encoder:      # its encode() is the reference's; its (small) decoder is not part of the file
            ae = d.AutoencoderKLLTX2Video(**{**AE_DECODER, **encoder})
            self.encoder, self.autoencoder = ae.encoder, (ae,)
        self.decoder = d.LTX2VideoDiffusionDecoderModel(**decoder).decoder
        n = decoder.get("latent_channels", 128)
        self.register_buffer("latents_mean", torch.zeros(n))
        self.register_buffer("latents_std", torch.ones(n))


def reference(seed: int = 0, **kw) -> ReferenceFile:
    """Random weights, non-trivial statistics, adaLN tables and norm weights."""
    torch.manual_seed(seed)
    m = ReferenceFile(**kw)
    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        m.latents_mean.copy_(torch.randn(m.latents_mean.shape, generator=g) * 0.5)
        m.latents_std.copy_(torch.rand(m.latents_std.shape, generator=g) + 0.5)
        for name, p in m.named_parameters():
            if name.endswith("scale_shift_table"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return jitter_norms(m).eval()


def posterior(ref: ReferenceFile, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The posterior of pixels ``x`` (0..1) in LATENT terms: diffusers' mean normalised by the statistics;
    the log-variance is the constant -30 (ComfyUI's LTX-2.5 config: ``latent_log_var`` "constant", the
    encoder's last channel dropped; diffusers' class knows only a uniform channel) divided by std^2."""
    with torch.no_grad():
        mean = ref.autoencoder[0].encode(x * 2 - 1).latent_dist.mean
    m, s = (v.view(1, -1, 1, 1, 1) for v in (ref.latents_mean, ref.latents_std))
    return (mean - m) / s, (-30.0 - 2 * s.log()).expand_as(mean)


def diffusers_state_dict(m: torch.nn.Module) -> dict:
    return {k: v.contiguous() for k, v in m.state_dict().items()}


def original_layout(diffusers_sd: dict) -> dict:
    """The shipped checkpoint's / ComfyUI's names, from diffusers' (its conversion script run backwards):
    q/k/v fused, the renames reversed, the statistics as ``per_channel_statistics``, the encoder in
    LTX's original layout (ltx_common)."""
    from ltx_common import original_layout as ltx_original
    from vae.archs import ltx_layout
    out, parts = {}, {}
    for k, v in diffusers_sd.items():
        if not k.startswith("decoder."):
            continue
        for a, b in RENAMES.items():
            k = k.replace(a, b)
        for which in "qkv":
            if f".attn.to_{which}." in k:
                parts.setdefault(k.replace(f".attn.to_{which}.", ".attn.qkv."), {})[which] = v
                break
        else:
            out[k] = v
    out.update({k: torch.cat([p[c] for c in "qkv"]) for k, p in parts.items()})
    if any(k.startswith("encoder.") for k in diffusers_sd):
        # the encoder through LTX's canonical layout (its own tests hold that conversion to diffusers)
        enc = {k: v for k, v in diffusers_sd.items() if k.startswith("encoder.") or k.startswith("latents_")}
        canonical = ltx_layout.to_canonical(enc)
        out.update({k: v for k, v in ltx_original(canonical).items() if k.startswith("encoder.")})
    out["per_channel_statistics.mean-of-means"] = diffusers_sd["latents_mean"]
    out["per_channel_statistics.std-of-means"] = diffusers_sd["latents_std"]
    for extra in ("mean-of-stds", "mean-of-stds_over_std-of-means", "channel"):
        out[f"per_channel_statistics.{extra}"] = torch.zeros_like(diffusers_sd["latents_mean"])
    return out


def metadata(decoder: dict = None, encoder: dict = None, **top) -> dict:
    """Safetensors metadata as the shipped file carries it (ComfyUI reads ``config`` -> ``vae``)."""
    vae_cfg = {"_class_name": "CausalDiffusionVAE", "model_output_type": "x0", **top}
    if decoder:
        vae_cfg["decoder"] = decoder
    if encoder:
        vae_cfg["encoder"] = encoder
    return {"config": json.dumps({"vae": vae_cfg})}


SMALL_METADATA = dict(stage_kernels=[[3, 3, 3]] * 4, stage5_kernel=[3, 5, 5])


# ---- the stand-in for diffusers' neighbourhood attention ------------------------------------------

def _windows(n: int, k: int) -> torch.Tensor:
    """[n, k]: the positions each query's window holds along one axis."""
    k = min(k, n)
    return torch.tensor([[min(max(i - k // 2, 0), n - k) + j for j in range(k)] for i in range(n)])


def brute_na(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel) -> torch.Tensor:
    """q/k/v [B, T, H, W, heads, dim] (queries pre-scaled) -> each query's attention over its window,
    one (frame, row) of queries at a time, in float64."""
    _, t_n, h_n, w_n = q.shape[:4]
    it, ih, iw = (_windows(n, kk) for n, kk in zip((t_n, h_n, w_n), kernel))
    out = torch.empty_like(q)
    for t in range(t_n):
        for y in range(h_n):
            keys = k[:, it[t]][:, :, ih[y]][:, :, :, iw].double()        # [B, kt, kh, W, kw, heads, dim]
            vals = v[:, it[t]][:, :, ih[y]][:, :, :, iw].double()
            keys, vals = (x.permute(0, 3, 1, 2, 4, 5, 6).flatten(2, 4) for x in (keys, vals))   # [B, W, n, h, d]
            w = torch.einsum("bwhd,bwnhd->bwhn", q[:, t, y].double(), keys).softmax(-1)
            out[:, t, y] = torch.einsum("bwhn,bwnhd->bwhd", w, vals).to(q.dtype)
    return out


class BruteProcessor:
    """diffusers' attention processor interface: its q/k/v (``project_qkv``), brute-force neighbourhood
    attention, its output projection."""

    def __call__(self, attn, hidden_states, block_mask=None):
        q, k, v = attn.project_qkv(hidden_states)
        return attn.to_out[0](brute_na(q, k, v, attn.kernel_size).flatten(-2))


def use_brute_attention(model: torch.nn.Module) -> torch.nn.Module:
    for m in model.modules():
        if hasattr(m, "project_qkv") and hasattr(m, "set_processor"):
            m.set_processor(BruteProcessor())
    return model
