"""The command line's entry point, importable without PyTorch: ``python -m vae`` (from the repository
root) and the ``vaekit`` console script that ``pip install -e .`` puts on the PATH (any folder). Where
PyTorch is missing it says what to install, instead of an import traceback (``--help`` included)."""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    from .. import TORCH_HELP, _TORCH_MISSING
    prog = prog or os.path.basename(sys.argv[0] or "vaekit")
    if prog in ("__main__.py", "-c", ""):
        prog = "python -m vae"
    if _TORCH_MISSING is not None:
        print(f"{'vaekit' if prog == 'vaekit' else 'vae'}: error: " + TORCH_HELP.format(python=sys.executable, error=_TORCH_MISSING), file=sys.stderr)
        return 1
    from .commands import main as cli_main
    return cli_main(argv, prog=prog)


def console() -> None:
    """The ``vaekit`` console script ([project.scripts] in pyproject.toml)."""
    sys.exit(main(prog="vaekit"))
