"""The latent cache (vae/cache/) on a small real dataset made here (tests/cache_data.py): the entry point,
buckets and frame rules, the posterior against diffusers, exactness, resume after a kill, a changed clip
redone, a broken clip listed, the dry run, --verify, timeouts and a missing PyAV."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cache_data
from helpers import ROOT

av = pytest.importorskip("av")

import vae  # noqa: E402
import vae.cache  # noqa: E402
from vae.cache import clips, media  # noqa: E402
from vae.cache.runner import CacheOptions, run  # noqa: E402

DEMO = ROOT / "vae" / "demo" / "vaekit_demo.safetensors"


def _run(tmp, vae_path, inputs, **kw) -> tuple:
    out = []
    opts = CacheOptions(vae=str(vae_path), inputs=[str(i) for i in inputs], output=str(tmp / "out"), **kw)
    return run(opts, say=out.append), out


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "vaekit-cache.json").read_text())["items"]


# ---- the entry point ------------------------------------------------------------------------------

def test_vae_cache_stays_callable_after_its_modules_are_imported():
    import vae.cache.datasets  # noqa: F401
    import vae.cache.formats
    import vae.cache.manifest  # noqa: F401
    import vae.cache.runner  # noqa: F401
    from vae import cache
    assert cache is vae.cache and callable(vae.cache) and callable(cache)
    with pytest.raises(AttributeError, match="`import vae.cache` or `from vae import cache`"):
        vae.__getattr__("cache")            # what `import vae; vae.cache` meets before anything imported the cache

    assert vae.cache.formats is sys.modules["vae.cache.formats"] and callable(vae.cache.cache)
    with pytest.raises(vae.InputError, match="no inputs"):
        vae.cache(str(DEMO), [], "x")


# ---- buckets and frames (no pixels) ---------------------------------------------------------------

def test_buckets_follow_the_trainers_rules():
    b = clips.Buckets((960, 544), 16)
    sizes = b.candidates()
    # musubi-tuner's rule: area 960*544, widths from 720/2 rounded to 16 up to 720, both orientations
    assert (960, 544) in sizes and (544, 960) in sizes and all(w % 16 == 0 and h % 16 == 0 for w, h in sizes)
    assert all(w * h <= 960 * 544 for w, h in sizes)
    assert b.choose((1920, 1080)) == clips.Bucket(960, 544)          # 16:9 -> the nearest ratio
    assert b.choose((1080, 1920)) == clips.Bucket(544, 960)
    assert clips.Buckets((960, 544), 16, enable=False).choose((100, 700)) == clips.Bucket(960, 544)
    assert clips.Buckets((960, 544), 16, no_upscale=True).choose((300, 200)) == clips.Bucket(288, 192)
    # LTX-2's trainer's rule: nearest log aspect ratio among buckets with few enough frames, then more frames
    fixed = clips.Buckets(fixed=clips.parse_buckets("768x768x25;512x768x49;768x512x49;768x512x25"))
    assert fixed.choose((1920, 1080), 100) == clips.Bucket(768, 512, 49)
    assert fixed.choose((1920, 1080), 30) == clips.Bucket(768, 512, 25)
    assert fixed.choose((1000, 1000), 30) == clips.Bucket(768, 768, 25)
    assert fixed.choose((1000, 1000), 10) is None
    crop = clips.crop_for((1920, 1080), clips.Bucket(960, 544))
    assert crop.scaled == (967, 544) and (crop.left, crop.top) == (3, 0)


@pytest.mark.parametrize("ratio, lengths", [(4, {1: 1, 4: 1, 5: 5, 20: 17, 81: 81}), (8, {9: 9, 16: 9, 49: 49, 50: 49}),
                                            (None, {1: 1, 30: 1})])
def test_frame_rules_round_down_to_the_family(ratio, lengths):
    fit = clips.frame_rule(ratio)
    assert {n: fit(n) for n in lengths} == lengths


def test_extractions_as_the_trainers_offer_them():
    fit = clips.frame_rule(4)
    spans = lambda fr, n=40: [(c.start, c.frames) for c in clips.plan_clips(n, fr, fit)]   # noqa: E731
    assert spans(clips.Frames((1, 13, 25))) == [(0, 1), (0, 13), (0, 25)]
    assert spans(clips.Frames((13,), "chunk")) == [(0, 13), (13, 13), (26, 13)]
    assert spans(clips.Frames((13,), "slide", stride=10)) == [(0, 13), (10, 13), (20, 13)]
    assert spans(clips.Frames((13,), "uniform", sample=3)) == [(0, 13), (13, 13), (27, 13)]
    assert spans(clips.Frames((13,), "full", max_frames=31)) == [(0, 29)]       # 31 -> 1 + 4*7
    assert spans(clips.Frames((50,))) == []                                     # longer than the clip
    # a target rate thins the frames (30 -> 15 fps: every other one), never repeats them
    c = clips.plan_clips(40, clips.Frames((5,), fps=15.0), fit, source_fps=30.0)[0]
    assert c.indices == (0, 2, 4, 6, 8)
    assert clips.resampled(5, 10.0, 30.0) == [0, 1, 2, 3, 4]


# ---- runs on real files -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cache")
    return cache_data.make_dataset(tmp / "data"), cache_data.vae_file(tmp, "wan")


def test_the_posterior_is_diffusers_and_the_exact_mean_is_one_pass(tmp_path, data):
    """Wan (tiny, random weights): the stored mean and log-variance are diffusers' AutoencoderKLWan posterior of
    the same frames (independent model code)."""
    folder, wan = data
    res, _ = _run(tmp_path, wan, [folder / "c.mp4"], resolution="32x32", frames=(5,))
    assert (res.written, res.failed) == (1, 0)
    from safetensors.torch import load_file
    stored = load_file(str(tmp_path / "out" / "c_00000-005.safetensors"))
    rec = _manifest(tmp_path / "out")["c_00000-005.safetensors"]
    assert rec["settings"]["bucket"] == [32, 32] and rec["settings"]["frames"] == [0, 1, 2, 3, 4]
    assert rec["plan"].startswith("exact") and rec["logvar_note"] == "exact"
    crop = clips.crop_for((80, 80), clips.Bucket(32, 32))
    (_, x), = list(media.read_clips(folder / "c.mp4", [clips.ClipPlan(0, 5, tuple(range(5)))], crop))
    mean, logvar = cache_data.diffusers_wan_posterior(x.unsqueeze(0))
    assert stored["mean"].shape == (16, 2, 4, 4) == mean[0].shape
    # float32, same weights, different conv code: a few ulps of the latent's scale
    assert (stored["mean"] - mean[0]).abs().max() <= 1e-4
    assert (stored["logvar"] - logvar[0].clamp(-30, 20)).abs().max() <= 1e-4


def test_exact_tiles_within_a_budget_equal_one_pass(tmp_path, data):
    """The demo VAE (TAESD, trained weights) on a 128 px bucket in 64 px exact tiles (on a CPU the planner's
    fixed overhead dwarfs so small a model, so the tile is given), the stored latent equal to one untiled
    pass of the same pixels."""
    folder, _ = data
    res, _ = _run(tmp_path, DEMO, [folder / "d.png"], resolution="128x128", enable_bucket=False, tile=64)
    assert res.written == 1
    rec = _manifest(tmp_path / "out")["d.safetensors"]
    assert rec["plan"].startswith("exact, 64 px tiles"), rec["plan"]
    from safetensors.torch import load_file
    stored = load_file(str(tmp_path / "out" / "d.safetensors"))
    x, _ = media.read_image(folder / "d.png", clips.Bucket(128, 128))
    one = vae.load(DEMO).encode(x[:, 0].unsqueeze(0))
    assert "logvar" not in stored and (stored["mean"] - one[0]).abs().max() <= 1e-5


def test_a_rerun_skips_redoes_what_changed_and_lists_what_is_broken(tmp_path, data):
    folder, _ = data
    wan = DEMO          # an image VAE: each clip is one frame (fast); the rules are the same
    src = tmp_path / "src"
    src.mkdir()
    for name in ("c.mp4", "d.png"):
        (src / name).write_bytes((folder / name).read_bytes())
    (src / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(2000))
    res, said = _run(tmp_path, wan, [src], resolution="32x32", frames=(1, 5))
    assert (res.written, res.failed) == (2, 1)          # c.mp4 (frames 1 and 5 fit to 1: one clip), d.png
    assert said[-1].startswith("cached 3 items: 2 written, 0 up to date, 1 failed")
    items = _manifest(tmp_path / "out")
    assert items["source:broken.mp4"]["status"] == "failed" and "cannot" in items["source:broken.mp4"]["reason"]
    res, _ = _run(tmp_path, wan, [src], resolution="32x32", frames=(1, 5))
    assert (res.written, res.skipped, res.failed) == (0, 2, 1)
    # the clip changes: its items are redone, the image is not
    cache_data.write_video(src / "c.mp4", cache_data.pan(cache_data.photos()[1], 9, (80, 80)))
    before = (tmp_path / "out" / "d.safetensors").stat().st_mtime_ns
    res, _ = _run(tmp_path, wan, [src], resolution="32x32", frames=(1, 5))
    assert (res.written, res.skipped) == (1, 1)
    assert (tmp_path / "out" / "d.safetensors").stat().st_mtime_ns == before
    # a changed setting (the bucket) redoes everything; a file we did not write is never touched
    (tmp_path / "out" / "mine.txt").write_text("keep")
    res, _ = _run(tmp_path, wan, [src], resolution="48x48", frames=(1, 5))
    assert res.written == 2 and (tmp_path / "out" / "mine.txt").read_text() == "keep"


def test_a_kill_mid_write_leaves_no_half_file_and_the_rerun_does_the_rest(tmp_path, data):
    folder, _ = data
    wan = DEMO
    out = tmp_path / "out"
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from vae.cache import formats
from vae.cache.runner import CacheOptions, run
calls = []
real = formats.VAEKit.write
def write(self, path, *a):
    calls.append(path)
    if len(calls) == 3:                      # the third file: half written, then the process is killed
        open(path, "wb").write(b"x" * 100)
        os.kill(os.getpid(), signal.SIGKILL)
    real(self, path, *a)
formats.VAEKit.write = write
run(CacheOptions(vae={str(wan)!r}, inputs=[{str(folder)!r}], output={str(out)!r}, resolution="32x32", frames=(1,)))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]
    finals = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert finals == ["a_00000-001.safetensors", "b_00000-001.safetensors", "vaekit-cache.log"]
    from safetensors.torch import load_file
    for name in finals[:2]:
        load_file(str(out / name))                              # whole files
    res, _ = _run(tmp_path, wan, [folder], resolution="32x32", frames=(1,))
    assert (res.written, res.skipped, res.failed) == (3, 2, 0)
    assert not [p for p in out.iterdir() if ".partial-" in p.name or p.suffix == ".log"]


def test_dry_run_plans_and_estimates_without_writing(tmp_path, data):
    folder, wan = data
    res, said = _run(tmp_path, wan, [folder], resolution="32x32", enable_bucket=False, frames=(1, 5), dry_run=True,
                     max_memory="0.5GB")
    text = "\n".join(said)
    assert "bucket 32x32, 5 frames: 3 items (3 to do)" in text and "bucket 32x32, 1 frame: 5 items" in text
    assert "predicted on cpu (budget 0.50 GiB)" in text and "first item" in text and "estimated" in text
    assert not [p for p in (tmp_path / "out").iterdir() if p.suffix == ".safetensors"]


def test_verify_decodes_and_compares_with_one_pass(tmp_path, data):
    folder, _ = data
    res, said = _run(tmp_path, DEMO, [folder / "e.jpg"], verify=1, tile=0)
    line = next(s for s in said if s.startswith("verify"))
    assert "PSNR" in line and "dB" in line
    diff = float(line.split("max |cached - untiled| ")[1].split()[0])
    assert diff <= 1e-4


def test_timeouts_and_a_missing_pyav_fail_items_not_the_run(tmp_path, data, monkeypatch):
    folder, wan = data
    res, _ = _run(tmp_path, wan, [folder / "a.mp4"], resolution="32x32", frames=(5,), timeout=1e-6)
    assert (res.written, res.failed) == (0, 1)
    assert "per-item timeout" in _manifest(tmp_path / "out")["a_00000-005.safetensors"]["reason"]

    def no_av():
        raise media.MediaError(media.AV_HELP)
    monkeypatch.setattr(media, "_av", no_av)
    res, said = _run(tmp_path / "x", DEMO, [folder])
    assert res.written == 2 and res.failed == 3          # the images, and three videos with the fix
    assert any('pip install "av>=15.1"' in s for s in said)


def test_the_command_line_says_how_many_failed(tmp_path, data, capsys):
    from vae.cli.commands import main
    folder, wan = data
    (tmp_path / "bad.webm").write_bytes(b"not a video")
    (tmp_path / "e.jpg").write_bytes((folder / "e.jpg").read_bytes())
    code = main(["cache", "--vae", str(DEMO), str(tmp_path / "bad.webm"), str(tmp_path / "e.jpg"), "-o",
                 str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert code == 1, err
    lines = out.strip().splitlines()
    assert lines[-1].startswith("cached 2 items: 1 written, 0 up to date, 1 failed")
    assert any(line.startswith("failed: source:bad.webm") for line in lines)
    assert err == ""                     # no progress bar where stderr is not a terminal


def test_frames_are_read_streaming_one_clip_at_a_time(tmp_path, monkeypatch):
    """A 20-frame video in 5-frame chunks: each clip comes out as soon as its last frame is decoded, and only
    the frames of clips still open are held (never the whole video)."""
    path = cache_data.write_video(tmp_path / "long.mp4", cache_data.pan(cache_data.photos()[0], 20, (64, 48)))
    plans = clips.plan_clips(20, clips.Frames((5,), "chunk"), clips.frame_rule(4))
    assert [p.start for p in plans] == [0, 5, 10, 15]
    fitted = []
    real = media.fit_frame
    monkeypatch.setattr(media, "fit_frame", lambda rgb, crop: fitted.append(1) or real(rgb, crop))
    seen = []
    for plan, x in media.read_clips(path, plans, clips.crop_for((64, 48), clips.Bucket(32, 32)), threads=1):
        seen.append((plan.start, len(fitted), tuple(x.shape)))
    assert seen == [(0, 5, (3, 5, 32, 32)), (5, 10, (3, 5, 32, 32)), (10, 15, (3, 5, 32, 32)), (15, 20, (3, 5, 32, 32))]


def test_the_bar_shows_items_and_frames_per_second_on_a_terminal_only():
    import io
    from vae.cache.runner import Bar

    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = Bar(stream, 2, quiet=False)
        bar.item(5)
        bar.item(5)
        bar.close()
    assert "2/2 items" in tty.getvalue() and "frames/s" in tty.getvalue() and pipe.getvalue() == ""
