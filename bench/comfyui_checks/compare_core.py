"""One comparison of ComfyUI core's VAE against ours for every family declared in core_families.py: the same
file (random weights at the published config) and the same inputs on both sides, decode and encode, one
parity table (time and memory beside core: bench/run.py's ``--kinds core,...``).

    python bench/comfyui_checks/compare_core.py --list                      # the families and their differences
    python bench/comfyui_checks/compare_core.py --dry                       # ours at a tiny size, no core needed
    python bench/comfyui_checks/compare_core.py --family cogvideox --comfyui PATH/TO/ComfyUI --python PATH/TO/venv/bin/python
    python bench/comfyui_checks/compare_core.py --family cogvideox ... --quick --check     # exit 1 over 1e-4
    python bench/comfyui_checks/compare_core.py --family taehv ... --json rows.json        # the rows for a test
    python bench/comfyui_checks/compare_core.py --family minimax ... --sizes tiny,tiny_int8 --core-attention pytorch

Core runs in a subprocess under ``--python`` (ComfyUI's venv; CPU, fp32 unless a family says otherwise:
this file with ``--worker``), ours in this process. Rows: max and mean abs difference and the max over the
larger side's largest magnitude; pixels 0..1 for decode, LATENTs for encode. ``parity`` rows compare the
same computation (``--check`` fails on them); the others show where the references differ, each with the
documented reason (``--list``: docs/core_differences.md).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DIFFERENCES = ROOT / "docs" / "core_differences.md"      # each family's documented differences (--list)
sys.path[:0] = [str(HERE.parent), str(HERE)]           # bench/: the shared harness; here: the families
import harness  # noqa: E402
from harness import comfy_core  # noqa: E402
from core_families import FAMILIES  # noqa: E402


class Run:
    """Our side of one comparison: the arguments ``a``, the family, ``variant`` (one of its sizes), the folder
    ``d`` of its files, the inputs, core's outputs and report, the table, our handles by file and ``state``
    (what the family's ``files`` kept for its rows, e.g. diffusers' model)."""

    def __init__(self, a, name: str, d: Path, variant: str = ""):
        self.a, self.name, self.fam, self.d, self.variant = a, name, FAMILIES[name], d, variant
        self.quick = a.quick
        self.inputs, self.core, self.info, self.ours, self.state, self.table = {}, {}, {}, {}, {}, None

    def flags(self) -> list[str]:
        """This command's flags for a worker of this run (``--worker`` comes in front of them)."""
        return [*self.a.argv, "--family", self.name, "--comfyui", self.a.comfyui or "", "--dir", str(self.d),
                "--variant", self.variant]

    def call(self, step: str, python: str | None = None) -> None:
        """Run the worker ``step`` (under ComfyUI's python unless ``python``); its error ends the run."""
        proc = subprocess.run([python or self.a.python, __file__, *self.flags(), "--worker", step],
                              capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"worker {step} FAILED:\n{(proc.stderr or proc.stdout)[-3000:]}")

    def ours_out(self, name: str, case: comfy_core.Case, handle=None):
        """Ours on a case, as the family's IO lays it out."""
        io, h, x = self.fam.io, handle or self.ours[case.file or next(iter(self.ours))], self.inputs[name]
        return io.ours_decode(h, x) if case.op == "decode" else io.ours_encode(h, x)

    def core_row(self, name: str, case: comfy_core.Case, ours=None, note: str = "", parity: bool = True,
                 label: str = "") -> torch.Tensor:
        """The row of ours against core's VAE Decode / VAE Encode on a case; returns ours."""
        ours = self.ours_out(name, case) if ours is None else ours
        what = f"vs core VAE {case.op.capitalize()}"
        self.table.add(label or name, ours, self.core[name], "; ".join(n for n in (what, note) if n), parity,
                       kind=case.op)
        return ours


class Worker:
    """Core's side of one comparison (under ComfyUI's python): the arguments, the family, the folder, the
    inputs, the outputs and report being written; ``v``: core's VAE of the file ``stem`` being run."""

    def __init__(self, a):
        from safetensors.torch import load_file
        self.a, self.fam, self.d, self.variant = a, FAMILIES[a.family], Path(a.dir), a.variant or ""
        torch.set_num_threads(a.threads)
        path = self.d / "inputs.safetensors"
        self.inputs = load_file(str(path)) if path.exists() else {}
        self.out, self.info, self.v, self.stem, self.sd = {}, {}, None, "", {}

    def files(self) -> list[str]:
        return json.loads((self.d / "files.json").read_text())

    def save(self, stem: str = "core") -> None:
        harness.save({k: t.float() for k, t in self.out.items()}, self.d / f"{stem}.safetensors")
        (self.d / f"{stem}.json").write_text(json.dumps(self.info))


def core_worker(w: Worker) -> None:
    """Every file through core (``core_build``, default ``comfy.sd.VAE`` with the file's metadata), every
    case on it through VAE Decode / VAE Encode, then the family's ``core_extra``."""
    comfy_core.start(w.a.comfyui, pytorch_attention=w.a.core_attention == "pytorch" or None)
    import comfy.utils
    fam = w.fam
    with torch.no_grad() if fam.no_grad else torch.inference_mode():
        for stem in w.files():
            w.stem = stem
            w.sd, meta = comfy.utils.load_torch_file(str(w.d / stem), return_metadata=True)
            w.v = fam.core_build(w, meta) if fam.core_build else comfy_core.vae(w.a.comfyui, dict(w.sd), metadata=meta)
            m = w.v.first_stage_model
            keys, have = set(m.state_dict()), fam.core_keys(w.sd)
            w.info[stem] = dict(model=type(m).__name__, missing=sorted(keys - have), unexpected=sorted(have - keys))
            for k, c in cases_of(fam, w.variant).items():
                if k in w.inputs and (c.file or w.files()[0]) == stem:
                    io = fam.io
                    w.out[k] = (io.core_decode if c.op == "decode" else io.core_encode)(w.v, w.inputs[k])
            if fam.core_extra:
                fam.core_extra(w)
    w.save()


def cases_of(fam, variant: str) -> dict:
    """The family's cases (at ``variant`` where they depend on it)."""
    return fam.cases(variant) if callable(fam.cases) else fam.cases


def write_files(run: Run) -> list[str]:
    """The family's files in ``run.d`` (built here, or by core's classes in a worker); their names."""
    if run.fam.core_files:
        run.call("files")
        return json.loads((run.d / "files.json").read_text())
    return harness.save_files(run.d, run.fam.files(run))


def load_ours(run: Run, name: str):
    import vae
    return run.fam.load(run, run.d / name) if run.fam.load else vae.load(run.d / name, dtype=torch.float32)


def compare(a, name: str, variant: str = "") -> list[dict]:
    """One run of the family ``name`` (at ``variant``): its rows."""
    from safetensors.torch import load_file
    fam = FAMILIES[name]
    with tempfile.TemporaryDirectory(prefix=f"cmp_{name}_", dir=a.tmp) as tmp:
        run = Run(a, name, Path(tmp), variant)
        files = write_files(run)
        every = cases_of(fam, variant)
        cases = {k: c for k, c in every.items() if not a.quick or not fam.quick or k in fam.quick}
        run.inputs = {k: x for k, x in comfy_core.draw(every, fam.seed, fam.extra_inputs).items()
                      if k in cases or k not in every}
        harness.save(run.inputs, run.d / "inputs.safetensors")
        run.call("core")
        run.core = load_file(str(run.d / "core.safetensors"))
        run.info = json.loads((run.d / "core.json").read_text())
        run.ours = {f: load_ours(run, f) for f in files}
        print(f"{fam.title}{f' ({variant})' if variant else ''}; fp32, CPU, {a.threads} threads")
        for f in files:
            i = run.info.get(f, {})
            print(f"  {f}: core {i.get('model')}, {len(i.get('missing', []))} missing, "
                  f"{len(i.get('unexpected', []))} unexpected keys; ours {run.ours[f].name}")
        run.table = comfy_core.Table(a.check, fam.relative_encode)
        with torch.inference_mode():
            for k, c in cases.items():
                if k in run.inputs:
                    (fam.case_rows or (lambda r, k, c: r.core_row(k, c)))(run, k, c)
            if fam.rows:
                fam.rows(run)
        return run.table.rows


def dry(names) -> None:
    """Each family's files at a tiny size loaded by ours, every dry case through ours: no core."""
    for name in names:
        fam = FAMILIES[name]
        files, cases = fam.dry()
        with tempfile.TemporaryDirectory(prefix=f"dry_{name}_") as tmp:
            run = Run(argparse.Namespace(quick=True), name, Path(tmp))
            for f, sd in files.items():
                harness.save(sd, run.d / f)
                run.ours[f] = load_ours(run, f)
            run.inputs = comfy_core.draw(cases, 0)
            with torch.inference_mode():
                shapes = [f"{k} {tuple(run.ours_out(k, c).shape)}" for k, c in cases.items()]
            print(f"{name}: ours {', '.join(h.name for h in run.ours.values())}; {'; '.join(shapes)}", flush=True)


def differences() -> dict[str, str]:
    """docs/core_differences.md by its ``## FAMILY`` sections: family -> the section's text."""
    sections = (part.partition("\n") for part in DIFFERENCES.read_text().split("\n## ")[1:])
    return {name.strip(): text.strip() for name, _, text in sections}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=sorted(FAMILIES))
    p.add_argument("--list", action="store_true", help="the families, each with its documented differences")
    p.add_argument("--dry", action="store_true", help="ours on each family's files at a tiny size, without core")
    p.add_argument("--comfyui", help="ComfyUI source directory (the one with comfy/)")
    p.add_argument("--python", "--comfy-python", dest="python", help="ComfyUI's python (its venv); default: this one")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="the family's quick cases (or narrow config)")
    p.add_argument("--check", type=float, nargs="?", const=1e-4,
                   help="exit 1 if a parity row is above this (default 1e-4)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--tmp", help="folder for the temporary files (a published file can be GBs)")
    p.add_argument("--core-attention", choices=("cpu", "pytorch"), default="cpu",
                   help="core's attention: its CPU choice (sub-quadratic) or --use-pytorch-cross-attention "
                        "(PyTorch SDPA, its choice on NVIDIA GPUs and ours)")
    for name, fam in FAMILIES.items():
        if fam.options:
            fam.options(p.add_argument_group(name))
    for hidden in ("--worker", "--dir", "--variant"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> None:
    p = parser()
    a = p.parse_args(argv)
    if a.worker:
        w = Worker(a)
        steps = {"files": lambda w: harness.save_files(w.d, w.fam.core_files(w)), **w.fam.workers}
        return steps.get(a.worker, core_worker)(w)
    if a.list:
        docs = differences()
        for name, fam in FAMILIES.items():
            print(f"{name}: {fam.title}\n    " + docs[name].replace("\n", "\n    ") + "\n")
        return
    sys.path.insert(0, str(ROOT))
    if a.dry:
        return dry([a.family] if a.family else list(FAMILIES))
    if not a.family:
        p.error("--family is required (or --list, --dry)")
    a.argv = [x for x in (argv if argv is not None else sys.argv[1:])]
    a.comfyui = str(Path(a.comfyui).resolve()) if a.comfyui else None
    a.python = a.python or sys.executable
    torch.set_num_threads(a.threads)
    fam = FAMILIES[a.family]
    if not a.comfyui:
        p.error("--comfyui is required")
    rows = []
    for variant in fam.variants(a) if fam.variants else [""]:
        rows += compare(a, a.family, variant)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    failed = comfy_core.failed(rows, a.check, fam.relative_encode) if a.check is not None else []
    if failed:
        sys.exit(f"parity rows above {a.check:g}: {', '.join(failed)}")


if __name__ == "__main__":
    main()
