"""Datasets in: what to cache, from a folder, a list file, or a trainer's dataset config.

- a folder: every image and video in it and below (sorted), named by their path relative to it;
- a list file: ``.txt`` (one path a line; ``#`` comments), ``.jsonl`` / ``.json`` (objects with
  ``video_path``, ``image_path`` or ``media_path``: musubi-tuner's and LTX-2's metadata files) or ``.csv``
  (the ``media_path``, ``video_path`` or ``image_path`` column: LTX-2's trainer's); relative paths are
  read from the list file's folder;
- a musubi-tuner dataset config (``.toml``): each ``[[datasets]]`` entry with its ``image_directory`` /
  ``video_directory`` / ``*_jsonl_file``, ``resolution``, ``enable_bucket``, ``bucket_no_upscale``,
  ``target_frames``, ``frame_extraction``, ``frame_stride``, ``frame_sample``, ``max_frames``,
  ``source_fps``, ``caption_extension`` and ``cache_directory``, ``[general]`` giving defaults, as
  musubi-tuner's config loader reads them (dataset/config_utils.py). Training-only keys (batch size,
  repeats, controls) are ignored; a key it does not know is refused, as musubi-tuner refuses it."""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from ..errors import InputError
from .clips import Buckets, Frames
from .media import kind

LIST_SUFFIXES = (".txt", ".jsonl", ".json", ".csv")
PATH_KEYS = ("video_path", "image_path", "media_path")
# musubi-tuner's frame rates per architecture, used where a dataset gives source_fps (image_video_dataset.py)
MUSUBI_FPS = {"hv": 24.0, "wan": 16.0, "fp": 30.0, "hv15": 24.0}
MUSUBI_KEYS = {
    "caption_extension", "batch_size", "num_repeats", "resolution", "enable_bucket", "bucket_no_upscale",
    "image_directory", "image_jsonl_file", "video_directory", "video_jsonl_file", "cache_directory",
    "control_directory", "multiple_target", "fp_latent_window_size", "fp_1f_clean_indices", "fp_1f_target_index",
    "fp_1f_no_post", "no_resize_control", "control_resolution", "target_frames", "frame_extraction",
    "frame_stride", "frame_sample", "max_frames", "source_fps"}


@dataclass
class Dataset:
    """Sources under one root, with the settings they share (None: the run's own)."""
    root: Path
    sources: list[Path] = field(default_factory=list)
    buckets: Optional[Buckets] = None
    frames: Optional[Frames] = None
    output: Optional[Path] = None
    name: str = ""
    video_buckets: Optional[Buckets] = None    # musubi-tuner buckets videos always (its VideoDataset)

    def relative(self, source: Path) -> Path:
        """The source's path under the root, which names its outputs in the cache folder; a source outside
        the root (an absolute path elsewhere, a list entry through ``..``) goes by its file name."""
        try:
            rel = Path(os.path.relpath(source, self.root))
        except ValueError:          # another drive (Windows)
            return Path(source.name)
        return Path(source.name) if rel.parts[:1] == ("..",) else rel


def _media(paths) -> list[Path]:
    return [p for p in paths if p.is_file() and kind(p)]


def from_folder(folder: Path) -> Dataset:
    return Dataset(folder, sorted(_media(folder.rglob("*")), key=lambda p: str(p.relative_to(folder))),
                   name=str(folder))


def _list_paths(path: Path) -> list[str]:
    suffix = path.suffix.lower()
    text = path.read_text(encoding="utf-8")
    if suffix == ".txt":
        return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if suffix == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
        column = next((k for k in PATH_KEYS[::-1] if rows and k in rows[0]), None)
        if column is None:
            raise InputError(f"'{path}' has no {' / '.join(PATH_KEYS)} column.", input="inputs",
                             fix="name the column of media paths media_path (LTX-2's trainer's default).")
        return [r[column].strip() for r in rows if r.get(column)]
    try:
        entries = [json.loads(line) for line in text.splitlines() if line.strip()] if suffix == ".jsonl" \
            else json.loads(text)
    except ValueError as e:
        raise InputError(f"'{path}' is not valid JSON{' lines' if suffix == '.jsonl' else ''}: {e}.", input="inputs",
                         fix="one object a line with a video_path / image_path / media_path.") from None
    out = []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        p = next((entry[k] for k in PATH_KEYS if isinstance(entry, dict) and entry.get(k)), None)
        if p is None:
            raise InputError(f"'{path}', entry {i + 1}: no {' / '.join(PATH_KEYS)}.", input="inputs",
                             fix="give each entry the path of its media file.")
        out.append(str(p).strip())
    return out


def from_list(path: Path) -> Dataset:
    base = path.parent
    sources = [(base / p) if not Path(p).is_absolute() else Path(p) for p in _list_paths(path)]
    return Dataset(base, sources, name=str(path))


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:            # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise InputError("reading a .toml dataset config needs Python 3.11 or the tomli package.",
                             input="inputs", fix="`python3 -m pip install tomli`, or use Python 3.11+.") from None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except Exception as e:       # noqa: BLE001 - tomllib.TOMLDecodeError
        raise InputError(f"'{path}' is not valid TOML: {e}.", input="inputs", fix="check the file's syntax.") from None


def from_musubi(path: Path, arch: Optional[str], step: int) -> list[Dataset]:
    """The datasets of a musubi-tuner dataset config; ``arch`` (its short name) gives the target fps."""
    config = _toml(path)
    general = config.get("general", {})
    entries = config.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"'{path}' has no [[datasets]] entries (not a musubi-tuner dataset config?).",
                         input="inputs", fix="see musubi-tuner's docs/dataset_config.md for the layout.")
    base = path.parent
    out = []
    for n, entry in enumerate(entries, 1):
        unknown = sorted(set(entry) - MUSUBI_KEYS) + sorted(set(general) - MUSUBI_KEYS)
        if unknown:
            raise InputError(f"'{path}', dataset {n}: unknown key(s) {', '.join(unknown)}.", input="inputs",
                             fix="use the keys of musubi-tuner's docs/dataset_config.md.")
        get = lambda k, d=None: entry.get(k, general.get(k, d))     # noqa: E731
        res = get("resolution", (960, 544))
        res = (int(res), int(res)) if isinstance(res, (int, float)) else (int(res[0]), int(res[1]))
        enable, no_up = bool(get("enable_bucket", False)), bool(get("bucket_no_upscale", False))
        buckets = Buckets(res, step, enable, no_up and enable)
        video = "video_directory" in entry or "video_jsonl_file" in entry
        cap = get("caption_extension")
        if entry.get("video_directory") or entry.get("image_directory"):
            folder = base / (entry.get("video_directory") or entry.get("image_directory"))
            if not folder.is_dir():
                raise InputError(f"'{path}', dataset {n}: no folder '{folder}'.", input="inputs", fix="check the path.")
            found = sorted(p for p in folder.iterdir() if p.is_file() and kind(p) == ("video" if video else "image"))
            if cap and not video:          # musubi-tuner keeps only images with a caption file
                found = [p for p in found if p.with_suffix(cap).is_file()]
            ds = Dataset(folder, found, name=f"{path.name} [{n}]")
        elif entry.get("video_jsonl_file") or entry.get("image_jsonl_file"):
            ds = from_list(base / (entry.get("video_jsonl_file") or entry.get("image_jsonl_file")))
            ds.name = f"{path.name} [{n}]"
        else:
            raise InputError(f"'{path}', dataset {n}: no image_directory, video_directory or *_jsonl_file.",
                             input="inputs", fix="give each dataset its media.")
        ds.buckets = buckets
        if video:
            source_fps = get("source_fps")
            targets = tuple(int(t) for t in get("target_frames", (1,)))
            ds.frames = Frames(targets, get("frame_extraction", "head"), int(get("frame_stride", 1)),
                               int(get("frame_sample", 1)), int(get("max_frames", 129)),
                               MUSUBI_FPS.get(arch or "") if source_fps else None,
                               float(source_fps) if source_fps else None)
            ds.video_buckets = replace(buckets, enable=True, no_upscale=False)
        if get("cache_directory"):
            ds.output = base / get("cache_directory")
        out.append(ds)
    return out


def gather(inputs: list[str], arch: Optional[str] = None, step: int = 16) -> list[Dataset]:
    out = []
    for text in inputs:
        p = Path(text)
        if p.is_dir():
            out.append(from_folder(p))
        elif p.is_file() and p.suffix.lower() == ".toml":
            out += from_musubi(p, arch, step)
        elif p.is_file() and p.suffix.lower() in LIST_SUFFIXES:
            out.append(from_list(p))
        elif p.is_file() and kind(p):
            out.append(Dataset(p.parent, [p], name=str(p)))
        elif p.exists():
            raise InputError(f"'{p}' is neither a folder, a list file ({', '.join(LIST_SUFFIXES)}), a musubi-tuner "
                             "dataset config (.toml) nor an image or video.", input="inputs",
                             fix="give a folder of images and videos, or a list of them.")
        else:
            raise InputError(f"no folder or file at '{p}'.", input="inputs", fix="check the path.")
    return out
