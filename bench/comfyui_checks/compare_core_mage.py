"""Mage-VAE against ComfyUI core (``comfy/ldm/mage_flow/vae.py`` through ``comfy.sd.VAE``): parity at the
published config, and time and memory beside core at the size the Mage-Flow templates decode.

    python bench/comfyui_checks/compare_core_mage.py --comfyui PATH/TO/ComfyUI --python PATH/TO/comfy/venv/bin/python
    python bench/comfyui_checks/compare_core_mage.py ... --quick               # the small cases only
    python bench/comfyui_checks/compare_core_mage.py ... --bench 1024          # also time and memory at 1024x1024

Weights: core's own ``MageVAE()`` (its hard-coded published config: 128 latent channels, 16x, 21 DiCo
blocks a side, 32-latent-pixel attention windows), random weights under a fixed seed (core's ops leave
parameters uninitialised: every tensor is drawn), written once in the file layout the templates load
(``student.dconv_encoder.*``, ``pipeline.*``, plus two tensors of the Flux.2 anchor encoder that both
loaders must drop). Core loads that file with ``comfy.sd.VAE`` (its detection and renames) in a
subprocess under ComfyUI's python (CPU); ours with ``vae.load``. Inputs are fixed-seed latents
randn(B, 128, h, w) and images rand(B, H, W, 3).

Parity (fp32): core's VAE Decode / VAE Encode (``VAE.decode`` / ``VAE.encode``: its 0..1 mapping,
clamp and centre crop) against our socket (``VAEKitVAE``, what core's nodes call on our VAE) and our
exact tiles (512 px); max and mean abs difference on 0..1 pixels (decode) and on the raw latent
(encode, with the latent's range). bf16 rows: both sides load the file in bf16 and compute in bf16
(core's working dtypes are bf16 and fp32): a rounding figure, not a parity claim; beside each, core's
own bf16 result against its fp32 one gives the scale of bf16 rounding. ``clamped`` is the
share of decoded pixels at 0 or 1 (random weights; a saturated decoder would hide differences).

--bench N: one subprocess per run, fp32, --threads threads, decode of a (1, 128, N/16, N/16) latent and
encode of an N x N image; the peak-RSS mark is reset after loading (bench/harness/measure.py), so
``working set`` = peak RSS during the call - RSS after load. Core's figures are its plain VAE Decode /
Encode (one pass; core's CPU device never tiles for memory). Nothing is asserted."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core  # noqa: E402
from harness.workers import results, run  # noqa: E402

SEED = 0
WEIGHTS = "mage_flow_vae.safetensors"
# name -> (op, shape): decode latents [B, 128, h, w], encode images [B, H, W, 3] (ComfyUI IMAGE)
CASES = {
    "decode 4x5 (one padded window)": ("decode", (1, 128, 4, 5)),
    "decode 6x4, batch 2": ("decode", (2, 128, 6, 4)),
    "decode 40x36 (2x2 windows)": ("decode", (1, 128, 40, 36)),
    "encode 64x80": ("encode", (1, 64, 80, 3)),
    "encode 650x590 (centre-cropped)": ("encode", (1, 650, 590, 3)),
}
BF16 = ("decode 40x36 (2x2 windows)", "encode 64x80")        # also compared in bf16
EXACT = ("decode 40x36 (2x2 windows)", "encode 650x590 (centre-cropped)")   # also with our exact 512 px tiles
QUICK = ("decode 4x5 (one padded window)", "decode 6x4, batch 2", "encode 64x80")
RUNS = ("core_decode", "ours_decode", "ours_exact_decode", "core_encode", "ours_encode", "ours_exact_encode")


# ---- ComfyUI side (its python) ------------------------------------------------------------------

def _comfy(comfyui: str):
    comfy_core.start(comfyui)
    import comfy.sd
    return comfy.sd


def write_weights(a) -> None:
    """Core's published MageVAE with every tensor drawn, in the file layout (plus anchor tensors)."""
    _comfy(a.comfyui)
    import comfy.ldm.mage_flow.vae as mage
    from safetensors.torch import save_file
    torch.manual_seed(SEED)
    model = mage.MageVAE()
    g = torch.Generator().manual_seed(SEED)
    sd = {}
    for name, p in model.state_dict().items():
        if p.dim() > 1:                          # convs and linears: unit-variance outputs
            t = torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5
        else:                                    # biases around 0, norm scales around 1
            t = (1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=g)
        prefix = "student." if name.startswith("dconv_encoder.") else ""
        sd[prefix + name.replace("decoder_model.", "pipeline.", 1)] = t.contiguous()
    sd["pipeline.y_embedder.encoder.conv_in.weight"] = torch.randn(128, 3, 3, 3, generator=g)
    sd["pipeline.y_embedder.bottleneck.weight"] = torch.randn(128, 64, 1, 1, generator=g)
    save_file(sd, str(Path(a.worker_dir) / WEIGHTS))


def core_parity(a) -> None:
    sd_mod = _comfy(a.comfyui)
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(a.threads)
    d = Path(a.worker_dir)
    sd = load_file(str(d / WEIGHTS))
    inputs = load_file(str(d / "inputs.safetensors"))
    out, info = {}, {}
    for dtype, names in ((torch.float32, list(inputs)), (torch.bfloat16, [n for n in BF16 if n in inputs])):
        v = sd_mod.VAE(sd=dict(sd), dtype=dtype)
        v.throw_exception_if_invalid()
        keys = set(v.first_stage_model.state_dict())
        info = {"model": type(v.first_stage_model).__name__, "missing": len(keys - _renamed(sd)),
                "latent_channels": v.latent_channels, "ratio": v.downscale_ratio}
        tag = "" if dtype == torch.float32 else " bf16"
        with torch.inference_mode():
            for name in names:
                x = inputs[name]
                y = v.decode(x).movedim(-1, 1) if CASES[name][0] == "decode" else v.encode(x)
                out[name + tag] = y.float().contiguous()
    save_file(out, str(d / "core.safetensors"))
    (d / "core.json").write_text(json.dumps(info))


def _renamed(sd: dict) -> set:
    return {k.replace("student.dconv_encoder.", "dconv_encoder.").replace("pipeline.", "decoder_model.", 1)
            for k in sd}


# ---- time and memory (one run per subprocess) ---------------------------------------------------

def bench_worker(a) -> None:
    from harness.measure import measure
    from safetensors.torch import load_file
    torch.set_num_threads(a.threads)
    d = Path(a.worker_dir)
    x = load_file(str(d / f"bench_{a.size}.safetensors"))["decode" if a.worker.endswith("decode") else "encode"]
    sd = load_file(str(d / WEIGHTS))
    if a.worker.startswith("core"):
        v = _comfy(a.comfyui).VAE(sd=sd)
        fn = (lambda z: v.decode(z)) if a.worker.endswith("decode") else (lambda im: v.encode(im))
        model = v.first_stage_model
    else:
        sys.path.insert(0, str(ROOT))
        from vae.loading import from_state_dict
        handle = from_state_dict(sd, source=WEIGHTS)
        kw = dict(tile=512, mode="exact") if "exact" in a.worker else {}
        if a.worker.endswith("decode"):
            fn = lambda z: handle.decode(z, **kw).movedim(1, -1)
        else:
            fn = lambda im: handle.encode(im.movedim(-1, 1), **kw)
        model = handle.model
    del sd
    measure(fn, x, model, 1, d / f"{a.worker}_{a.size}")


def bench(a, d: Path) -> None:
    import numpy as np
    from safetensors.torch import save_file
    n = a.bench
    g = torch.Generator().manual_seed(SEED + 2)
    save_file({"decode": torch.randn(1, 128, n // 16, n // 16, generator=g),
               "encode": torch.rand(1, n, n, 3, generator=g)}, str(d / f"bench_{n}.safetensors"))
    print(f"\nMage-VAE published config, random weights, fp32, {a.threads} threads: decode 1x128x{n // 16}x{n // 16} "
          f"-> {n}x{n}, encode {n}x{n}; ours exact: 512 px tiles")
    print(f"{'run':<18} {'time s':>8} {'cpu s':>8} {'working MiB':>12} {'max err vs core':>16}")
    ref = {}
    flags = ["--worker-dir", str(d), "--comfyui", a.comfyui, "--threads", str(a.threads), "--size", str(n)]
    start = lambda name: run(__file__, name, flags, d / f"{name}_{n}", a.python, tail=2)
    for name, r, y in results(RUNS, start, lambda name: f"{name:<18} "):
        op = name.rsplit("_", 1)[1]
        ref.setdefault(op, y) if name.startswith("core") else None
        err = float(np.abs(y - ref[op]).max()) if op in ref and y.shape == ref[op].shape else float("nan")
        print(f"{name:<18} {r['best_s']:>8.1f} {r['cpu_s']:>8.1f} {r['working_set_mib']:>12.0f} {err:>16.2e}", flush=True)


# ---- ours and the comparison (this python) ------------------------------------------------------

def row(name: str, ours: torch.Tensor, core: torch.Tensor, decode: bool) -> str:
    if ours.shape != core.shape:
        return f"{name:<46} SHAPE {tuple(ours.shape)} vs {tuple(core.shape)}"
    diff = (ours.float() - core.float()).abs()
    extra = (f"{100 * ((ours <= 0) | (ours >= 1)).float().mean().item():.0f}% clamped" if decode else
             f"latent range {core.min().item():.2f}..{core.max().item():.2f}")
    return f"{name:<46} {str(tuple(ours.shape)):<18} {diff.max().item():>9.2e} {diff.mean().item():>9.2e}  {extra}"


def parity(a, d: Path, call) -> None:
    from safetensors.torch import load_file, save_file
    sys.path.insert(0, str(ROOT))
    from vae.cli.pack import load_pack
    pack = load_pack()                         # the repository as ComfyUI imports it: our nodes' socket
    from vaekit.nodes.convert import center_crop_to_multiple
    from vaekit.nodes.socket import VAEKitVAE
    g = torch.Generator().manual_seed(SEED + 1)
    inputs = {name: torch.randn(shape, generator=g) if op == "decode" else torch.rand(shape, generator=g)
              for name, (op, shape) in CASES.items()}
    inputs = {name: x for name, x in inputs.items() if not a.quick or name in QUICK}
    save_file(inputs, str(d / "inputs.safetensors"))
    proc = call("core_parity")
    if proc.returncode:
        raise SystemExit(f"ComfyUI failed: {(proc.stderr or proc.stdout).strip().splitlines()[-3:]}")
    core, info = load_file(str(d / "core.safetensors")), json.loads((d / "core.json").read_text())
    print(f"core: {info['model']}, {info['missing']} keys missing after its renames, latent_channels "
          f"{info['latent_channels']}, ratio {info['ratio']}")
    print(f"{'case (ours vs core)':<46} {'shape':<18} {'max':>9} {'mean':>9}")
    for dtype in (torch.float32, torch.bfloat16):
        handle = pack.vae.load(d / WEIGHTS, dtype=dtype)
        sock, tag = VAEKitVAE(handle), ("" if dtype == torch.float32 else " bf16")
        for name in (inputs if dtype == torch.float32 else [n for n in BF16 if n in inputs]):
            op, x = CASES[name][0], inputs[name]
            with torch.inference_mode():
                y = sock.decode(x).movedim(-1, 1) if op == "decode" else sock.encode(x)
                print(row(name + tag, y, core[name + tag], op == "decode"), flush=True)
                if tag:                          # the scale of bf16 rounding: core against itself in fp32
                    print(row("  (core bf16 vs core fp32)", core[name + tag], core[name], op == "decode"))
                if dtype == torch.float32 and name in EXACT:
                    y = (handle.decode(x, tile=512, mode="exact") if op == "decode" else
                         handle.encode(center_crop_to_multiple(x, 16).movedim(-1, 1), tile=512, mode="exact"))
                    print(row(name + " exact 512 px", y, core[name], op == "decode"), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True, help="ComfyUI source directory (the one with comfy/)")
    p.add_argument("--python", help="ComfyUI's python (its venv); default: this one")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bench", type=int, default=0, help="also time and memory at N x N pixels (e.g. 1024)")
    p.add_argument("--no-parity", action="store_true", help="only the --bench runs")
    p.add_argument("--quick", action="store_true", help="parity on the small cases only (minutes, not tens)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-dir", help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    a.comfyui = str(Path(a.comfyui).resolve())
    if a.worker:
        return {"weights": write_weights, "core_parity": core_parity}.get(a.worker, bench_worker)(a)
    a.python = a.python or sys.executable
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory(prefix="cmp_mage_") as tmp:
        d = Path(tmp)

        def call(worker: str):
            return subprocess.run([a.python, str(Path(__file__).resolve()), "--worker", worker, "--worker-dir", tmp,
                                   "--comfyui", a.comfyui, "--threads", str(a.threads)], capture_output=True, text=True)
        proc = call("weights")
        if proc.returncode:
            raise SystemExit(f"ComfyUI could not build the weights: {(proc.stderr or proc.stdout).strip().splitlines()[-3:]}")
        if not a.no_parity:
            parity(a, d, call)
        if a.bench:
            bench(a, d)


if __name__ == "__main__":
    main()
