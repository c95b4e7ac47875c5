"""A small real dataset for the cache's tests, made on the spot: short mp4 (H.264) and webm (VP9) clips
written with PyAV from still photos (scikit-image's public-domain samples where scikit-image is
installed, else crops of the repository's demo photo, NASA's astronaut), panned so that frames differ,
and a few still images; plus tiny video VAE files (random weights) for the encodes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import ROOT


def photos() -> list[np.ndarray]:
    """RGB uint8 photos, at least 3."""
    try:
        from skimage import data
        return [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]
    except ImportError:
        from PIL import Image
        a = np.asarray(Image.open(ROOT / "vae" / "demo" / "vaekit_sample.png").convert("RGB"))
        h, w = a.shape[:2]
        return [a, a[: h // 2 + h // 4, : w // 2 + w // 4].copy(), np.ascontiguousarray(a[h // 4:, ::-1])]


def pan(photo: np.ndarray, frames: int, size: tuple[int, int]) -> list[np.ndarray]:
    """``frames`` frames of ``size`` (W, H) panning across ``photo`` (so every frame differs)."""
    from PIL import Image
    w, h = size
    big = np.asarray(Image.fromarray(photo).resize((w + frames * 2, h + frames), Image.BICUBIC))
    return [np.ascontiguousarray(big[i // 2: i // 2 + h, 2 * i: 2 * i + w]) for i in range(frames)]


def write_video(path: Path, frames: list[np.ndarray], fps: int = 24) -> Path:
    av = pytest.importorskip("av")
    codec = {".mp4": "libx264", ".webm": "libvpx-vp9", ".mkv": "libx264", ".mov": "libx264"}[path.suffix]
    with av.open(str(path), mode="w") as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height, s.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        if codec == "libx264":
            s.options = {"crf": "12", "preset": "ultrafast"}
        for f in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


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


def diffusers_wan_posterior(x: torch.Tensor):
    """diffusers' AutoencoderKLWan (the same tiny weights) on clips in 0..1: (mean, logvar) of its posterior."""
    from video_families import tiny_reference
    with torch.no_grad():
        dist = tiny_reference("wan").encode(x * 2 - 1).latent_dist
    return dist.mean, dist.logvar
