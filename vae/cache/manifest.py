"""The manifest that keeps a cache true: ``vaekit-cache.json`` in the output folder, one record per output
file (its path relative to the folder), saying what made it:

- ``source``: the file, its size, mtime (ns) and the SHA-256 of its first MiB (``fingerprint``);
- ``settings``: the VAE file's SHA-256, the compute dtype, the mode (exact/fast; fast also its tile),
  the format (and its architecture, stored dtype), the bucket, the crop, the frame indices and fps;
- ``plan`` (the tile and chunk the planner chose), the time it took, the written file's size;
- or, for an item that failed, ``status`` "failed" and the ``reason``.

A rerun skips an item whose record has the same fingerprint and settings and whose file is still there
with its recorded size; anything else is done again. Nothing the manifest does not list is ever touched:
a file the cache did not write at an output's name is kept and its item fails (``refusal``), and no path
leads out of the folder (through ``..`` or a link). A failed redo of a written item keeps the earlier
file's ``bytes`` in its record, so the file stays the cache's to replace.

While a run goes on, records are appended to ``vaekit-cache.log`` (one JSON line each, flushed, one log
per process of a several-device run); the manifest is rewritten from it atomically at the end, and a
run that was killed leaves a log that the next run reads (a torn last line is ignored)."""
from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Iterable, Optional

MANIFEST = "vaekit-cache.json"
LOG = "vaekit-cache{rank}.log"
HEAD_BYTES = 1 << 20
VERSION = 1


def fingerprint(path: Path) -> dict:
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(HEAD_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_sha256": h.hexdigest()}


def file_sha256(path: Path, known: Optional[dict] = None) -> str:
    """The whole file's SHA-256; ``known`` (an earlier manifest's entry for the same size and mtime)
    saves reading a multi-GB file again."""
    st = path.stat()
    if known and known.get("size") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns and known.get("sha256"):
        return known["sha256"]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def write_json_atomic(path: Path, data) -> None:
    """Whole or not at all: a hidden temporary beside it, flushed, then renamed over it."""
    tmp = path.with_name(f".{path.name}.partial-{secrets.token_hex(4)}")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class Manifest:
    def __init__(self, root: Path, rank: int = 0):
        self.root, self.rank = Path(root), rank
        self.records: dict[str, dict] = {}
        self.vae: dict = {}
        self._log = None

    @property
    def path(self) -> Path:
        return self.root / MANIFEST

    def logs(self) -> list[Path]:
        return sorted(self.root.glob(LOG.format(rank="*")))

    def load(self) -> "Manifest":
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, ValueError):
                data = {}
            self.records = dict(data.get("items", {}))
            self.vae = dict(data.get("vae", {}))
        for log in self.logs():
            for rec in _read_log(log):
                self._apply(rec)
        return self

    def _apply(self, rec: dict) -> None:
        if "vae_file" in rec:
            self.vae = rec["vae_file"]
        elif rec.get("status") == "cleared":          # a source that failed before and was read now
            self.records.pop(rec.get("output"), None)
        elif "output" in rec:
            self.records[rec["output"]] = rec

    def open_log(self) -> None:
        self._log = open(self.root / LOG.format(rank=f".{self.rank}" if self.rank else ""), "a")

    def add(self, rec: dict) -> None:
        self._apply(rec)
        if self._log is not None:
            self._log.write(json.dumps(rec, sort_keys=True) + "\n")
            self._log.flush()
            os.fsync(self._log.fileno())

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def save(self) -> None:
        """The records as one file, atomically; then the logs it holds are removed (this process's
        and, on rank 0, the other ranks' after they finished)."""
        self.close_log()
        for log in self.logs():
            for rec in _read_log(log):
                self._apply(rec)
        write_json_atomic(self.path, {"version": VERSION, "vae": self.vae, "items": self.records})
        for log in self.logs():
            log.unlink(missing_ok=True)

    def fresh(self, output: str, source: dict, settings: dict) -> bool:
        """Is ``output`` done, from this source and these settings, and still there as written?"""
        rec = self.records.get(output)
        if not rec or rec.get("status") != "done" or rec.get("source") != source or rec.get("settings") != settings:
            return False
        f = self.root / output
        return f.is_file() and f.stat().st_size == rec.get("bytes")

    def owns(self, output: str) -> bool:
        """Is what lies at ``output`` the cache's? Its record holds the size of a file it wrote."""
        return "bytes" in self.records.get(output, {})

    def inside(self, output: str) -> bool:
        """Does ``output`` name a path inside the folder, following every link on the way?"""
        try:
            return (self.root / output).resolve().is_relative_to(self.root.resolve())
        except (OSError, RuntimeError):          # a loop of links
            return False

    def refusal(self, output: str) -> Optional[str]:
        """Why the cache may not write ``output`` (None: it may), with the fix, as a failed item's reason."""
        final, name = self.root / output, Path(output)
        fix = "move it away, or give another cache folder (-o)"
        if name.is_absolute() or ".." in name.parts or not name.name:
            return f"its output name {output!r} is not a file name inside the cache folder; rename the source"
        if not self.inside(output):
            return (f"{final} leads outside the cache folder {self.root} (a link on the way points out), so nothing "
                    "is written there; remove the link, or give another cache folder (-o)")
        for folder in reversed(name.parents[:-1]):
            if os.path.lexists(self.root / folder) and not (self.root / folder).is_dir():
                return f"{self.root / folder} is not a folder, so {output} cannot be written below it; {fix}"
        if os.path.lexists(final) and (final.is_dir() or not self.owns(output)):
            return f"the cache did not write what is at {final} (the manifest does not list it): it is kept; {fix}"
        return None

    def written(self) -> Iterable[tuple[str, dict]]:
        return ((k, r) for k, r in self.records.items() if r.get("status") == "done")


def _read_log(path: Path) -> list[dict]:
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:          # a line torn by a kill: the item is simply done again
            continue
    return out
