"""Exact tiling benchmark: untiled, our fast and exact tiles, and core ComfyUI's VAE Decode (Tiled),
on the same weights and latent, in one run.

    python bench/bench_exact.py                                   # SD shape at 1024x1024 + HunyuanVideo
    python bench/bench_exact.py --comfyui /path/to/ComfyUI --comfy-python /path/to/venv/bin/python
    python bench/bench_exact.py --quick                           # 256x256, small video (smoke run)
    python bench/bench_exact.py --seam-maps docs/                 # also write the seam map PNGs

Models (random weights under a fixed seed, saved once to a temporary file that every configuration
loads): the SD-shape AutoencoderKL (128/256/512/512, 2 resnets per level, mid attention, 4 latent
channels) and HunyuanVideo's published config (clip-wide GroupNorm, frame-causal mid attention).
Every configuration runs in its own process, so peak RSS is per configuration; ``working set`` is
the peak minus the RSS once the weights are loaded (the peak mark is reset after loading, as in
bench_decode.py). Core ComfyUI's node calls ``vae.decode_tiled(z, tile//8, tile//8, overlap//8)``:
three passes of differently shaped tiles, averaged. Errors are against our untiled output, on 0..1
pixels; PSNR in dB. Nothing is asserted: figures and the targets are printed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
from harness import comfy_core  # noqa: E402
from harness.measure import MIB, reset_peak, vm_hwm_kib, vm_rss_kib, loaded_rss_kib  # noqa: E402
from bench_decode import KL_SHAPE  # noqa: E402
from harness.workers import worker_flags  # noqa: E402

SEED = 0
# config -> (engine, mode, tile px, overlap px)
IMAGE = {"untiled": ("ours", "fast", None, None),
         "fast_512": ("ours", "fast", 512, 64), "exact_512": ("ours", "exact", 512, 64),
         "fast_256": ("ours", "fast", 256, 32), "exact_256": ("ours", "exact", 256, 32),
         "core_512": ("core", None, 512, 64), "core_256": ("core", None, 256, 32)}
VIDEO = {"untiled": ("ours", "fast", None, None), "fast_64": ("ours", "fast", 64, 16),
         "exact_64": ("ours", "exact", 64, 16)}


def _models(tmp: Path, quick: bool, size: int) -> dict:
    import torch
    from safetensors.torch import save_file
    sys.path.insert(0, str(ROOT))
    import vae
    from diffusers import AutoencoderKL, AutoencoderKLHunyuanVideo

    torch.manual_seed(SEED)
    kl = vae.from_state_dict(AutoencoderKL(**KL_SHAPE).state_dict())
    hy = vae.from_state_dict(AutoencoderKLHunyuanVideo().state_dict())
    side = 256 if quick else size
    cases = {"sd": (kl, (1, 4, side // 8, side // 8)), "hunyuan_video": (hy, (1, 16, 3, 16, 16))}
    for name, (v, shape) in cases.items():
        # the LDM layout, which is also ComfyUI's for these models
        save_file(v.state_dict(), str(tmp / f"{name}.safetensors"))
        torch.save(torch.randn(shape, generator=torch.Generator().manual_seed(SEED)), tmp / f"{name}_z.pt")
    return cases


def worker(a) -> None:
    import torch
    torch.set_num_threads(a.threads)
    tmp = Path(a.tmp)
    engine, mode, tile, overlap = (IMAGE if a.model == "sd" else VIDEO)[a.worker]
    z = torch.load(tmp / f"{a.model}_z.pt", weights_only=True)
    if engine == "core":
        from safetensors.torch import load_file
        v = comfy_core.vae(a.comfyui, load_file(str(tmp / f"{a.model}.safetensors")))

        def decode():    # as core's VAEDecodeTiled node: latent units, IMAGE [B, H, W, 3] out
            return v.decode_tiled(z, tile_x=tile // 8, tile_y=tile // 8, overlap=overlap // 8).movedim(-1, 1)
    else:
        sys.path.insert(0, str(ROOT))
        import vae
        v = vae.load(tmp / f"{a.model}.safetensors")

        def decode():
            return v.decode(z, tile=tile, overlap=overlap, mode=mode)
    model = v.first_stage_model if engine == "core" else v.model
    rss = loaded_rss_kib(model)    # page in memory-mapped weights now: loading is not the decode's working set
    # VmHWM, not ru_maxrss: after exec, ru_maxrss keeps the forking parent's peak (our parent holds models)
    if not reset_peak() and vm_hwm_kib() > vm_rss_kib() + 1024:
        print("warning: could not reset the peak-RSS mark; working sets include loading", file=sys.stderr)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = decode()
        seconds = time.perf_counter() - t0
    torch.save(out.float().clamp(0, 1).contiguous(), tmp / f"{a.model}_{a.worker}.pt")
    (tmp / f"{a.model}_{a.worker}.json").write_text(json.dumps(
        dict(seconds=seconds, working_set_mib=(vm_hwm_kib() - rss) / MIB, peak_rss_mib=vm_hwm_kib() / MIB,
             rss_after_load_mib=rss / MIB)))


def seam_map(diff, path: Path, gain: float) -> None:
    """abs difference to untiled, amplified, as an 8-bit PNG (max over channels)."""
    sys.path.insert(0, str(ROOT))
    from vae.files import imageio
    m = (diff.amax(dim=1)[0] * gain).clamp(0, 1)
    imageio.write_image(path, m[..., None].expand(*m.shape, 3))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--comfyui", help="ComfyUI source directory (adds core's VAE Decode (Tiled) rows)")
    p.add_argument("--comfy-python", default=sys.executable, help="python with ComfyUI's requirements")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--size", type=int, default=1024, help="SD image side in pixels")
    p.add_argument("--configs", help="comma-separated configurations (default: all)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--only", help="comma-separated models: sd,hunyuan_video")
    p.add_argument("--seam-maps", help="folder for seam map PNGs (SD model)")
    worker_flags(p, model=str, tmp=str)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    import torch
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cases = _models(tmp, a.quick, a.size)
        for model in (a.only.split(",") if a.only else cases):
            configs = IMAGE if model == "sd" else VIDEO
            rows = {}
            for name, (engine, mode, tile, overlap) in configs.items():
                if (engine == "core" and not a.comfyui) or (a.configs and name not in ("untiled", *a.configs.split(","))):
                    continue
                python = a.comfy_python if engine == "core" else sys.executable
                cmd = [python, __file__, "--worker", name, "--model", model, "--tmp", d, "--threads", str(a.threads)]
                if a.comfyui:
                    cmd += ["--comfyui", a.comfyui]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode:
                    print(f"{model} {name}: failed\n{r.stderr[-2000:]}")
                    continue
                rows[name] = json.loads((tmp / f"{model}_{name}.json").read_text())
                rows[name]["out"] = torch.load(tmp / f"{model}_{name}.pt", weights_only=True)
            report(model, tuple(cases[model][1]), rows, configs, a.seam_maps)


def report(model: str, shape, rows: dict, configs: dict, seam_dir) -> None:
    base = rows["untiled"]
    print(f"\n{model}: latent {shape}, output {tuple(base['out'].shape)}, fp32, {os.cpu_count()} CPU threads")
    print(f"{'configuration':<22}{'time s':>9}{'x untiled':>11}{'working set MiB':>17}{'max abs err':>13}{'PSNR dB':>9}")
    for name, r in rows.items():
        diff = (r["out"] - base["out"]).abs()
        err = diff.max().item()
        mse = diff.square().mean().item()
        psnr = math.inf if mse == 0 else 10 * math.log10(1 / mse)
        engine, mode, tile, overlap = configs[name]
        label = "untiled" if tile is None else f"{'core tiled' if engine == 'core' else mode} {tile}/{overlap}"
        print(f"{label:<22}{r['seconds']:>9.1f}{r['seconds'] / base['seconds']:>11.2f}{r['working_set_mib']:>17.0f}"
              f"{err:>13.2e}{psnr:>9.1f}")
        if seam_dir and model == "sd" and tile is not None:
            Path(seam_dir).mkdir(parents=True, exist_ok=True)
            seam_map(diff, Path(seam_dir) / f"seams_{name}.png", gain=5.0)
    print("targets: exact <= 1.5x the untiled time and below its working set, max abs err <= 1e-4; "
          "fast's error below core's at the same tile and overlap")


if __name__ == "__main__":
    main()
