"""What the cache writes, checked against facts recorded from the trainers' code (kohya-ss/musubi-tuner:
dataset/cache_io.py, dataset/image_video_dataset.py, wan/modules/vae.py; Lightricks/LTX-2:
packages/ltx-trainer/scripts/process_videos.py, src/ltx_trainer/datasets.py), and read by the trainers'
own loaders where an environment variable names a copy of them (MUSUBI_TUNER_DIR, LTX2_DIR; the Python to
run them with: MUSUBI_PYTHON / LTX2_PYTHON, default this one). Also: a musubi-tuner dataset config as the
input, and several processes sharing the items (CPU gloo ranks)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cache_data
from helpers import ROOT

pytest.importorskip("av")

from vae.cache.runner import CacheOptions, run  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("formats")
    folder = cache_data.make_dataset(tmp / "data", videos=(("a.mp4", 12, (96, 64)), ("b.webm", 9, (64, 96))),
                                     images=(("d.png", (100, 60)),))
    return tmp, folder


def _cache(out, vae_path, inputs, **kw):
    said = []
    res = run(CacheOptions(vae=str(vae_path), inputs=[str(i) for i in inputs], output=str(out), **kw), say=said.append)
    assert res.failed == 0, said
    return res


def test_musubi_wan_files_are_named_keyed_and_normalised_as_musubi_tuner_writes_them(data):
    tmp, folder = data
    wan = cache_data.vae_file(tmp, "wan")
    out, ours = tmp / "musubi", tmp / "ours"
    _cache(out, wan, [folder], format="musubi", arch="wan", resolution="32x32", frames=(1, 5))
    _cache(ours, wan, [folder / "a.mp4"], resolution="32x32", frames=(5,), bucket_step=16)
    from safetensors import safe_open
    names = sorted(p.name for p in out.iterdir() if p.suffix == ".safetensors")
    # {name}_{start:05d}-{frames:03d}_{W:04d}x{H:04d}_{arch}.safetensors (W x H: the source's size)
    assert names == ["a_00000-001_0096x0064_wan.safetensors", "a_00000-005_0096x0064_wan.safetensors",
                     "b_00000-001_0064x0096_wan.safetensors", "b_00000-005_0064x0096_wan.safetensors",
                     "d_0100x0060_wan.safetensors"]
    with safe_open(str(out / names[1]), "pt") as f:
        assert list(f.keys()) == ["latents_2x4x4_bfloat16"] and f.metadata() == {
            "architecture": "wan", "width": "96", "height": "64", "format_version": "1.0.1", "frame_count": "5"}
        z = f.get_tensor("latents_2x4x4_bfloat16")
    # [C, F, H, W]; the bucket of 96x64 at 32x32 in 16 px steps (musubi-tuner's rule) is 32x32, / 8
    assert z.dtype == torch.bfloat16 and z.shape == (16, 2, 4, 4)
    with safe_open(str(out / names[4]), "pt") as f:
        assert list(f.keys()) == ["latents_1x4x4_bfloat16"] and "frame_count" not in f.metadata()
    # Wan's per-channel statistics (musubi-tuner's wan/modules/vae.py): channel 0 mean -0.7571 std 2.8184,
    # channel 15 mean -0.2921 std 1.9160; stored = (mean - m) / s, in bfloat16
    from safetensors.torch import load_file
    mean = load_file(str(ours / "a_00000-005.safetensors"))["mean"]
    for c, m, s in ((0, -0.7571, 2.8184), (15, -0.2921, 1.9160)):
        assert (z[c].float() - (mean[c] - m) / s).abs().max() <= 1e-2 * max(1.0, float(z[c].float().abs().max()))


def test_ltx2_files_are_the_trainers_dicts(data):
    tmp, folder = data
    ltx = cache_data.vae_file(tmp, "ltx")
    out, ours = tmp / "ltx2", tmp / "ltx_ours"
    _cache(out, ltx, [folder / "a.mp4", folder / "d.png"], format="ltx2", buckets="64x32x9;64x32x1")
    _cache(ours, ltx, [folder / "a.mp4"], buckets="64x32x9")
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".pt") == ["a.pt", "d.pt"]
    d = torch.load(str(out / "a.pt"), map_location="cpu", weights_only=True)      # as its loader reads it
    assert sorted(d) == ["fps", "height", "latents", "num_frames", "width"]
    assert d["latents"].dtype == torch.bfloat16 and d["latents"].shape == (16, 2, 1, 2)      # [C, F', H', W']
    assert (d["num_frames"], d["height"], d["width"]) == (2, 1, 2) and all(
        type(d[k]) is int for k in ("num_frames", "height", "width"))
    assert d["fps"] == 24.0 and type(d["fps"]) is float
    img = torch.load(str(out / "d.pt"), map_location="cpu", weights_only=True)
    assert img["latents"].shape == (16, 1, 1, 2) and img["fps"] == 1.0       # images: one frame at 1 fps
    from safetensors.torch import load_file
    mean = load_file(str(ours / "a_00000-009.safetensors"))["mean"]        # normalised, as LTX-2's encoder gives it
    assert (d["latents"].float() - mean).abs().max() <= 1e-2 * max(1.0, float(mean.abs().max()))


def test_a_musubi_dataset_config_is_read_as_musubi_tuner_reads_it(data):
    tmp, folder = data
    wan = cache_data.vae_file(tmp, "wan")
    vids = tmp / "vids"
    vids.mkdir(exist_ok=True)
    (vids / "a.mp4").write_bytes((folder / "a.mp4").read_bytes())      # 12 frames at 24 fps
    config = tmp / "dataset.toml"
    config.write_text(f"""
[general]
resolution = [32, 32]
caption_extension = ".txt"
batch_size = 1

[[datasets]]
video_directory = "{vids}"
cache_directory = "{tmp / 'toml_cache'}"
target_frames = [5]
frame_extraction = "chunk"
source_fps = 32.0
""")
    res = _cache(tmp / "unused", wan, [config], format="musubi", arch="wan")
    # at 32 fps thinned to Wan's 16: 6 frames, one chunk of 5
    names = sorted(p.name for p in (tmp / "toml_cache").iterdir() if p.suffix == ".safetensors")
    assert names == ["a_00000-005_0096x0064_wan.safetensors"] and res.written == 1
    rec = json.loads((tmp / "toml_cache" / "vaekit-cache.json").read_text())["items"][names[0]]
    assert rec["settings"]["frames"] == [0, 2, 4, 6, 8] and rec["settings"]["fps"] == 16.0
    config.write_text(config.read_text() + "\nflip_aug = true\n")
    with pytest.raises(Exception, match="unknown key"):
        _cache(tmp / "unused", wan, [config], format="musubi", arch="wan")


def test_several_processes_share_the_items_and_agree_with_one(data):
    tmp, folder = data
    demo = ROOT / "vae" / "demo" / "vaekit_demo.safetensors"
    one, two = tmp / "one", tmp / "two"
    _cache(one, demo, [folder])
    r = subprocess.run([sys.executable, "-m", "vae", "cache", "--vae", str(demo), str(folder), "-o", str(two),
                        "--devices", "cpu,cpu"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1].startswith("cached 3 items: 3 written, 0 up to date, 0 failed")
    items = json.loads((two / "vaekit-cache.json").read_text())["items"]
    assert sorted(items) == sorted(p.name for p in one.iterdir() if p.suffix == ".safetensors")
    assert not list(two.glob("*.log"))                       # the ranks' logs were folded into the manifest
    from safetensors.torch import load_file
    for name in items:
        a, b = load_file(str(one / name))["mean"], load_file(str(two / name))["mean"]
        assert (a - b).abs().max() <= 1e-5


def test_musubi_tuners_own_loader_batches_our_files(data):
    tmp, folder = data
    out = tmp / "musubi_loader"
    _cache(out, cache_data.vae_file(tmp, "wan"), [folder / "a.mp4"], format="musubi", arch="wan", resolution="32x32",
           frames=(9,))
    from safetensors.torch import save_file
    save_file({"varlen_t5_bfloat16": torch.zeros(3, 8, dtype=torch.bfloat16)}, str(out / "a_wan_te.safetensors"))
    src = Path(os.environ.get("MUSUBI_TUNER_DIR", ".")) / "src"
    got = cache_data.trainer_loader("MUSUBI_TUNER_DIR", f"""
import json, sys
sys.path.insert(0, {str(src)!r})
from musubi_tuner.dataset.image_video_dataset import VideoDataset
ds = VideoDataset((32, 32), None, 1, 1, True, False, video_directory={str(folder)!r}, cache_directory={str(out)!r},
                  target_frames=[9], architecture="wan")
ds.prepare_for_training()
batch = ds.batch_manager[0]
print(json.dumps({{k: list(v.shape) for k, v in batch.items() if hasattr(v, "shape")}}))
""", tmp)
    assert got["latents"] == [1, 16, 3, 4, 4]


def test_ltx2_trainers_own_loader_reads_our_files(data):
    tmp, folder = data
    root = tmp / "ltx_loader" / ".precomputed" / "latents"
    _cache(root, cache_data.vae_file(tmp, "ltx"), [folder / "a.mp4"], format="ltx2", buckets="64x32x9")
    src = Path(os.environ.get("LTX2_DIR", ".")) / "packages" / "ltx-trainer" / "src"
    got = cache_data.trainer_loader("LTX2_DIR", f"""
import json, sys
sys.path.insert(0, {str(src)!r})
from ltx_trainer.datasets import PrecomputedDataset
ds = PrecomputedDataset({str(tmp / 'ltx_loader')!r}, ["latents"])
item = ds[0]["latents"]
print(json.dumps({{"shape": list(item["latents"].shape), "fps": item["fps"], "frames": item["num_frames"]}}))
""", tmp)
    assert got == {"shape": [16, 2, 1, 2], "fps": 24.0, "frames": 2}


# musubi-tuner's cache_io.py per architecture: (architecture metadata, key pattern, dtype its script stores)
MUSUBI_FACTS = {
    "wan": ("wan", "latents_{F}x{H}x{W}_bfloat16", torch.bfloat16),
    "hv": ("hunyuan_video", "latents_{F}x{H}x{W}_float16", torch.float16),
    "hv15": ("hunyuan_video_1_5", "latents_{F}x{H}x{W}_float16", torch.float16),
    "qi": ("qwen_image", "latents_{F}x{H}x{W}_bfloat16", torch.bfloat16),
    "f2d": ("flux_2_dev", "latents_{H}x{W}_float32", torch.float32),
    "f2k4b": ("flux_2_klein_4b", "latents_{H}x{W}_float32", torch.float32),
}


@pytest.mark.parametrize("arch", sorted(MUSUBI_FACTS))
def test_every_musubi_architecture_keys_its_latents_as_its_cache_script(tmp_path, arch):
    from safetensors import safe_open

    from vae.cache import formats
    full, key, dtype = MUSUBI_FACTS[arch]
    fmt = formats.make("musubi", arch)
    a = fmt.arch
    video = a.videos
    item = formats.Item("clip", Path("sub/clip.mp4"), video, 8, 9 if video else 1, (1280, 720), 24.0)
    mean = torch.randn((1, a.channels, 3, 5, 7) if a.frames else (1, a.channels, 5, 7))
    path = tmp_path / fmt.path(item)
    fmt.write(path, item, mean, None, {})
    # the short name in the file name: musubi-tuner's datasets glob "*_{short}.safetensors"
    name = f"clip_00008-009_1280x0720_{arch}.safetensors" if video else f"clip_1280x0720_{arch}.safetensors"
    assert path.name == name
    with safe_open(str(path), "pt") as f:
        k = key.format(F=3, H=5, W=7)
        assert list(f.keys()) == [k] and f.get_tensor(k).dtype == dtype
        assert f.get_tensor(k).shape == ((a.channels, 3, 5, 7) if a.frames else (a.channels, 5, 7))
        meta = {"architecture": full, "width": "1280", "height": "720", "format_version": "1.0.1"}
        assert f.metadata() == ({**meta, "frame_count": "9"} if video else meta)
    back = fmt.read(path)                # --verify reads it back into the family's latent space
    assert (back - mean[0]).abs().max() <= 2e-2 * float(mean.abs().max())


@pytest.mark.parametrize("arch", ["fp", "fk", "nope"])
def test_musubi_architectures_a_vae_cannot_make_are_refused_with_the_reason(arch):
    from vae.cache import formats
    from vae.errors import InputError
    with pytest.raises(InputError, match="SigLIP|control image|unknown musubi"):
        formats.make("musubi", arch)


def test_ltx2_fork_files_carry_its_names_keys_dtype_and_source_identity(data):
    """The LTX-2 fork of musubi-tuner (AkaneTendo25/musubi-tuner, branch ltx-2, e0e570f4): file names
    ``{name}[_{start:05d}-{frames:03d}]_{W:04d}x{H:04d}_ltx2.safetensors`` (dataset/image_video_dataset.py:2213-2227,
    :3614; architecture "ltx2" in dataset/architectures.py:6); keys ``latents_{F}x{H}x{W}_{dtype}`` [C, F, H, W]
    and metadata ``architecture`` "ltx2_v1", ``format_version`` 1.0.1, ``frame_count`` (dataset/cache_io.py:133-155,
    :380-397) plus ``source_path`` relative to the cache folder, ``source_path_format``, ``source_size``,
    ``source_mtime_ns``, ``target_fps``, ``duration_seconds`` (cache_io.py:50-88); the encoder's normalised mean
    (ltx_2/model/video_vae/video_vae.py:314-316) in bfloat16 (ltx2_cache_latents.py:153, :1617)."""
    tmp, folder = data
    ltx2 = cache_data.ltx2_vae_file(tmp)
    out, ours = tmp / "ltx2_fork", tmp / "ltx2_fork_ours"
    _cache(out, ltx2, [folder / "a.mp4", folder / "d.png"], format="musubi", arch="ltx2", resolution="64x64",
           frames=(9,))
    _cache(ours, ltx2, [folder / "a.mp4"], resolution="64x64", frames=(9,), bucket_step=32)
    from safetensors import safe_open
    names = sorted(p.name for p in out.iterdir() if p.suffix == ".safetensors")
    assert names == ["a_00000-009_0096x0064_ltx2.safetensors", "d_0100x0060_ltx2.safetensors"]
    for name, src in zip(names, ("a.mp4", "d.png")):
        st = os.stat(folder / src)
        with safe_open(str(out / name), "pt") as f:
            meta, keys = f.metadata(), list(f.keys())
            z = f.get_tensor(keys[0])
        frames = 2 if src == "a.mp4" else 1                   # 9 frames -> 1 + 8/8 latent frames; an image: one
        assert keys == [f"latents_{frames}x2x2_bfloat16"] and z.dtype == torch.bfloat16 and z.shape == (128, frames, 2, 2)
        expect = {"architecture": "ltx2_v1", "width": str(_size(folder / src)[0]), "height": str(_size(folder / src)[1]),
                  "format_version": "1.0.1", "source_path": f"../data/{src}", "source_path_format": "relative_to_cache",
                  "source_size": str(st.st_size), "source_mtime_ns": str(st.st_mtime_ns)}
        if src == "a.mp4":
            expect.update(frame_count="9", target_fps="24.0", duration_seconds=str(9 / 24.0))
        assert meta == expect
    from safetensors.torch import load_file
    mean = load_file(str(ours / "a_00000-009.safetensors"))["mean"]       # normalised, as the fork's encoder gives it
    with safe_open(str(out / names[0]), "pt") as f:
        z = f.get_tensor(list(f.keys())[0]).float()
    assert (z - mean).abs().max() <= 1e-2 * max(1.0, float(mean.abs().max()))


def _size(path: Path) -> tuple[int, int]:
    """W, H of an image or video."""
    from vae.cache import media
    return media.probe(path, 1).size


def test_an_ltx_vae_gets_the_ltx2_architecture_only_when_named(data):
    """LTX-Video 0.9 and LTX-2 files share the encoder's shapes: musubi's ltx2 is never guessed."""
    from vae.cache import formats
    from vae.loading import load
    tmp, _ = data
    vae = load(str(cache_data.ltx2_vae_file(tmp)))
    assert formats.default_arch(vae) is None
    formats.make("musubi", "ltx2").check(vae)                 # named, it is accepted


def test_ltx2_forks_own_loader_batches_our_files(data):
    tmp, folder = data
    out = tmp / "ltx2_fork_loader"
    _cache(out, cache_data.ltx2_vae_file(tmp), [folder / "a.mp4"], format="musubi", arch="ltx2", resolution="64x64",
           frames=(9,), fps=25.0)
    from safetensors.torch import save_file
    save_file({"text_bfloat16": torch.zeros(3, 8, dtype=torch.bfloat16)}, str(out / "a_ltx2_te.safetensors"))
    src = Path(os.environ.get("MUSUBI_LTX2_DIR", ".")) / "src"
    got = cache_data.trainer_loader("MUSUBI_LTX2_DIR", f"""
import json, sys
sys.path.insert(0, {str(src)!r})
from musubi_tuner.dataset.image_video_dataset import VideoDataset
ds = VideoDataset((64, 64), None, 1, 1, True, False, video_directory={str(folder)!r}, cache_directory={str(out)!r},
                  target_frames=[9], architecture="ltx2")
ds.prepare_for_training()
latents = ds.batch_manager[0]["latents"]           # the fork batches a dict: latents and their frame facts
print(json.dumps({{"latents": list(latents["latents"].shape), "dtype": str(latents["latents"].dtype),
                  "num_frames": latents["num_frames"].tolist()}}))
""", tmp)
    assert got == {"latents": [1, 128, 2, 2, 2], "dtype": "torch.bfloat16", "num_frames": [2]}
