"""Where outputs go, and writing them so that they appear whole or not at all.

``save_path`` is ComfyUI's ``folder_paths.get_save_image_path``, rule for rule: a ``filename_prefix``
may name subfolders of the output folder (``latents/ComfyUI``), never a place outside it (``../x``,
an absolute path: refused, as ComfyUI refuses them), ``%width%``/``%height%``/``%year%``... are filled
in, and the counter continues after the highest ``<name>_NNNNN_`` already there, so earlier outputs
are never overwritten.

``AtomicFiles`` writes a set of files (a batch of PNGs, one .latent) under hidden temporary names in
their folder and renames them into place only when every one is written; an error or an interrupt
(KeyboardInterrupt included) removes the temporaries and any file already renamed."""
from __future__ import annotations

import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Union

from ..errors import InputError

PathLike = Union[str, os.PathLike]


def _vars(prefix: str, width: int, height: int) -> str:
    now = time.localtime()
    for key, value in (("%width%", width), ("%height%", height), ("%year%", now.tm_year),
                       ("%month%", f"{now.tm_mon:02d}"), ("%day%", f"{now.tm_mday:02d}"),
                       ("%hour%", f"{now.tm_hour:02d}"), ("%minute%", f"{now.tm_min:02d}"),
                       ("%second%", f"{now.tm_sec:02d}")):
        prefix = prefix.replace(key, str(value))
    return prefix


def _counter(folder: Path, name: str) -> int:
    """1 + the highest N of files '<name>_N_...' in ``folder`` (ComfyUI's rule), or 1."""
    best = 0
    if folder.is_dir():
        for f in os.listdir(folder):
            head, digits = f[: len(name) + 1], f[len(name) + 1:].split("_")[0]
            if os.path.normcase(head[:-1]) == os.path.normcase(name) and head[-1:] == "_" and digits.isdigit():
                best = max(best, int(digits))
    return best + 1


def save_path(prefix: str, output_dir: PathLike, width: int = 0, height: int = 0,
              input: str = "filename_prefix") -> tuple[Path, str, int]:
    """(folder, file name stem, first free counter) for ``prefix`` inside ``output_dir``. Refuses a
    prefix that leaves the output folder; does not create anything."""
    out = os.path.abspath(output_dir)
    if "%" in prefix:
        prefix = _vars(prefix, width, height)
    norm = os.path.normpath(prefix) if prefix else ""
    sub, name = os.path.dirname(norm), os.path.basename(norm)
    folder = os.path.abspath(os.path.join(out, sub))
    if os.path.commonpath((out, folder)) != out:
        raise InputError(f"'{prefix}' would write to '{folder}', outside the output folder '{out}'.", input=input,
                         fix="use a name, or a subfolder of the output folder such as 'videos/clip' (as ComfyUI, "
                             "which refuses the same prefixes).")
    if not name or name in (".", ".."):
        raise InputError(f"'{prefix}' names a folder, not files.", input=input,
                         fix="end it with a file name, e.g. 'ComfyUI' or 'latents/ComfyUI'.")
    return Path(folder), name, _counter(Path(folder), name)


def numbered(folder: Path, name: str, counter: int, ext: str) -> Path:
    """ComfyUI's file name: '<name>_00001_.png'."""
    return folder / f"{name}_{counter:05d}_{ext}"


def check_writable(folder: PathLike, input: str = "output", create: bool = False) -> Path:
    """Refuse an output folder that is missing (or create it) or not writable, before any work."""
    folder = Path(folder)
    if not folder.exists():
        if not create:
            raise InputError(f"the output folder '{folder}' does not exist.", input=input,
                             fix=f"create it first (mkdir -p '{folder}') or choose another output.")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"the output folder '{folder}' cannot be created ({e.strerror}).", input=input,
                             fix="choose a folder you can write to.") from None
    if not folder.is_dir():
        raise InputError(f"'{folder}' is a file, not a folder.", input=input, fix="choose a folder for the outputs.")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise InputError(f"cannot write to the output folder '{folder}' ({e.strerror}).", input=input,
                         fix="choose a folder you can write to, or change its permissions.") from None
    return folder


class AtomicFiles:
    """``with AtomicFiles() as files: write(files.temp(final), ...)``: all the finals appear at the end
    of the block, or none does."""

    def __init__(self, overwrite: bool = False):
        self.overwrite = overwrite
        self.pending: list[tuple[Path, Path]] = []

    def temp(self, final: PathLike) -> Path:
        final = Path(final)
        # the real suffix last: writers pick the format from it (Pillow)
        tmp = final.with_name(f".{final.stem}.partial-{secrets.token_hex(4)}{final.suffix}")
        self.pending.append((tmp, final))
        return tmp

    def __enter__(self) -> "AtomicFiles":
        return self

    def __exit__(self, kind, error, tb) -> None:
        if kind is not None:
            self._remove([t for t, _ in self.pending])
            return
        done: list[Path] = []
        try:
            for tmp, final in self.pending:
                if final.exists() and not self.overwrite:
                    raise InputError(f"'{final}' appeared while writing; it is left as it is.", input="output",
                                     fix="run again (the counter moves past it).")
                os.replace(tmp, final)
                done.append(final)
        except BaseException:
            self._remove([t for t, _ in self.pending] + done)
            raise

    @staticmethod
    def _remove(paths: list[Path]) -> None:
        for p in paths:
            try:
                p.unlink()
            except FileNotFoundError:
                pass


def one_file(final: PathLike, overwrite: bool = False, input: str = "output") -> Path:
    """Refuse to replace an existing file unless asked to."""
    final = Path(final)
    if final.exists() and not overwrite:
        raise InputError(f"'{final}' exists.", input=input, fix="choose another name, or pass --overwrite.")
    return final
