"""What the benchmark runners share: the families declared once with their references (families.py), the
runs a table can hold (runs.py), a worker's own measurement (measure.py), running workers and reading their
figures back (workers.py), and ComfyUI core started inside a worker as the reference (comfy_core.py).
Nothing here imports a runner."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def repo_on_path() -> None:
    """The repository and its tests importable (``vae``, the tests' reference builders)."""
    for path in (str(ROOT), str(ROOT / "tests")):
        if path not in sys.path:
            sys.path.insert(0, path)


def save(tensors: dict, path, metadata: dict | None = None) -> None:
    """``tensors`` as a .safetensors file at ``path``, each made a contiguous CPU tensor (what safetensors
    writes)."""
    from safetensors.torch import save_file
    save_file({k: t.contiguous().cpu() for k, t in tensors.items()}, str(path), metadata=metadata)


def save_files(folder: Path, files: dict) -> list[str]:
    """Every file of ``files`` (name -> tensors, (tensors, metadata), or None: a file written already) in
    ``folder``, and files.json naming them; their names."""
    import json
    for name, tensors in files.items():
        sd, metadata = tensors if isinstance(tensors, tuple) else (tensors, None)
        if sd is not None:
            save(sd, folder / name, metadata)
    (folder / "files.json").write_text(json.dumps(list(files)))
    return list(files)


def module_at(path, name: str):
    """The Python file ``path`` (a reference's copy, not an installed package) imported as ``name``."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
