"""The drop-in families of compare_core.py: diffusers' model at its published config with random weights
(seed 0), converted by our library to the layout ComfyUI's files have, loaded by core's Load VAE (its own
detection: ``comfy.sd.VAE``) and by ``vae.load``. Each row adds ``scale``, the least-squares slope of ours on
core after centring (1.0000: the same latent scaling convention). A case with an expected difference (core's
attention without our causal mask) is not parity; its row ``*`` compares it again against core with our causal
attention patched in, which checks that the cause named is the whole difference."""
from __future__ import annotations

import re

import torch

from harness.comfy_core import CLIP, IO, Case, Family, cases, core_vae

SEED = 0
LTX_091 = dict(decoder_block_out_channels=(256, 512, 1024), decoder_layers_per_block=(5, 6, 7, 8),
               decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(True, True, True, False),
               upsample_residual=(True, True, True), upsample_factor=(2, 2, 2), timestep_conditioning=True)
WAN22 = dict(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, patch_size=2, in_channels=12,
             out_channels=12, scale_factor_spatial=16)
HY_MASK = "expected: core mid-block attention has no causal frame mask"
MOCHI_ATTN = "expected: core encoder attention is not causal"
# family -> the diffusers class and its published config (its defaults unless given)
SOURCES = {"mochi": ("AutoencoderKLMochi", {}), "ltx": ("AutoencoderKLLTXVideo", {}),
           "ltx-0.9.1": ("AutoencoderKLLTXVideo", LTX_091), "hunyuan_video": ("AutoencoderKLHunyuanVideo", {}),
           "wan": ("AutoencoderKLWan", {}), "wan2.2": ("AutoencoderKLWan", WAN22),
           "qwen21": ("AutoencoderKLQwenImage21", {})}
# ComfyUI wraps each causal conv of HunyuanVideo 1.0 in a module whose own conv is `.conv`
HY_WRAP = re.compile(r"\.(conv_in|conv_out|conv1|conv2|nin_shortcut|downsample\.conv|upsample\.conv)\.(weight|bias)$")
# an image VAE's IMAGE batch [B, H, W, 3] is B images (CLIP's is one clip's frames)
IMAGES = IO(CLIP.core_decode, lambda v, x: v.encode(x.movedim(1, -1)), CLIP.ours_decode, CLIP.ours_encode)
# core draws LTX 0.9.1's latent noise mix unseeded: off on both sides (its injected noise scales are zeroed)
NO_NOISE = IO(lambda v, z: v.decode(z, vae_options={"noise_scale": 0.0}).movedim(-1, 1), CLIP.core_encode,
              lambda h, z: h.decode(z, noise_scale=0.0), CLIP.ours_encode)


def comfy_weights(family: str, cls: str, kwargs: dict) -> dict:
    """diffusers' ``cls`` at ``kwargs``, seed 0, in the layout ComfyUI's files of ``family`` have."""
    import diffusers
    import vae
    torch.manual_seed(SEED)
    ref = getattr(diffusers, cls)(**kwargs).eval()
    sd = ref.state_dict()
    del ref
    if family.startswith("ltx"):                 # non-trivial per-channel statistics
        g = torch.Generator().manual_seed(SEED + 1)
        sd["latents_mean"] = torch.randn(sd["latents_mean"].shape, generator=g) * 0.5
        sd["latents_std"] = torch.rand(sd["latents_std"].shape, generator=g) + 0.5
    canonical = vae.from_state_dict(sd).state_dict()
    del sd
    if family == "mochi":                        # canonical = genmo's layout with ComfyUI's prefixes
        return canonical
    if family == "hunyuan_video":
        return {HY_WRAP.sub(r".\1.conv.\2", k): v for k, v in canonical.items()}
    if family.startswith("wan") or family == "qwen21":     # Wan's original names, as ComfyUI's files hold them
        from vae.archs.wan_layout import to_original
        return to_original(canonical, nested=family != "wan")
    from vae.archs.ltx_layout import to_original
    return {k: torch.zeros_like(v) if "per_channel_scale" in k else v for k, v in to_original(canonical).items()}


def causal_core(family: str, model: torch.nn.Module) -> None:
    """Give ComfyUI's attention the causal masking ours has (to check that it is the whole difference)."""
    import torch.nn.functional as F
    if family == "mochi":                        # 1-D temporal attention, q/k/v [B*h*w, heads, t, d]
        import comfy.ldm.genmo.vae.model as genmo

        def attn(q, k, v, heads, skip_reshape=True, **kw):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return o.transpose(1, 2).reshape(o.shape[0], o.shape[2], -1)
        genmo.optimized_attention = attn
        return

    def attn(q, k, v):                           # HunyuanVideo mid-block AttnBlocks, q/k/v [B, C, t, h, w]
        frame = torch.arange(q.shape[2]).repeat_interleave(q[0, 0, 0].numel())
        qkv = [x.reshape(x.shape[0], 1, x.shape[1], -1).transpose(2, 3) for x in (q, k, v)]
        o = F.scaled_dot_product_attention(*qkv, attn_mask=frame[:, None] >= frame[None, :])
        return o.transpose(2, 3).reshape(q.shape)
    for m in model.modules():
        if hasattr(m, "optimized_attention"):
            m.optimized_attention = attn


def scale(ours: torch.Tensor, core: torch.Tensor) -> float:
    """The least-squares slope of ours on core after centring."""
    if ours.shape != core.shape:
        return float("nan")
    o, c = ours - ours.mean(), core - core.mean()
    return ((o * c).sum() / (c * c).sum()).item()


def drop_in(family: str, shapes: dict, tiny: dict, dry_shapes: dict, expected: dict = None, io: IO = CLIP) -> Family:
    """The declaration of a drop-in family: its cases, name -> shape (``comfy_core.cases``), ``expected`` name ->
    the documented difference of that case; ``tiny`` the config and ``dry_shapes`` the inputs of ``--dry``."""
    expected, (cls, kwargs) = expected or {}, SOURCES[family]

    def core_extra(w):
        if any(k in w.inputs for k in expected):
            causal_core(family, w.v.first_stage_model)
            for k in (k for k in expected if k in w.inputs):
                w.out[k + " causal"] = (io.core_decode if k.startswith("decode") else io.core_encode)(w.v, w.inputs[k])

    def case_rows(run, k: str, c: Case):
        ours = run.ours_out(k, c)
        s = scale(ours, run.core[k])
        run.core_row(k, c, ours, "; ".join(n for n in (expected.get(k, ""), f"scale {s:.4f}") if n),
                     parity=k not in expected)
        run.table.rows[-1]["scale"] = s
        if k + " causal" in run.core:
            run.table.add(f"{k} *", ours, run.core[k + " causal"], "*: core with our causal attention patched in",
                          True, c.op)

    return Family(
        title=f"diffusers {cls} (core: its Load VAE's detection), published config, random weights "
              "(seed 0)", cases=cases(shapes), io=io,
        files=lambda run: {f"{family}.safetensors": comfy_weights(family, cls, kwargs)}, core_build=core_vae,
        core_extra=core_extra, case_rows=case_rows,
        dry=lambda: ({f"{family}.safetensors": comfy_weights(family, cls, {**kwargs, **tiny})},
                     cases(dry_shapes)))


# decode shapes are latents [1, C, t, h, w], encode shapes clips [1, 3, T, H, W]
DROP_IN = {
    "mochi": drop_in(
        "mochi", {"decode_t3": (1, 12, 3, 8, 8), "encode_T1": (1, 3, 1, 64, 64), "encode_T13": (1, 3, 13, 64, 64)},
        dict(encoder_block_out_channels=(32, 32, 32, 64), decoder_block_out_channels=(32, 32, 32, 64),
             layers_per_block=(1,) * 5),
        {"decode": (1, 12, 2, 2, 2), "encode": (1, 3, 7, 16, 16)}, expected={"encode_T13": MOCHI_ATTN}),
    "ltx": drop_in(
        "ltx", {"decode_t2": (1, 128, 2, 4, 4), "encode_T9": (1, 3, 9, 128, 128)},
        dict(latent_channels=16, block_out_channels=(8, 16, 32, 32), decoder_block_out_channels=(8, 16, 32, 32),
             layers_per_block=(1,) * 5, decoder_layers_per_block=(1,) * 5),
        {"decode": (1, 16, 2, 2, 2), "encode": (1, 3, 9, 64, 64)}),
    "ltx-0.9.1": drop_in(
        "ltx-0.9.1", {"decode_t2": (1, 128, 2, 4, 4)},
        dict(latent_channels=16, block_out_channels=(8, 16, 32, 32), decoder_block_out_channels=(8, 16, 32),
             layers_per_block=(1,) * 5, decoder_layers_per_block=(1,) * 4),
        {"decode": (1, 16, 2, 2, 2), "encode": (1, 3, 9, 64, 64)}, io=NO_NOISE),
    "hunyuan_video": drop_in(
        "hunyuan_video", {"decode_t1": (1, 16, 1, 8, 8), "decode_t3": (1, 16, 3, 8, 8), "encode_T1": (1, 3, 1, 64, 64),
                          "encode_T9": (1, 3, 9, 64, 64)},
        dict(block_out_channels=(32,) * 4, layers_per_block=1),
        {"decode": (1, 16, 2, 2, 2), "encode": (1, 3, 5, 16, 16)},
        expected={"decode_t3": HY_MASK, "encode_T9": HY_MASK}),
    "wan": drop_in(
        "wan", {"decode_t1": (1, 16, 1, 8, 8), "decode_t3": (1, 16, 3, 8, 8), "encode_T1": (1, 3, 1, 64, 64),
                "encode_T9": (1, 3, 9, 64, 64)},
        dict(base_dim=8, z_dim=16), {"decode": (1, 16, 2, 2, 2), "encode": (1, 3, 5, 16, 16)}),
    "wan2.2": drop_in(
        "wan2.2", {"decode_t1": (1, 48, 1, 4, 4), "decode_t3": (1, 48, 3, 4, 4), "encode_T1": (1, 3, 1, 64, 64),
                   "encode_T9": (1, 3, 9, 64, 64)},
        dict(base_dim=8, decoder_base_dim=12, z_dim=12), {"decode": (1, 12, 2, 2, 2), "encode": (1, 3, 5, 32, 32)}),
    # an image VAE: decode shapes are latents [1, C, h, w], encode shapes images [1, 3, H, W]
    "qwen21": drop_in(
        "qwen21", {"decode_8x8": (1, 64, 8, 8), "encode_128x128": (1, 3, 128, 128)},
        dict(base_dim=8, decoder_base_dim=12), {"decode": (1, 64, 2, 2), "encode": (1, 3, 32, 32)}, io=IMAGES),
}
