"""Fixtures: the pack as a package, a fixed seed, the shared real weights."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import SHARED_DATA, load_pack


@pytest.fixture(scope="session")
def pack():
    return load_pack()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "taef2_decoder.pth").is_file():
        pytest.skip("../shared/data (real TAEF2 weights) is not beside this checkout")
    return SHARED_DATA
