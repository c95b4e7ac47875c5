"""The shared shape of the benchmark scripts: one run per subprocess, so that every run's peak RSS is its own.

A script starts itself with ``--worker NAME`` (``run``; ComfyUI core's runs under ComfyUI's python, since
core needs its own venv), the worker times a call on an input the parent saved (``measure_saved``) and
leaves its figures (``STEM.json``) and output (``STEM.npy``) for the parent, which reads them back run by
run (``results``)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def diffusers_from_file(cls, path: Path, **config):
    """A diffusers model holding exactly the weights in ``path``, in eval mode, its tiling, slicing and
    frame-wise switches off (one pass, the definition: a run switches on what it measures). Built on the
    meta device, so no random initialisation is timed or held, then given the file's tensors."""
    import torch
    from safetensors.torch import load_file
    with torch.device("meta"):
        model = cls(**config)
    model.load_state_dict(load_file(str(path)), strict=True, assign=True)
    for flag in ("use_framewise_decoding", "use_framewise_encoding", "use_tiling", "use_slicing"):
        if hasattr(model, flag):
            setattr(model, flag, False)
    return model.eval().requires_grad_(False)


def measure_saved(threads: int, source: Path, build, out_stem: Path, repeat: int = 1) -> None:
    """A worker's measurement: the input saved at ``source`` (.npy), ``build()`` -> (model, call), ``repeat``
    timed calls by measure.measure (figures to ``out_stem``.json, the output to ``out_stem``.npy)."""
    import numpy as np
    import torch
    from .measure import measure
    torch.set_num_threads(threads)
    x = torch.from_numpy(np.load(source))
    model, fn = build()
    x = getattr(fn, "prepare", lambda t: t)(x)    # the input in the caller's own range, made before measuring
    measure(fn, x, model, repeat, out_stem)


def run(script: str, name: str, flags: list[str], stem: Path, comfy_python: str | None = None,
        tail: int = 3, env: dict | None = None) -> dict:
    """Run ``script --worker name *flags`` (under ComfyUI's python for a ``core*`` run) and return the
    figures it wrote to ``stem``.json with ``output``: the path of its output (``stem``.npy); or
    ``{"error": ...}`` with the last ``tail`` lines it printed when it failed."""
    python = comfy_python if name.startswith("core") else sys.executable
    cmd = [python, str(Path(script).resolve()), "--worker", name, *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        return {"error": " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-tail:])}
    return {**json.loads(Path(f"{stem}.json").read_text()), "output": f"{stem}.npy"}


def results(names, start, label):
    """(name, figures, output array) of each run that worked; ``start(name)`` runs one (see ``run``). A run
    that failed gets its row here: ``label(name)``, FAILED and its error."""
    import numpy as np
    for name in names:
        r = start(name)
        if "error" in r:
            print(f"{label(name)}FAILED: {r['error']}", flush=True)
            continue
        yield name, r, np.load(r["output"])


def worker_flags(p: argparse.ArgumentParser, **hidden: type) -> None:
    """The flags a script passes to itself to start a worker: ``--worker`` and ``hidden`` (name -> type),
    left out of --help."""
    p.add_argument("--worker", help=argparse.SUPPRESS)
    for name, kind in hidden.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, help=argparse.SUPPRESS)

