"""``--format simpletuner``: SimpleTuner's VAE cache, checked against facts recorded from its code
(bghira/SimpleTuner bc8e6ab7, cited by line in vae/cache/simpletuner.py: helpers/caching/vae.py
generate_vae_cache_filename, encode_images, process_video_latents, models/foundation_mixins.py
scale_vae_latents_for_cache, models/qwen_image/model.py, models/wan/__init__.py, models/ltxvideo/__init__.py,
models/ltxvideo2/__init__.py and model.py, models/sd3/model.py, models/hunyuanvideo/autoencoder.py,
multiaspect/image.py calculate_new_size_by_pixel_edge, image_manipulation/training_sample.py,
metadata/backends/discovery.py and base.py, data_backend/factory.py), the latents against diffusers' models on
the same weights, and, where SIMPLETUNER_DIR names a checkout of it (SIMPLETUNER_PYTHON: the Python to run it
with), its own TrainingSample, cache-name function, loader and HunyuanVideo 1.5 VAE class."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import cache_data
from helpers import diffusers_kl

pytest.importorskip("av")

from vae.cache import media  # noqa: E402
from vae.cache.clips import ClipPlan  # noqa: E402
from vae.cache.formats import WAN21_MEAN, WAN21_STD  # noqa: E402
from vae.cache.runner import CacheOptions, run  # noqa: E402
from vae.cache.simpletuner import SimpleTuner, pixel_edge  # noqa: E402
from vae.errors import InputError  # noqa: E402


def _sha(stem: str) -> str:
    return hashlib.sha256(stem.encode()).hexdigest() + ".pt"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("simpletuner")
    folder = cache_data.make_dataset(tmp / "data", videos=(("a.mp4", 5, (64, 48)),), images=(("d.png", (100, 60)),))
    cache_data.make_dataset(folder / "sub", videos=(), images=(("e.png", (50, 80)),))
    return tmp, folder


def _kl_file(tmp: Path, channels: int) -> tuple[Path, torch.nn.Module]:
    ref = diffusers_kl(latent_channels=channels)
    path = tmp / f"kl{channels}.safetensors"
    if not path.exists():
        save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return path, ref


def _run(out, vae_path, inputs, **kw):
    said = []
    kw = {"format": "simpletuner", "resolution": "64", "crop_style": "center", **kw}
    res = run(CacheOptions(vae=str(vae_path), inputs=[str(i) for i in inputs], output=str(out), **kw), say=said.append)
    return res, said


def test_pixel_sizes_follow_its_pixel_edge_rule():
    # worked by hand from calculate_new_size_by_pixel_edge and calculate_target_size: (target, intermediary, aspect)
    assert pixel_edge((100, 60), 64, 16) == ((112, 64), (112, 67), 1.75)     # width 106 -> 112; covers by height
    assert pixel_edge((50, 80), 64, 16) == ((64, 96), (64, 102), 0.67)       # aspect 0.625 rounds (half even) to 0.62
    assert pixel_edge((640, 480), 1024, 64) == ((1344, 1024), (1365, 1024), 1.31)
    assert pixel_edge((101, 100), 64, 16) == ((64, 64), (64, 64), 1.0)       # aspect 1.0: the resolution square
    assert pixel_edge((100, 60), 64, 32) == ((96, 64), (106, 64), 1.5)


# per model_family: (stored shape for d.png, dtype, our latent -> stored), from its code as cited above
def _kl(scale, shift=0.0):
    return lambda z: (z - shift) * scale


def _wan(z):
    shape = (-1,) + (1,) * (z.dim() - 1)
    return (z - torch.tensor(WAN21_MEAN).view(shape)) / torch.tensor(WAN21_STD).view(shape)


FACTS = {
    "sdxl": ((4, 32, 64), torch.bfloat16, _kl(0.13025)),             # sample * scaling_factor
    "flux": ((16, 32, 64), torch.bfloat16, _kl(0.3611, 0.1159)),     # (sample - shift_factor) * scaling_factor
    "sd3": ((16, 32, 64), torch.bfloat16, _kl(1.5305, 0.0609)),      # the same rule with SD3's VAE config
    "qwen_image": ((16, 8, 12), torch.bfloat16, _wan),               # normalised sample, frame axis dropped
    "wan": ((16, 1, 8, 12), torch.bfloat16, _wan),                   # mode of the normalised posterior
    # normalised with the VAE's own statistics (the reference computes them), float32
    "ltxvideo": ((128, 1, 2, 4), torch.float32, lambda z: z),
    "ltxvideo2": ((128, 1, 2, 4), torch.float32, lambda z: z),
}
# its LTX families' VAE classes (ltxvideo/model.py AutoencoderKLLTXVideo, ltxvideo2/model.py:136
# AutoencoderKLLTX2Video): the tiny rows of tests/video_families.py at their 128 latent channels
LTX_ROWS = {"ltxvideo": "ltx", "ltxvideo2": "ltx2"}


def _ltx_reference(tmp: Path, row: str):
    """diffusers' tiny LTX VAE of ``row`` with 128 latent channels and per-channel statistics off the identity
    (so a missing or inverted normalisation shows), and the same weights as a safetensors file."""
    from video_families import tiny_reference
    tiny = tiny_reference(row)
    torch.manual_seed(0)
    ref = type(tiny).from_config({**tiny.config, "latent_channels": 128}).eval()
    g = torch.Generator().manual_seed(3)
    ref.latents_mean.copy_(0.3 * torch.randn(128, generator=g))
    ref.latents_std.copy_(0.5 + torch.rand(128, generator=g))
    path = tmp / f"{row}_128_stats.safetensors"
    if not path.exists():
        save_file({k: v.float().contiguous() for k, v in ref.state_dict().items()}, str(path))
    return path, ref


def _reference(family: str, tmp: Path):
    """(our VAE file, the diffusers posterior mean of clips [1, 3, F, H, W] in 0..1 as a function)."""
    if family in ("sdxl", "flux", "sd3"):
        path, ref = _kl_file(tmp, 4 if family == "sdxl" else 16)
        return path, lambda x: ref.encode(x[:, :, 0] * 2 - 1).latent_dist.mean[0]
    if family in ("wan", "qwen_image"):
        return cache_data.vae_file(tmp, "wan"), lambda x: cache_data.diffusers_wan_posterior(x)[0][0]
    path, ref = _ltx_reference(tmp, LTX_ROWS[family])

    def mean(x):                # its LTX models hand the VAE the pixels in 0..1 (a bare ToTensor)
        z = ref.encode(x).latent_dist.mean[0]
        return (z - ref.latents_mean.view(-1, 1, 1, 1)) / ref.latents_std.view(-1, 1, 1, 1)
    return path, mean


@pytest.mark.parametrize("family", sorted(FACTS))
def test_files_are_named_and_hold_what_its_cache_stores(data, family):
    tmp, folder = data
    shape, dtype, stored_from = FACTS[family]
    vae_path, reference = _reference(family, tmp)
    out = tmp / f"out_{family}"
    res, said = _run(out, vae_path, [folder], model_family=family)
    # the video: an image model does not train on it; a video model needs its num_frames (--frames)
    video = family in ("wan", "ltxvideo", "ltxvideo2")
    assert (res.written, res.failed) == (2, 1), said
    assert any("a.mp4" in s and ("--frames" if video else "trains on images") in s for s in said), said
    # {cache_dir}/{folders below instance_data_dir}/{sha256(stem)}.pt
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.pt")) == sorted([_sha("d"), f"sub/{_sha('e')}"])
    z = torch.load(str(out / _sha("d")), map_location="cpu", weights_only=True)
    assert type(z) is torch.Tensor and z.dtype == dtype and tuple(z.shape) == shape
    fmt = SimpleTuner(family, resolution="64", crop_style="center")
    place = fmt.place((100, 60), 1)
    x, _ = media.read_image(folder / "d.png", place.bucket, place.crop)
    with torch.no_grad():
        expected = stored_from(reference(x.unsqueeze(0)).float()).reshape(shape)
    # two steps of the stored dtype's rounding (bfloat16: 2 ** -8 relative), on the largest value
    tol = (8e-3 if dtype == torch.bfloat16 else 1e-4) * float(expected.abs().max()) + 1e-5
    assert (z.float() - expected).abs().max() <= tol


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("simpletuner_videos")
    return tmp, cache_data.make_dataset(tmp / "data", videos=(("v.mp4", 11, (64, 48)), ("s.mp4", 5, (48, 64))),
                                        images=())


# the 64 x 48 video's 96 x 64 bucket: Wan's trim keeps it (12 x 8 latents of the tiny VAE's 8 px), LTX's trims it
# to 64 x 64 (96 / 32 is odd); 9 frames are 3 latent frames at Wan's ratio 4, 2 at LTX's 8
@pytest.mark.parametrize("family, latent", [("wan", (3, 8, 12)), ("ltxvideo", (2, 2, 2)),
                                            ("ltxvideo2", (2, 2, 2))])
def test_a_video_is_its_first_num_frames_on_its_frame_rule(videos, family, latent):
    # num_frames 12 -> 9 (adjust_video_frames: down to 1 + 8k, also for Wan whose VAE takes 1 + 4k); the
    # 11-frame video is cut to its first 9, the 5-frame one is below min_frames (= num_frames) and dropped
    tmp, folder = videos
    shape, dtype, stored_from = FACTS[family]
    vae_path, reference = _reference(family, tmp)
    out = tmp / f"out_{family}"
    res, said = _run(out, vae_path, [folder], model_family=family, frames=(12,), id="ds")
    assert (res.written, res.failed) == (1, 1), said
    assert any("s.mp4" in s and "min_frames" in s for s in said)
    z = torch.load(str(out / _sha("v")), map_location="cpu", weights_only=True)
    assert type(z) is torch.Tensor and z.dtype == dtype and tuple(z.shape) == (shape[0],) + latent
    fmt = SimpleTuner(family, resolution="64", crop_style="center", frames=(12,))
    place = fmt.place((64, 48), 1, 11)
    assert place.clips == [ClipPlan(0, 9, tuple(range(9)))] and place.metadata["num_frames"] == 9
    (_, x), = media.read_clips(folder / "v.mp4", place.clips, place.crop)
    with torch.no_grad():
        expected = stored_from(reference(x.unsqueeze(0)).float())
    tol = (8e-3 if dtype == torch.bfloat16 else 1e-4) * float(expected.abs().max()) + 1e-5
    assert (z.float() - expected).abs().max() <= tol
    meta = json.loads((out / "aspect_ratio_bucket_metadata_ds.json").read_text())
    assert meta[str(folder / "v.mp4")]["num_frames"] == 9


@pytest.fixture(scope="module")
def lengths(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("simpletuner_lengths")
    return tmp, cache_data.make_dataset(tmp / "data", videos=(("v.mp4", 11, (64, 48)), ("l.mp4", 17, (64, 48))),
                                        images=())


# num_frames 9 throughout; each video's count on Wan's frame rule (adjust_video_frames, 1 + 8k): v 11 -> 9, l 17
@pytest.mark.parametrize("kw, kept, dropped, word", [
    ({}, ["l", "v"], [], None),                                     # min_frames = num_frames
    ({"video_min_frames": 12}, ["l", "v"], [], None),               # min_frames fitted as num_frames: 12 -> 9
    ({"video_min_frames": 17}, ["l"], ["v.mp4"], "fewer than min_frames 17"),
    ({"video_max_frames": 10}, ["v"], ["l.mp4"], "more than max_frames 10"),    # v's 11 frames count as 9
])
def test_min_and_max_frames_drop_videos_by_their_count_on_its_frame_rule(lengths, kw, kept, dropped, word):
    tmp, folder = lengths
    out = tmp / f"out_{'_'.join(f'{k}{v}' for k, v in kw.items())}"
    res, said = _run(out, cache_data.vae_file(tmp, "wan"), [folder], model_family="wan", frames=(9,), **kw)
    assert sorted(p.name for p in out.rglob("*.pt")) == sorted(_sha(k) for k in kept), said
    assert res.failed == len(dropped)
    for name in dropped:
        assert any(name in s and word in s for s in said), said
    for k in kept:          # the first num_frames, whatever min_frames is: 3 latent frames at Wan's ratio 4
        assert torch.load(str(out / _sha(k)), weights_only=True).shape[1] == 3


@pytest.mark.parametrize("interval, key", [(None, "96x64@9"), (4, "96x64@8"), (16, "96x64@9")])
def test_resolution_frames_keys_a_video_by_its_size_and_frames(lengths, interval, key):
    # discovery.py / _compute_video_bucket: WxH of the target, the video's count on the frame rule rounded down to
    # frame_interval (16 leaves none: the count itself); the 64 x 48 videos' target at 64 px, alignment 32: 96 x 64
    tmp, folder = lengths
    out = tmp / f"rf_{interval}"
    res, said = _run(out, cache_data.vae_file(tmp, "wan"), [folder / "v.mp4"], model_family="wan", frames=(9,),
                     id="ds", bucket_strategy="resolution_frames", frame_interval=interval)
    assert res.written == 1, said
    indices = json.loads((out / "aspect_ratio_bucket_indices_ds.json").read_text())["aspect_ratio_bucket_indices"]
    assert indices == {key: [str(folder / "v.mp4")]}
    meta = json.loads((out / "aspect_ratio_bucket_metadata_ds.json").read_text())[str(folder / "v.mp4")]
    assert meta["bucket_frames"] == int(key.split("@")[1]) and meta["num_frames"] == 9


@pytest.mark.parametrize("kw, word", [
    ({"video_min_frames": 5}, "greater than or equal"),
    ({"frame_interval": 4}, "only with"),
    ({"bucket_strategy": "duration"}, "bucket_strategy"),
    ({"frames": (9, 17)}, "one clip per video"),
    ({"fps": 8.0}, "does not resample"),
    ({"extraction": "chunk"}, "first num_frames"),
    ({"model_family": "flux"}, "trains on images"),
])
def test_video_options_it_has_no_rule_for_are_refused(videos, kw, word):
    tmp, folder = videos
    kw = {"model_family": "wan", "frames": (9,), **kw}
    if kw["model_family"] == "flux":        # not an option error: its image models skip the videos
        res, said = _run(tmp / "refused_flux", _kl_file(tmp, 16)[0], [folder / "v.mp4"], **kw)
        assert res.failed == 1 and any(word in s for s in said)
        return
    with pytest.raises(InputError, match=word):
        _run(tmp / "refused", cache_data.vae_file(tmp, "wan"), [folder / "v.mp4"], **kw)


def test_metadata_files_hold_its_bucket_indices_and_sizes(data):
    tmp, folder = data
    out = tmp / "meta"
    res, said = _run(out, _kl_file(tmp, 16)[0], [folder], model_family="flux", aspect_bucket_alignment=16, id="mine",
                     instance_data_dir="datasets/photos")
    assert res.written == 2, said
    indices = json.loads((out / "aspect_ratio_bucket_indices_mine.json").read_text())
    assert indices == {"config": {"resolution": 64, "resolution_type": "pixel", "crop": False, "crop_style": "center"},
                       "aspect_ratio_bucket_indices": {"1.75": ["datasets/photos/d.png"],
                                                       "0.67": [os.path.join("datasets/photos", "sub", "e.png")]}}
    meta = json.loads((out / "aspect_ratio_bucket_metadata_mine.json").read_text())
    assert meta["datasets/photos/d.png"] == {"original_size": [100, 60], "crop_coordinates": [1, 0],
                                             "target_size": [112, 64], "intermediary_size": [112, 67],
                                             "aspect_ratio": 1.75}
    assert meta[os.path.join("datasets/photos", "sub", "e.png")]["crop_coordinates"] == [3, 0]     # (top, left)
    z = torch.load(str(out / _sha("d")), weights_only=True)
    assert tuple(z.shape) == (16, 32, 56)           # the 112 x 64 bucket, / 2 (the tiny VAE's ratio)


@pytest.mark.parametrize("kw, word", [
    ({"model_family": None}, "model_family"),
    ({"model_family": "hidream"}, "model_family"),
    ({"model_family": "hunyuanvideo"}, "one frame more"),
    ({"model_family": "flux", "resolution_type": "area"}, "file order"),
    ({"model_family": "flux", "resolution_type": "pixel_area"}, "file order"),
    ({"model_family": "flux", "crop": True}, "unseeded"),
    ({"model_family": "flux", "crop_style": "random"}, "unseeded"),
    ({"model_family": "flux", "crop_style": None}, "unseeded"),
    ({"model_family": "flux", "resolution": "64x64"}, "one number"),
    ({"model_family": "sdxl"}, "4 channels"),                  # a 16-channel VAE named as SDXL's
    ({"model_family": "flux", "id": "../x"}, "dataset id"),
])
def test_what_it_cannot_make_exactly_is_refused(data, kw, word):
    tmp, folder = data
    with pytest.raises(InputError, match=word):
        _run(tmp / "refused", _kl_file(tmp, 16)[0], [folder / "d.png"], **kw)


def test_a_rerun_redoes_only_what_changed_and_keeps_foreign_files(data, tmp_path):
    tmp, folder = data
    vae_path = _kl_file(tmp, 16)[0]
    out = tmp_path / "out"
    out.mkdir()
    (out / "aspect_ratio_bucket_metadata_ds.json").write_text("mine")
    res, said = _run(out, vae_path, [folder], model_family="flux", id="ds")
    assert res.written == 2 and any("not written: aspect_ratio_bucket_metadata_ds.json" in s for s in said)
    assert (out / "aspect_ratio_bucket_metadata_ds.json").read_text() == "mine"
    assert json.loads((out / "aspect_ratio_bucket_indices_ds.json").read_text())["config"]["crop_style"] == "center"
    res, said = _run(out, vae_path, [folder], model_family="flux", id="ds")
    assert (res.written, res.skipped) == (0, 2), said
    res, said = _run(out, vae_path, [folder], model_family="flux", id="ds", crop_style="corner")
    assert res.written == 2, said         # the cut moved: both written again, and the JSON with them
    assert json.loads((out / "aspect_ratio_bucket_indices_ds.json").read_text())["config"]["crop_style"] == "corner"


def test_two_sources_of_one_stem_are_one_file_and_fail(tmp_path):
    from PIL import Image
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("x.png", "x.jpg"):
        Image.new("RGB", (64, 64), (10, 20, 30)).save(folder / name)
    res, said = _run(tmp_path / "out", _kl_file(tmp_path, 16)[0], [folder], model_family="flux")
    assert (res.written, res.failed) == (1, 1) and any("also another source's" in s for s in said)


def test_simpletuners_own_code_sizes_names_and_reads_our_files(data):
    tmp, folder = data
    out = tmp / "own"
    res, said = _run(out, _kl_file(tmp, 16)[0], [folder], model_family="flux", aspect_bucket_alignment=16, id="ds")
    assert res.written == 2, said
    fmt = SimpleTuner("flux", resolution="64", crop_style="center", alignment=16)
    ours = {}
    for rel in ("d.png", "sub/e.png"):
        from PIL import Image
        with Image.open(folder / rel) as im:
            place = fmt.place(im.size, 1)
        x, _ = media.read_image(folder / rel, place.bucket, place.crop)
        ours[rel] = (place.metadata, (x[:, 0] * 255).round().to(torch.uint8).permute(1, 2, 0).tolist())
    (tmp / "ours.json").write_text(json.dumps(ours))
    st = os.environ.get("SIMPLETUNER_DIR", ".")
    got = cache_data.trainer_loader("SIMPLETUNER_DIR", f"""
import importlib.machinery, importlib.util, json, sys, types
from types import SimpleNamespace
import numpy as np, torch
from PIL import Image
sys.path.insert(0, {st!r})
from simpletuner.helpers.training.state_tracker import StateTracker
from simpletuner.helpers.data_backend.local import LocalDataBackend
if importlib.util.find_spec("torchvision") is None:
    # a stand-in: the size, resize and crop code never calls torchvision (only a model's transforms do)
    tv = types.ModuleType("torchvision"); tv.transforms = types.ModuleType("torchvision.transforms")
    tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    sys.modules["torchvision"] = tv; sys.modules["torchvision.transforms"] = tv.transforms
from simpletuner.helpers.image_manipulation.training_sample import TrainingSample
from simpletuner.helpers.caching.vae import VAECache
StateTracker.set_args(SimpleNamespace(aspect_bucket_alignment=16, aspect_bucket_rounding=2))
StateTracker.set_data_backend_config("ds", {{"resolution": 64, "resolution_type": "pixel", "crop": False,
                                            "crop_style": "center"}})
ours = json.load(open({str(tmp / 'ours.json')!r}))
cache = SimpleNamespace(image_data_backend=None, hash_filenames=True, cache_dir={str(out)!r},
                        instance_data_dir={str(folder)!r})
backend = LocalDataBackend(accelerator=None, id="ds")
result = {{}}
for rel, (meta, pixels) in ours.items():
    path = {str(folder)!r} + "/" + rel
    im = Image.open(path)
    p = TrainingSample(image=im, data_backend_id="ds", image_metadata={{"original_size": im.size}}, image_path=path,
                       model=None).prepare()
    theirs = np.asarray(p.image).astype(int)
    name = VAECache.generate_vae_cache_filename(cache, path)[0]
    z = backend.torch_load(name)
    result[rel] = {{"sizes": [list(p.target_size), list(p.intermediary_size), list(p.crop_coordinates), p.aspect_ratio],
                   "ours": [meta["target_size"], meta["intermediary_size"], meta["crop_coordinates"],
                            meta["aspect_ratio"]],
                   "pixels": int(np.abs(theirs - np.array(pixels)).max()), "tensor": [str(z.dtype), list(z.shape)]}}
print(json.dumps(result))
""", tmp)
    for rel, r in got.items():
        assert r["sizes"] == r["ours"], rel
        assert r["pixels"] <= 1, rel          # its 8-bit OpenCV bilinear against ours, rounded: one level at most
        assert r["tensor"][0] == "torch.bfloat16" and len(r["tensor"][1]) == 3, rel


def test_its_hunyuanvideo_vae_adds_the_frame_we_refuse_to_guess(tmp_path):
    """The premise of refusing ``hunyuanvideo``: SimpleTuner's own HunyuanVideo 1.5 VAE class, on diffusers' tiny
    weights, gives diffusers' latent frames plus one (from its padded copy of the last frame). If a SimpleTuner
    version stops adding it, this fails and the family can be written."""
    from safetensors.torch import save_file as save
    from video_families import tiny_reference
    from vae.archs import hunyuan_video15_layout
    ref = tiny_reference("hunyuan_video15")
    canonical = hunyuan_video15_layout.to_canonical(ref.state_dict())
    save({k: v.contiguous() for k, v in canonical.items() if k.startswith("encoder.")}, str(tmp_path / "enc.safetensors"))
    torch.manual_seed(1)
    clips = {f: torch.rand(1, 3, f, 32, 48) * 2 - 1 for f in (1, 5)}
    torch.save(clips, str(tmp_path / "clips.pt"))
    cfg = ref.config
    st = os.environ.get("SIMPLETUNER_DIR", ".")
    cache_data.trainer_loader("SIMPLETUNER_DIR", f"""
import json, sys, torch
from safetensors.torch import load_file
sys.path.insert(0, {st!r})
from simpletuner.helpers.models.hunyuanvideo.autoencoder import AutoencoderKLConv3D
m = AutoencoderKLConv3D(in_channels=3, out_channels=3, latent_channels={cfg['latent_channels']},
    block_out_channels={tuple(cfg['block_out_channels'])}, layers_per_block={cfg['layers_per_block']},
    ffactor_spatial={cfg['spatial_compression_ratio']}, ffactor_temporal={cfg['temporal_compression_ratio']},
    sample_size=256, sample_tsize=64).eval()
ours = load_file("enc.safetensors")
# its names are Tencent's: ours with the causal convs' ".conv." wrapper where it has one
sd = {{k: ours.get("encoder." + k, ours.get("encoder." + k.replace(".conv.weight", ".weight").replace(".conv.bias", ".bias")))
      for k in m.encoder.state_dict()}}
m.encoder.load_state_dict(sd, strict=True)
with torch.no_grad():
    torch.save({{f: m.encode(x).latent_dist.mean for f, x in torch.load("clips.pt").items()}}, "theirs.pt")
print(json.dumps({{}}))
""", tmp_path)
    theirs = torch.load(str(tmp_path / "theirs.pt"), weights_only=True)
    for f, x in clips.items():
        with torch.no_grad():
            ours = ref.encode(x).latent_dist.mean
        assert theirs[f].shape[2] == ours.shape[2] + 1, f
        assert (theirs[f][:, :, :-1] - ours).abs().max() <= 1e-4 * ours.abs().max()


def test_simpletuners_own_ltx2_vae_and_loader_agree_with_our_ltxvideo2_file(videos):
    """Its own copy of AutoencoderKLLTX2Video (the encoder, on our tiny weights) and normalize_ltx2_latents on the
    clip we encoded, against our file read with its loader (the name is checked against its own function above)."""
    tmp, folder = videos
    vae_path, ref = _ltx_reference(tmp, "ltx2")
    out = tmp / "own_ltx2"
    res, said = _run(out, vae_path, [folder / "v.mp4"], model_family="ltxvideo2", frames=(12,))
    assert res.written == 1, said
    fmt = SimpleTuner("ltxvideo2", resolution="64", crop_style="center", frames=(12,))
    place = fmt.place((64, 48), 1, 11)
    (_, x), = media.read_clips(folder / "v.mp4", place.clips, place.crop)
    save_file({k: v.float().contiguous() for k, v in ref.state_dict().items() if not k.startswith("decoder.")},
              str(tmp / "ltx2_encoder.safetensors"))
    torch.save(x.unsqueeze(0), str(tmp / "ltx2_clip.pt"))
    (tmp / "ltx2_config.json").write_text(json.dumps({k: v for k, v in ref.config.items() if not k.startswith("_")}))
    st = os.environ.get("SIMPLETUNER_DIR", ".")
    got = cache_data.trainer_loader("SIMPLETUNER_DIR", f"""
import inspect, json, sys, torch
from safetensors.torch import load_file
sys.path.insert(0, {st!r})
from simpletuner.helpers.models.ltxvideo2 import normalize_ltx2_latents
from simpletuner.helpers.models.ltxvideo2.autoencoder import AutoencoderKLLTX2Video
from simpletuner.helpers.data_backend.local import LocalDataBackend
cfg = json.load(open("ltx2_config.json"))
params = inspect.signature(AutoencoderKLLTX2Video.__init__).parameters
vae = AutoencoderKLLTX2Video(**{{k: v for k, v in cfg.items() if k in params}}).eval()
weights = load_file("ltx2_encoder.safetensors")
missing = [k for k in vae.load_state_dict(weights, strict=False).missing_keys if not k.startswith("decoder.")]
assert not missing, missing
with torch.no_grad():        # its cache samples the posterior; the mean is the sample without its noise
    z = vae.encode(torch.load("ltx2_clip.pt")).latent_dist.mean
    theirs = normalize_ltx2_latents(z, vae.latents_mean, vae.latents_std, scaling_factor=vae.config.scaling_factor)[0]
ours = LocalDataBackend(accelerator=None, id="ds").torch_load({str(out / _sha('v'))!r})
print(json.dumps({{"dtype": str(ours.dtype), "shape": list(ours.shape), "theirs": list(theirs.shape),
                  "diff": float((ours.float() - theirs).abs().max()), "scale": float(theirs.abs().max())}}))
""", tmp)
    assert got["dtype"] == "torch.float32" and got["shape"] == got["theirs"] == [128, 2, 2, 2], got
    assert got["diff"] <= 1e-4 * got["scale"] + 1e-5, got
