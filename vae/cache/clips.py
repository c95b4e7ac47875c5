"""What each cached item is: its bucket (W x H), the crop that fills it, and its frames (which source
frames, how many), before any pixel is read.

Buckets, as the trainers make them:
- from a resolution (musubi-tuner's rule): the area W*H, candidate sizes in steps of ``step`` pixels
  from half the square side up to the side (both orientations), and each source takes the candidate
  nearest its aspect ratio; without bucketing the one bucket is the resolution; ``no_upscale`` keeps a
  smaller source at its own size (rounded down to the step).
- from a list of W x H x F buckets (LTX-2's trainer's rule): among the buckets with no more frames than
  the source has, the nearest aspect ratio (in log scale), then the most frames, then the largest area.
Resize and crop: scaled to cover the bucket, then cut at the centre.

Frames: a target fps first (the source's frames thinned: output frame k is the first source frame at
or after k / fps; a source slower than the target keeps every frame, none repeated), then the extraction the trainers offer: ``head`` (the first F frames, for each target
F), ``chunk`` (consecutive F-frame pieces), ``slide`` (F frames every ``stride``), ``uniform``
(``sample`` windows of F spread evenly), ``full`` (all frames, at most ``max_frames``). Every length is
fitted to the family's frame rule (1 + r*k, read from the VAE, e.g. 1 + 4k for Wan, 1 + 8k for LTX) by
rounding down, as musubi-tuner does."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

EXTRACTIONS = ("head", "chunk", "slide", "uniform", "full")


@dataclass(frozen=True)
class Bucket:
    width: int
    height: int
    frames: Optional[int] = None        # an explicit bucket's frame count (LTX-2's W x H x F)

    def __str__(self) -> str:
        return f"{self.width}x{self.height}" + (f"x{self.frames}" if self.frames else "")


@dataclass(frozen=True)
class Crop:
    """How a source of ``source`` (W, H) fills a bucket: scaled to ``scaled`` (W, H), then cut at
    ``left``, ``top``. ``region`` is the cut in source pixels (x, y, w, h)."""
    source: tuple[int, int]
    scaled: tuple[int, int]
    left: int
    top: int
    bucket: tuple[int, int]
    resample: str = "lanczos"     # or "bilinear": OpenCV's INTER_LINEAR, no antialiasing (SimpleTuner's resize)

    @property
    def region(self) -> tuple[float, float, float, float]:
        sx, sy = self.source[0] / self.scaled[0], self.source[1] / self.scaled[1]
        return (round(self.left * sx, 2), round(self.top * sy, 2), round(self.bucket[0] * sx, 2),
                round(self.bucket[1] * sy, 2))


def crop_for(source: tuple[int, int], bucket: Bucket) -> Crop:
    """Scale to cover the bucket (the larger of the two ratios, rounded to whole pixels), then centre."""
    w, h = source
    scale = max(bucket.width / w, bucket.height / h)
    sw, sh = max(bucket.width, int(w * scale + 0.5)), max(bucket.height, int(h * scale + 0.5))
    return Crop(source, (sw, sh), (sw - bucket.width) // 2, (sh - bucket.height) // 2, (bucket.width, bucket.height))


@dataclass(frozen=True)
class Buckets:
    """The bucket rule of one dataset: ``resolution`` (W, H) with ``enable``/``no_upscale`` and ``step``,
    or an explicit ``fixed`` list (W x H x F)."""
    resolution: Optional[tuple[int, int]] = None
    step: int = 16
    enable: bool = True
    no_upscale: bool = False
    fixed: tuple[Bucket, ...] = ()

    def candidates(self) -> list[tuple[int, int]]:
        if self.fixed or self.resolution is None:
            return [(b.width, b.height) for b in self.fixed]
        if not self.enable:
            return [self.resolution]
        area, s = self.resolution[0] * self.resolution[1], self.step
        side = int(math.sqrt(area))
        sizes = set()
        for w in range(side // 2 - (side // 2) % s, side + s, s):
            if w <= 0:
                continue
            h = area // w - (area // w) % s
            if h > 0:
                sizes.update({(w, h), (h, w)})
        return sorted(sizes)

    def choose(self, size: tuple[int, int], frames: Optional[int] = None) -> Optional[Bucket]:
        """The bucket of a source of ``size`` (W, H) with ``frames`` frames (None: a still image), or
        None when no explicit bucket has few enough frames."""
        w, h = size
        if self.fixed:
            fit = [b for b in self.fixed if (b.frames or 1) <= (frames or 1)]
            if not fit:
                return None
            return min(fit, key=lambda b: (abs(math.log(w / h) - math.log(b.width / b.height)), -(b.frames or 1),
                                           -b.width * b.height))
        if self.resolution is None:
            return Bucket(w - w % self.step, h - h % self.step)
        if self.enable and self.no_upscale and w * h <= self.resolution[0] * self.resolution[1]:
            return Bucket(w - w % self.step, h - h % self.step)
        sizes = self.candidates()
        best = min(range(len(sizes)), key=lambda i: (abs(sizes[i][0] / sizes[i][1] - w / h), i))
        return Bucket(*sizes[best])


@dataclass(frozen=True)
class Frames:
    """A dataset's frame extraction. ``targets``: clip lengths (pixel frames); ``fps``: resample to this
    rate first (None: every frame as it is)."""
    targets: tuple[int, ...] = (1,)
    extraction: str = "head"
    stride: int = 1
    sample: int = 1
    max_frames: int = 129
    fps: Optional[float] = None
    source_fps: Optional[float] = None    # take every source at this rate (musubi-tuner's source_fps)


@dataclass(frozen=True)
class ClipPlan:
    """One clip of a source: its first frame and length on the resampled timeline, and the source
    frame indices it reads."""
    start: int
    frames: int
    indices: tuple[int, ...] = field(repr=False)


def resampled(count: int, source_fps: Optional[float], fps: Optional[float]) -> list[int]:
    """Source frame index of each output frame: all of them without a target rate; with one, output
    frame k is the first source frame at or after time k / fps."""
    if not fps or not source_fps or fps >= source_fps - 1e-6:       # never repeats a frame
        return list(range(count))
    out, k = [], 0
    while True:
        i = math.ceil(k * source_fps / fps - 1e-9)
        if i >= count:
            return out
        out.append(i)
        k += 1


def plan_clips(count: int, frames: Frames, fit: Callable[[int], int], source_fps: Optional[float] = None,
               fixed_frames: Optional[int] = None) -> list[ClipPlan]:
    """The clips of a video of ``count`` frames (at ``source_fps``). ``fit`` rounds a length down to the
    family's frame rule; ``fixed_frames`` (an explicit bucket's F) replaces the targets, read from the head."""
    timeline = resampled(count, frames.source_fps or source_fps, frames.fps)
    n = len(timeline)
    targets = sorted({fit(t) for t in ((fixed_frames,) if fixed_frames else frames.targets) if t and fit(t) > 0})
    spans: list[tuple[int, int]] = []
    how = "head" if fixed_frames else frames.extraction
    if how == "uniform" and frames.sample <= 1:
        how = "head"                 # one window spread evenly is the head (musubi-tuner does the same)
    if how == "full":
        length = fit(min(n, frames.max_frames))
        spans = [(0, length)] if length > 0 else []
    else:
        for f in targets:
            if f > n:
                continue
            if how == "head":
                spans.append((0, f))
            elif how == "chunk":
                spans += [(s, f) for s in range(0, n - f + 1, f)]
            elif how == "slide":
                spans += [(s, f) for s in range(0, n - f + 1, max(1, frames.stride))]
            elif how == "uniform":
                k = frames.sample
                starts = sorted({int((n - f) * i / (k - 1)) for i in range(k)})
                spans += [(s, f) for s in starts]
    seen, clips = set(), []
    for s, f in spans:
        if (s, f) not in seen:
            seen.add((s, f))
            clips.append(ClipPlan(s, f, tuple(timeline[s:s + f])))
    return clips


def frame_rule(ratio: Optional[int], own: Optional[Callable[[int], int]] = None) -> Callable[[int], int]:
    """Round a length down to 1 + ratio*k (ratio None: an image VAE, one frame); ``own``: the model's rule."""
    if own is not None:
        return own
    if not ratio:
        return lambda f: 1 if f >= 1 else 0
    return lambda f: 1 + (f - 1) // ratio * ratio if f >= 1 else 0


def parse_size(text: str, what: str = "--resolution") -> tuple[int, int]:
    """'960x544' or '512' (square) -> (W, H)."""
    from ..errors import InputError
    parts = str(text).lower().replace(",", "x").split("x")
    try:
        nums = [int(p) for p in parts if p.strip()]
    except ValueError:
        nums = []
    if len(nums) == 1:
        nums = nums * 2
    if len(nums) != 2 or min(nums) <= 0:
        raise InputError(f"{what} {text!r} is not a size.", input=what, fix="give WIDTHxHEIGHT in pixels, e.g. 960x544.")
    return nums[0], nums[1]


def parse_buckets(text: str) -> tuple[Bucket, ...]:
    """'768x768x25;512x512x49' (LTX-2's trainer's notation, W x H x F) -> buckets."""
    from ..errors import InputError
    out = []
    for part in str(text).replace(",", ";").split(";"):
        if not part.strip():
            continue
        nums = part.lower().split("x")
        try:
            w, h, f = (int(n) for n in nums) if len(nums) == 3 else (*(int(n) for n in nums), 1)
        except ValueError:
            w = h = f = 0
        if min(w, h, f) <= 0 or len(nums) not in (2, 3):
            raise InputError(f"--buckets: {part!r} is not WIDTHxHEIGHTxFRAMES.", input="--buckets",
                             fix="give buckets like 768x768x25;512x512x49 (frames 1 for images).")
        out.append(Bucket(w, h, f))
    if not out:
        raise InputError("--buckets names no bucket.", input="--buckets", fix="give e.g. 768x768x25.")
    return tuple(out)


def check_bucket(bucket: Bucket, multiple: int, fit: Callable[[int], int]) -> Optional[str]:
    """Why a bucket cannot be encoded by this VAE (sizes not multiples of its ratio, frames off its
    rule), or None."""
    if bucket.width % multiple or bucket.height % multiple:
        return (f"bucket {bucket} is not a multiple of {multiple} pixels (the VAE's ratio); "
                f"use {bucket.width // multiple * multiple}x{bucket.height // multiple * multiple}")
    if bucket.frames and fit(bucket.frames) != bucket.frames:
        return f"bucket {bucket} has {bucket.frames} frames; this VAE encodes {fit(bucket.frames)} (its frame rule)"
    return None


def steps(values: Sequence[int]) -> int:
    """The least common multiple of ``values`` (a bucket step that every constraint divides)."""
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out
