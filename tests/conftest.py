"""Fixtures: the pack as a package, a fixed seed, the shared real weights."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from helpers import SHARED_DATA, load_pack

# Run in parallel (pytest-xdist, as pytest.ini asks): the cores are shared among the workers, so each
# worker's torch takes its share of them instead of all (oversubscribed threads slow every worker down).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.fixture(scope="session")
def pack():
    return load_pack()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "taef2_decoder.pth").is_file():
        pytest.skip("the real TAEF2 weights are not here: set VAEKIT_TAEF2_DIR or put them in ../shared/data")
    return SHARED_DATA


@pytest.fixture(scope="module")
def one_thread():
    """One CPU thread for a module of tiny models: thread hand-offs cost more than the maths.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def loaded():
    """One tiny random-weight VAE of each video family (tests/video_families.py), by family id."""
    import vae
    from video_families import FAMILIES, tiny_state_dict
    n = torch.get_num_threads()
    torch.set_num_threads(1)      # tiny tensors: thread hand-offs cost more than the maths
    yield {f: vae.from_state_dict(tiny_state_dict(f)) for f in FAMILIES}
    torch.set_num_threads(n)
