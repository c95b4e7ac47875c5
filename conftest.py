"""The repository root is the node pack's package (ComfyUI imports it by folder name). pytest would
import its __init__.py as a test package named after the checkout folder, which fails when that
name is not an identifier (a checkout in 'vaekit-main'); collect the root as a plain directory."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent


class _RootAsDir:
    # registered globally: path-scoped conftest hooks do not see the root directory's own collection
    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_directory(self, path, parent):
        return pytest.Dir.from_parent(parent, path=path) if path == ROOT else None


def pytest_configure(config):
    config.pluginmanager.register(_RootAsDir(), "vaekit-root-as-dir")
