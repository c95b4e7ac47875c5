"""ComfyUI core inside a bench worker, as the reference the scripts compare against (run under ComfyUI's python).

ComfyUI picks its device and attention function from its command-line flags when ``comfy.model_management``
is first imported; a worker never passes ComfyUI its own argv, so ``start`` sets the flags on core's parsed
defaults before anything imports that module."""
from __future__ import annotations

import sys
from pathlib import Path


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
    from safetensors.torch import load_file
    return load_file(Path(folder) / "weights.safetensors"), load_file(Path(folder) / "inputs.safetensors")


def save_worker(folder: str, outputs: dict, report: dict) -> None:
    """In a worker of ``run_worker``: its outputs and its report, for the caller."""
    import json
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


def parse_comparison(p, worker):
    """Parse the command line of a core comparison (``p`` has ``comparison_flags``). In a worker: run
    ``worker(args)`` and return None. Else the arguments, with ``--comfyui`` made absolute and ``--python``
    defaulting to this python, after setting torch's threads to ``--threads``."""
    import torch
    a = p.parse_args()
    if a.worker:
        return worker(a)
    a.comfyui, a.python = str(Path(a.comfyui).resolve()), a.python or sys.executable
    torch.set_num_threads(a.threads)
    return a


def diffusers_jittered(cls, seed: int):
    """diffusers' model ``cls`` at its default config (the published one), random weights seeded with
    ``seed``, every norm's parameters jittered (seed + 1) so that no affine is the identity."""
    import torch
    torch.manual_seed(seed)
    model = cls().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def case_inputs(cases: dict, seed: int) -> dict:
    """The inputs of the cases ``name -> (op, shape)`` of a video comparison, from one generator seeded with
    ``seed``: randn latents for ``decode``, clips in 0..1 (rand) for ``encode``."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(shape, generator=g) if op == "decode" else torch.rand(shape, generator=g)
            for k, (op, shape) in cases.items()}


def video_worker(a, suffix: str, decode, encode) -> None:
    """Core's side of a video comparison (``case_inputs``): each ``decode*`` LATENT through core's VAE Decode,
    each clip [1, 3, T, H, W] through its VAE Encode (as an IMAGE batch), and beside them ``decode(model, x)``
    / ``encode(model, x)`` of core's model as ``NAME + suffix``. The report: core's model class and the keys
    it missed or did not expect in the file (``load_note``)."""
    import torch
    torch.set_num_threads(a.threads)
    sd, inputs = worker_files(a.worker)
    v = vae(a.comfyui, sd)
    m = v.first_stage_model
    keys = set(m.state_dict())
    out = {}
    with torch.inference_mode():
        for k, x in inputs.items():
            if k.startswith("decode"):
                out[k] = v.decode(x).movedim(-1, 1)                  # [B, T, H, W, 3] -> [B, 3, T, H, W]
                out[k + suffix] = decode(m, x)
            else:
                out[k] = v.encode(x[0].movedim(0, -1))               # an IMAGE batch [T, H, W, 3]
                out[k + suffix] = encode(m, x)
    save_worker(a.worker, out, {"model": type(m).__name__, "missing": sorted(keys - set(sd)),
                                "unexpected": sorted(set(sd) - keys)})


def parse_video_comparison(doc: str, cases: dict, quick: tuple, check_help: str, worker):
    """The command line of a video comparison (``doc``'s first paragraph for --help): ``comparison_flags``,
    ``--quick`` (only the cases named in ``quick``) and ``--check`` (``check_help``), parsed by
    ``parse_comparison``. Returns the arguments and the cases to run; (None, {}) in a worker."""
    import argparse
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    comparison_flags(p)
    p.add_argument("--quick", action="store_true", help=f"only {', '.join(quick)}")
    p.add_argument("--check", action="store_true", help=check_help)
    a = parse_comparison(p, worker)
    if a is None:
        return None, {}
    return a, {k: c for k, c in cases.items() if not a.quick or k in quick}


class CheckedRows:
    """The printed rows of a video comparison: case, output (T, H, W), what it is against, and ``diff``'s max
    / mean / relative. A row expected to match is marked ok or FAIL against ``tol`` and a FAIL kept in
    ``failed`` (for ``--check``). ``width``: the against column; ``rel``: the relative column's format."""

    def __init__(self, tol: float, width: int, rel: str = "8.3f"):
        self.tol, self.width, self.rel, self.failed = tol, width, rel, []
        print(f"{'case':<11} {'out (T, H, W)':<15} {'against':<{width}} {'max':>9} {'mean':>9} {'rel':>8}")

    def row(self, case: str, out, against: str, other, expect: bool = True) -> None:
        mx, mean, rel = diff(out, other)
        mark = "" if not expect else ("  ok" if mx <= self.tol else "  FAIL")
        if expect and mx > self.tol:
            self.failed.append(f"{case} {against}")
        print(f"{case:<11} {str(tuple(out.shape[2:])):<15} {against:<{self.width}} {mx:>9.2e} {mean:>9.2e} "
              f"{rel:>{self.rel}}{mark}")


def load_note(info: dict) -> str:
    """What ``video_worker`` reports of core's load, for a comparison's first line."""
    return (f"core model {info['model']}, core load: {len(info['missing'])} missing, {len(info['unexpected'])} "
            f"unexpected keys")


class ParityTable:
    """The rows of a core comparison (``bench/comfyui_checks/compare_core_*.py``): max / mean abs difference
    of ours against a reference, printed as they come and kept for ``--json``. ``parity`` rows compare the
    same computation (the tests assert them); the others show where references differ. ``width``: the
    case column; ``skip``: leading dimensions left out of the printed shape (batch, channels)."""

    def __init__(self, width: int = 40, skip: int = 2):
        self.rows, self.width, self.skip = [], width, skip

    def add(self, name: str, ours, ref, note: str, parity: bool) -> None:
        import math
        if ours.shape != ref.shape:
            print(f"{name:<{self.width}} SHAPE {tuple(ours.shape)} vs {tuple(ref.shape)}  {note}")
            self.rows.append(dict(name=name, max=math.inf, mean=math.inf, parity=parity, note=note))
            return
        diff = (ours.float() - ref.float()).abs()
        row = dict(name=name, max=diff.max().item(), mean=diff.mean().item(), parity=parity, note=note)
        self.rows.append(row)
        print(f"{name:<{self.width}} {str(tuple(ours.shape[self.skip:])):<16} {row['max']:>9.2e} {row['mean']:>9.2e}  "
              f"{'parity' if parity else '      '}  {note}")


def diff(a, b) -> tuple[float, float, float]:
    """Max and mean abs difference of two outputs, and the max over the larger side's largest magnitude
    (the rows of a core comparison). Different shapes end the run, saying both."""
    if a.shape != b.shape:
        raise SystemExit(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    d = (a.float() - b.float()).abs()
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-12)
    return d.max().item(), d.mean().item(), d.max().item() / scale
