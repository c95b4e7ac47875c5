"""ComfyUI core inside a bench worker, as the reference the scripts compare against (run under ComfyUI's python).

ComfyUI picks its device and attention function from its command-line flags when ``comfy.model_management``
is first imported; a worker never passes ComfyUI its own argv, so ``start`` sets the flags on core's parsed
defaults before anything imports that module."""
from __future__ import annotations

import sys


def start(comfyui: str, pytorch_attention: bool | None = None) -> None:
    """Make ComfyUI's source at ``comfyui`` importable and set it up for the CPU (``--cpu``); with
    ``pytorch_attention`` also ``--use-pytorch-cross-attention`` on or off. Call it before importing
    anything else from comfy or ComfyUI's ``nodes``."""
    if sys.path[0] != comfyui:
        sys.path.insert(0, comfyui)
    _audio_stand_in()
    from comfy.cli_args import args
    args.cpu = True
    if pytorch_attention is not None:
        args.use_pytorch_cross_attention = pytorch_attention


def _audio_stand_in() -> None:
    """Core 783545f6 imports ``torchaudio.functional`` at start-up (its Gemma 4 text encoder). Where
    torchaudio is an import-only stand-in without it (a CPU setup without the audio wheel), an empty
    module lets core start; no bench runs audio."""
    import importlib.util
    import types
    if importlib.util.find_spec("torchaudio") is not None and "torchaudio.functional" not in sys.modules:
        try:
            importlib.import_module("torchaudio.functional")
        except ImportError:
            sys.modules["torchaudio.functional"] = types.ModuleType("torchaudio.functional")


def vae(comfyui: str, sd: dict, **kw):
    """Core's VAE of a state dict, as its Load VAE builds it: ``comfy.sd.VAE(sd=sd, **kw)`` on the CPU."""
    start(comfyui)
    import comfy.sd
    return comfy.sd.VAE(sd=sd, **kw)


def run_worker(script: str, comfyui: str, python: str, threads: int, weights: dict, inputs: dict,
               prefix: str = "cmp_") -> tuple[dict, dict]:
    """Core's side of a comparison in a subprocess under ComfyUI's ``python``: ``weights`` and ``inputs``
    are written to a temporary folder, ``script --worker FOLDER --comfyui .. --threads ..`` runs there and
    leaves ``core.safetensors`` (its outputs) and ``core.json`` (its report) beside them (``worker_files``,
    ``save_worker``); both are returned. Exits with core's error if the worker fails."""
    import json
    import subprocess
    import tempfile
    from pathlib import Path

    from safetensors.torch import load_file, save_file
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        d = Path(tmp)
        save_file({k: t.contiguous() for k, t in weights.items()}, d / "weights.safetensors")
        save_file({k: t.contiguous() for k, t in inputs.items()}, d / "inputs.safetensors")
        proc = subprocess.run([python, script, "--worker", tmp, "--comfyui", comfyui, "--threads", str(threads)],
                              capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"ComfyUI FAILED:\n{proc.stderr[-3000:]}")
        return load_file(d / "core.safetensors"), json.loads((d / "core.json").read_text())


def worker_files(folder: str) -> tuple[dict, dict]:
    """In a worker of ``run_worker``: the weights and the inputs it was given."""
    from pathlib import Path

    from safetensors.torch import load_file
    return load_file(Path(folder) / "weights.safetensors"), load_file(Path(folder) / "inputs.safetensors")


def save_worker(folder: str, outputs: dict, report: dict) -> None:
    """In a worker of ``run_worker``: its outputs and its report, for the caller."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file
    save_file({k: t.contiguous() for k, t in outputs.items()}, Path(folder) / "core.safetensors")
    (Path(folder) / "core.json").write_text(json.dumps(report))


def comparison_flags(p) -> None:
    """The flags of a core comparison (``bench/comfyui_checks/compare_core_*.py``): ``--comfyui``, ``--python``,
    ``--threads`` and the hidden ``--worker`` of ``run_worker``."""
    import argparse
    p.add_argument("--comfyui", required=True, help="ComfyUI source directory (the one with comfy/)")
    p.add_argument("--python", help="ComfyUI's python (its venv); default: this one")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", help=argparse.SUPPRESS)
