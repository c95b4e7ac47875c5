"""The latent cache's throughput on CPU beside musubi-tuner's own cache script, same clips, same VAE file,
one run; and the two caches compared file by file.

    python3 bench/run.py cache --musubi PATH/TO/musubi-tuner --musubi-python PATH/TO/venv/bin/python
    python3 bench/run.py cache --clips 4 --frames 17 --size 256x256 --runs ours      # ours alone

Weights: Wan 2.1 at its published config with random weights (bench/harness/families.py: diffusers'
``AutoencoderKLWan()`` under a fixed seed, written in Wan's original layout, the file ComfyUI and
musubi-tuner read). Clips: ``--clips`` mp4 files of ``--frames`` frames at exactly ``--size`` (so that
neither cache resizes: both encode the same pixels), made with PyAV (bench/harness/clips.py).

Runs (each a subprocess, timed from its start to its end, imports and model loading included, as a user
runs them; ``cpu s`` is the process's CPU time):
  ours     vaekit cache --format musubi --arch wan (exact, float32; stored float32 as musubi-tuner stores
           latents in its VAE's dtype), musubi-tuner's file layout
  musubi   musubi-tuner's wan_cache_latents.py --vae_dtype float32 --device cpu, its defaults otherwise
           (Wan: no spatial tiling; the encoder runs its own causal time chunks), through a shim where a
           CPU-only torch refuses what its imports do (the comment at the command says what)
Then the latents of each pair of files are compared (max abs; float32 files).
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from harness.clips import pan, photos, write_video  # noqa: E402
from harness.families import FAMILIES, write_weights  # noqa: E402


def timed(cmd: list, cwd: Path, env=None) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(f"{cmd[:4]} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), r.stdout


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clips", type=int, default=4)
    p.add_argument("--frames", type=int, default=17)
    p.add_argument("--size", default="256x256", help="WxH of the clips and the bucket")
    p.add_argument("--musubi", help="a musubi-tuner checkout")
    p.add_argument("--musubi-python", default=sys.executable, help="a Python with musubi-tuner's dependencies")
    p.add_argument("--runs", default="ours,musubi")
    p.add_argument("--tmp", help="work folder (default: a temporary one)")
    a = p.parse_args(argv)
    w, h = (int(n) for n in a.size.split("x"))
    tmp = Path(a.tmp or tempfile.mkdtemp(prefix="bench_cache_"))
    clips = tmp / "clips"
    clips.mkdir(parents=True, exist_ok=True)
    weights = write_weights(FAMILIES["wan"], tmp)
    ph = photos()
    for i in range(a.clips):
        if not (clips / f"clip{i}.mp4").exists():
            write_video(clips / f"clip{i}.mp4", pan(ph[i % len(ph)], a.frames, (w, h)), fps=16)
        (clips / f"clip{i}.txt").write_text("a photo, panned")          # musubi-tuner reads a caption per video
    runs = a.runs.split(",")
    print(f"{a.clips} clips of {a.frames} frames at {w}x{h}, Wan 2.1 (published config, random weights), CPU float32")
    results = {}
    if "ours" in runs:
        out = tmp / "ours"
        cmd = [sys.executable, "-m", "vae", "cache", "--vae", str(weights), str(clips), "-o", str(out), "--format",
               "musubi", "--arch", "wan", "--resolution", f"{w}x{h}", "--no-bucket", "--frames", str(a.frames), "-q",
               "--save-dtype", "float32"]
        for f in out.glob("*"):
            f.unlink()
        results["ours"] = timed(cmd, ROOT) + (out,)
    if "musubi" in runs:
        if not a.musubi:
            raise SystemExit("--musubi names no musubi-tuner checkout")
        out = tmp / "musubi"
        out.mkdir(exist_ok=True)
        for f in out.glob("*"):
            f.unlink()
        config = tmp / "dataset.toml"
        config.write_text(f'[general]\nresolution = [{w}, {h}]\nbatch_size = 1\ncaption_extension = ".txt"\n\n'
                          f'[[datasets]]\nvideo_directory = '
                          f'"{clips}"\ncache_directory = "{out}"\ntarget_frames = [{a.frames}]\n'
                          'frame_extraction = "head"\n')
        script = Path(a.musubi) / "src" / "musubi_tuner" / "wan_cache_latents.py"
        args = ["--dataset_config", str(config), "--vae", str(weights), "--vae_dtype", "float32", "--device", "cpu",
                "--num_workers", "1"]
        # at import its wan/modules/t5.py calls torch.cuda.current_device() (a default argument; a CPU-only torch
        # refuses it) and its clip.py imports torchvision (the I2V CLIP's preprocessing): the shim answers 0 and
        # gives an empty torchvision; neither is used by a text-to-video latent cache
        shim = ("import runpy, sys, types, importlib.machinery as m, torch; torch.cuda.current_device = lambda: 0; "
                "tv = types.ModuleType('torchvision'); tv.transforms = types.ModuleType('torchvision.transforms'); "
                "tv.__spec__ = m.ModuleSpec('torchvision', None); tv.__version__ = '0.0'; "
                "sys.modules.update({'torchvision': tv, 'torchvision.transforms': tv.transforms}); "
                f"sys.argv = [{str(script)!r}] + {args!r}; runpy.run_path({str(script)!r}, run_name='__main__')")
        cmd = [a.musubi_python, "-c", shim]
        env = {**os.environ, "PYTHONPATH": str(Path(a.musubi) / "src")}
        results["musubi"] = timed(cmd, Path(a.musubi), env) + (out,)
    # on a shared machine wall time follows the other processes' load; CPU time is the figure to compare
    print(f"{'run':8} {'wall s':>8} {'cpu s':>8} {'items/min':>10} {'items/cpu-min':>14}")
    for name, (wall, cpu, _, _) in results.items():
        print(f"{name:8} {wall:8.1f} {cpu:8.1f} {a.clips / wall * 60:10.2f} {a.clips / cpu * 60:14.2f}")
    if "ours" in results and "musubi" in results:
        print(f"ours / musubi-tuner: CPU time {results['ours'][1] / results['musubi'][1]:.2f}x, "
              f"wall time {results['ours'][0] / results['musubi'][0]:.2f}x")
        from safetensors import safe_open
        from safetensors.torch import load_file
        worst = 0.0
        for f in sorted(results["musubi"][3].glob("*_wan.safetensors")):
            mine = results["ours"][3] / f.name
            if not mine.exists():
                raise SystemExit(f"ours has no {f.name} (theirs: {sorted(x.name for x in results['musubi'][3].iterdir())})")
            x, y = load_file(str(f)), load_file(str(mine))
            assert list(x) == list(y), (list(x), list(y))
            with safe_open(str(f), "pt") as fx, safe_open(str(mine), "pt") as fy:
                assert fx.metadata() == fy.metadata(), (fx.metadata(), fy.metadata())
            worst = max(worst, max((x[k].float() - y[k].float()).abs().max().item() for k in x))
        print(f"same file names, keys and metadata; max |ours - musubi-tuner| over the latents: {worst:.3e} (float32)")


if __name__ == "__main__":
    main()
