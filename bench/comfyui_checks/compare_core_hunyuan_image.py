"""HunyuanImage 2.1's and 3.0's VAEs against ComfyUI core (``comfy/ldm/hunyuan_video/vae.py`` and the
``refiner_vae=False`` branch of ``vae_refiner.py``), diffusers (2.1: ``AutoencoderKLHunyuanImage``) and
Tencent's originals (when HUNYUAN_IMAGE21_REFERENCE / HUNYUAN_IMAGE3_REFERENCE name copies of
``hyimage/models/vae/hunyuanimage_vae.py`` / ``hunyuan_image_3/autoencoder_kl_3d.py``), on the same files.

    python bench/comfyui_checks/compare_core_hunyuan_image.py --comfyui PATH/TO/ComfyUI --python PATH/TO/comfy/venv/bin/python
    python bench/comfyui_checks/compare_core_hunyuan_image.py ... --quick          # narrow configs (seconds)
    python bench/comfyui_checks/compare_core_hunyuan_image.py ... --check 1e-4     # exit 1 if a fp32 row is above

Weights: core's own model at the published config (2.1: widths 128..1024 over 6 levels, 64 latent channels,
32x; 3.0: 128..1024 over 5 levels, 32 channels, 16x; the ``ddconfig`` core's ``comfy/sd.py`` builds), every
tensor drawn under a fixed seed (core's ops leave parameters uninitialised), written once in core's file
layout (= Tencent's names). Core loads that file with ``comfy.sd.VAE`` (its detection and its VAE Decode /
VAE Encode: 0..1 mapping, clamp, centre crop; 3.0's images as one-frame clips) in a subprocess under
ComfyUI's python (CPU); ours with ``vae.load`` behind our socket (``VAEKitVAE``: what core's nodes call on
our VAE), and with exact tiles. ``--quick``: the same structures narrow; ``comfy.sd.VAE`` builds only the
published widths, so there core's Encoder/Decoder classes are built in an ``AutoencodingEngine`` as
``comfy/sd.py`` builds them, with core's pixel mapping (``x * 2 - 1``; ``clamp((y + 1) / 2)``).

Rows: max and mean abs difference, decode on 0..1 pixels, encode on the raw latent (with the latent's
range); ``clamped`` is the share of decoded pixels at 0 or 1 (random weights; a saturated decoder would
hide differences). fp32 throughout. ``--check TOL`` applies to every row: decode max abs, encode max abs
relative to the latent's largest value."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core  # noqa: E402

SEED = 0
# core's ddconfig per variant (comfy/sd.py), and the narrow one of --quick (the same structure)
CONFIGS = {
    "2.1": dict(published=dict(block_out_channels=[128, 256, 512, 512, 1024, 1024], num_res_blocks=2),
                quick=dict(block_out_channels=[32, 32, 64, 64, 128, 128], num_res_blocks=1),
                common=dict(in_channels=3, out_channels=3, z_channels=64, ffactor_spatial=32,
                            downsample_match_channel=True, upsample_match_channel=True),
                module="comfy.ldm.hunyuan_video.vae"),
    "3.0": dict(published=dict(block_out_channels=[128, 256, 512, 1024, 1024], num_res_blocks=2),
                quick=dict(block_out_channels=[32, 32, 64, 64, 64], num_res_blocks=1),
                common=dict(in_channels=3, out_channels=3, z_channels=32, ffactor_spatial=16, ffactor_temporal=4,
                            downsample_match_channel=True, upsample_match_channel=True, refiner_vae=False),
                module="comfy.ldm.hunyuan_video.vae_refiner"),
}
# name -> (variant, op, shape): decode LATENTs as core's samplers / VAE Encode give them, encode IMAGEs
CASES = {
    "2.1 decode 3x4": ("2.1", "decode", (1, 64, 3, 4)),
    "2.1 decode 2x2, batch 2": ("2.1", "decode", (2, 64, 2, 2)),
    "2.1 encode 96x128": ("2.1", "encode", (1, 96, 128, 3)),
    "2.1 encode 100x70 (centre-cropped)": ("2.1", "encode", (1, 100, 70, 3)),
    "3.0 decode 1x32x1x4x3": ("3.0", "decode", (1, 32, 1, 4, 3)),
    "3.0 decode 2x32x1x2x2": ("3.0", "decode", (2, 32, 1, 2, 2)),
    "3.0 encode 64x48": ("3.0", "encode", (1, 64, 48, 3)),
    "3.0 encode 2x40x50 (centre-cropped)": ("3.0", "encode", (2, 40, 50, 3)),
}
EXACT = ("2.1 decode 3x4", "2.1 encode 96x128", "3.0 decode 1x32x1x4x3", "3.0 encode 64x48")   # also exact tiles


def _file(d: Path, variant: str) -> Path:
    return d / f"hunyuan_image_{variant}_vae.safetensors"


# ---- ComfyUI side (its python) ------------------------------------------------------------------

def _engine(a, variant: str):
    comfy_core.start(a.comfyui)
    from comfy.ldm.models.autoencoder import AutoencodingEngine
    c = CONFIGS[variant]
    ddconfig = {**c["common"], **c["quick" if a.quick else "published"]}
    return AutoencodingEngine(regularizer_config={"target": "comfy.ldm.models.autoencoder.DiagonalGaussianRegularizer"},
                              encoder_config={"target": f"{c['module']}.Encoder", "params": ddconfig},
                              decoder_config={"target": f"{c['module']}.Decoder", "params": ddconfig})


def write_weights(a) -> None:
    """Core's model of each variant, every tensor drawn: convs at unit output variance, norm scales near 1."""
    from safetensors.torch import save_file
    for variant in CONFIGS:
        model = _engine(a, variant)
        g = torch.Generator().manual_seed(SEED)
        sd = {}
        for name, p in model.state_dict().items():
            if p.dim() > 1:
                t = torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5
            else:
                t = (1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=g)
            sd[name] = t.contiguous()
        save_file(sd, str(_file(Path(a.worker_dir), variant)))


def core_parity(a) -> None:
    comfy_core.start(a.comfyui)
    import comfy.sd
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(a.threads)
    d = Path(a.worker_dir)
    inputs = load_file(str(d / "inputs.safetensors"))
    out, info = {}, {}
    for variant in CONFIGS:
        sd = load_file(str(_file(d, variant)))
        if a.quick:          # core's classes; comfy.sd.VAE builds the published widths only
            model = _engine(a, variant)
            model.load_state_dict(sd, strict=True)
            dec, enc = _core_io(model.eval(), variant)
            info[variant] = {"model": CONFIGS[variant]["module"] + " (core's classes, narrow)"}
        else:
            v = comfy.sd.VAE(sd=dict(sd))
            v.throw_exception_if_invalid()
            dec, enc = v.decode, v.encode
            keys = set(v.first_stage_model.state_dict())
            info[variant] = {"model": type(v.first_stage_model.decoder).__module__, "missing": len(keys - set(sd)),
                             "latent_channels": v.latent_channels, "latent_dim": v.latent_dim}
        with torch.inference_mode():
            for name, (var, op, _) in CASES.items():
                if var == variant and name in inputs:
                    y = dec(inputs[name]) if op == "decode" else enc(inputs[name])
                    out[name] = y.float().contiguous()
    save_file(out, str(d / "core.safetensors"))
    (d / "core.json").write_text(json.dumps(info))


def _core_io(model, variant: str):
    """What comfy.sd.VAE's decode / encode do around the model for these two (comfy/sd.py): LATENT -> 0..1
    IMAGE (3.0: a one-frame clip's frame), IMAGE centre-cropped -> [-1, 1] (3.0: as one-frame clips) -> LATENT."""
    r, clip = (32, False) if variant == "2.1" else (16, True)

    def dec(z):    # 3.0: [B, 1, H, W, C], a one-frame clip's frames (core's VAE Decode node flattens them)
        return ((model.decode(z) + 1) / 2).clamp(0, 1).movedim(1, -1)

    def enc(image):
        x = _core_crop(image, r).movedim(-1, 1) * 2 - 1
        return model.encode(x.unsqueeze(2) if clip else x)
    return dec, enc


def _core_crop(image: torch.Tensor, r: int) -> torch.Tensor:
    """comfy.sd.VAE.vae_encode_crop_pixels: sides centre-cropped to multiples of the ratio."""
    h, w = image.shape[1] // r * r, image.shape[2] // r * r
    y, x = (image.shape[1] % r) // 2, (image.shape[2] % r) // 2
    return image[:, y:y + h, x:x + w]


# ---- the other references (this python) ---------------------------------------------------------

def _module(env: str):
    path = os.environ.get(env)
    if not path or not os.path.isfile(path) or importlib.util.find_spec("einops") is None:
        return None
    spec = importlib.util.spec_from_file_location(f"_{env.lower()}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def references(handle, variant: str) -> dict:
    """name -> (decode fn: LATENT -> 0..1 IMAGE, encode fn: IMAGE -> LATENT) of the references that load the
    same weights: diffusers and Tencent's original (2.1), Tencent's original (3.0)."""
    from vae.archs import hunyuan_image_layout
    cfg, sd = handle.config, hunyuan_image_layout.to_original(handle.state_dict())
    pix = lambda y: ((y.clamp(-1, 1) + 1) / 2).movedim(1, -1)
    out = {}
    if variant == "2.1":
        import diffusers
        m = diffusers.AutoencoderKLHunyuanImage(
            in_channels=3, out_channels=3, latent_channels=cfg.latent_channels, block_out_channels=cfg.widths,
            layers_per_block=cfg.layers_per_block, spatial_compression_ratio=cfg.ratios[0], sample_size=384)
        _load_diffusers(m, handle.state_dict())
        out["diffusers"] = m.eval()
        mod = _module("HUNYUAN_IMAGE21_REFERENCE")
        if mod:
            t = mod.HunyuanVAE2D(in_channels=3, out_channels=3, latent_channels=cfg.latent_channels,
                                 block_out_channels=cfg.widths, layers_per_block=cfg.layers_per_block,
                                 ffactor_spatial=cfg.ratios[0], sample_size=384, sample_tsize=1)
            t.load_state_dict(sd)
            out["Tencent"] = t.eval()
        fns = {k: (lambda z, m=m: pix(m.decode(z).sample), lambda im, m=m: m.encode(
            _core_crop(im, 32).movedim(-1, 1) * 2 - 1).latent_dist.mode()) for k, m in out.items()}
    else:
        mod = _module("HUNYUAN_IMAGE3_REFERENCE")
        fns = {}
        if mod:
            t = mod.AutoencoderKLConv3D(in_channels=3, out_channels=3, latent_channels=cfg.latent_channels,
                                        block_out_channels=cfg.widths, layers_per_block=cfg.layers_per_block,
                                        ffactor_spatial=cfg.ratios[0], ffactor_temporal=cfg.frames, sample_size=256,
                                        sample_tsize=64)
            t.load_state_dict(sd)
            t.eval()
            fns["Tencent"] = (lambda z, m=t: pix(m.decode(z).sample),
                              lambda im, m=t: m.encode(_core_crop(im, 16).movedim(-1, 1)[:, :, None] * 2 - 1)
                              .latent_dist.mode())
    return fns


def _load_diffusers(m, canonical: dict) -> None:
    """Our canonical weights into diffusers' class: its own keys read by our layout give the names (the
    layout's renames keep the order of the keys)."""
    from vae.archs import hunyuan_image_layout
    theirs = m.state_dict()
    names = list(hunyuan_image_layout.to_canonical(theirs))
    assert len(names) == len(theirs)
    m.load_state_dict({k: canonical[n] for k, n in zip(theirs, names)}, strict=True)


# ---- ours and the comparison (this python) ------------------------------------------------------

def row(name: str, ours: torch.Tensor, ref: torch.Tensor, decode: bool) -> tuple[str, float]:
    if ours.shape != ref.shape:
        return f"{name:<52} SHAPE {tuple(ours.shape)} vs {tuple(ref.shape)}", float("inf")
    diff = (ours.float() - ref.float()).abs()
    big = diff.max().item()
    score = big if decode else big / max(ref.abs().max().item(), 1e-12)
    extra = (f"{100 * ((ours <= 0) | (ours >= 1)).float().mean().item():.0f}% clamped" if decode else
             f"latent range {ref.min().item():.2f}..{ref.max().item():.2f}")
    return f"{name:<52} {str(tuple(ours.shape)):<20} {big:>9.2e} {diff.mean().item():>9.2e}  {extra}", score


def parity(a, d: Path, call) -> float:
    from safetensors.torch import load_file, save_file
    sys.path.insert(0, str(ROOT))
    from vae.cli.pack import load_pack
    pack = load_pack()                         # the repository as ComfyUI imports it: our nodes' socket
    from vaekit.nodes.convert import center_crop_to_multiple
    from vaekit.nodes.socket import VAEKitVAE
    g = torch.Generator().manual_seed(SEED + 1)
    inputs = {name: torch.randn(shape, generator=g) if op == "decode" else torch.rand(shape, generator=g)
              for name, (_, op, shape) in CASES.items()}
    save_file(inputs, str(d / "inputs.safetensors"))
    proc = call("core_parity")
    if proc.returncode:
        raise SystemExit(f"ComfyUI failed: {(proc.stderr or proc.stdout).strip().splitlines()[-3:]}")
    core, info = load_file(str(d / "core.safetensors")), json.loads((d / "core.json").read_text())
    worst = 0.0
    print(f"{'case (ours vs reference)':<52} {'shape':<20} {'max':>9} {'mean':>9}")
    for variant in CONFIGS:
        handle = pack.vae.load(_file(d, variant))
        sock, s = VAEKitVAE(handle), handle.caps.spatial_ratio
        refs = references(handle, variant)
        print(f"-- HunyuanImage {variant} ({'narrow' if a.quick else 'published'} config): ours {handle.name}; "
              f"core {info[variant]}; other references: {', '.join(refs) or 'none given'}")
        for name, (var, op, _) in CASES.items():
            if var != variant:
                continue
            x, dec = inputs[name], op == "decode"
            with torch.inference_mode():
                y = sock.decode(x) if dec else sock.encode(x)
                text, score = row(name + " vs core", y, core[name], dec)
                print(text, flush=True)
                worst = max(worst, score)
                for ref_name, fns in refs.items():
                    want = fns[0](x) if dec else fns[1](x)
                    text, score = row(f"{name} vs {ref_name}", y, want, dec)
                    print(text, flush=True)
                    worst = max(worst, score)
                if name in EXACT:
                    t = 2 * s
                    y = (sock._out(handle.decode(x, tile=t, mode="exact"), x) if dec else
                         handle.encode(center_crop_to_multiple(x, s).movedim(-1, 1), tile=t, mode="exact"))
                    text, score = row(f"{name} exact {t} px tiles vs core", y, core[name], dec)
                    print(text, flush=True)
                    worst = max(worst, score)
    return worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True, help="ComfyUI source directory (the one with comfy/)")
    p.add_argument("--python", help="ComfyUI's python (its venv); default: this one")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="narrow configs of the same structures (seconds)")
    p.add_argument("--check", type=float, help="exit 1 if a row's difference is above this")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-dir", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.comfyui = str(Path(a.comfyui).resolve())
    if a.worker:
        return {"weights": write_weights, "core_parity": core_parity}[a.worker](a)
    a.python = a.python or sys.executable
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory(prefix="cmp_hyimage_") as tmp:
        def call(worker: str):
            return subprocess.run([a.python, str(Path(__file__).resolve()), "--worker", worker, "--worker-dir", tmp,
                                   "--comfyui", a.comfyui, "--threads", str(a.threads)] + (["--quick"] if a.quick else []),
                                  capture_output=True, text=True)
        proc = call("weights")
        if proc.returncode:
            raise SystemExit(f"ComfyUI could not build the weights: {(proc.stderr or proc.stdout).strip().splitlines()[-3:]}")
        worst = parity(a, Path(tmp), call)
    print(f"largest difference: {worst:.2e}")
    if a.check is not None and not worst <= a.check:
        raise SystemExit(f"above --check {a.check:g}")


if __name__ == "__main__":
    main()
