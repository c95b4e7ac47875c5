"""Exact within a memory budget: measured working sets beside the planner's predictions, one pass beside
exact tiles, and the plans for sizes this machine cannot run.

    python bench/bench_budget.py scaling --family wan             # the table of docs/memory.md for Wan 2.1
    python bench/bench_budget.py scaling --family wan --sizes 256x384x17,512x768x17 --tile 256x192 --kinds exact
    python bench/bench_budget.py scaling --family hunyuan_video15 --sizes 256x384x9,512x768x9
    python bench/bench_budget.py scaling --family qwen --sizes 2048x2048x1 --tile 512
    python bench/bench_budget.py scaling --family ltx_diffusion --sizes 256x256x17 --tile 128
    python bench/bench_budget.py plans          # Wan 720p/1080p, LTX-2, SD KL 2048 px, LTX-2.5 720p, 4 GB
    python bench/bench_budget.py plans --cases ltx_diffusion

Weights: each family's published config (diffusers' class where it has one: Wan 2.1 = AutoencoderKLWan(),
also Qwen-Image's VAE; HunyuanVideo 1.5; LTX-2.3 with its published flags; SD-shape AutoencoderKL; LTX-2.5's
diffusion VAE as bench/comfyui_checks/compare_core_ltx_diffusion.py writes it, the shipped layout and metadata) with
random weights under a fixed seed, saved once to a temporary .safetensors file that ours loads. Latents
randn under a fixed seed. Each run is its own subprocess (CPU, fp32, ``--threads``), measured as
bench/bench_decode.py measures (peak RSS after load: the working set, output included; the process's CPU
time of the call). "one pass" is ``VAE.decode(z)`` untiled: for Wan and HunyuanVideo 1.5 their own
chunked definition (one and two latent frames at a time, equal to the whole clip at once), the
reference every exact figure is compared with (max abs on 0..1 pixels). ``predicted`` is the planner's
figure for the same call (vae/engine/budget.py: calibrated device peak + maps + output, all on the CPU here),
computed in the worker before the call; ``fit`` is the factor that run implies with the CPU's fixed bytes:
(measured - maps - output - fixed) / the tracker's live peak, what vae/engine/memory.py's CALIBRATION is fitted to.

Plans (``plans``): the planner's choice for a budget on a GPU with host memory as the offload device,
in bf16, from the meta measurement alone (nothing is decoded): tile, chunk, predicted device bytes, what
the host holds (maps between stages, the output).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness.measure import measure  # noqa: E402
from bench_decode import KL_SHAPE  # noqa: E402
from bench_video import FAMILIES as VIDEO  # noqa: E402

# family -> (diffusers class, kwargs, latent channels, spatial ratio, temporal ratio or None)
FAMILIES = {
    "wan": ("AutoencoderKLWan", {}, 16, 8, 4),
    "qwen": ("AutoencoderKLWan", {}, 16, 8, 4),           # Qwen-Image's VAE is Wan 2.1's; one-frame latents
    "hunyuan_video15": ("AutoencoderKLHunyuanVideo15", {}, 32, 16, 4),
    "ltx2.3": (VIDEO["ltx2.3"][0], VIDEO["ltx2.3"][1], 128, 32, 8),
    "kl": ("AutoencoderKL", KL_SHAPE, 4, 8, None),
    # LTX-2.5 (diffusion decoder): no diffusers class holds the whole file; its core bench writes it
    "ltx_diffusion": (None, {}, 128, 32, 8),
}
SIZES = {"wan": "256x384x9,512x768x9,256x384x45,512x768x17", "hunyuan_video15": "256x384x9,512x768x9,256x384x45",
         "qwen": "1024x1024x1,2048x2048x1", "ltx2.3": "512x768x25", "kl": "1024x1024x1", "ltx_diffusion": "256x256x17"}


def _weights(family: str, folder: Path) -> Path:
    if FAMILIES[family][0] is None:
        from comfyui_checks import compare_core_ltx_diffusion as writer
        if not (folder / writer.FILE).exists():
            writer.write_weights(folder)
        return folder / writer.FILE
    path = folder / f"{family}.safetensors"
    if not path.exists():
        import diffusers
        import torch
        from safetensors.torch import save_file
        cls, kwargs, *_ = FAMILIES[family]
        torch.manual_seed(0)
        ref = getattr(diffusers, cls)(**kwargs).eval()
        save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return path


def _latent(family: str, size: str):
    import torch
    h, w, t = map(int, size.split("x"))
    _, _, c, s, r = FAMILIES[family]
    g = torch.Generator().manual_seed(0)
    if r is None:
        return torch.randn(1, c, h // s, w // s, generator=g)
    return torch.randn(1, c, 1 + (t - 1) // r, h // s, w // s, generator=g)


def worker(a) -> None:
    import torch
    import vae
    from vae.engine import budget
    torch.set_num_threads(a.threads)
    v = vae.load(a.weights)
    z = _latent(a.family, a.size)
    tile = tuple(map(int, a.tile.split("x"))) if "x" in a.tile else int(a.tile)       # HxW or one side
    kw = {} if a.kind == "one_pass" else dict(tile=tile, mode="exact")
    cpu = torch.device("cpu")
    p = budget.predict(v, v.call_for("decode", z.shape, **kw), cpu, cpu)
    Path(f"{a.out}.pred.json").write_text(json.dumps(dict(device=p.device, maps=p.maps, output=p.output, live=p.live)))
    measure(lambda x: v.decode(x, **kw), z, v.model, 1, Path(a.out))


def _run(a, tmp: Path, weights: Path, family: str, size: str, kind: str) -> dict:
    out = tmp / f"{family}_{size}_{kind}"
    cmd = [sys.executable, str(Path(__file__).resolve()), "worker", "--family", family, "--size", size,
           "--kind", kind, "--tile", str(a.tile), "--threads", str(a.threads), "--weights", str(weights),
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        return {"error": " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])}
    r = json.loads(Path(f"{out}.json").read_text())
    r["pred"] = json.loads(Path(f"{out}.pred.json").read_text())
    r["npy"] = f"{out}.npy"
    return r


MIB = 2 ** 20


def scaling(a) -> None:
    import numpy as np
    from vae.engine import memory
    fixed = memory.calibration("cpu")[1]
    sizes = (a.sizes or SIZES[a.family]).split(",")
    kinds = a.kinds.split(",")
    with tempfile.TemporaryDirectory(prefix="bench_budget_") as tmp:
        tmp = Path(tmp)
        weights = _weights(a.family, tmp)
        print(f"{a.family} (published config, random weights), CPU fp32, {a.threads} threads, exact tile {a.tile} px")
        print(f"{'size':<14} {'run':<10} {'cpu s':>8} {'wall s':>8} {'working MiB':>12} {'predicted MiB':>14} "
              f"{'pred/meas':>9} {'fit':>5} {'vs one pass':>12} {'cpu ratio':>9} {'max abs':>9}")
        for size in sizes:
            ref = None
            for kind in kinds:
                r = _run(a, tmp, weights, a.family, size, kind)
                if "error" in r:
                    print(f"{size:<14} {kind:<10} FAILED: {r['error']}", flush=True)
                    continue
                p = r["pred"]
                pred = (p["device"] + p["maps"] + p["output"]) / MIB
                fit = (r["working_set_mib"] * MIB - p["maps"] - p["output"] - fixed) / max(p["live"], 1)
                out = np.load(r["npy"])
                if kind == "one_pass":
                    ref = (out, r)
                err = float(np.abs(out - ref[0]).max()) if ref is not None else float("nan")
                mem = f"{r['working_set_mib'] / ref[1]['working_set_mib']:.3f}x" if ref else "-"
                cpu = f"{r['cpu_s'] / ref[1]['cpu_s']:.3f}x" if ref else "-"
                print(f"{size:<14} {kind:<10} {r['cpu_s']:>8.1f} {r['best_s']:>8.1f} {r['working_set_mib']:>12.0f} "
                      f"{pred:>14.0f} {pred / r['working_set_mib']:>9.2f} {fit:>5.2f} {mem:>12} {cpu:>9} {err:>9.2e}", flush=True)
                Path(r["npy"]).unlink()


def plans(a) -> None:
    import torch
    import vae
    from vae.engine import budget, memory
    gpu, host = torch.device("cuda"), torch.device("cpu")
    cases = [("wan", "1280x720x81"), ("wan", "1920x1080x241"), ("ltx2.3", "1920x1088x121"), ("kl", "2048x2048x1"),
             ("ltx_diffusion", "1280x704x121")]
    cases = [c for c in cases if not a.cases or c[0] in a.cases.split(",")]
    print(f"plans for a {a.budget} GB budget on a GPU, offload and output in host memory, bf16 "
          f"(meta measurement only; calibration factor, fixed bytes {memory.calibration(gpu)})")
    with tempfile.TemporaryDirectory(prefix="bench_budget_") as tmp:
        for family, size in cases:
            v = vae.load(_weights(family, Path(tmp))).to(dtype=torch.bfloat16)
            w, h, t = map(int, size.split("x"))
            z = _latent(family, f"{h}x{w}x{t}")
            call = v.call_for("decode", z.shape, tile=4096, mode="exact")
            try:
                p = budget.plan(v, call, int(a.budget * budget.GIB), gpu, host, host)
                print(f"{family:<8} {size:<14} {p.describe()}", flush=True)
            except vae.VAEKitError as e:
                print(f"{family:<8} {size:<14} {e}", flush=True)
            del v


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("scaling", "plans", "worker"))
    p.add_argument("--family", default="wan", choices=tuple(FAMILIES))
    p.add_argument("--sizes", help="HxWxT pixel sizes, comma-separated")
    p.add_argument("--kinds", default="one_pass,exact")
    p.add_argument("--tile", default="256", help="exact tile, pixels: one side, or HxW")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budget", type=float, default=4.0, help="GB, for plans")
    p.add_argument("--cases", help="plans: only these families' cases, comma-separated")
    p.add_argument("--size", help=argparse.SUPPRESS)
    p.add_argument("--kind", help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    {"scaling": scaling, "plans": plans, "worker": worker}[a.what](a)


if __name__ == "__main__":
    main()
