"""Tiled Decode's 'devices' input: a worker pool when the devices are there (the same result as one
device: exact tiles stay exact), one device with the reason in the log otherwise."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT

DEMO = ROOT / "vae" / "demo"

SCRIPT = """
import sys, torch
sys.path.insert(0, "tests")
from helpers import load_pack
pack = load_pack()
from vaekit.nodes import NODE_CLASS_MAPPINGS as nodes
from vaekit.vae.files.latents import read_latent_file
vae = nodes["VAEKitLoad"]().load(str(sys.argv[1]))[0]
z = {"samples": read_latent_file(sys.argv[2])}
dec = nodes["VAEKitTiledDecode"]()
one = dec.decode(z, vae, tile_size=256, overlap=32, mode="exact")[0]
for _ in range(2):                       # the second prompt reuses the pool
    two = dec.decode(z, vae, tile_size=256, overlap=32, mode="exact", devices="cpu,cpu")[0]
    print("max diff", (one - two).abs().max().item())
from vaekit.nodes import devices
print("pools", len(devices._POOL), "alive", all(p.alive for p in devices._POOL.values()))
"""


def test_devices_share_the_tiles_and_the_pool_is_reused(tmp_path):
    (tmp_path / "models" / "vae").mkdir(parents=True)
    weights = tmp_path / "models" / "vae" / "vaekit_demo.safetensors"
    weights.write_bytes((DEMO / "vaekit_demo.safetensors").read_bytes())
    env_models = {"VAEKIT_MODEL_DIRS": str(tmp_path / "models")}
    r = subprocess.run([sys.executable, "-c", SCRIPT, "vaekit_demo.safetensors", str(DEMO / "vaekit_sample.latent")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, **env_models})
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[:2] == ["max diff 0.0", "max diff 0.0"] and lines[2] == "pools 1 alive True", r.stdout


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the devices")
def test_missing_devices_fall_back_to_one_device_and_say_why(pack, caplog):
    from vaekit.nodes import NODE_CLASS_MAPPINGS as nodes
    from vaekit.vae.files.latents import read_latent_file
    vae = pack.vae.load(DEMO / "vaekit_demo.safetensors")
    z = {"samples": read_latent_file(DEMO / "vaekit_sample.latent")[..., :16, :16]}
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        out = nodes["VAEKitTiledDecode"]().decode(z, vae, tile_size=64, overlap=16, devices="cuda:0,cuda:1")[0]
    assert "not found: this machine has" in caplog.text and "Running on one device" in caplog.text
    assert (out - nodes["VAEKitTiledDecode"]().decode(z, vae, tile_size=64, overlap=16)[0]).abs().max() == 0
