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
