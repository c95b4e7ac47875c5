"""Encoding within a budget: diffusers' encode and ours in one pass beside our exact encode planned for a
memory budget (time chunks through the encoder's causal caches, spatial tiles where a chunk alone does
not fit), same weights from the same file, same clip, one run.

    python bench/bench_encode.py --family ltx --size 512x768x49 --budget 1.5       # the origin case
    python bench/bench_encode.py --family wan --size 480x832x17 --budget 1.5,2.5
    python bench/bench_encode.py --family hunyuan_video15 --size 240x416x13 --budget 2
    python bench/bench_encode.py --family wan --size 480x832x81 --plans 1.5,2,3,4   # the plans only (meta)

Weights: each family's published config, diffusers' class (LTX-Video 0.9.0 = AutoencoderKLLTXVideo(), Wan 2.1
= AutoencoderKLWan(), HunyuanVideo 1.5 = AutoencoderKLHunyuanVideo15()), random weights under a fixed seed,
saved once to a temporary .safetensors file that both libraries load. The clip: uniform pixels in 0..1
under a fixed seed, [1, 3, T, H, W]. Each run is its own subprocess (CPU, fp32, ``--threads``), measured as
bench/harness/measure.py measures: ``working`` = peak RSS during the call - RSS after loading (the input
clip is loaded before that mark, the output is inside it); ``cpu s`` the process's CPU time of the call.

Runs:
  diffusers       the model's ``encode(x).latent_dist.mean`` with its tiling and frame-wise switches off (Wan
                  encodes 1 + 4k frames chunk by chunk through its caches by definition; LTX and
                  HunyuanVideo 1.5 the whole clip at once)
  ours_one_pass   ``VAE.encode(x)``: the handle's default (LTX: one pass; Wan one latent frame a chunk and
                  HunyuanVideo 1.5 two, as their references chunk)
  ours_budget     ``VAE.encode(x, mode="exact", budget=B)`` for each budget B of ``--budget``: the planner's
                  tile and time chunk for B (printed, with its prediction, from the worker's own plan
                  before the call)
  ours_posterior  the same call with ``posterior=True`` (mean and log-variance; compared on the mean)
``max abs`` is against ours_one_pass (latents; LTX's are normalised by its per-channel statistics, the
identity here, so both libraries' latents are the raw posterior mean), ``vs diffusers`` against diffusers'.

``--plans``: the plan for each budget (GB) from the meta measurement alone, nothing encoded.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from harness.workers import diffusers_from_file, measure_saved, results, run, worker_flags

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {"ltx": "AutoencoderKLLTXVideo", "wan": "AutoencoderKLWan", "hunyuan_video15": "AutoencoderKLHunyuanVideo15"}
RUNS = ("diffusers", "ours_one_pass", "ours_budget")
GIB = 1 << 30


def _size(text: str) -> tuple[int, int, int]:
    h, w, t = map(int, text.split("x"))
    return h, w, t


def _encoder(a, weights: Path, plan_out: Path):
    """The run's encode: pixels [1, 3, T, H, W] in 0..1 -> latent (the posterior mean)."""
    if a.worker == "diffusers":
        import diffusers
        model = diffusers_from_file(getattr(diffusers, FAMILIES[a.family]), weights)
        for flag in ("use_framewise_encoding", "use_framewise_decoding", "use_tiling", "use_slicing"):
            if hasattr(model, flag):
                setattr(model, flag, False)
        return model, lambda x: model.encode(x * 2 - 1).latent_dist.mean
    sys.path.insert(0, str(ROOT))
    import torch
    import vae
    from vae.engine import budget
    v = vae.load(weights)
    if a.worker == "ours_one_pass":
        return v.model, lambda x: v.encode(x)
    b = int(float(a.budget) * GIB)
    posterior = a.worker == "ours_posterior"
    cpu = torch.device("cpu")
    call = v.call_for("encode", (1, 3, *_clip(a)), mode="exact")
    p = budget.plan(v, dataclasses.replace(call, posterior=posterior), b, cpu, cpu, cpu)
    plan_out.write_text(json.dumps(dict(plan=p.describe(), predicted=p.on_device())))
    if posterior:
        return v.model, lambda x: v.encode(x, mode="exact", budget=b, posterior=True)[0]
    return v.model, lambda x: v.encode(x, mode="exact", budget=b)


def _clip(a) -> tuple[int, int, int]:
    h, w, t = _size(a.size)
    return t, h, w


def worker(a) -> None:
    tmp = Path(a.tmp)
    stem = tmp / (a.stem or a.worker)
    measure_saved(a.threads, tmp / "clip.npy", lambda: _encoder(a, tmp / f"{a.family}.safetensors",
                                                                Path(f"{stem}.plan.json")), stem)


def write_inputs(a, tmp: Path) -> Path:
    import diffusers
    import numpy as np
    import torch
    from safetensors.torch import save_file
    torch.manual_seed(0)
    model = getattr(diffusers, FAMILIES[a.family])()
    path = tmp / f"{a.family}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    del model
    t, h, w = _clip(a)
    np.save(tmp / "clip.npy", np.random.default_rng(0).random((1, 3, t, h, w), dtype=np.float32))
    return path


def plans(a, weights: Path) -> None:
    import torch
    sys.path.insert(0, str(ROOT))
    import vae
    from vae.engine import budget
    v = vae.load(weights)
    cpu = torch.device("cpu")
    call = v.call_for("encode", (1, 3, *_clip(a)), mode="exact")
    for gb in map(float, a.plans.split(",")):
        try:
            print(f"  {gb:>5.2f} GB: {budget.plan(v, call, int(gb * GIB), cpu, cpu, cpu).describe()}", flush=True)
        except vae.VAEKitError as e:
            print(f"  {gb:>5.2f} GB: {e}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="ltx", choices=tuple(FAMILIES))
    p.add_argument("--size", default="512x768x49", help="HxWxT pixels and frames")
    p.add_argument("--budget", default="1.5", help="GB (2^30 bytes) for ours_budget (and ours_posterior), comma-separated")
    p.add_argument("--runs", default=",".join(RUNS), help=f"of {', '.join(RUNS + ('ours_posterior',))}")
    p.add_argument("--plans", help="GB budgets, comma-separated: print the plans only")
    p.add_argument("--threads", type=int, default=2)
    worker_flags(p, tmp=str, stem=str)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    import numpy as np
    with tempfile.TemporaryDirectory(prefix="bench_encode_") as tmp:
        tmp = Path(tmp)
        weights = write_inputs(a, tmp)
        t, h, w = _clip(a)
        print(f"{a.family} (published config, random weights), encode of {t} frames of {w}x{h}, CPU fp32, "
              f"{a.threads} threads, budget {a.budget} GB", flush=True)
        budgets = a.budget.split(",")
        if a.plans:
            return plans(a, weights)
        print(f"{'run':<19} {'cpu s':>8} {'wall s':>8} {'working MiB':>12} {'cpu vs one pass':>16} "
              f"{'max abs':>9} {'vs diffusers':>12}  plan", flush=True)
        flags = ["--tmp", str(tmp), "--family", a.family, "--size", a.size, "--threads", str(a.threads)]
        # a budgeted run per budget: "ours_budget@1.5" (the worker's name and the budget it plans for)
        names = [f"{n}@{b}" if n in ("ours_budget", "ours_posterior") else n for n in a.runs.split(",")
                 for b in (budgets if n in ("ours_budget", "ours_posterior") else [""])]

        def start(name):
            worker_name, _, b = name.partition("@")
            return run(__file__, worker_name, flags + ["--budget", b or budgets[0], "--stem", name], tmp / name)
        label = lambda name: f"{name:<19} "                                 # noqa: E731
        done = {}
        for name, r, out in results(names, start, label):
            done[name] = (r, out)
            base = done.get("ours_one_pass")
            ref = done.get("diffusers")
            err = float(np.abs(out - base[1]).max()) if base else float("nan")
            vs = float(np.abs(out - ref[1]).max()) if ref else float("nan")
            cpu = f"{r['cpu_s'] / base[0]['cpu_s']:.2f}x" if base else "-"
            plan = Path(tmp / f"{name}.plan.json")
            note = ""
            if plan.exists():
                info = json.loads(plan.read_text())
                note = f"{info['plan']}; measured {r['working_set_mib'] / 1024:.2f} GiB"
            print(f"{name:<19} {r['cpu_s']:>8.1f} {r['best_s']:>8.1f} {r['working_set_mib']:>12.0f} {cpu:>16} "
                  f"{err:>9.2e} {vs:>12.2e}  {note}", flush=True)


if __name__ == "__main__":
    main()
