"""Every workflow in workflows/ validates against the node definitions (names, types, ranges,
links), its UI and API files are the same graph, and the API graphs run headless."""
from __future__ import annotations

import functools
import json
import math
import shutil

import pytest
import torch

from helpers import ROOT
from video_families import FAMILIES, RATIOS, tiny_state_dict

WORKFLOWS = ROOT / "workflows"
API = sorted(WORKFLOWS.glob("*_api.json"))
DEMO = ROOT / "vae" / "demo"
# the video workflows' VAE files and latents: tiny random-weight models under the names the graphs use
VIDEO = {json.loads(p.read_text())["1"]["inputs"]["vae_name"]: p.stem.split("_decode_")[1][: -len("_api")]
         for p in API if p.name.startswith("video_")}
VIDEO_LATENT = {"mochi": (12, 10, 4, 4), "ltx": (16, 10, 2, 2), "ltx2": (16, 14, 2, 2), "hunyuan_video": (16, 10, 4, 4),
                "magvit": (16, 10, 4, 4), "wan": (16, 10, 4, 4), "hunyuan_video15": (32, 10, 3, 3),
                "ltx_diffusion": (16, 10, 2, 2),
                "seedvr2": (16, 10, 4, 4),
                "minimax": (24, 12, 3, 3),
                # odd: an even count's first 4 frames are one frame repeated (no lone first frame), which an
                # animated WebP stores once
                "cogvideox": (16, 9, 4, 4),
                "taehv": (16, 10, 4, 4), "taeh3": (24, 12, 3, 3), "svd": (4, 16, 4, 4)}
# families whose LATENT holds one clip's frames in the batch, [T, C, h, w] (as core's SVD nodes make it)
FRAMES_IN_BATCH = ("svd",)
# image graphs whose VAE is a video family's (Qwen-Image runs on a Wan 2.1-architecture VAE)
IMAGE_WITH_VIDEO_VAE = {"qwen_image_vae.safetensors": "wan"}
FLUX2 = "flux2-vae.safetensors"        # a random-weight Flux.2 VAE at the published ratio (8, 16 packed), narrow
QWEN21 = "qwen_image_2.1_vae_bf16.safetensors"   # the templates' file: ComfyUI's layout, bf16; narrow, random


MAGE = "mage_flow_vae_bf16.safetensors"   # a random-weight Mage-VAE at the published ratio (16), narrow, bf16
# the names Comfy-Org's HunyuanImage files go by (2.1: its templates' file); ComfyUI's layout, fp16; narrow, random
HUNYUAN_IMAGE = {"hunyuan_image_2.1_vae_fp16.safetensors": "2.1", "hunyuan_image_3_vae_fp16.safetensors": "3.0"}


@pytest.fixture
def comfy_dirs(tmp_path, monkeypatch):
    """models/, input/, output/ as a ComfyUI install would have them for these workflows."""
    (tmp_path / "models" / "vae").mkdir(parents=True)
    shutil.copy(DEMO / "vaekit_demo.safetensors", tmp_path / "models" / "vae")
    (tmp_path / "input").mkdir()
    shutil.copy(DEMO / "vaekit_sample.png", tmp_path / "input" / "vaekit_sample.png")
    monkeypatch.setenv("VAEKIT_MODEL_DIRS", str(tmp_path / "models"))
    return tmp_path


@pytest.fixture
def video_dirs(comfy_dirs):
    from safetensors.torch import save_file

    from vaekit.vae.files.latents import write_latent_file
    g = torch.Generator().manual_seed(0)
    for name, family in {**VIDEO, **IMAGE_WITH_VIDEO_VAE}.items():
        save_file(tiny_state_dict(family), str(comfy_dirs / "models" / "vae" / name))
        if name in VIDEO:
            z = torch.randn(1, *VIDEO_LATENT[family], generator=g)
            write_latent_file(comfy_dirs / "input" / f"{family}_sample.latent",
                              z[0].movedim(1, 0) if family in FRAMES_IN_BATCH else z)
    save_file(_flux2_weights(), str(comfy_dirs / "models" / "vae" / FLUX2))
    save_file(_qwen21_weights(), str(comfy_dirs / "models" / "vae" / QWEN21))


    save_file(_mage_weights(), str(comfy_dirs / "models" / "vae" / MAGE))
    for name, version in HUNYUAN_IMAGE.items():
        save_file(_hunyuan_image_weights(version), str(comfy_dirs / "models" / "vae" / name))
    return comfy_dirs


@functools.lru_cache(maxsize=1)
def _flux2_weights() -> dict:
    import diffusers_flux2
    return {k: v.contiguous() for k, v in diffusers_flux2.model(widths=(32,) * 4, latent=32).state_dict().items()}


@functools.lru_cache(maxsize=1)
def _qwen21_weights() -> dict:
    from helpers import diffusers_qwen21
    from vaekit.vae.archs import wan, wan_layout
    original = wan_layout.to_original(wan.SPEC.to_canonical(diffusers_qwen21().state_dict()), nested=True)
    return {k: v.to(torch.bfloat16).contiguous() for k, v in original.items()}


@functools.lru_cache(maxsize=1)
def _mage_weights() -> dict:
    import mage_tiny
    sd = mage_tiny.file_layout(mage_tiny.canonical(patch=16), anchor=True)      # ComfyUI's file layout
    return {k: v.to(torch.bfloat16) for k, v in sd.items()}


@functools.lru_cache(maxsize=2)
def _hunyuan_image_weights(version: str) -> dict:
    from helpers import diffusers_hunyuan_image21, hunyuan_image3_file
    from vaekit.vae.archs import hunyuan_image_layout
    if version == "2.1":
        sd = hunyuan_image_layout.to_original(hunyuan_image_layout.to_canonical(diffusers_hunyuan_image21().state_dict()))
    else:
        sd = hunyuan_image3_file()
    return {k: v.to(torch.float16).contiguous() for k, v in sd.items()}


def test_every_api_workflow_has_a_ui_twin():
    assert len(API) >= 4
    names = {p.name for p in WORKFLOWS.glob("*.json")}
    for api in API:
        assert api.name.replace("_api.json", ".json") in names


@pytest.mark.parametrize("api_path", API, ids=lambda p: p.stem)
def test_workflow_validates_and_ui_matches_api(pack, video_dirs, api_path):
    comfy_dirs = video_dirs
    from vaekit.nodes import headless
    from vaekit.nodes.workflow_format import ui_to_api
    headless._Dirs.input = comfy_dirs / "input"
    (comfy_dirs / "input" / "vaekit_sample.latent").write_bytes(b"")   # listed by name only
    api = json.loads(api_path.read_text())
    classes = headless.node_classes()
    assert headless.validate_prompt(api, classes) == []
    ui = json.loads(api_path.with_name(api_path.name.replace("_api.json", ".json")).read_text())
    assert ui["version"] == 0.4
    assert ui_to_api(ui, classes) == api
    # link table consistent with the nodes' input and output slots
    nodes = {n["id"]: n for n in ui["nodes"]}
    for lid, src, slot, dst, dslot, kind in ui["links"]:
        assert nodes[dst]["inputs"][dslot]["link"] == lid
        assert lid in nodes[src]["outputs"][slot]["links"]
        assert nodes[src]["outputs"][slot]["type"] == kind == nodes[dst]["inputs"][dslot]["type"]


@pytest.mark.parametrize("ui_path", [p.with_name(p.name.replace("_api.json", ".json")) for p in API],
                         ids=lambda p: p.stem)
def test_ui_files_store_every_widget_value(pack, ui_path):
    """Every widget's value is in the file (and a seed control's only where the input has one), so the
    graph opens the same in any frontend version instead of taking that version's defaults."""
    from vaekit.nodes import headless
    from vaekit.nodes.workflow_format import UPLOAD_WIDGETS, _has_control, _inputs, _is_widget
    classes = headless.node_classes()
    for node in json.loads(ui_path.read_text())["nodes"]:
        linked = {s["name"] for s in node.get("inputs", []) if s.get("link") is not None}
        widgets = [(n, d) for n, d in _inputs(classes[node["type"]]) if _is_widget(d) and n not in linked]
        expect = len(widgets) + sum(_has_control(n, d) for n, d in widgets) + len(UPLOAD_WIDGETS.get(node["type"], []))
        assert len(node["widgets_values"]) == expect, (node["type"], node["widgets_values"])


def test_decode_widgets_fit_the_frontend(pack):
    """A decode never randomizes its seed (ComfyUI's cache would miss on every queue), and inputs that
    only some VAEs use are 'advanced' (folded away by frontends that know the flag)."""
    from vaekit.nodes import NODE_CLASS_MAPPINGS as nodes
    for name in ("VAEKitTiledDecode", "VAEKitFramewiseDecode"):
        spec = nodes[name].INPUT_TYPES()
        inputs = {**spec["required"], **spec.get("optional", {})}
        assert inputs["seed"][1]["control_after_generate"] is False
        for family_only in ("decode_timestep", "decode_noise_scale", "seed"):
            assert inputs[family_only][1].get("advanced") is True, (name, family_only)
    tiled = {**nodes["VAEKitTiledEncode"].INPUT_TYPES()["required"]}
    assert all(tiled[k][1].get("advanced") for k in ("temporal_size", "temporal_overlap"))
    assert not tiled["tile_size"][1].get("advanced")


def test_validation_catches_bad_workflows(pack, comfy_dirs):
    from vaekit.nodes.headless import validate_prompt
    good = json.loads((WORKFLOWS / "image_tiled_roundtrip_api.json").read_text())
    bad = json.loads(json.dumps(good))
    bad["4"]["inputs"]["tile_size"] = 16                  # below min
    bad["4"]["inputs"]["samples"] = ["2", 0]              # IMAGE into LATENT
    bad["3"]["inputs"].pop("vae")                         # missing input
    bad["1"]["inputs"]["dtype"] = "fp8"                   # not a choice
    errors = "\n".join(validate_prompt(bad))
    for expect in ("tile_size: 16 is below its minimum, 64. Fix: use a value from 64 to 4096",
                   "type mismatch: IMAGE into LATENT", "required input 'vae' missing",
                   "dtype: 'fp8' is not one of its choices. Fix: choose one of 'auto', 'fp32', 'bf16', 'fp16'"):
        assert expect in errors


def _psnr(a, b):
    return 10 * math.log10(1 / float((a - b).square().mean()))


def test_api_workflows_run_headless(pack, comfy_dirs):
    from vaekit.nodes.headless import run_prompt
    from vaekit.vae.files.latents import read_latent_file as lib_latent
    from vaekit.vae.files.imageio import read_image
    load = lambda name: json.loads((WORKFLOWS / name).read_text())
    out = comfy_dirs / "output"
    kw = dict(input_dir=comfy_dirs / "input", output_dir=out)
    ui = run_prompt(load("image_tiled_roundtrip_api.json"), **kw)
    (png,) = ui["5"]["images"]
    original = read_image(comfy_dirs / "input" / "vaekit_sample.png")
    score = _psnr(read_image(png), original)
    print(f"round trip through the demo VAE, tiled 256/32: {score:.2f} dB")
    assert score > 20
    ui = run_prompt(load("image_tiled_encode_api.json"), **kw)
    (latent,) = ui["4"]["latents"]
    shipped = lib_latent(DEMO / "vaekit_sample.latent")       # the demo latent users copy to input/
    assert (lib_latent(latent) - shipped).abs().max() <= 1e-4, "vae/demo/vaekit_sample.latent is stale"
    shutil.copy(latent, comfy_dirs / "input" / "vaekit_sample.latent")
    ui = run_prompt(load("image_tiled_decode_api.json"), **kw)
    assert torch.equal(read_image(ui["4"]["images"][0]), read_image(png))   # same tiles, same result
    ui = run_prompt(load("image_exact_roundtrip_api.json"), **kw)            # exact tiles = untiled
    import vaekit.vae as lib
    v = lib.load(DEMO / "vaekit_demo.safetensors")
    untiled = v.decode(v.encode(original.movedim(-1, 0)[None]))[0].movedim(0, -1)
    assert (read_image(ui["5"]["images"][0]) - untiled).abs().max() <= 1 / 255 + 1e-6   # 8-bit PNG rounding
    ui = run_prompt(load("core_nodes_with_vaekit_vae_api.json"), **kw)       # core nodes, our VAE
    assert _psnr(read_image(ui["5"]["images"][0]), original) > 20
    assert _psnr(read_image(ui["7"]["images"][0]), original) > 20


def test_every_video_family_has_tiled_and_framewise_decode_workflows():
    names = {p.name for p in API}
    for family in FAMILIES:
        assert {f"video_tiled_decode_{family}_api.json", f"video_framewise_decode_{family}_api.json"} <= names


def _expected(v, z, family, dec):
    """The library's own decode with the graph's settings (tiled, or frame-wise), as [1, 3, T, H, W]."""
    s, r = RATIOS[family]
    opts = dict(timestep=dec.get("decode_timestep"), noise_scale=dec.get("decode_noise_scale"), seed=dec.get("seed"))
    if z.dim() == 4:            # [T, C, h, w]: one clip (Tiled Decode); Frame-wise: each chunk its own clip
        n = dec.get("frames_per_chunk") or len(z)
        out = torch.cat([v.decode(z[i:i + n], tile=dec["tile_size"] or None, mode=dec.get("mode", "fast"))
                         for i in range(0, len(z), n)])
        return out.movedim(0, 1)[None]
    if "frames_per_chunk" in dec:
        return v.decode(z, tile=dec["tile_size"] or None, overlap=dec["tile_overlap"],
                        tile_frames=dec["frames_per_chunk"] * r, overlap_frames=dec["overlap"] * r, **opts)
    return v.decode(z, tile=dec["tile_size"], overlap=dec["overlap"], tile_frames=v.temporal_tile(dec["temporal_size"]),
                    overlap_frames=dec["temporal_overlap"], mode=dec.get("mode", "fast"), **opts)


@pytest.mark.parametrize("kind", ["tiled", "framewise"])
@pytest.mark.parametrize("family", FAMILIES)
def test_video_workflows_run_headless_and_match_the_library(pack, video_dirs, family, kind):
    """Load Latent -> VAE Load -> Tiled Decode / Frame-wise Decode (chunked in time here) -> Save
    Animated WEBP at the model's frame rate: the frames of the library's own decode, same settings."""
    from vaekit import vae as lib
    from vaekit.nodes.headless import run_prompt
    from vaekit.vae.files.imageio import read_frames
    api = json.loads((WORKFLOWS / f"video_{kind}_decode_{family}_api.json").read_text())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ui = run_prompt(api, input_dir=video_dirs / "input", output_dir=video_dirs / "output")
        dec = api["3"]["inputs"]
        z = lib.files.latents.read_latent_file(video_dirs / "input" / f"{family}_sample.latent")
        v = lib.load(video_dirs / "models" / "vae" / api["1"]["inputs"]["vae_name"])
        s, r = RATIOS[family]
        chunk = dec.get("frames_per_chunk") or v.temporal_tile(dec["temporal_size"]) // r
        length = z.shape[0] if v.caps.frames_in_batch else z.shape[2]
        if v.caps.own_tiling is not None:       # a family whose chunks are its definition runs its own
            assert len(v.caps.own_tiling.plan("decode", tuple(z.shape)).chunks) > 1
        elif v.caps.frames_in_batch and kind == "tiled":
            assert length <= chunk, "one clip (SVD's exact tiles never cut time)"
        else:
            assert length > chunk, "the sample latent is chunked in time"
        want = _expected(v, z, family, dec)
    finally:
        torch.set_num_threads(threads)
    (webp,) = ui["4"]["images"]                   # Save Animated WEBP: one lossless file, every frame
    frames = read_frames(webp)
    assert len(frames) == want.shape[2] == v.frames_for(z.shape[0] if v.caps.frames_in_batch else z.shape[2])
    for i in (0, len(frames) // 2, len(frames) - 1):
        frame = want[0, :, i].movedim(0, -1)      # [H, W, 3]
        assert (frames[i] - frame).abs().max() <= 1 / 255 + 1e-6      # 8-bit frames


def _image_roundtrip(api_name: str, vae_file: str, dirs, nodes=("5",)):
    """Run an image round-trip graph headless; (the PNG Save Image node 5 saved, or the list of those of
    ``nodes``, the VAE, the library's untiled latent and round trip of the same image)."""
    from vaekit import vae as lib
    from vaekit.nodes.headless import run_prompt
    from vaekit.vae.files.imageio import read_image
    api = json.loads((WORKFLOWS / api_name).read_text())
    assert api["1"]["inputs"]["vae_name"] == vae_file
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ui = run_prompt(api, input_dir=dirs / "input", output_dir=dirs / "output")
        v = lib.load(dirs / "models" / "vae" / vae_file)
        x = read_image(dirs / "input" / "vaekit_sample.png").movedim(-1, 0)[None]
        z = v.encode(x)
        want = v.decode(z)[0].movedim(0, -1)
    finally:
        torch.set_num_threads(threads)
    pngs = [read_image(ui[n]["images"][0]) for n in nodes]
    return (pngs[0] if len(nodes) == 1 else pngs), v, z, want


def test_flux2_workflow_runs_headless_and_matches_the_library(pack, video_dirs):
    """Load Image -> core VAE Encode (a Flux.2 reference latent: 128 channels, packed, normalised) ->
    Tiled Decode (exact, 256 px) -> Save Image: the library's untiled round trip, to PNG rounding."""
    png, v, z, want = _image_roundtrip("image_flux2_roundtrip_api.json", FLUX2, video_dirs)
    assert v.spec.id == "flux2" and z.shape == (1, 128, png.shape[0] // 16, png.shape[1] // 16)
    assert (png - want).abs().max() <= 1 / 255 + 1e-6     # 8-bit PNG rounding


def test_qwen_image_roundtrip_runs_headless(pack, video_dirs):
    """Qwen-Image's VAE (Wan 2.1 architecture): one image is a one-frame clip, its LATENT 5-D
    [1, 16, 1, h, w] as core's Qwen-Image nodes make it; decoded back, as the library does."""
    from vaekit import vae as lib
    from vaekit.nodes.headless import run_prompt
    from vaekit.vae.files.imageio import read_image
    api = json.loads((WORKFLOWS / "image_qwen_roundtrip_api.json").read_text())
    ui = run_prompt(api, input_dir=video_dirs / "input", output_dir=video_dirs / "output")
    v = lib.load(video_dirs / "models" / "vae" / "qwen_image_vae.safetensors")
    image = read_image(video_dirs / "input" / "vaekit_sample.png").movedim(-1, 0)[None, :, None]   # [1, 3, 1, H, W]
    z = v.encode(image)
    assert z.shape[:3] == (1, 16, 1)
    want = v.decode(z)[0, :, 0].movedim(0, -1)
    (png,) = ui["5"]["images"]
    assert (read_image(png) - want).abs().max() <= 1 / 255 + 1e-6


def test_qwen21_roundtrip_runs_headless(pack, video_dirs):
    """Qwen-Image 2.1's VAE (an image VAE, RGBA): Load Image (RGB) -> Tiled Encode -> Tiled Decode, both
    exact at 256 px (2x2 tiles) -> Save Image, and core's VAE Decode of the same 4-D LATENT -> Save
    Image: both RGBA PNGs of the library's untiled round trip (alpha padded opaque), to PNG rounding."""
    import numpy as np
    from PIL import Image

    from vaekit import vae as lib
    from vaekit.nodes.headless import run_prompt
    from vaekit.vae.files.imageio import read_image
    api = json.loads((WORKFLOWS / "image_qwen21_roundtrip_api.json").read_text())
    assert api["1"]["inputs"]["vae_name"] == QWEN21
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ui = run_prompt(api, input_dir=video_dirs / "input", output_dir=video_dirs / "output")
        v = lib.load(video_dirs / "models" / "vae" / QWEN21)
        x = read_image(video_dirs / "input" / "vaekit_sample.png").movedim(-1, 0)[None]    # RGB [1, 3, H, W]
        z = v.encode(x)
        want = v.decode(z)[0].movedim(0, -1)                                                # RGBA [H, W, 4]
    finally:
        torch.set_num_threads(threads)
    assert v.name.startswith("Qwen-Image 2.1") and z.shape == (1, 64, x.shape[2] // 16, x.shape[3] // 16)
    for node in ("5", "7"):                     # ours (exact tiles) and core's VAE Decode
        (png,) = ui[node]["images"]
        with Image.open(png) as im:
            assert im.mode == "RGBA"
            got = torch.from_numpy(np.asarray(im).astype(np.float32) / 255)
        assert (got - want).abs().max() <= 1 / 255 + 1e-6, node


def test_mage_workflow_runs_headless_and_matches_the_library(pack, video_dirs):
    """Load Image -> Tiled Encode -> Tiled Decode (both exact, 256 px: tiles cut the image's attention
    windows and its pooled gates) -> Save Image: the library's untiled round trip, to PNG rounding."""
    png, v, z, want = _image_roundtrip("image_mage_roundtrip_api.json", MAGE, video_dirs)
    assert v.spec.id == "mage" and z.shape == (1, 16, png.shape[0] // 16, png.shape[1] // 16)
    assert (png - want).abs().max() <= 1 / 255 + 1e-6     # 8-bit PNG rounding


@pytest.mark.parametrize("version", ["2.1", "3.0"])
def test_hunyuan_image_roundtrip_runs_headless(pack, video_dirs, version):
    """Load Image -> Tiled Encode -> Tiled Decode (both exact, 256 px) -> Save Image, and core's VAE Decode of
    the same LATENT -> Save Image: both PNGs are the library's untiled round trip, to PNG rounding. 2.1:
    32x, LATENT [1, 64, h, w], 2x2 tiles of the 512 px sample. 3.0 (an image as four frames: heavier) on a
    128x96 crop of it, LATENT [1, 32, 1, h, w] as core's VAE Encode gives it."""
    from PIL import Image
    name = next(n for n, v in HUNYUAN_IMAGE.items() if v == version)
    if version == "3.0":
        path = video_dirs / "input" / "vaekit_sample.png"
        with Image.open(path) as im:
            im.crop((0, 0, 128, 96)).save(path)
    api = "image_hunyuan_image21_roundtrip_api.json" if version == "2.1" else "image_hunyuan_image3_roundtrip_api.json"
    (ours, core), v, z, want = _image_roundtrip(api, name, video_dirs, nodes=("5", "7"))
    h, w = want.shape[0], want.shape[1]
    assert v.spec.id == "hunyuan_image" and z.shape == ((1, 64, h // 32, w // 32) if version == "2.1" else
                                                         (1, 32, 1, h // 16, w // 16))
    for png in (ours, core):      # ours (exact tiles) and core's VAE Decode
        assert (png - want).abs().max() <= 1 / 255 + 1e-6     # 8-bit PNG rounding
