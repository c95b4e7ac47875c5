"""Drop-in check: does a LATENT decode (and a clip encode) the same through VAEKit's video VAEs as
through ComfyUI core's own VAE code (`comfy.sd.VAE`)?

    python bench/comfyui_checks/compare_comfyui.py --comfyui /path/to/ComfyUI --python /path/to/comfyui/venv/bin/python
    python bench/comfyui_checks/compare_comfyui.py ... --families mochi,ltx,hunyuan_video   # default: these + ltx-0.9.1, magvit

Run it with a python that has torch + diffusers (the weights' source) and this repository. Per family
a diffusers model at its default (published, full-size) config is built with random weights under a
fixed seed (ComfyUI's constructors are fixed-size), converted with our library to the canonical
layout and from there to ComfyUI's layout, and saved with fixed-seed latents/clips to a temp dir.
ComfyUI decodes/encodes them in a subprocess under `--python` (CPU, fp32; this file in --worker
mode), ours in this process from the same file (`vae.load`). Columns: our vs core frame count and
value range, max/mean abs difference (pixels 0..1 for decode, latents for encode), `scale` = the
least-squares slope of ours on core after centring (1.000 = same latent scaling convention), and
a note: `agree` (max diff < 1e-3) or `DIFFER`, with the known cause where one is expected; such a
case gets a second row (op marked `*`) against core with our causal attention patched in, which
checks that the cause named is the whole difference. Core's missing/unexpected keys are reported
(LTX's per_channel_statistics buffers other than the two means/stds are never read and not counted).
LTX gets random per-channel statistics so that its in-VAE latent normalisation is exercised.
`ltx-0.9.1` compares with the latent noise mix off (noise_scale=0, both sides) and the
injected-noise scales zeroed in the weights (ComfyUI draws both unseeded). Magvit/EasyAnimate is
not in ComfyUI core, so there is nothing to compare it with. Wan 2.1 and 2.2 are written in Wan's
original layout (ComfyUI's files); core loads them with its own detection. `qwen21`: Qwen-Image 2.1's
VAE (an image VAE: 4-D latents, RGB images that both sides pad with opaque alpha, RGBA out), in the
same layout with its causal convs 5-D of time size 1; only a core that has its branch in comfy/sd.py
(upstream after 783545f6, e.g. 0.38.1: Wan 2.2's class with temporal_kernel=1) loads it, an older one
is reported as FAILED. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core

ROOT = Path(__file__).resolve().parents[2]
SEED = 0
LTX_091 = dict(decoder_block_out_channels=(256, 512, 1024), decoder_layers_per_block=(5, 6, 7, 8),
               decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(True, True, True, False),
               upsample_residual=(True, True, True), upsample_factor=(2, 2, 2), timestep_conditioning=True)
WAN22 = dict(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, patch_size=2, in_channels=12,
             out_channels=12, scale_factor_spatial=16)
HY_MASK = "expected: core mid-block attention has no causal frame mask"
MOCHI_ATTN = "expected: core encoder attention is not causal"
# family -> diffusers class, kwargs, [(op, shape, expected difference)], ComfyUI vae_options
# decode shapes are latents [C, t, h, w]; encode shapes are clips [T, H, W]
FAMILIES = {
    "mochi": ("AutoencoderKLMochi", {}, [("decode", (12, 3, 8, 8), ""), ("encode", (1, 64, 64), ""),
              ("encode", (13, 64, 64), MOCHI_ATTN)], {}),
    "ltx": ("AutoencoderKLLTXVideo", {}, [("decode", (128, 2, 4, 4), ""), ("encode", (9, 128, 128), "")], {}),
    "hunyuan_video": ("AutoencoderKLHunyuanVideo", {}, [
        ("decode", (16, 1, 8, 8), ""), ("decode", (16, 3, 8, 8), HY_MASK),
        ("encode", (1, 64, 64), ""), ("encode", (9, 64, 64), HY_MASK)], {}),
    "ltx-0.9.1": ("AutoencoderKLLTXVideo", LTX_091, [("decode", (128, 2, 4, 4), "")], {"noise_scale": 0.0}),
    # Wan 2.1 (diffusers' default config is the published one) and Wan 2.2 (its published config)
    "wan": ("AutoencoderKLWan", {}, [("decode", (16, 1, 8, 8), ""), ("decode", (16, 3, 8, 8), ""),
            ("encode", (1, 64, 64), ""), ("encode", (9, 64, 64), "")], {}),
    "wan2.2": ("AutoencoderKLWan", WAN22, [("decode", (48, 1, 4, 4), ""), ("decode", (48, 3, 4, 4), ""),
               ("encode", (1, 64, 64), ""), ("encode", (9, 64, 64), "")], {}),
    # an image VAE: decode shapes are latents [C, h, w], encode shapes images [H, W] (RGB)
    "qwen21": ("AutoencoderKLQwenImage21", {}, [("decode", (64, 8, 8), ""), ("encode", (128, 128), "")], {}),
}
# ComfyUI wraps each causal conv of HunyuanVideo 1.0 in a module whose own conv is `.conv`
HY_WRAP = re.compile(r"\.(conv_in|conv_out|conv1|conv2|nin_shortcut|downsample\.conv|upsample\.conv)\.(weight|bias)$")


def causal_core(family: str, model: torch.nn.Module) -> None:
    """Give ComfyUI's attention the causal masking ours has (to check that it is the whole difference)."""
    import torch.nn.functional as F
    if family == "mochi":                        # 1-D temporal attention, q/k/v [B*h*w, heads, t, d]
        import comfy.ldm.genmo.vae.model as genmo
        def attn(q, k, v, heads, skip_reshape=True, **kw):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return o.transpose(1, 2).reshape(o.shape[0], o.shape[2], -1)
        genmo.optimized_attention = attn
    else:                                        # HunyuanVideo mid-block AttnBlocks, q/k/v [B, C, t, h, w]
        def attn(q, k, v):
            frame = torch.arange(q.shape[2]).repeat_interleave(q[0, 0, 0].numel())
            qkv = [x.reshape(x.shape[0], 1, x.shape[1], -1).transpose(2, 3) for x in (q, k, v)]
            o = F.scaled_dot_product_attention(*qkv, attn_mask=frame[:, None] >= frame[None, :])
            return o.transpose(2, 3).reshape(q.shape)
        for m in model.modules():
            if hasattr(m, "optimized_attention"):
                m.optimized_attention = attn


def worker(a) -> None:
    """ComfyUI side (runs under ComfyUI's python): decode/encode every input, save the results; inputs
    marked ``_x`` (an expected difference) again with causal attention patched into core."""
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(a.threads)
    d = Path(a.worker)
    sd = load_file(d / "weights.safetensors")
    v = comfy_core.vae(a.comfyui, sd)
    v.throw_exception_if_invalid()
    keys = set(v.first_stage_model.state_dict())
    inputs = load_file(d / "inputs.safetensors")
    # IMAGE batch [T,H,W,3] = one clip for a video VAE; [B,H,W,3] = B images for an image VAE
    image = lambda x: x[0].movedim(0, -1) if x.dim() == 5 else x.movedim(1, -1)
    run = lambda k, x: (v.decode(x, vae_options=json.loads(a.vae_options)).movedim(-1, 1) if k.startswith("decode")
                        else v.encode(image(x))).contiguous()
    with torch.inference_mode():
        out = {k: run(k, x) for k, x in inputs.items()}
        if any(k.endswith("_x") for k in inputs):
            causal_core(a.family, v.first_stage_model)
            out.update({k + "causal": run(k, x) for k, x in inputs.items() if k.endswith("_x")})
    save_file(out, d / "core.safetensors")
    missing = sorted(k for k in keys - set(sd) if "statistics" not in k)   # LTX: unused stats buffers
    (d / "core.json").write_text(json.dumps({"model": type(v.first_stage_model).__name__, "missing": missing,
                                             "unexpected": sorted(set(sd) - keys)}))


def comfy_weights(family: str, cls: str, kwargs: dict) -> dict:
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


def stats(ours: torch.Tensor, core: torch.Tensor) -> dict:
    rng = lambda t: f"{t.min().item():.3f}..{t.max().item():.3f}"
    row = {"range": f"{rng(ours)} / {rng(core)}", "max": float("nan"), "mean": float("nan"), "scale": float("nan")}
    if ours.shape == core.shape:
        diff = (ours - core).abs()
        o, c = ours - ours.mean(), core - core.mean()
        row.update(max=diff.max().item(), mean=diff.mean().item(), scale=((o * c).sum() / (c * c).sum()).item())
    return row


def verdict(ours: torch.Tensor, core: torch.Tensor) -> str:
    if ours.shape != core.shape:
        return f"SHAPE {tuple(ours.shape)} vs {tuple(core.shape)}"
    return "agree" if (ours - core).abs().max().item() < 1e-3 else "DIFFER"


def clamped(x: torch.Tensor) -> str:
    """Share of decoded pixels at 0 or 1: a random-weight decoder that saturates would hide differences."""
    return f"; {100 * ((x <= 0) | (x >= 1)).float().mean().item():.0f}% clamped"


def run_family(family: str, a) -> list[dict]:
    import vae
    from safetensors.torch import load_file, save_file
    cls, kwargs, cases, opts = FAMILIES[family]
    with tempfile.TemporaryDirectory(prefix=f"cmp_{family}_") as tmp:
        d = Path(tmp)
        save_file({k: v.contiguous() for k, v in comfy_weights(family, cls, kwargs).items()}, d / "weights.safetensors")
        g = torch.Generator().manual_seed(SEED)
        inputs = {}
        for i, (op, shape, expect) in enumerate(cases):
            k = f"{op}{i}" + "_x" * bool(expect)
            inputs[k] = torch.randn((1,) + shape, generator=g) if op == "decode" else torch.rand((1, 3) + shape, generator=g)
        save_file(inputs, d / "inputs.safetensors")
        cmd = [a.python, str(Path(__file__).resolve()), "--worker", tmp, "--comfyui", a.comfyui,
               "--threads", str(a.threads), "--family", family, "--vae-options", json.dumps(opts)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            return [{"family": family, "op": "-", "note": f"ComfyUI FAILED: {tail[0] if tail else proc.returncode}"}]
        info = json.loads((d / "core.json").read_text())
        core = load_file(d / "core.safetensors")
        ours_vae = vae.load(d / "weights.safetensors")
        rows = []
        with torch.inference_mode():
            for i, (op, shape, expect) in enumerate(cases):
                k = f"{op}{i}" + "_x" * bool(expect)
                ours = ours_vae.decode(inputs[k], **opts) if op == "decode" else ours_vae.encode(inputs[k])
                if ours.dim() == 4:                 # an image VAE: no frames
                    row = {"family": family, "op": f"{op} {'x'.join(map(str, shape[-2:]))}", "frames": "-",
                           **stats(ours, core[k])}
                else:
                    row = {"family": family, "op": f"{op} {'t' if op == 'decode' else 'T'}={shape[1 if op == 'decode' else 0]}",
                           "frames": f"{ours.shape[2]} / {core[k].shape[2]}", **stats(ours, core[k])}
                note = verdict(ours, core[k]) + (f" ({expect})" if expect else "") + clamped(ours) * (op == "decode")
                if info["missing"] or info["unexpected"]:
                    note += f"; core load: {len(info['missing'])} missing {info['missing'][:3]}, {len(info['unexpected'])} unexpected"
                rows.append({**row, "note": note + f"; core model {info['model']}" * (i == 0)})
                if k + "causal" in core:             # the same case against core with causal attention
                    rows.append({**row, **stats(ours, core[k + "causal"]), "op": row["op"] + " *", "note":
                                 verdict(ours, core[k + "causal"]) + " (*: core with our causal attention patched in)"})
        return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True, help="ComfyUI source directory (the one with comfy/)")
    p.add_argument("--python", help="ComfyUI's python (its venv); default: this one")
    p.add_argument("--families", default=",".join(FAMILIES) + ",magvit", help="comma list (default: all): "
                   + ", ".join(FAMILIES) + ", magvit (only reported as skipped)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--family", help=argparse.SUPPRESS)
    p.add_argument("--vae-options", default="{}", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    a.comfyui, a.python = str(Path(a.comfyui).resolve()), a.python or sys.executable
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(a.threads)
    rows = []
    for fam in a.families.split(","):
        if fam == "magvit":
            rows.append({"family": "magvit", "op": "-", "note": "skipped: Magvit/EasyAnimate is not in ComfyUI core"})
            continue
        rows += run_family(fam, a)
        print(f"# {fam} done", file=sys.stderr, flush=True)
    cols = [("family", 13, "s"), ("op", 13, "s"), ("frames", 9, "s"), ("range", 29, "s"),
            ("max", 9, ".2e"), ("mean", 9, ".2e"), ("scale", 7, ".4f")]
    print(" | ".join(f"{c:<{w}}" for c, w, _ in cols) + " | note  (ours / core)")
    for r in rows:
        cells = [format(r[c], f) if c in r else "" for c, _, f in cols]
        print(" | ".join(f"{s:<{w}}" for s, (_, w, _) in zip(cells, cols)) + " | " + r.get("note", ""))


if __name__ == "__main__":
    main()
