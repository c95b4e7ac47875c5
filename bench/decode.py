"""Decode and encode tables: runs of one family (or several) at one size (or several), each in its own
process, on the same file and the same input, figures read back into one table.

    python3 bench/run.py decode --family wan --size 128x192x33 --kinds one_pass,default,fast,exact,diffusers
    python3 bench/run.py encode --family ltx --size 512x768x49 --kinds diffusers,default,budget@1.5,budget@2.5
    python3 bench/run.py budget --family wan --size 512x768x17 --kinds one_pass,budget --budget 1
    python3 bench/run.py budget --family wan,ltx2.3,kl,ltx_diffusion --plans 4 --device cuda --dtype bf16
    python3 bench/run.py face --family wan --size 384x384x9 --kinds diffusers,face,face@0.25x

Weights: each family's published config with random weights under a fixed seed, written once to a
temporary folder (bench/harness/families.py); the input: randn latents, uniform 0..1 pixels, fixed seed.
Runs by name (bench/harness/runs.py); ``NAME@P`` gives a run its parameter (a tile ``512/64``, a budget in
GB, or ``0.25x``: a quarter of the least working set measured before it by a run without a parameter). ``face``: diffusers' class
beside vae.diffusers' face on the same file, decode then encode (``--op decode,encode``). Each run: its own subprocess (core's under ComfyUI's python), CPU, fp32, ``--threads``, measured by
bench/harness/measure.py: ``working`` = peak RSS during the call - RSS after loading (the output
included; ``w/o out`` subtracts the float32 output), ``cpu s`` the process's CPU time of the fastest call.
Errors against the first run of the list: max and mean abs, PSNR on 0..1 pixels (encode: relative to the
first run's max abs); ``agree from``: the first frame from which every frame agrees within 1e-4.
``--predict`` (``budget``): the planner's prediction of our runs (vae/engine/budget.py) and ``fit``, the
factor the run implies for vae/engine/memory.py's CALIBRATION: (measured - maps - output - fixed) / live.
``--plans GB``: the planner's choice for each budget from the meta measurement alone, nothing run.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from harness.families import FAMILIES, shape, write_input, write_weights  # noqa: E402
from harness.workers import measure_saved, results, run, worker_flags  # noqa: E402

MIB, GIB = 2 ** 20, 2 ** 30


def worker(a) -> None:
    from harness import runs
    folder = Path(a.tmp)
    a.run, _, a.param = a.worker.partition("@")
    a.info = {}
    dims = tuple(json.loads(a.shape))
    stem = folder / a.stem
    build = lambda: runs.build(a, folder, dims)      # noqa: E731
    if a.profile:
        return _profile(build, folder / a.input)
    measure_saved(a.threads, folder / a.input, build, stem, a.repeat)
    Path(f"{stem}.info.json").write_text(json.dumps(a.info))


def _profile(build, source: Path) -> None:
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile
    model, fn = build()
    x = torch.from_numpy(np.load(source))
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(x)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40))


def _errors(out, ref, op: str) -> tuple[float, float, str, str]:
    import numpy as np
    if ref is None or out.shape != ref.shape:
        return math.nan, math.nan, "-", "-"
    d = np.abs(out.astype(np.float64) - ref)
    scale = 1.0 if op == "decode" else float(np.abs(ref).max()) or 1.0
    mse = float(np.mean(d * d))
    psnr = "-" if op != "decode" else "inf" if mse == 0 else f"{10 * math.log10(1 / mse):.1f}"
    agree = "-"
    if out.ndim == 5:
        bad = np.nonzero(d.max(axis=(0, 1, 3, 4)) > 1e-4)[0]
        agree = str(int(bad[-1] + 1) if len(bad) else 0)
    return float(d.max()) / scale, float(d.mean()) / scale, psnr, agree


def _notes(r: dict, info: dict, fixed: float, predict: bool) -> str:
    notes = [info[k] for k in ("plan", "note") if k in info]
    if predict and "pred" in info:
        p = info["pred"]
        pred = p["device"] + p["maps"] + p["output"]
        fit = (r["working_set_mib"] * MIB - p["maps"] - p["output"] - fixed) / max(p["live"], 1)
        notes.append(f"predicted {pred / MIB:.0f} MiB ({pred / MIB / r['working_set_mib']:.2f}x), fit {fit:.2f}")
    if "compile_s" in info:
        notes.append(f"first call (graphs built) {info['compile_s']:.1f} s, {info['graphs']} graphs, "
                     f"eager fallbacks {info['fallbacks'] or 'none'}")
    if "attention" in r:
        notes.append(f"core attention {r['attention']}")
    return "; ".join(notes)


def table(a, family_name: str, size: str, folder: Path) -> list[dict]:
    import numpy as np
    family = FAMILIES[family_name]
    dims = shape(family, a.op, size)
    source = folder / f"{a.op}_{size}.npy"
    write_input(family, a.op, size, source)
    write_weights(family, folder)          # here, so that a table of core runs alone finds its file
    fixed = 0.0
    if a.predict:
        from vae.engine import memory
        fixed = memory.calibration("cpu")[1]
    flags = ["--family", family_name, "--op", a.op, "--tmp", str(folder), "--input", source.name, "--shape",
             json.dumps(dims), "--threads", str(a.threads), "--repeat", str(a.repeat), "--budget", str(a.budget),
             "--tile", a.tile or "", "--comfyui", a.comfyui or "", "--core-tile", a.core_tile or "",
             "--diffusers-tile", a.diffusers_tile or "", "--newer-tiled-decode", a.newer_tiled_decode or ""]
    names = [k for k in a.kinds.split(",") if a.comfyui or not k.startswith("core")]
    print(f"\n{family.title}, published config, random weights; {a.op} at {size} (HxWxT), input {dims}, "
          f"CPU fp32, {a.threads} threads")
    print(f"{'run':<18} {'time s':>8} {'cpu s':>8} {'x first':>7} {'working MiB':>11} {'w/o out':>8} "
          f"{'max err':>9} {'mean err':>9} {'PSNR':>5} {'agree from':>10}  notes")
    ref, rows = None, []
    stem = lambda k: f"{size}_{k.replace('/', '_')}"          # noqa: E731
    start = lambda k: run(str(BENCH / "decode.py"), _resolved(k, rows), flags + ["--stem", stem(k)],  # noqa: E731
                          folder / stem(k), a.comfy_python)
    for name, r, out in results(names, start, lambda k: f"{k:<18} "):
        info = json.loads(Path(folder / f"{stem(name)}.info.json").read_text())
        ref = (out.astype(np.float64), r) if ref is None else ref
        err, mean, psnr, agree = _errors(out, ref[0], a.op)
        ratio = r["cpu_s"] / ref[1]["cpu_s"] if ref[1]["cpu_s"] else math.nan
        output = out.size * 4 / MIB
        given = _resolved(name, rows)
        notes = "; ".join(filter(None, [f"budget {given.partition('@')[2]} GB" if given != name else "",
                                        _notes(r, info, fixed, a.predict)]))
        print(f"{name:<18} {r['best_s']:>8.2f} {r['cpu_s']:>8.2f} {ratio:>7.2f} {r['working_set_mib']:>11.0f} "
              f"{r['working_set_mib'] - output:>8.0f} {err:>9.2e} {mean:>9.2e} {psnr:>5} {agree:>10}  {notes}",
              flush=True)
        rows.append(dict(family=family_name, size=size, op=a.op, run=name, given=given, **r, info=info, max_err=err,
                         err_scale=1.0 if a.op == "decode" else float(np.abs(ref[0]).max()), output_mib=output))
        if a.seam_maps and name != names[0] and out.ndim == 4:
            _seam_map(np.abs(out - ref[0]), Path(a.seam_maps) / f"seams_{family_name}_{name.replace('/', '_')}.png")
        Path(r["output"]).unlink()
    return rows


def _resolved(name: str, rows: list[dict]) -> str:
    """``NAME@Fx`` as ``NAME@GB``: F times the least working set measured before it (``rows``) by a run
    without a parameter (a budget below each one-pass run); any other name as it is."""
    run_name, _, param = name.partition("@")
    if not param.endswith("x"):
        return name
    plain = [r["working_set_mib"] for r in rows if "@" not in r["run"]]
    if not plain:
        raise SystemExit(f"{name}: a budget relative to the runs before it needs one without a parameter.")
    least = min(plain)
    return f"{run_name}@{float(param[:-1]) * least / 1024:.4f}"


def _seam_map(diff, path: Path, gain: float = 5.0) -> None:
    """|out - first run|, amplified, max over channels, as an 8-bit PNG."""
    import torch
    from vae.files import imageio
    path.parent.mkdir(parents=True, exist_ok=True)
    m = (torch.from_numpy(diff).amax(dim=1)[0] * gain).clamp(0, 1).float()
    imageio.write_image(path, m[..., None].expand(*m.shape, 3))


def plans(a, family_name: str, folder: Path) -> None:
    """The planner's choice for each budget of ``--plans`` (GB) from the meta measurement alone."""
    import torch
    import vae
    from vae.engine import budget
    family = FAMILIES[family_name]
    device = torch.device(a.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    v = vae.load(write_weights(family, folder)).to(dtype=dtype)
    for size in (a.size or family.plan_size or family.size).split(","):
        call = v.call_for(a.op, shape(family, a.op, size), tile=4096, mode="exact")
        for gb in map(float, a.plans.split(",")):
            try:
                p = budget.plan(v, call, int(gb * GIB), device, torch.device("cpu"), torch.device("cpu"))
                print(f"{family_name:<14} {size:<14} {gb:>5.2f} GB {a.dtype} on {a.device}: {p.describe()}", flush=True)
            except vae.VAEKitError as e:
                print(f"{family_name:<14} {size:<14} {gb:>5.2f} GB: {e}", flush=True)


def main(argv=None, op: str = "decode", predict: bool = False, face: bool = False) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="wan" if face else "kl", help=f"comma list of {', '.join(FAMILIES)}")
    p.add_argument("--size", help="HxWxT pixels and frames, comma list (default: the family's)")
    kinds = "diffusers,face,face@0.25x" if face else "one_pass,exact" if predict else "one_pass,default,fast,exact,diffusers"
    p.add_argument("--kinds", default=kinds,
                   help="runs, comma list (bench/harness/runs.py); NAME@P gives a run its parameter")
    p.add_argument("--tile", help="our tile in pixels, TILE or TILE/OVERLAP (default: the family's)")
    p.add_argument("--budget", default="4", help="GB for the budget runs that name none")
    p.add_argument("--repeat", type=int, default=1, help="timed calls per run (no warm-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--op", default="decode,encode" if face else op, help="decode, encode, or both (decode,encode)")
    p.add_argument("--predict", action="store_true", default=predict, help="the planner's prediction beside")
    p.add_argument("--plans", help="GB budgets, comma list: print the plans only")
    p.add_argument("--device", default="cpu", help="--plans: the device planned for")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="--plans: the weights' dtype")
    p.add_argument("--profile", help="profile one call of this run (torch.profiler) instead of the table")
    p.add_argument("--seam-maps", help="folder for PNGs of each image run's difference to the first run")
    p.add_argument("--json", help="write the rows as JSON")
    p.add_argument("--comfyui", help="ComfyUI source directory (the core runs)")
    p.add_argument("--comfy-python", help="ComfyUI's python (its venv)")
    p.add_argument("--core-tile", help="core_tiled's tile in pixels (default: the family's declared settings)")
    p.add_argument("--diffusers-tile", help="diffusers_tiled's tile_sample_min_size, pixels")
    p.add_argument("--newer-tiled-decode", help="MiniMax core_newer: core 0.38.1's tiled decode source")
    worker_flags(p, tmp=str, input=str, shape=str, stem=str)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    ops = a.op.split(",")
    if set(ops) - {"decode", "encode"}:
        p.error(f"--op: decode, encode or decode,encode, not {a.op}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vaekit-bench-") as tmp:
        for name in a.family.split(","):
            folder = Path(tmp) / name
            folder.mkdir()
            if a.plans:
                plans(a, name, folder)
                continue
            if a.profile:
                flags = ["--family", name, "--op", a.op, "--tmp", str(folder), "--input", "in.npy", "--profile", "1"]
                size = (a.size or FAMILIES[name].size).split(",")[0]
                write_input(FAMILIES[name], a.op, size, folder / "in.npy")
                import subprocess
                subprocess.run([sys.executable, __file__, "--worker", a.profile, *flags, "--shape",
                                json.dumps(shape(FAMILIES[name], a.op, size)), "--tile", a.tile or ""])
                continue
            for size in (a.size or FAMILIES[name].size).split(","):
                for op in ops:
                    a.op = op
                    rows += table(a, name, size, folder)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
