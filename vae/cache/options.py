"""What a cache run is asked to do: one set of options for ``vae.cache(...)``, ``vaekit cache`` and the
processes of a several-device run (they travel as JSON)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Optional, Union

import torch

from ..errors import InputError
from .clips import EXTRACTIONS

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass
class CacheOptions:
    vae: str
    inputs: list[str]
    output: Optional[str] = None           # the cache folder (a musubi-tuner config's cache_directory wins)
    format: str = "vaekit"                 # vaekit | musubi | ltx2 | simpletuner
    arch: Optional[str] = None             # musubi-tuner's architecture (wan, hv, hv15, qi, f2d, ...)
    resolution: Optional[str] = None       # WxH: buckets of this area (musubi-tuner's rule); simpletuner: pixels
    buckets: Optional[str] = None          # 'WxHxF;...': explicit buckets (LTX-2's trainer's rule)
    bucket_step: Optional[int] = None      # pixels; default: 16 (musubi), 32 (ltx2), the VAE's ratio (vaekit)
    enable_bucket: bool = True
    no_upscale: bool = False
    frames: tuple[int, ...] = (1,)         # target clip lengths (pixel frames), fitted to the family's rule
    extraction: str = "head"
    frame_stride: int = 1
    frame_sample: int = 1
    max_frames: int = 129
    fps: Optional[float] = None            # resample every video to this rate first
    mode: str = "exact"
    max_memory: Union[str, float, int, None] = None
    tile: int = 512
    overlap: int = 64
    dtype: str = "float32"                 # the VAE's compute dtype
    save_dtype: Optional[str] = None       # the stored latents' (default: the format's)
    device: Optional[str] = None
    devices: Optional[str] = None          # 'cuda:0,cuda:1': whole items shared among processes
    timeout: float = 600.0                 # seconds per source (reading and encoding)
    threads: int = 2                       # decoder threads per video
    dry_run: bool = False
    verify: int = 0
    prune: bool = False
    seed: int = 0
    quiet: bool = False
    # simpletuner: its config's model_family and the dataset's settings, as its dataloader config names them
    model_family: Optional[str] = None
    resolution_type: str = "pixel"
    crop: bool = False
    crop_style: Optional[str] = None
    aspect_bucket_alignment: Optional[int] = None
    id: Optional[str] = None
    instance_data_dir: Optional[str] = None
    video_min_frames: Optional[int] = None     # its video.min_frames (default: num_frames)
    video_max_frames: Optional[int] = None     # its video.max_frames
    bucket_strategy: str = "aspect_ratio"      # its video.bucket_strategy
    frame_interval: Optional[int] = None       # its video.frame_interval (resolution_frames)
    extra: dict = field(default_factory=dict)

    def check(self) -> "CacheOptions":
        if self.extraction not in EXTRACTIONS:
            raise InputError(f"unknown frame extraction {self.extraction!r}.", input="--extraction",
                             fix=f"use one of {', '.join(EXTRACTIONS)}.")
        if self.mode not in ("exact", "fast"):
            raise InputError(f"unknown mode {self.mode!r}.", input="--mode", fix="use exact or fast.")
        for name in ("dtype", "save_dtype"):
            v = getattr(self, name)
            if v is not None and v not in DTYPES:
                raise InputError(f"unknown dtype {v!r}.", input=f"--{name.replace('_', '-')}",
                                 fix="use float32, bfloat16 or float16.")
        if self.timeout <= 0 or self.threads < 1 or self.verify < 0 or self.max_frames < 1:
            raise InputError("--timeout, --threads and --max-frames are positive, --verify 0 or more.", input="options")
        if not self.inputs:
            raise InputError("no inputs to cache.", input="inputs", fix="give a folder, a list file or a dataset config.")
        self.frames = tuple(int(f) for f in self.frames)
        if any(f < 1 for f in self.frames):
            raise InputError(f"--frames {self.frames}: clip lengths are 1 or more.", input="--frames")
        return self

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "CacheOptions":
        data = json.loads(text)
        data["frames"] = tuple(data.get("frames", (1,)))
        return cls(**data)
