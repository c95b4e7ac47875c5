"""The node pack as a package outside ComfyUI (``python -m vae run``, the tests), sharing this very
library instead of a second copy.

Inside ComfyUI the pack is a package (named after its folder) and the library is only ``<pack>.vae``.
Outside, the library is ``vae`` and the pack is imported as ``vaekit``; left alone, Python would load
the library a second time as ``vaekit.vae``, with its own ``VAEKitError`` (the CLI's ``except`` missed
the nodes' errors) and its own ``VAE`` class (a handle from ``vae.load`` was no VAE to the nodes).
``load_pack`` first installs an import alias: every ``vaekit.vae[.x]`` is the module ``vae[.x]``."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

NAME = "vaekit"
ROOT = Path(__file__).resolve().parents[2]
LIBRARY = __name__.partition(".")[0]            # "vae"


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``<alias>[.x]`` to the already importable ``<target>[.x]`` module object."""

    def __init__(self, alias: str, target: str):
        self.alias, self.target = alias, target
        self._specs: dict = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.alias or fullname.startswith(self.alias + "."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(self.target + spec.name[len(self.alias):])
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # the import system has just set the alias's spec on the module; give it back its own
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


def install_alias() -> None:
    alias = f"{NAME}.{LIBRARY}"
    if not any(isinstance(f, _Alias) and f.alias == alias for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias(alias, LIBRARY))


def load_pack():
    """Import the repository root as the package 'vaekit', as ComfyUI imports a custom node folder."""
    if NAME in sys.modules:
        return sys.modules[NAME]
    if not (ROOT / "__init__.py").is_file() or not (ROOT / "nodes").is_dir():
        from ..errors import InputError
        raise InputError(f"the node pack (nodes/ beside vae/) is not in '{ROOT}': this is an installed copy of the "
                         "library alone.", fix="install from the repository with `pip install -e .` (an editable "
                         "install keeps using the checkout), or run `python -m vae run` in the repository.")
    install_alias()
    spec = importlib.util.spec_from_file_location(NAME, ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[NAME]
        raise
    return mod
