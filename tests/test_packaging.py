"""The Comfy Registry metadata (pyproject.toml) agrees with what the pack really needs and ships."""
from __future__ import annotations

import re

import pytest

from helpers import ROOT

tomllib = pytest.importorskip("tomllib")


def _requirements() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_registry_metadata():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, comfy = meta["project"], meta["tool"]["comfy"]
    assert re.fullmatch(r"[a-z0-9][a-z0-9_-]*", project["name"])          # Registry ids are lowercase
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"])
    assert (ROOT / project["license"]["file"]).is_file()
    assert project["urls"]["Repository"].startswith("https://github.com/")
    assert comfy["PublisherId"] and comfy["DisplayName"]
    # ComfyUI-Manager installs requirements.txt, the Registry reads pyproject: the same list
    assert project["dependencies"] == _requirements()


def test_the_readme_clones_the_registered_repository():
    repo = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    assert f"git clone {repo}" in (ROOT / "README.md").read_text()


def test_the_console_script_and_what_an_install_holds():
    """`pip install -e .` builds with setuptools: the `vaekit` script points at the library's entry point
    (importable without torch), and the package list is every package of the library (a new
    subpackage of vae/ must be listed, or a non-editable install would lack it). The node pack itself
    (nodes/, the root __init__.py) is never installed as top-level packages: ComfyUI has a `nodes` module."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["build-system"]["build-backend"] == "setuptools.build_meta"
    assert meta["project"]["scripts"] == {"vaekit": "vae.cli.entry:console"}
    packages = meta["tool"]["setuptools"]["packages"]
    found = sorted(str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "vae").rglob("__init__.py")
                   if "__pycache__" not in p.parts)
    assert sorted(packages) == found and not any(p.split(".")[0] != "vae" for p in packages)
    for pattern in meta["tool"]["setuptools"]["package-data"]["vae"]:
        assert list((ROOT / "vae").glob(pattern)), pattern


def test_the_readme_says_where_the_command_line_runs():
    text = (ROOT / "README.md").read_text()
    assert "pip install -e ." in text and "vaekit " in text and "from the repository root" in text
