"""A small real dataset for the cache's tests, made on the spot: short mp4 (H.264) and webm (VP9) clips
written with PyAV from still photos (bench/harness/clips.py), and a few still images; plus tiny video
VAE files (random weights) for the encodes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.harness.clips import pan, photos, write_video  # noqa: F401 (the tests use them through this module)


def make_dataset(folder: Path, videos=(("a.mp4", 20, (96, 64)), ("b.webm", 13, (64, 96)), ("c.mp4", 9, (80, 80))),
                 images=(("d.png", (100, 60)), ("e.jpg", (64, 64)))) -> Path:
    from PIL import Image
    folder.mkdir(parents=True, exist_ok=True)
    ph = photos()
    for i, (name, n, size) in enumerate(videos):
        write_video(folder / name, pan(ph[i % len(ph)], n, size))
    for i, (name, (w, h)) in enumerate(images):
        Image.fromarray(ph[(i + 1) % len(ph)]).resize((w, h), Image.BICUBIC).save(folder / name)
    return folder


def vae_file(tmp: Path, family: str = "wan") -> Path:
    """A tiny VAE of ``family`` (tests/video_families.py), saved as a safetensors file."""
    from safetensors.torch import save_file
    from video_families import tiny_state_dict
    path = tmp / f"tiny_{family}.safetensors"
    if not path.exists():
        save_file({k: v.float().contiguous() for k, v in tiny_state_dict(family).items()}, str(path))
    return path


def ltx2_vae_file(tmp: Path) -> Path:
    """A tiny LTX-2 VAE with LTX-2's 128 latent channels (random weights), as a safetensors file: what
    the LTX-2 fork of musubi-tuner trains on has 128 channels."""
    from safetensors.torch import save_file
    from video_families import tiny_reference
    path = tmp / "tiny_ltx2_128.safetensors"
    if not path.exists():
        tiny = tiny_reference("ltx2")            # the tiny LTX-2 of the family tests, widened to 128 channels
        torch.manual_seed(0)
        model = type(tiny).from_config({**tiny.config, "latent_channels": 128})
        save_file({k: v.float().contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def diffusers_wan_posterior(x: torch.Tensor):
    """diffusers' AutoencoderKLWan (the same tiny weights) on clips in 0..1: (mean, logvar) of its posterior."""
    from video_families import tiny_reference
    with torch.no_grad():
        dist = tiny_reference("wan").encode(x * 2 - 1).latent_dist
    return dist.mean, dist.logvar


def trainer_loader(env: str, script: str, tmp: Path) -> dict:
    """The last line of ``script`` (JSON) run by a trainer's own code: ``env`` names its copy (skipped
    without one), ``{PREFIX}_PYTHON`` the Python to run it with (default this one)."""
    where = os.environ.get(env)
    if not where:
        pytest.skip(f"{env} names no copy of the trainer")
    python = os.environ.get(env.split("_")[0] + "_PYTHON", sys.executable)
    r = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
