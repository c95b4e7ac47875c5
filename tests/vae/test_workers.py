"""The ways into a distributed call besides vae.engine.distributed.ranks(): a persistent worker pool (one
process per extra device, weights loaded by each worker from the same file), the command line's
--devices, and torchrun. Each runs in processes of its own (a pool or torchrun makes its process a
rank of a group); CPUs stand in for GPUs (gloo)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from helpers import ROOT

import vae
from vae.files.imageio import read_image
from vae.workers import parse_devices

DEMO = ROOT / "vae" / "demo"


def _run(*args, timeout=600):
    r = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def test_a_pool_serves_calls_survives_failures_and_interrupts_and_closes():
    out = json.loads(_run(ROOT / "tests" / "pool_check.py").strip().splitlines()[-1])
    assert out["decode"] <= 1e-5 and out["encode"] <= 1e-5          # exact: the untiled result, 3 ranks
    assert out["missing file"].startswith("rank 1 of 3 failed, so every rank stopped: LoadError: no file at")
    assert out["interrupt"] == "KeyboardInterrupt"
    assert out["after"] <= 1e-6 and out["alive"] and out["closed"]   # the pool went on, then shut down


@pytest.mark.parametrize("launch", ["devices", "torchrun"])
def test_cli_decode_across_processes_equals_one_untiled_pass(tmp_path, launch):
    latent, weights = DEMO / "vaekit_sample.latent", DEMO / "vaekit_demo.safetensors"
    common = ["decode", "--vae", weights, "--tile", 256, "--mode", "exact", "-o", tmp_path / "d", latent]
    if launch == "devices":
        _run("-m", "vae", *common[:1], "--devices", "cpu,cpu", *common[1:])
    else:
        _run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", 2, "-m", "vae", *common)
    _run("-m", "vae", "decode", "--vae", weights, "--tile", 0, "-o", tmp_path / "u", latent)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d_00001_.png", "u_00001_.png"]    # rank 0 wrote, once
    # exact tiles equal one pass to float rounding (tiles of another size may take another conv kernel,
    # which rounds in another order): a value near an 8-bit step may land on the next one, never further
    diff = (read_image(tmp_path / "d_00001_.png") - read_image(tmp_path / "u_00001_.png")).abs()
    assert diff.max() <= 1 / 255 + 1e-6 and (diff > 0).float().mean() <= 1e-3


@pytest.mark.parametrize("text, message", [
    ("cpu", "names 1 device"), ("cpu,cuda:0", "mixes device types"),
    ("cuda:0,cuda:1", "not found: this machine has 0 CUDA device"), ("gpu0,gpu1", "cannot read the device list")])
def test_device_lists_are_checked_with_a_fix(text, message):
    import torch
    if torch.cuda.is_available() and "cuda:1" in text:
        pytest.skip("this machine has CUDA devices")
    with pytest.raises(vae.VAEKitError, match=message):
        parse_devices(text)


def _ended(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"   # gone or unreaped
    except FileNotFoundError:
        return True


def test_an_idle_pool_outlives_the_group_timeout_and_its_workers_end_with_their_parent():
    """Between calls the workers wait outside any collective, so a pool kept idle across prompts for longer
    than the group's timeout (NCCL's watchdog aborts a collective pending that long; gloo raises) still
    serves; a parent that ends without closing the pool (a killed ComfyUI) still ends its workers."""
    out = json.loads(_run(ROOT / "tests" / "pool_check.py", "idle", timeout=120).strip().splitlines()[-1])
    assert out["alive"] and out["decode"] <= 1e-5
    deadline = time.monotonic() + 20
    while not all(map(_ended, out["workers"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(map(_ended, out["workers"])), out["workers"]
