"""Short real video clips made on the spot with PyAV (no downloads): still photos (scikit-image's
public-domain samples where scikit-image is installed, else crops of the repository's demo photo,
NASA's astronaut) panned so that every frame differs. The cache's tests and its benchmark read them."""
from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CODECS = {".mp4": "libx264", ".webm": "libvpx-vp9", ".mkv": "libx264", ".mov": "libx264"}


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
    """``frames`` frames of ``size`` (W, H) panning across ``photo``."""
    from PIL import Image
    w, h = size
    big = np.asarray(Image.fromarray(photo).resize((w + frames * 2, h + frames), Image.BICUBIC))
    return [np.ascontiguousarray(big[i // 2: i // 2 + h, 2 * i: 2 * i + w]) for i in range(frames)]


def write_video(path: Path, frames: list[np.ndarray], fps: int = 24) -> Path:
    """H.264 (mp4, mkv, mov) or VP9 (webm), yuv420p, near-lossless."""
    import av
    codec = CODECS[path.suffix]
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
