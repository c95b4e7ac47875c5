"""Reading the sources: images (Pillow, as the rest of the library) and videos (PyAV), streaming.

A video is decoded frame by frame; each frame is resized into its bucket as soon as it is decoded and
kept only while a pending clip needs it, and each clip is handed on as soon as its last frame is in, so
a long source never sits whole in memory (at most the open clips, at bucket size). The decoder's thread
count is capped (``threads``) and a read stops at a deadline (the caller's per-item timeout).

PyAV is needed for videos only (``pip install "av>=15.1"``; 14.x deadlocks on HEVC under load); without
it images still work and every video is listed as failed with that fix."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from .clips import Bucket, ClipPlan, Crop, crop_for

VIDEO_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv", ".avi", ".m4v")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
AV_HELP = 'reading videos needs PyAV: install it with `python3 -m pip install "av>=15.1"` (14.x deadlocks on HEVC).'


class MediaError(Exception):
    """A source that cannot be read (the item is listed as failed with this reason; the run goes on)."""


class ReadTimeout(MediaError):
    pass


def kind(path: Path) -> Optional[str]:
    s = path.suffix.lower()
    return "video" if s in VIDEO_SUFFIXES else "image" if s in IMAGE_SUFFIXES else None


def _av():
    try:
        import av
    except ImportError:
        raise MediaError(AV_HELP) from None
    return av


@dataclass(frozen=True)
class Probe:
    """What a source is, from its header: size (W, H), frames (1 for an image) and fps (None for an image)."""
    size: tuple[int, int]
    frames: int
    fps: Optional[float]


def probe(path: Path, threads: int = 2) -> Probe:
    if kind(path) == "image":
        from PIL import Image
        try:
            with Image.open(path) as im:
                return Probe(im.size, 1, None)
        except Exception as e:     # noqa: BLE001 - any unreadable image is a failed item, said as such
            raise MediaError(f"cannot read the image: {e}") from None
    av = _av()
    try:
        with av.open(str(path)) as c:
            if not c.streams.video:
                raise MediaError("the file has no video stream")
            s = c.streams.video[0]
            rate = s.average_rate or s.base_rate or s.guessed_rate
            fps = float(rate) if rate else None
            size = (s.codec_context.width, s.codec_context.height)
            frames = s.frames
            if not frames:             # containers without a count (webm, mkv): count packets, no decoding
                frames = sum(1 for p in c.demux(s) if p.size)
            if not frames or not min(size):
                raise MediaError("the video has no frames")
            return Probe(size, int(frames), fps)
    except MediaError:
        raise
    except Exception as e:     # noqa: BLE001 - PyAV's errors (InvalidDataError, ...) and OSError
        raise MediaError(f"cannot read the video: {type(e).__name__}: {e}") from None


def _bilinear(rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 [H, W, 3] resized to ``size`` (W, H) as OpenCV's INTER_LINEAR does it (pixel centres, edges
    clamped, no antialiasing when shrinking), rounded back to uint8; OpenCV's fixed-point sums may round
    one level differently."""
    x = torch.from_numpy(np.array(rgb)).permute(2, 0, 1)[None].float()      # a copy: PIL arrays are read-only
    y = torch.nn.functional.interpolate(x, size=(size[1], size[0]), mode="bilinear", align_corners=False)
    return y[0].round_().clamp_(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()


def fit_frame(rgb: np.ndarray, crop: Crop) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [bucket H, bucket W, 3]: scaled to ``crop.scaled`` (Lanczos, or the
    crop's ``resample``), then cut at ``crop.left``, ``crop.top``."""
    from PIL import Image
    if (rgb.shape[1], rgb.shape[0]) != crop.scaled and crop.resample == "bilinear":
        rgb = _bilinear(rgb, crop.scaled)
    im = Image.fromarray(rgb)
    if im.size != crop.scaled:
        im = im.resize(crop.scaled, Image.LANCZOS)
    w, h = crop.bucket
    return np.asarray(im.crop((crop.left, crop.top, crop.left + w, crop.top + h)))


def to_clip(frames: Sequence[np.ndarray]) -> torch.Tensor:
    """uint8 frames [H, W, 3] -> float clip [3, F, H, W] in 0..1."""
    a = torch.from_numpy(np.stack(frames))           # F, H, W, 3
    return a.permute(3, 0, 1, 2).float().div_(255.0)


def read_image(path: Path, bucket: Bucket, crop: Optional[Crop] = None) -> tuple[torch.Tensor, Crop]:
    """The image fitted into ``bucket`` (``crop``: a planned cut of a source of that size, else to cover
    and centre)."""
    from PIL import Image
    try:
        with Image.open(path) as im:
            rgb = np.asarray(im.convert("RGB"))
    except Exception as e:     # noqa: BLE001
        raise MediaError(f"cannot read the image: {e}") from None
    size = (rgb.shape[1], rgb.shape[0])
    crop = crop if crop is not None and crop.source == size else crop_for(size, bucket)
    return to_clip([fit_frame(rgb, crop)]), crop


def read_clips(path: Path, clips: Sequence[ClipPlan], crop: Crop, threads: int = 2,
               deadline: Optional[float] = None) -> Iterator[tuple[ClipPlan, torch.Tensor]]:
    """Each clip of ``clips`` as [3, F, H, W] in 0..1, in the order their last frames arrive, decoding
    the video once. Raises MediaError (ReadTimeout past ``deadline``, a ``time.monotonic()`` value)."""
    av = _av()
    wanted: dict[int, int] = {}                    # source frame -> clips still needing it
    for c in clips:
        for i in c.indices:
            wanted[i] = wanted.get(i, 0) + 1
    last = max(wanted) if wanted else -1
    pending = sorted(clips, key=lambda c: c.indices[-1])
    held: dict[int, np.ndarray] = {}
    try:
        container = av.open(str(path))
    except Exception as e:     # noqa: BLE001
        raise MediaError(f"cannot open the video: {type(e).__name__}: {e}") from None
    try:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = max(1, threads)
        n = -1
        for n, frame in enumerate(container.decode(stream)):
            if deadline is not None and time.monotonic() > deadline:
                raise ReadTimeout(f"reading took longer than the per-item timeout (at frame {n})")
            if n in wanted:
                held[n] = fit_frame(frame.to_ndarray(format="rgb24"), crop)
            while pending and pending[0].indices[-1] <= n:
                c = pending.pop(0)
                yield c, to_clip([held[i] for i in c.indices])
                for i in c.indices:
                    wanted[i] -= 1
                    if not wanted[i]:
                        del wanted[i], held[i]
            if n >= last:
                break
        if pending:
            raise MediaError(f"the video ended at frame {n + 1}, before the clip at frames "
                             f"{pending[0].indices[0]}..{pending[0].indices[-1]} was complete")
    except MediaError:
        raise
    except Exception as e:     # noqa: BLE001 - a decode error mid-file
        raise MediaError(f"cannot decode the video: {type(e).__name__}: {e}") from None
    finally:
        container.close()


def source_frames(path: Path, indices: Sequence[int], threads: int = 2) -> torch.Tensor:
    """The frames ``indices`` of a video (or the image) at full size, [3, F, H, W] in 0..1 (--verify)."""
    if kind(path) == "image":
        from PIL import Image
        with Image.open(path) as im:
            return to_clip([np.asarray(im.convert("RGB"))])
    av = _av()
    want, got = set(indices), {}
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        s.codec_context.thread_count = max(1, threads)
        for n, frame in enumerate(c.decode(s)):
            if n in want:
                got[n] = frame.to_ndarray(format="rgb24")
            if n >= max(want):
                break
    return to_clip([got[i] for i in indices])
