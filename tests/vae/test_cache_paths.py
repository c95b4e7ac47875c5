"""Where the cache may write (vae/cache/): every output lands inside its cache folder whatever a folder, list
file, CSV, JSONL or musubi-tuner config names (``..``, absolute paths, odd names), nothing is written through
a link leading out of the folder, and a file the manifest does not list is kept, its item listed as failed
with the reason while the run goes on."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import cache_data
from helpers import ROOT

pytest.importorskip("av")

from vae.cache.runner import CacheOptions, Runner, run  # noqa: E402
from vae.errors import VAEKitError  # noqa: E402

DEMO = ROOT / "vae" / "demo" / "vaekit_demo.safetensors"       # an image VAE: each clip is one frame (fast)


def _run(out: Path, inputs, **kw) -> tuple:
    said = []
    opts = CacheOptions(vae=str(DEMO), inputs=[str(i) for i in inputs], output=str(out), resolution="32x32", **kw)
    return run(opts, say=said.append), said


def _items(out: Path) -> dict:
    return json.loads((out / "vaekit-cache.json").read_text())["items"]


def _files(folder: Path) -> set:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    folder = tmp_path_factory.mktemp("paths") / "media"
    return cache_data.make_dataset(folder, videos=(("far.mp4", 5, (48, 32)),), images=(("pic.png", (40, 40)),))


def _list_file(lists: Path, form: str, entries: list[str]) -> Path:
    """``entries`` as a .txt / .jsonl / .json / .csv list, or a musubi-tuner config naming a JSONL of them."""
    lists.mkdir()
    rows = [{"media_path": e} for e in entries]
    if form == "txt":
        (lists / "l.txt").write_text("\n".join(entries) + "\n")
    elif form in ("jsonl", "toml"):
        (lists / "l.jsonl").write_text("".join(json.dumps({"video_path": e}) + "\n" for e in entries))
        if form == "toml":
            (lists / "l.toml").write_text('[[datasets]]\nimage_jsonl_file = "l.jsonl"\ncache_directory = "../out"\n')
    elif form == "json":
        (lists / "l.json").write_text(json.dumps(rows))
    else:
        (lists / "l.csv").write_text("caption,media_path\n" + "".join(f"x,{e}\n" for e in entries))
    return lists / f"l.{form}"


@pytest.mark.parametrize("form", ["txt", "jsonl", "json", "csv", "toml"])
def test_list_entries_above_the_list_or_absolute_are_written_inside_the_cache_folder(tmp_path, media, form):
    """The user's case: a list's entry ``../elsewhere/far.mp4`` wrote ``far_00000-001.safetensors`` beside
    the source; an entry outside the list's folder goes by its file name, as an absolute path does."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("far.mp4", "pic.png"):
        (elsewhere / name).write_bytes((media / name).read_bytes())
    listed = _list_file(tmp_path / "lists", form, ["../elsewhere/far.mp4", str(elsewhere / "pic.png")])
    res, said = _run(tmp_path / "out", [listed])
    assert (res.written, res.failed) == (2, 0), said
    assert _files(elsewhere) == {"far.mp4", "pic.png"}
    assert sorted(_items(tmp_path / "out")) == ["far_00000-001.safetensors", "pic.safetensors"]
    assert all(p.resolve().parent == (tmp_path / "out").resolve() for p in res.outputs)


@pytest.mark.parametrize("blocker", ["a link leading out", "a file on the way"])
def test_nothing_is_written_through_a_link_out_of_the_cache_folder_or_below_a_file(tmp_path, media, blocker):
    src, out, outside = tmp_path / "src", tmp_path / "out", tmp_path / "outside"
    (src / "sub").mkdir(parents=True)
    outside.mkdir()
    out.mkdir()
    for rel in ("sub/x.png", "y.png"):
        (src / rel).write_bytes((media / "pic.png").read_bytes())
    if blocker == "a link leading out":
        (out / "sub").symlink_to(outside, target_is_directory=True)
    else:
        (out / "sub").write_text("mine")
    res, said = _run(out, [src])
    assert (res.written, res.failed) == (1, 1), said
    reason = _items(out)["sub/x.safetensors"]["reason"]
    assert ("outside the cache folder" if blocker == "a link leading out" else "not a folder") in reason
    assert any(s.startswith("failed: sub/x.safetensors: ") for s in said)
    assert _files(outside) == set() and (out / "y.safetensors").is_file()
    if blocker == "a file on the way":
        assert (out / "sub").read_text() == "mine"


def test_a_file_the_manifest_does_not_list_is_kept_and_its_item_fails(tmp_path, media):
    """A user's own file at an output's name is never replaced: the item is listed as failed (manifest and
    summary) with the reason, the other items are written, and the refusal does not make the file the
    cache's: the next run refuses again, until the file is moved away."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    for name in ("d.png", "e.png"):
        (src / name).write_bytes((media / "pic.png").read_bytes())
    (out / "d.safetensors").write_bytes(b"the user's own file")
    _, said = _run(out, [src], dry_run=True)
    assert any(s.startswith("  will fail: d.safetensors: the cache did not write") for s in said), said
    for _ in range(2):
        res, said = _run(out, [src])
        assert (res.written + res.skipped, res.failed) == (1, 1), said
        assert (out / "d.safetensors").read_bytes() == b"the user's own file"
        rec = _items(out)["d.safetensors"]
        assert rec["status"] == "failed" and "did not write" in rec["reason"] and "move it away" in rec["reason"]
        assert any(s.startswith("failed: d.safetensors: the cache did not write") for s in said)
        assert said[-1].startswith("cached 2 items:") and "1 failed" in said[-1]
    (out / "d.safetensors").unlink()
    res, _ = _run(out, [src])
    assert (res.written, res.skipped, res.failed) == (1, 1, 0)


def test_a_file_that_appears_while_its_item_encodes_is_kept(tmp_path, media, monkeypatch):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "d.png").write_bytes((media / "pic.png").read_bytes())
    real = Runner.encode

    def encode(self, *a, **k):
        (out / "d.safetensors").write_bytes(b"copied in meanwhile")
        return real(self, *a, **k)
    monkeypatch.setattr(Runner, "encode", encode)
    res, said = _run(out, [src])
    assert (res.written, res.failed) == (0, 1), said
    assert (out / "d.safetensors").read_bytes() == b"copied in meanwhile"
    assert "did not write" in _items(out)["d.safetensors"]["reason"]


def test_a_file_the_cache_wrote_is_still_redone_after_a_failed_redo(tmp_path, media, monkeypatch):
    """A failed record keeps the earlier file the cache's own: a later run redoes it (the resume rules)."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "d.png").write_bytes((media / "pic.png").read_bytes())
    assert _run(out, [src])[0].written == 1

    def fail(*a, **k):
        raise VAEKitError("the latent has NaN/Inf values")
    with monkeypatch.context() as m:
        m.setattr(Runner, "encode", fail)
        os.utime(src / "d.png", ns=(1, 1))                      # the source changed: the item is redone
        assert _run(out, [src])[0].failed == 1
    res, said = _run(out, [src])
    assert (res.written, res.failed) == (1, 0), said


def test_odd_file_names_give_outputs_inside_the_cache_folder(tmp_path, media):
    """A source named ``..png`` stopped the whole run (no output name); a backslash or a leading dash is
    part of a POSIX file name."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for name in ("..png", "a\\b.png", "-x.png", "plain.png"):
        (src / name).write_bytes((media / "pic.png").read_bytes())
    res, said = _run(out, [src])
    assert (res.written, res.failed) == (4, 0), said
    assert sorted(_items(out)) == ["-x.safetensors", "..safetensors", "a\\b.safetensors", "plain.safetensors"]
    assert all(p.resolve().parent == out.resolve() for p in res.outputs)


def test_prune_never_removes_a_file_outside_the_cache_folder(tmp_path, media):
    """A manifest record that names a path leading out (an edited manifest, an earlier version's output)
    is never followed: --prune removes only files inside the folder."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "d.png").write_bytes((media / "pic.png").read_bytes())
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / "vaekit-cache.json").write_text(json.dumps({"version": 1, "vae": {}, "items": {
        "../victim.txt": {"output": "../victim.txt", "status": "done", "bytes": victim.stat().st_size}}}))
    res, said = _run(out, [src], prune=True)
    assert res.written == 1 and victim.read_text() == "keep me", said
