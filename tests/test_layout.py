"""The layout shows the design (../DESIGN.md, docs/architecture.md): vae/'s top holds only the public face and
the bottom modules, its roles live in folders, and imports run one way, down, with no circle anywhere
(vae/, nodes/, bench/; imports inside functions included)."""
from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

# vae/'s layers, bottom first: a module imports only from its own layer or one below.
LAYERS = [
    ("bottom", {"vae.errors", "vae.spec", "vae.run", "vae.checks", "vae.progress"}),
    ("blocks and files", {"vae.nn", "vae.files"}),
    ("engine", {"vae.engine"}),
    ("archs", {"vae.archs"}),
    ("public face", {"vae", "vae.handle", "vae.loading", "vae.registry", "vae.compile", "vae.workers", "vae.demo"}),
    ("front ends", {"vae.cli", "vae.__main__", "vae.cache"}),
]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(*folders: str) -> dict[str, Path]:
    return {_module(p): p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))}


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, anywhere in the file. Bench scripts import each other
    by bare name (their folder on sys.path); the pack's nodes reach the library as ``..vae``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    bases = [""] + (["bench.", f"{package}."] if name.startswith("bench") else [])

    def add(dotted: str) -> None:
        for base in bases:          # the first part of a name must be a module; attributes after it are cut
            parts = dotted.split(".")
            while parts and base + ".".join(parts) not in known:
                parts.pop()
            if parts and base + ".".join(parts) != name:
                found.add(base + ".".join(parts))
                return

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = (node.module or "").removeprefix("vaekit.")
            for alias in node.names:
                full = f"{module}.{alias.name}"
                add(full if any(k == full for k in known) else module)
    return found


def _graph() -> dict[str, set[str]]:
    known = _sources("vae", "nodes", "bench")
    return {name: _imports(name, path, known) for name, path in known.items()}


def _layer(module: str) -> int:
    best = (-1, -1)
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), rank))
    assert best[1] >= 0, f"{module} is in no layer of the design: add it to LAYERS where it belongs"
    return best[1]


def test_the_top_of_vae_is_the_public_face():
    top = sorted(p.name for p in (ROOT / "vae").glob("*.py"))
    assert len(top) <= 12, top
    folders = {p.name for p in (ROOT / "vae").iterdir() if (p / "__init__.py").is_file()}
    assert {"archs", "nn", "engine", "files", "cli"} <= folders


def test_imports_run_down():
    wrong = []
    for module, targets in _graph().items():
        if not module.startswith("vae"):
            continue
        for target in targets:
            if target.startswith("vae") and _layer(target) > _layer(module):
                wrong.append(f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_circle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
