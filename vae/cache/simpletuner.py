"""``simpletuner``: SimpleTuner's VAE cache (its ``VAECache``, read at bghira/SimpleTuner bc8e6ab7; paths below
are under simpletuner/helpers/, line numbers at that commit).

Files: ``{cache_dir_vae}/{subfolders}/{sha256(stem)}.pt``, ``stem`` the source's file name without its
extension and ``subfolders`` its folder below the dataset's ``instance_data_dir`` (caching/vae.py:678
``generate_vae_cache_filename``; the factory always hashes the names, data_backend/factory.py:4011, 4232
``hash_filenames=True``). Each file is ``torch.save`` of one tensor (data_backend/local.py:335 ``torch_save``,
uncompressed by default): for LTX the dict its encode makes is cut down to its ``latents`` before the write
(caching/vae.py:1419-1440, ``_write_latents_in_batch`` keeps the dict only for audio and ace_step).

What the tensor holds, per ``model_family`` (caching/vae.py:1293-1355 ``encode_images``: the model's
pre/post-encode hooks, ``latent_dist.sample()`` at :1337 (the ``mode()`` for Wan at :1220),
``process_video_latents`` at :1132, then foundation_mixins.py:67-79 ``scale_vae_latents_for_cache``:
(z - shift_factor) * scaling_factor where the VAE config has a shift, else z * scaling_factor, the factor the
VAE config's, models/common.py:2745):

- ``sdxl``: a sample times the VAE config's ``scaling_factor`` (0.13025), [C, H, W];
- ``flux``: (sample - ``shift_factor`` 0.1159) * ``scaling_factor`` 0.3611, [C, H, W];
- ``sd3``: the same rule with SD3's VAE config, (sample - 0.0609) * 1.5305, [C, H, W] (sd3/model.py:111 has
  no hook of its own, :867-868 refuses a custom VAE);
- ``qwen_image``: a sample, (z - latents_mean) / latents_std per channel, the frame axis dropped, [C, H, W]
  (qwen_image/model.py:1744 ``post_vae_encode_transform_sample``; its VAE config has no scaling factor);
- ``wan``: the mode of the posterior normalised by the same statistics (caching/vae.py:1163-1225,
  models/wan/__init__.py:53 ``compute_wan_posterior``), [C, 1, H, W] for an image;
- ``ltxvideo`` / ``ltxvideo2``: a sample, (z - latents_mean) * scaling_factor / latents_std with the VAE's own
  statistics (caching/vae.py:1134-1160; models/ltxvideo/__init__.py:8-19 ``normalize_ltx_latents``,
  models/ltxvideo2/__init__.py:6-17 ``normalize_ltx2_latents``: ``.float()`` inside, so float32, the
  statistics first cast to the latents' dtype), [C, 1, H, W]; the scaling factor is 1.0 (ltxvideo: the
  function's default; ltxvideo2: its VAE config's, the class default 1.0, ltxvideo2/autoencoder.py:1156). Its
  scaling hook meets a dict there and leaves it. ltxvideo2's VAE is its own copy of diffusers'
  AutoencoderKLLTX2Video (ltxvideo2/model.py:136); its encoder gives diffusers' latents.

The dtype is the VAE's (caching/vae.py:636-639 ``_cache_vae_dtype``: ``--vae_dtype``, bf16 unless fp32 is
asked), but LTX's normalisation returns float32. We store the posterior's mean where SimpleTuner stores an
unseeded sample (SDXL, SD3, Flux, Qwen-Image, LTX): one of the latents its cache could hold, the noise-free one.

Not written: ``hunyuanvideo`` (its HunyuanVideo 1.5; see ``REFUSED``): its own VAE class
(hunyuanvideo/model.py:58 ``AutoencoderKLConv3D``, hunyuanvideo/autoencoder.py:444-451 and :506-511 in
``Downsample._forward_fast``) pads an odd frame count at each temporal down-sampler with a copy of the last
frame, and so returns diffusers' latent frames plus one: [C, 2, H', W'] for an image (measured on tiny
weights: the first frames equal diffusers' to 3e-6). It would otherwise be a sample * scaling_factor (no
shift in its VAE class, :1035-1036) of pixels in 0..1 (hunyuanvideo/model.py:839-842 keep
VideoTransformMixin's bare ToTensor), frame counts not fitted (no ``adjust_video_frames`` of its own:
foundation_mixins.py:114-126 returns the count), latents trimmed to even sizes at 16 px (caching/vae.py:1064).

Sizes (``resolution_type: pixel``, ``crop: false``; TrainingSample.resize, MultiaspectImage
``calculate_new_size_by_pixel_edge``): see ``pixel_edge``; the source is resized to the intermediary size
with the ``trainingsample`` package's resize (OpenCV's INTER_LINEAR: bilinear, no antialiasing), which
we do in float and round (within one level of its 8-bit result), then the bucket is cut at the
``crop_style``'s place (``cropping.py``: centre ``int((inter - target) / 2)``, or corner 0, 0). Alignment:
each model's ``check_user_config`` forces it (sdxl/model.py:648-652, sd3/model.py:869-871,
flux/model.py:1125-1129, ltxvideo/model.py:422-426, ltxvideo2/model.py:1526-1530: 64; qwen_image/model.py:1842-1850,
wan/model.py:1529-1535: 32, 64 for Wan 2.2 5B).
Videos (wan, ltxvideo, ltxvideo2): see ``SimpleTuner.clip``; every frame is sized and cut as an image of its
size, and the first ``num_frames`` are encoded into [C, F', H', W'] (caching/vae.py:1092-1094), the latent
trimmed to even sizes (:1096-1126). num_frames and min_frames are fitted down to 1 + 8k (factory.py:867-890;
wan/model.py:458, ltxvideo/model.py:82, ltxvideo2/model.py:177-184 ``adjust_video_frames``), max_frames is
not; a video's own count, fitted the same way, drops it below min_frames or above max_frames
(metadata/backends/base.py:1173-1200, 1206-1224; discovery.py:461-487). min_frames defaults to num_frames
and may not be below it (factory.py:813-817, 862-865). ``bucket_strategy: resolution_frames`` keys a video's
bucket ``{W}x{H}@{F}`` (its target size; its fitted count rounded down to ``frame_interval``, or the count
where that leaves none) and adds ``bucket_frames`` to its metadata (discovery.py:531-540,
metadata/backends/base.py:304-320, 350-364); the latents are the same (the cache still takes num_frames,
factory.py:4223). Its LTX models feed their VAE pixels in 0..1 (``pixels``: foundation_mixins.py:128-152
VideoTransformMixin.get_transforms, a bare ToTensor, where wan/model.py:1580-1585 and the image models'
models/common.py:1794-1807 add Normalize([0.5], [0.5])). Decoding: SimpleTuner decodes with ``trainingsample``
(image_manipulation/load.py ``load_image``): PNG pixels equal Pillow's, alpha is dropped as Pillow's RGB
conversion drops it, EXIF orientation is not applied (its ``exif_transpose`` meets an image without EXIF), as
here; a JPEG's decoded pixels may differ from Pillow's by a few levels (another decoder). ``area`` /
``pixel_area`` are refused: their target size for an aspect ratio is the first one seen in the run
(``StateTracker.get_resolution_by_aspect`` / ``set_resolution_by_aspect``), so it depends on the order the
files are read in. ``crop: true`` is refused (its crops are a random aspect or random place), and so is
``crop_style: random`` even with ``crop: false``: the few pixels between the intermediary size and the bucket
are cut at a random place, unseeded.

Beside the latents it writes, in the cache folder, the two JSON files its metadata backend keeps in the
dataset's ``instance_data_dir`` (metadata/backends/discovery.py ``save_cache`` / ``save_image_metadata``):
``aspect_ratio_bucket_indices_{id}.json`` (``config``, ``aspect_ratio_bucket_indices``: aspect ratio ->
source paths) and ``aspect_ratio_bucket_metadata_{id}.json`` (path -> ``original_size``,
``crop_coordinates`` (top, left), ``target_size``, ``intermediary_size``, ``aspect_ratio``)."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..errors import InputError
from .clips import Bucket, ClipPlan, Crop
from .formats import WAN21_MEAN, WAN21_STD, Format, Item, _unbatched, channel_stats, require_latents


@dataclass(frozen=True)
class Family:
    """A SimpleTuner ``model_family`` as its cache stores it."""
    name: str
    spec: str                          # our VAE family (spec id)
    channels: int
    alignment: int                     # aspect_bucket_alignment its check_user_config enforces
    frame_axis: bool                   # [C, 1, H, W] for an image (its video models)
    trim: Optional[int] = None         # prepare_video_latents trims to even latent sizes at this ratio
    scale: float = 1.0                 # after the shift: (z - shift) * scale
    shift: float = 0.0
    wan_stats: bool = False            # (z - mean) / std with Wan 2.1's per-channel statistics
    dtype: Optional[torch.dtype] = None    # fixed by its code (else the VAE's dtype, bf16 by default)
    mode: bool = False                 # it stores the mode (else an unseeded sample)
    frame_step: Optional[int] = None   # videos: its adjust_video_frames, frame counts down to 1 + step * k
    unit_pixels: bool = False          # its VAE gets the pixels in 0..1, not -1..1 (no Normalize transform)


FAMILIES = {f.name: f for f in (
    # sdxl/model.py, flux/model.py check_user_config: alignment 64; scaling factors of their VAE configs
    Family("sdxl", "kl", 4, 64, False, scale=0.13025),
    Family("flux", "kl", 16, 64, False, scale=0.3611, shift=0.1159),
    # sd3/model.py:111 an ImageModelFoundation with no hook of its own, :867-871 its own VAE only, alignment 64;
    # the SD3 VAE config's shift_factor 0.0609 and scaling_factor 1.5305
    Family("sd3", "kl", 16, 64, False, scale=1.5305, shift=0.0609),
    Family("qwen_image", "wan", 16, 32, False, wan_stats=True),
    # wan/model.py: 32 (64 for the 5B's 48-channel VAE, not written here)
    Family("wan", "wan", 16, 32, True, trim=8, wan_stats=True, mode=True, frame_step=8),
    # ltxvideo/model.py, ltxvideo2/model.py: no get_transforms of their own, so VideoTransformMixin's, a bare
    # ToTensor (foundation_mixins.py), where wan/model.py get_transforms adds Normalize([0.5], [0.5])
    Family("ltxvideo", "ltx", 128, 64, True, trim=32, dtype=torch.float32, frame_step=8, unit_pixels=True),
    Family("ltxvideo2", "ltx", 128, 64, True, trim=32, dtype=torch.float32, frame_step=8, unit_pixels=True),
)}
CROP_STYLES = ("center", "corner")
BUCKET_STRATEGIES = ("aspect_ratio", "resolution_frames")
# model families SimpleTuner caches that no other VAE implementation can reproduce, and why
REFUSED = {
    "hunyuanvideo": "its HunyuanVideo 1.5 VAE (models/hunyuanvideo/autoencoder.py:444-451, its own copy) pads an "
                    "odd frame count at each temporal down-sampler with a copy of the last frame, so its latents "
                    "have one frame more than the model's, [C, 2, H, W] for an image and F' + 1 for a video, the last "
                    "made from the padded copy; no other implementation makes that frame",
}


def _round_multiple(value: float, multiple: int) -> int:
    """MultiaspectImage._round_to_nearest_multiple: Python's round (half to even), at least one multiple."""
    return max(round(value / multiple) * multiple, multiple)


def aspect(size: tuple[int, int], rounding: int = 2) -> float:
    """MultiaspectImage.calculate_image_aspect_ratio: W / H rounded to ``rounding`` places."""
    return round(size[0] / size[1], rounding)


def pixel_edge(size: tuple[int, int], resolution: int, alignment: int) -> tuple[tuple, tuple, float]:
    """(target W x H, intermediary W x H, aspect ratio) of a source of ``size`` under ``resolution_type:
    pixel`` without cropping, as TrainingSample.calculate_target_size makes them: the shorter side to
    ``resolution`` at the rounded aspect ratio, both sides to the nearest multiple of ``alignment``; the
    intermediary keeps the source's own aspect ratio and covers the target; a target of aspect 1.0 is
    ``resolution`` square (and so is an intermediary narrower than that)."""
    w, h = size
    ar = aspect(size)
    if w < h:
        wt = resolution
        ht = int(wt / ar)
    else:
        ht = resolution
        wt = int(ht * ar)
    wa, ha = _round_multiple(wt, alignment), _round_multiple(ht, alignment)
    raw = w / h
    if raw >= 1.0:
        hi = max(ha, ht)
        wi = int(hi * raw)
        if wi < wa:
            wi = wa
            hi = int(wi / raw)
    else:
        wi = max(wa, wt)
        hi = int(wi / raw)
        if hi < ha:
            hi = ha
            wi = int(hi * raw)
    target, inter = (wa, ha), (wi, hi)
    ar = aspect(target)
    if ar == 1.0 and inter[0] < resolution:
        inter = (resolution, resolution)
    if ar == 1.0:
        target = (resolution, resolution)
    return target, inter, ar


def _even_latent(dim: int, ratio: int) -> int:
    """prepare_video_latents' ``_align_dimension``: down in steps of ``ratio`` until dim / ratio is even."""
    aligned = dim // ratio * ratio
    least = ratio * 2
    if aligned < least:
        return dim
    while aligned >= least and (aligned // ratio) % 2:
        aligned -= ratio
    return max(least, aligned)


def cache_name(relative: Path) -> Path:
    """``generate_vae_cache_filename``: the folders below the dataset root, then sha256 of the stem."""
    stem = os.path.splitext(relative.name)[0]
    return relative.parent / (hashlib.sha256(stem.encode()).hexdigest() + ".pt")


@dataclass(frozen=True)
class Placement:
    """Where a source goes: the bucket encoded, the crop that fills it, and SimpleTuner's metadata."""
    bucket: Bucket
    crop: Crop
    metadata: dict
    clips: Optional[list[ClipPlan]] = None      # a video's clips (None: an image)


class SimpleTuner(Format):
    name, suffix = "simpletuner", ".pt"

    def __init__(self, family: Optional[str], dtype: Optional[torch.dtype] = None, resolution: Optional[str] = None,
                 resolution_type: str = "pixel", crop: bool = False, crop_style: Optional[str] = None,
                 alignment: Optional[int] = None, dataset_id: Optional[str] = None,
                 instance_data_dir: Optional[str] = None, frames: tuple[int, ...] = (1,),
                 fps: Optional[float] = None, extraction: str = "head", min_frames: Optional[int] = None,
                 max_frames: Optional[int] = None, bucket_strategy: str = "aspect_ratio",
                 frame_interval: Optional[int] = None):
        if family in REFUSED:
            raise InputError(f"SimpleTuner's {family} cache is not written: {REFUSED[family]}.", input="--model-family",
                             fix="let SimpleTuner cache this dataset itself.")
        if not family or family not in FAMILIES:
            raise InputError(f"SimpleTuner's cache needs its model_family; {family!r} is not one written here.",
                             input="--model-family", fix=f"give one of {', '.join(FAMILIES)} (as in your "
                                                         "SimpleTuner config's model_family).")
        self.family = FAMILIES[family]
        self.dtype = dtype or self.family.dtype or torch.bfloat16
        if resolution_type in ("area", "pixel_area"):
            raise InputError(f"resolution_type {resolution_type} is not written: SimpleTuner gives an aspect ratio the "
                             "size of the first image of that aspect it reads, so the sizes depend on its file order.",
                             input="--resolution-type", fix="use resolution_type: pixel (in both configs).")
        if resolution_type != "pixel":
            raise InputError(f"unknown resolution_type {resolution_type!r}.", input="--resolution-type",
                             fix="use pixel.")
        if crop:
            raise InputError("crop: true is not written: SimpleTuner's crops (random aspect, random place) are "
                             "unseeded, so no other tool can make the latents it would.", input="--crop",
                             fix="set crop: false in the dataset's config.")
        if crop_style not in CROP_STYLES:
            raise InputError(f"crop_style {crop_style!r}: with crop: false SimpleTuner still cuts the bucket out of a "
                             "slightly larger resize at the crop_style's place; 'random' (its default) is unseeded.",
                             input="--crop-style", fix="set crop_style: center (or corner) in the dataset's config "
                                                       "and give the same here.")
        self.crop_style = crop_style
        try:
            self.resolution = int(str(resolution))
        except ValueError:
            self.resolution = 0
        if self.resolution <= 0:
            raise InputError(f"--resolution {resolution!r}: SimpleTuner's pixel resolution is one number (the shorter "
                             "side), e.g. 1024.", input="--resolution", fix="give the dataset's resolution.")
        self.alignment = alignment or self.family.alignment
        self.dataset_id = dataset_id
        if dataset_id is not None and (not dataset_id or dataset_id in (".", "..") or "/" in dataset_id
                                       or os.sep in dataset_id):
            raise InputError(f"--id {dataset_id!r} is not a dataset id (it names files in the cache folder).",
                             input="--id", fix="give the dataset's id from SimpleTuner's dataloader config.")
        self.instance_data_dir = instance_data_dir
        self.num_frames = self._num_frames(tuple(frames), fps, extraction)
        self._video_settings(tuple(frames), min_frames, max_frames, bucket_strategy, frame_interval)

    def _num_frames(self, frames: tuple[int, ...], fps: Optional[float], extraction: str) -> int:
        """Its video ``num_frames`` after the model's adjust_video_frames (factory.py), or 1 (images only)."""
        f = self.family
        if not f.frame_step:
            return 1
        if len(frames) != 1:
            raise InputError(f"--frames {','.join(map(str, frames))}: SimpleTuner caches one clip per video, its "
                             "dataset's video num_frames.", input="--frames",
                             fix="give the dataset's video num_frames as the one --frames value.")
        if fps:
            raise InputError(f"--fps {fps:g}: SimpleTuner reads every frame of a video as decoded, at its own rate; "
                             "it does not resample.", input="--fps", fix="leave --fps out.")
        if extraction != "head":
            raise InputError(f"--extraction {extraction}: SimpleTuner caches a video's first num_frames frames.",
                             input="--extraction", fix="leave --extraction at head.")
        return self._fit(frames[0])

    def _video_settings(self, frames: tuple[int, ...], min_frames: Optional[int], max_frames: Optional[int],
                        bucket_strategy: str, frame_interval: Optional[int]) -> None:
        """Its dataset's video.min_frames, max_frames, bucket_strategy and frame_interval, as it applies them."""
        if bucket_strategy not in BUCKET_STRATEGIES:
            raise InputError(f"unknown bucket_strategy {bucket_strategy!r}.", input="--bucket-strategy",
                             fix=f"use {' or '.join(BUCKET_STRATEGIES)}.")
        if frame_interval is not None and (bucket_strategy != "resolution_frames" or frame_interval < 1):
            raise InputError(f"--frame-interval {frame_interval}: SimpleTuner reads video.frame_interval only with "
                             "bucket_strategy resolution_frames, and only a positive one.", input="--frame-interval",
                             fix="give it with --bucket-strategy resolution_frames, or leave it out.")
        self.bucket_strategy, self.frame_interval = bucket_strategy, frame_interval
        self.min_frames, self.max_frames = self.num_frames, None
        if self.num_frames == 1:        # an image family, or no num_frames given: no video is cached
            return
        if min_frames is not None:
            # factory.py:862-865 refuses min_frames below num_frames (both as given), :873-882 fits it as num_frames
            if min_frames < frames[0]:
                raise InputError(f"--video-min-frames {min_frames} is below num_frames {frames[0]}: SimpleTuner refuses "
                                 "it (video->min_frames must be greater than or equal to video->num_frames).",
                                 input="--video-min-frames", fix="give min_frames >= num_frames, or leave it out.")
            self.min_frames = self._fit(min_frames)
        if max_frames:                  # metadata/backends/base.py:163: 0 or none is no limit; not fitted
            self.max_frames = max_frames

    def _fit(self, count: int) -> int:
        """adjust_video_frames (wan/, ltxvideo/, ltxvideo2/model.py): down to 1 + step * k, at least 1."""
        step = self.family.frame_step
        return max((count - 1) // step * step + 1, 1)

    @property
    def no_videos(self) -> Optional[str]:
        if self.family.frame_step:
            return None
        return f"SimpleTuner's {self.family.name} trains on images; this video is not written"

    def describe(self) -> str:
        # also the manifest's setting: LTX files encoded from -1..1 pixels (before 0..1) are made again
        return f"simpletuner ({self.family.name}{', pixels 0..1' if self.family.unit_pixels else ''})"

    def check(self, vae) -> None:
        f = self.family
        require_latents(vae, f"SimpleTuner's {f.name}", f.spec, f.channels, "--model-family", "model family")

    def place(self, size: tuple[int, int], ratio: int, frames: Optional[int] = None) -> Placement:
        """The bucket and crop of a source of ``size`` (W, H), and for a video of ``frames`` frames its one
        clip; raises ValueError with the reason."""
        target, inter, ar = pixel_edge(size, self.resolution, self.alignment)
        if target == inter:
            left = top = 0
        elif self.crop_style == "center":
            left, top = max(0, int((inter[0] - target[0]) / 2)), max(0, int((inter[1] - target[1]) / 2))
        else:
            left = top = 0
        if inter[0] - left < target[0] or inter[1] - top < target[1]:
            raise ValueError(f"SimpleTuner resizes it to {inter[0]}x{inter[1]}, smaller than its bucket "
                             f"{target[0]}x{target[1]}, and would cache a smaller latent than the bucket's")
        w, h = target
        if self.family.trim:          # its video models trim right and bottom to even latent sizes
            w, h = _even_latent(w, self.family.trim), _even_latent(h, self.family.trim)
        if w % ratio or h % ratio:
            raise ValueError(f"its bucket {w}x{h} is not a multiple of the VAE's {ratio} px")
        meta = {"original_size": list(size), "crop_coordinates": [top, left], "target_size": list(target),
                "intermediary_size": list(inter), "aspect_ratio": ar}
        clips = None
        if frames is not None:
            clips = [self.clip(frames)]
            meta["num_frames"] = self._fit(frames)      # discovery.py: the video's own count, adjusted
            if self.bucket_strategy == "resolution_frames":
                meta["bucket_frames"] = self._bucket_frames(meta["num_frames"])
        return Placement(Bucket(w, h), Crop(tuple(size), inter, left, top, (w, h), "bilinear"), meta, clips)

    def clip(self, frames: int) -> ClipPlan:
        """The one clip of a video of ``frames`` frames: its first num_frames. SimpleTuner cuts a video's count to
        its model's frame rule, drops it below min_frames or above max_frames (discovery.py:461-487,
        metadata/backends/base.py:1173-1200, 1206-1224; min_frames defaults to num_frames), then caches frames
        [:num_frames] (caching/vae.py:1092-1094 prepare_video_latents)."""
        n = self.num_frames
        if n == 1:          # --frames left at its default: SimpleTuner's own would be 5 s of the video
            raise ValueError("a video needs the dataset's video num_frames: --frames was left at 1 (SimpleTuner's "
                             "default is 5 s at the video's frame rate); pass --frames N, N its num_frames")
        fitted = self._fit(frames)
        if fitted < self.min_frames:
            raise ValueError(f"it has {frames} frames ({fitted} on its frame rule), fewer than min_frames "
                             f"{self.min_frames}: SimpleTuner drops it")
        if self.max_frames is not None and fitted > self.max_frames:
            raise ValueError(f"it has {frames} frames ({fitted} on its frame rule), more than max_frames "
                             f"{self.max_frames}: SimpleTuner drops it")
        return ClipPlan(0, n, tuple(range(n)))

    def _bucket_frames(self, count: int) -> int:
        """metadata/backends/base.py:350-364 _compute_video_bucket: down to a multiple of frame_interval (if
        that leaves none, the count itself)."""
        step = self.frame_interval
        return (count // step * step or count) if step else count

    @property
    def pixel_range(self) -> tuple[float, float]:
        """SimpleTuner's LTX models hand their VAE the 0..1 values themselves: ours reads them as -1..1 (the
        model's range: no mapping, no copy of the clip)."""
        return (-1.0, 1.0) if self.family.unit_pixels else (0.0, 1.0)

    def path(self, item: Item) -> Path:
        return cache_name(item.relative)

    def _stats(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return channel_stats((WAN21_MEAN, WAN21_STD), z)

    def latent(self, mean: torch.Tensor) -> torch.Tensor:
        """Our mean (the family's LATENT, unbatched) -> the tensor SimpleTuner stores."""
        f, z = self.family, _unbatched(mean).float()
        if z.dim() == 3 and f.frame_axis:
            z = z.unsqueeze(1)
        if z.dim() == 4 and not f.frame_axis:
            z = z.squeeze(1)
        if f.wan_stats:
            m, s = self._stats(z)
            z = (z - m) / s
        z = (z - f.shift) * f.scale
        return z.to(self.dtype).contiguous()

    def write(self, path, item, mean, logvar, record) -> None:
        torch.save(self.latent(mean), str(path))

    def read(self, path: Path) -> torch.Tensor:
        f = self.family
        z = torch.load(str(path), map_location="cpu", weights_only=True).float()
        z = z / f.scale + f.shift
        if f.wan_stats:
            m, s = self._stats(z)
            z = z * s + m
        return z

    # ---- the metadata backend's two JSON files ----------------------------------------------------------
    def metadata_files(self, entries: list[tuple[Path, Path, dict]]) -> dict[str, dict]:
        """{file name: content} for the sources cached under ``root``: ``entries`` of (dataset root, the
        source's path below it, its metadata)."""
        ident = self.dataset_id or "vaekit"
        indices: dict[str, list[str]] = {}
        metadata: dict[str, dict] = {}
        for base, relative, meta in entries:
            where = os.path.join(self.instance_data_dir or str(base), str(relative))
            # discovery.py:531-538: a video's key under resolution_frames is WxH@F (its target size, bucket frames)
            key = (f"{meta['target_size'][0]}x{meta['target_size'][1]}@{meta['bucket_frames']}"
                   if "bucket_frames" in meta else str(meta["aspect_ratio"]))
            indices.setdefault(key, []).append(where)
            metadata[where] = meta
        for paths in indices.values():
            paths.sort()
        return {f"aspect_ratio_bucket_indices_{ident}.json": {"config": self.config(),
                                                              "aspect_ratio_bucket_indices": indices},
                f"aspect_ratio_bucket_metadata_{ident}.json": metadata}

    def config(self) -> dict:
        """The dataset settings the sizes come from, as its dataloader config names them. SimpleTuner puts a
        value saved here back over a different one in the dataset's config (factory.py, "has inconsistent
        config"), so only the settings the files depend on are saved."""
        return {"resolution": self.resolution, "resolution_type": "pixel", "crop": False,
                "crop_style": self.crop_style}


def from_options(opts, dtype: Optional[torch.dtype]) -> SimpleTuner:
    """The format of a run's options (CacheOptions: its SimpleTuner settings)."""
    return SimpleTuner(opts.model_family, dtype, opts.resolution, opts.resolution_type, opts.crop, opts.crop_style,
                       opts.aspect_bucket_alignment, opts.id, opts.instance_data_dir, opts.frames, opts.fps,
                       opts.extraction, opts.video_min_frames, opts.video_max_frames, opts.bucket_strategy,
                       opts.frame_interval)
