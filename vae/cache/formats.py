"""The files the cache writes, one per item, in the layout each trainer reads.

``vaekit`` (ours): ``<name>.safetensors`` with ``mean`` and, where the family's encoder has a posterior,
``logvar``, both [C, F', H', W'] (an image VAE: [C, H', W']) as the family's LATENT holds them (raw for Wan
and HunyuanVideo, normalised for LTX, packed and normalised for Flux.2: what ``VAE.encode`` returns);
float32; the metadata ``vaekit_cache`` is the item's manifest record (JSON). A trainer samples
``mean + exp(logvar / 2) * noise`` per step, or takes the mean.

``musubi`` (kohya-ss/musubi-tuner, per architecture ``--arch``): ``{name}_{start:05d}-{frames:03d}_{W:04d}x
{H:04d}_{arch}.safetensors`` for a video clip and ``{name}_{W:04d}x{H:04d}_{arch}.safetensors`` for an image
(W x H: the source's size, from which musubi-tuner buckets again at training; ``arch`` the short name, which
its datasets glob for), the tensor ``latents_{F}x{H}x{W}_{dtype}`` [C, F, H, W] (Flux.2: ``latents_{H}x{W}_
{dtype}`` [C, H, W]) and the metadata ``architecture`` (the full name), ``width``, ``height``, ``format_version``
1.0.1 and, for clips, ``frame_count``. The latent is the posterior's mode (musubi-tuner's Wan, Qwen-Image and
HunyuanVideo 1.5 scripts store the mode; its HunyuanVideo script one sample), normalised as its scripts
normalise it, in its scripts' default dtype. The LTX-2 fork's ``ltx2`` (AkaneTendo25/musubi-tuner) adds the
source's identity to the metadata: ``source_path`` (relative to the cache file's folder, with
``source_path_format`` ``relative_to_cache``), ``source_size``, ``source_mtime_ns`` and, for a clip with a
frame rate, ``target_fps`` and ``duration_seconds``.

``ltx2`` (Lightricks/LTX-2's trainer, ``process_videos.py``): ``<relative path>.pt``, a ``torch.save`` of
``{"latents": [C, F', H', W'] bfloat16, "num_frames", "height", "width": ints (latent), "fps": float}``
(plain tensors and numbers: its loader reads it with ``weights_only=True``); the normalised mean, as its
encoder returns it.

``simpletuner`` (SimpleTuner's VAE cache, images and videos): its own module, ``simpletuner.py``, with its
size and frame rules.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from ..errors import InputError

# Per-channel statistics of the Wan 2.1 VAE's latent (the same values are Qwen-Image's): musubi-tuner
# stores (mean - MEAN) / STD (wan/modules/vae.py, qwen_image/qwen_image_autoencoder_kl.py).
WAN21_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
              0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
WAN21_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
             3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclass(frozen=True)
class Item:
    """What a format needs to know of one cached item."""
    name: str                     # the source's file name without its suffix
    relative: Path                # the source's path relative to its dataset root
    video: bool                   # a clip of a video (else an image)
    start: int                    # first frame on the (resampled) timeline
    frames: int
    size: tuple[int, int]         # the source's W, H
    fps: Optional[float]


@dataclass(frozen=True)
class MusubiArch:
    short: str
    full: str
    family: str                   # the VAE family (spec id) its latents come from
    channels: int                 # latent channels as our encode returns them
    dtype: torch.dtype            # the dtype its cache script stores
    frames: bool                  # F in the key (all but Flux.2)
    videos: bool                  # takes video clips (else images only)
    normalise: Optional[tuple[tuple[float, ...], tuple[float, ...]]] = None
    source_identity: bool = False     # the source's path, size and mtime in the metadata (the LTX-2 fork)
    by_default: bool = True           # the architecture a VAE of its family gets without --arch


MUSUBI = {a.short: a for a in (
    MusubiArch("wan", "wan", "wan", 16, torch.bfloat16, True, True, (WAN21_MEAN, WAN21_STD)),
    MusubiArch("hv", "hunyuan_video", "hunyuan_video", 16, torch.float16, True, True),
    MusubiArch("hv15", "hunyuan_video_1_5", "hunyuan_video15", 32, torch.float16, True, True),
    MusubiArch("qi", "qwen_image", "wan", 16, torch.bfloat16, True, False, (WAN21_MEAN, WAN21_STD)),
    MusubiArch("f2d", "flux_2_dev", "flux2", 128, torch.float32, False, False),
    MusubiArch("f2k4b", "flux_2_klein_4b", "flux2", 128, torch.float32, False, False),
    MusubiArch("f2k9b", "flux_2_klein_9b", "flux2", 128, torch.float32, False, False),
    # the LTX-2 fork (AkaneTendo25/musubi-tuner, branch ltx-2): its encoder returns the normalised mean
    # (ltx_2/model/video_vae/video_vae.py:314-316), cached in bfloat16 (ltx2_cache_latents.py:1617, :153);
    # LTX-Video 0.9 files have the same encoder, so an LTX VAE gets it only when named
    MusubiArch("ltx2", "ltx2_v1", "ltx", 128, torch.bfloat16, True, True, source_identity=True, by_default=False),
)}
# what musubi-tuner needs besides a VAE's latents for these (so we do not write files it cannot train on)
MUSUBI_UNSUPPORTED = {
    "fp": "FramePack's cache files hold SigLIP image embeddings and section indices beside the latents "
          "(fpack_cache_latents.py requires --image_encoder): an image encoder, not a VAE, makes them",
    "fk": "FLUX.1 Kontext's cache files hold a control image's latents beside each target "
          "(flux_kontext_cache_latents.py requires one control per item)",
}


class Format:
    name = ""
    suffix = ""
    wants_logvar = False
    dtype = torch.float32

    def check(self, vae) -> None:
        pass

    def path(self, item: Item) -> Path:
        raise NotImplementedError

    def write(self, path: Path, item: Item, mean: torch.Tensor, logvar: Optional[torch.Tensor], record: dict) -> None:
        raise NotImplementedError

    def read(self, path: Path) -> torch.Tensor:
        """The stored mean back in the family's LATENT space, float32, unbatched (--verify)."""
        raise NotImplementedError

    @property
    def pixel_range(self) -> tuple[float, float]:
        """The range the VAE reads the 0..1 clips as (``VAE.encode``'s ``pixel_range``): this trainer's own."""
        return (0.0, 1.0)

    def describe(self) -> str:
        return self.name


def require_latents(vae, trainer: str, family: str, channels: int, option: str, what: str) -> None:
    """Refuse a VAE whose latent space is not the one ``trainer`` trains on (named by ``option``)."""
    if vae.spec.id != family or vae.caps.latent_channels_packed != channels:
        raise InputError(f"{trainer} trains on latents of the {family} VAE with {channels} channels; this VAE is "
                         f"{vae.name}.", input=option, fix=f"load that model's VAE, or name the {what} this VAE belongs to.")


def channel_stats(stats: tuple, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-channel (mean, std) shaped to broadcast over ``z`` [C, ...]."""
    return tuple(torch.tensor(v).view(-1, *([1] * (z.dim() - 1))) for v in stats)


def _unbatched(z: torch.Tensor) -> torch.Tensor:
    return z[0].contiguous() if z.dim() >= 4 and z.shape[0] == 1 else z.contiguous()


class VAEKit(Format):
    name, suffix, wants_logvar = "vaekit", ".safetensors", True

    def __init__(self, dtype: Optional[torch.dtype] = None):
        self.dtype = dtype or torch.float32

    def path(self, item: Item) -> Path:
        # the name as text: pathlib refuses a stem like "." (a source named "..png") on some Pythons
        stem = item.relative.name.removesuffix(item.relative.suffix)
        clip = f"_{item.start:05d}-{item.frames:03d}" if item.video else ""
        return item.relative.with_name(f"{stem}{clip}{self.suffix}")

    def write(self, path, item, mean, logvar, record) -> None:
        from safetensors.torch import save_file
        tensors = {"mean": _unbatched(mean).to(self.dtype)}
        if logvar is not None:
            tensors["logvar"] = _unbatched(logvar).to(self.dtype)
        save_file(tensors, str(path), metadata={"vaekit_cache": json.dumps(record, sort_keys=True)})

    def read(self, path: Path) -> torch.Tensor:
        from safetensors.torch import load_file
        return load_file(str(path))["mean"].float()


class Musubi(Format):
    name, suffix = "musubi", ".safetensors"

    def __init__(self, arch: str, dtype: Optional[torch.dtype] = None):
        if arch in MUSUBI_UNSUPPORTED:
            raise InputError(f"musubi-tuner architecture '{arch}' is not written: {MUSUBI_UNSUPPORTED[arch]}.",
                             input="--arch", fix=f"use musubi-tuner's own script for '{arch}', or one of "
                                                 f"{', '.join(MUSUBI)}.")
        if arch not in MUSUBI:
            raise InputError(f"unknown musubi-tuner architecture {arch!r}.", input="--arch",
                             fix=f"give one of {', '.join(MUSUBI)} (musubi-tuner's short names).")
        self.arch = MUSUBI[arch]
        self.dtype = dtype or self.arch.dtype

    def describe(self) -> str:
        return f"musubi ({self.arch.full})"

    def check(self, vae) -> None:
        a = self.arch
        require_latents(vae, f"musubi-tuner's '{a.short}' ({a.full})", a.family, a.channels, "--arch", "architecture")

    def path(self, item: Item) -> Path:
        w, h = item.size
        clip = f"_{item.start:05d}-{item.frames:03d}" if item.video else ""
        # the short name: musubi-tuner's datasets glob "*_{architecture}.safetensors" with the short one
        # (dataset/image_video_dataset.py get_latent_cache_path; config_utils.py "short style like hv")
        return Path(f"{item.name}{clip}_{w:04d}x{h:04d}_{self.arch.short}{self.suffix}")

    def _stats(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return channel_stats(self.arch.normalise, z)

    def latent(self, mean: torch.Tensor) -> torch.Tensor:
        z = _unbatched(mean).float()
        if self.arch.normalise:
            m, s = self._stats(z)
            z = (z - m) / s
        return z.to(self.dtype).contiguous()

    def read(self, path: Path) -> torch.Tensor:
        from safetensors.torch import load_file
        z = next(iter(load_file(str(path)).values())).float()
        if self.arch.normalise:
            m, s = self._stats(z)
            z = z * s + m
        return z

    def write(self, path, item, mean, logvar, record) -> None:
        from safetensors.torch import save_file
        z = self.latent(mean)
        if self.arch.frames and z.dim() == 3:
            z = z.unsqueeze(1)
        shape = "x".join(str(n) for n in z.shape[1:])
        meta = {"architecture": self.arch.full, "width": str(item.size[0]), "height": str(item.size[1]),
                "format_version": "1.0.1"}
        if item.video:
            meta["frame_count"] = str(item.frames)
        if self.arch.source_identity:
            meta.update(_source_identity(path, item, record["source"]))
        save_file({f"latents_{shape}_{DTYPE_NAMES[z.dtype]}": z}, str(path), metadata=meta)


def _source_identity(path: Path, item: Item, source: dict) -> dict[str, str]:
    """The LTX-2 fork's freshness metadata (dataset/cache_io.py build_source_freshness_metadata): the
    source's path relative to the cache file's folder, its size and mtime (those the manifest recorded),
    and for a clip its frame rate and length in seconds."""
    where = os.path.relpath(os.path.abspath(source["path"]), os.path.abspath(path.parent)).replace(os.sep, "/")
    meta = {"source_path": where, "source_path_format": "relative_to_cache", "source_size": str(source["size"]),
            "source_mtime_ns": str(source["mtime_ns"])}
    if item.video and item.fps:
        meta["target_fps"] = str(float(item.fps))
        meta["duration_seconds"] = str(float(item.frames) / float(item.fps))
    return meta


class LTX2(Format):
    name, suffix = "ltx2", ".pt"

    def __init__(self, dtype: Optional[torch.dtype] = None):
        self.dtype = dtype or torch.bfloat16

    def check(self, vae) -> None:
        if not vae.is_video:
            raise InputError(f"LTX-2's trainer reads video latents [C, F, H, W]; {vae.name} is an image VAE.",
                             input="--format", fix="load the LTX-2 (or LTX-Video) VAE.")

    def path(self, item: Item) -> Path:
        return item.relative.with_suffix(self.suffix)

    def write(self, path, item, mean, logvar, record) -> None:
        z = _unbatched(mean).to(self.dtype)
        c, f, h, w = z.shape
        torch.save({"latents": z, "num_frames": int(f), "height": int(h), "width": int(w),
                    "fps": float(item.fps or 1.0)}, str(path))

    def read(self, path: Path) -> torch.Tensor:
        return torch.load(str(path), map_location="cpu", weights_only=True)["latents"].float()


FORMATS: dict[str, Callable[..., Format]] = {"vaekit": VAEKit, "ltx2": LTX2}


def make(name: str, arch: Optional[str] = None, dtype: Optional[torch.dtype] = None) -> Format:
    """The format ``name`` (``simpletuner`` is made from the run's options: simpletuner.from_options)."""
    if name == "musubi":
        if not arch:
            raise InputError("the musubi format needs musubi-tuner's architecture.", input="--arch",
                             fix=f"give --arch, one of {', '.join(MUSUBI)}.")
        return Musubi(arch, dtype)
    if name not in FORMATS:
        raise InputError(f"unknown cache format {name!r}.", input="--format",
                         fix="use vaekit (ours: mean and log-variance), musubi (with --arch), ltx2 or simpletuner.")
    return FORMATS[name](dtype)


def default_arch(vae) -> Optional[str]:
    """The musubi-tuner architecture a VAE's latents train, when only one of them fits it (video first)."""
    fits = [a.short for a in MUSUBI.values()
            if a.by_default and a.family == vae.spec.id and a.channels == vae.caps.latent_channels_packed]
    return fits[0] if len(fits) == 1 or (fits and MUSUBI[fits[0]].videos) else None
