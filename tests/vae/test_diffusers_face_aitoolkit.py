"""ai-toolkit's own latent step with vae.diffusers' face in place of the VAE it loads: each model class's
``encode_images`` (Wan 2.1, Stable Diffusion's class for SDXL and Flux.1, Qwen-Image, LTX-2), and the data
loader's latent cache (``LatentCachingMixin._cache_one_latent``, which encodes through ``encode_images`` and
writes ``_latent_cache/*.safetensors``), run once with the class ai-toolkit loads (for Wan its own subclass of
diffusers' ``AutoencoderKLWan``, else diffusers') and once with the face on the same weights, the same pixels
and the global RNG seeded alike (``encode_images`` draws ``latent_dist.sample()`` without a generator).

ai-toolkit is not a package: set ``AI_TOOLKIT_DIR`` to a checkout of it (github.com/ostris/ai-toolkit) in an
environment with what its modules import (accelerate, optimum-quanto, torchao, peft, albumentations,
opencv, oyaml, ...; its requirements.txt). Where torchvision or torchaudio do not import (a build for another
torch), they stand in while ai-toolkit's modules import: their names bind and objects made from them exist,
and any use fails; the tests check that the latent path made none. The model objects are ai-toolkit's
classes built from a ``ModelConfig`` (no weights loaded); the VAE is assigned where ``load_model`` assigns
it (LTX-2: ``pipeline.vae``, the one thing its ``encode_images`` reads of the pipeline)."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import vae
from vae.errors import InputError
from diffusers_face_common import TOL, pixels, save
from helpers import diffusers_kl, jitter_gammas
from ltx_common import ltx2_reference

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

STAND_IN_USES: list[str] = []      # what the code under test made or called of a stand-in module


class _Made:
    """What calling a stand-in gives (ai-toolkit builds transforms at import): any use of it fails."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        STAND_IN_USES.append(f"{self._name}().{attr}")
        raise RuntimeError(f"{self._name} stands in for a module that does not import here")

    def __call__(self, *args, **kwargs):
        STAND_IN_USES.append(f"{self._name}()()")
        raise RuntimeError(f"{self._name} stands in for a module that does not import here")


class _Name:
    """A name from a stand-in module: it binds, a class may derive from it, calling it is recorded."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Name(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        STAND_IN_USES.append(f"{self._name}()")
        return _Made(self._name)

    def __mro_entries__(self, bases):
        return (type(self._name.rsplit(".", 1)[-1], (), {}),)


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Modules (and their submodules) that do not import here, as _Name-valued stand-ins. ``__version__`` is
    set because transformers parses the version of any torchvision it finds."""

    def __init__(self, roots: set[str]):
        self.roots = roots

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__, module.__version__ = [], "0"
        module.__getattr__ = lambda attr: _absent_attribute(spec.name, attr)
        return module

    def exec_module(self, module):
        pass


def _absent_attribute(module: str, attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Name(f"{module}.{attr}")


def _does_not_import(name: str) -> bool:
    try:
        importlib.import_module(name)
        return False
    except Exception:       # noqa: BLE001 -- a build for another torch fails with OSError or RuntimeError too
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        return True


def _ai_toolkit():
    """ai-toolkit's modules on the latent path, imported from ``AI_TOOLKIT_DIR``, or a skip naming why not.
    Three things that are only imported on that path stand in where they do not import: torchvision and
    torchaudio (see the module's docstring) and diffusers' ``pipelines.ltx2.export_utils.encode_video``
    (ai-toolkit's LTX-2 module imports it to save sample videos; diffusers 0.42 moved it to
    ``diffusers.utils.export_utils``). ``extensions_built_in``'s package ``__init__`` files, which import
    every model it has, are not run: its model modules are imported by their paths."""
    root = os.environ.get("AI_TOOLKIT_DIR")
    if not root:
        pytest.skip("AI_TOOLKIT_DIR is not set: set it to a checkout of github.com/ostris/ai-toolkit, in an "
                    "environment with its requirements, to run ai-toolkit's latent step", allow_module_level=True)
    if not (Path(root) / "toolkit" / "dataloader_mixins.py").is_file():
        pytest.skip(f"AI_TOOLKIT_DIR={root} is not an ai-toolkit checkout (no toolkit/dataloader_mixins.py)",
                    allow_module_level=True)
    if root not in sys.path:
        sys.path.insert(0, root)
    stand_ins = _StandIns({m for m in ("torchvision", "torchaudio") if _does_not_import(m)})
    try:
        export_utils = importlib.import_module("diffusers.pipelines.ltx2.export_utils")
    except ImportError as e:        # it needs PyAV, which ai-toolkit's requirements install
        pytest.skip(f"diffusers' LTX-2 export utilities do not import here ({e})", allow_module_level=True)
    missing_encode_video = not hasattr(export_utils, "encode_video")
    if missing_encode_video:
        export_utils.encode_video = _Name("diffusers.pipelines.ltx2.export_utils.encode_video")
    for name in ("extensions_built_in", "extensions_built_in.diffusion_models"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(Path(root, *name.split(".")))]
            sys.modules[name] = package
    sys.meta_path.insert(0, stand_ins)
    try:
        names = ("toolkit.config_modules", "toolkit.stable_diffusion_model", "toolkit.models.wan21.wan21",
                 "toolkit.models.wan21.autoencoder_kl_wan", "extensions_built_in.diffusion_models.qwen_image.qwen_image",
                 "extensions_built_in.diffusion_models.ltx2.ltx2",
                 "extensions_built_in.diffusion_models.wan22.wan22_5b_model", "toolkit.dataloader_mixins",
                 "toolkit.data_transfer_object.data_loader")
        modules = types.SimpleNamespace(**{n.rsplit(".", 1)[-1]: importlib.import_module(n) for n in names})
    except ImportError as e:
        pytest.skip(f"ai-toolkit's modules do not import here ({e}): install its requirements.txt",
                    allow_module_level=True)
    finally:
        # later tests see these modules as they are
        sys.meta_path.remove(stand_ins)
        for key in [k for k in sys.modules if k.split(".")[0] in stand_ins.roots]:
            del sys.modules[key]
        if missing_encode_video:
            del export_utils.encode_video
    modules.stand_ins = sorted(stand_ins.roots) + (["encode_video"] if missing_encode_video else [])
    return modules


aitk = _ai_toolkit()


# ---- the models: ai-toolkit's class, the VAE its load_model loads, how the face is given the same weights ----

def _wan(**config):
    """ai-toolkit's own AutoencoderKLWan (diffusers' class with gradient checkpointing added)."""
    def make():
        torch.manual_seed(0)
        return jitter_gammas(aitk.autoencoder_kl_wan.AutoencoderKLWan(base_dim=8, **config))
    return make


def _qwen():
    torch.manual_seed(0)
    return jitter_gammas(diffusers.AutoencoderKLQwenImage(base_dim=8, z_dim=16))


def _kl(latent_channels: int, quant: bool, **published):
    def make():
        ref = diffusers_kl(latent_channels=latent_channels, quant=quant)
        ref.register_to_config(**published)
        return ref
    return make


def _model(cls, arch: str, **config):
    """ai-toolkit's model object as its trainer builds it (fp32, CPU), before ``load_model``."""
    cfg = aitk.config_modules.ModelConfig(name_or_path="unused: no weights are loaded", arch=arch, dtype="fp32",
                                          vae_dtype="fp32", **config)
    return cls("cpu", cfg, dtype="fp32")


def _give(model, v) -> None:
    """The VAE where ``load_model`` puts it (LTX-2's ``encode_images`` reads ``self.pipeline.vae``)."""
    if isinstance(model, aitk.ltx2.LTX2Model):
        model.pipeline = types.SimpleNamespace(vae=v)
    else:
        model.vae = v


# name -> (VAE maker, how the face loads its weights, ai-toolkit's model (a maker), pixels as the data loader
# gives them: an image [C, H, W] or a clip [T, C, H, W], in [-1, 1])
CASES = {
    "wan21-clip": (_wan(z_dim=16), "wan_2.1_vae.safetensors", lambda: _model(aitk.wan21.Wan21, "wan21"), (5, 3, 16, 24)),
    "wan21-image": (_wan(z_dim=16), "wan_2.1_vae.safetensors", lambda: _model(aitk.wan21.Wan21, "wan21"), (3, 16, 24)),
    # not a multiple of 8: encode_images resizes it first (bilinear, its own F.interpolate)
    "wan21-resized": (_wan(z_dim=16), "wan_2.1_vae.safetensors", lambda: _model(aitk.wan21.Wan21, "wan21"),
                      (3, 19, 29)),
    # Wan 2.2 5B: Wan21's encode_images with the 48-channel VAE's structure (patchified, residual), narrow
    "wan22-5b": (_wan(decoder_base_dim=12, z_dim=12, is_residual=True, patch_size=2, in_channels=12, out_channels=12,
                      scale_factor_spatial=16, latents_mean=[0.1 * i for i in range(12)],
                      latents_std=[1 + 0.1 * i for i in range(12)]), "folder",
                 lambda: _model(aitk.wan22_5b_model.Wan225bModel, "wan22_5b"), (5, 3, 32, 32)),
    "sdxl": (_kl(4, True, scaling_factor=0.13025), "folder",
             lambda: _model(aitk.stable_diffusion_model.StableDiffusion, "sdxl"), (3, 16, 24)),
    "flux1": (_kl(16, False, scaling_factor=0.3611, shift_factor=0.1159), "folder",
              lambda: _model(aitk.stable_diffusion_model.StableDiffusion, "flux"), (3, 16, 24)),
    "qwen-image": (_qwen, "qwen_image_vae.safetensors",
                   lambda: _model(aitk.qwen_image.QwenImageModel, "qwen_image"), (3, 16, 24)),
    "ltx2": (lambda: ltx2_reference("2.0"), "folder", lambda: _model(aitk.ltx2.LTX2Model, "ltx2"), (9, 3, 64, 64)),
    # low_vram: its encode_images sets diffusers' tiling attributes on the VAE first
    "ltx2-low-vram": (lambda: ltx2_reference("2.0"), "folder",
                      lambda: _model(aitk.ltx2.LTX2Model, "ltx2", low_vram=True), (9, 3, 64, 64)),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    make, how, model, shape = CASES[request.param]
    ref = make().eval().requires_grad_(False)
    face = vae.diffusers.load(save(ref, how, tmp_path_factory.mktemp(request.param)))
    return request.param, ref, face, model(), pixels(shape)


def _encode_images(model, v, images):
    """``model.encode_images(images)`` with ``v`` as its VAE, the global RNG seeded as for the other VAE."""
    _give(model, v)
    torch.manual_seed(11)
    return model.encode_images(images)


def _close(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    worst = float((got - want).abs().max())
    assert worst <= TOL, worst
    return worst


@pytest.fixture(autouse=True)
def no_stand_in_used():
    """The latent path makes and calls nothing of a module that stands in."""
    before = len(STAND_IN_USES)
    yield
    assert STAND_IN_USES[before:] == []


def test_encode_images_equals_the_vae_ai_toolkit_loads(case):
    name, ref, face, model, x = case
    want, got = _encode_images(model, ref, [x, -x]), _encode_images(model, face, [x, -x])
    assert want.shape[0] == 2 and torch.isfinite(want).all()
    owner = "ai-toolkit's" if type(ref).__module__.startswith("toolkit.") else "diffusers'"
    print(f"ai-toolkit {type(model).__name__}.encode_images ({name}, latents {tuple(want.shape)}, max |latent| "
          f"{float(want.abs().max()):.2f}): max abs {_close(got, want):.1e} (face vs {owner} {type(ref).__name__}; "
          f"stand-ins: {aitk.stand_ins})")
    if name == "ltx2-low-vram":      # what encode_images set on the face it left as it found it
        assert face.tile_sample_min_num_frames == 64 and not face.use_framewise_encoding


@pytest.mark.parametrize("name", ["wan21-clip", "wan22-5b", "flux1", "qwen-image"])
def test_decode_latents_equals_the_vae_ai_toolkit_loads(name, tmp_path):
    """``decode_latents`` (sample previews, and the diffusion feature extractor's target) of the latents
    ``encode_images`` gave: un-normalised by the model's code, decoded by each VAE. Not SDXL: Stable
    Diffusion's ``decode_latents`` adds ``config['shift_factor']``, None for SDXL, with either VAE."""
    make, how, model, shape = CASES[name]
    ref = make().eval().requires_grad_(False)
    face = vae.diffusers.load(save(ref, how, tmp_path))
    model = model()
    latents = _encode_images(model, ref, [pixels(shape)])
    images = []
    for v in (ref, face):
        _give(model, v)
        with torch.no_grad():
            images.append(model.decode_latents(latents))
    print(f"ai-toolkit {type(model).__name__}.decode_latents ({name}, images {tuple(images[0].shape)}): "
          f"max abs {_close(images[1], images[0]):.1e}")


def test_decode_latents_with_gradients_is_refused_by_name(tmp_path):
    """ai-toolkit's diffusion feature extractor loss (``toolkit/models/diffusion_feature_extraction.py``)
    decodes the predicted latents with gradients: the face cannot serve it, and says so."""
    make, how, model, shape = CASES["wan21-clip"]
    face = vae.diffusers.load(save(make(), how, tmp_path))
    model = model()
    _give(model, face)
    latents = torch.randn(1, 16, 2, 2, 3, requires_grad=True)
    with pytest.raises(InputError, match="requires gradients"):
        model.decode_latents(latents * 1)


# ---- the data loader's latent cache --------------------------------------------------------------------------

def _file_item(tmp_path: Path, x: torch.Tensor, do_i2v: bool):
    """ai-toolkit's ``FileItemDTO`` for one image (a PNG it sizes itself) or one clip (its size from the size
    database, as a second caching run reads it), its pixels already loaded: loading them goes through
    torchvision's transforms, which ``_cache_one_latent`` does not."""
    from PIL import Image
    clip = x.dim() == 4
    frames, _, h, w = x.shape if clip else (1, *x.shape)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / ("clip.mp4" if clip else "image.png")
    if clip:
        path.write_bytes(b"a clip the size database describes")
    else:
        Image.new("RGB", (w, h)).save(path)
    size_database = {path.name: (w, h, aitk.data_loader.get_quick_signature_string(str(path)), frames, 24.0)}
    config = aitk.config_modules.DatasetConfig(folder_path=str(tmp_path), num_frames=frames, do_i2v=do_i2v,
                                               resolution=max(h, w))
    item = aitk.data_loader.FileItemDTO(path=str(path), dataset_config=config, size_database=size_database,
                                        latent_space_version="test")
    assert item.is_video == clip
    item.tensor = x.clone()
    return item


def _cache(model, v, x, tmp_path: Path, do_i2v: bool) -> tuple[dict, dict, dict]:
    """``_cache_one_latent`` of one item with ``v`` as the model's VAE, to disk and to memory: the file's
    tensors, its metadata, and the latents the item keeps in memory."""
    item = _file_item(tmp_path, x, do_i2v)
    dataset = types.SimpleNamespace(sd=model, dataset_config=item.dataset_config, is_audio_model=False)
    path = item.get_latent_path()
    _give(model, v)
    torch.manual_seed(11)
    aitk.dataloader_mixins.LatentCachingMixin._cache_one_latent(dataset, item, path, None, True, True, True)
    with safe_open(path, "pt") as f:
        stored, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    memory = {"latent": item._encoded_latent, "first_frame_latent": item._cached_first_frame_latent}
    return stored, meta, {k: t for k, t in memory.items() if t is not None}


@pytest.mark.parametrize("name", ["wan21-clip", "sdxl", "qwen-image"])
def test_the_latent_cache_equals_the_vae_ai_toolkit_loads(name, tmp_path):
    """What ``_latent_cache`` holds (the latent, the clip's first-frame latent for image-to-video training,
    its frame count; the metadata) and what the item keeps in memory, written once with each VAE."""
    make, how, model, shape = CASES[name]
    ref = make().eval().requires_grad_(False)
    face = vae.diffusers.load(save(ref, how, tmp_path))
    model, x, i2v = model(), pixels(shape), len(shape) == 4
    want = _cache(model, ref, x, tmp_path / "diffusers", i2v)
    got = _cache(model, face, x, tmp_path / "face", i2v)
    assert got[0].keys() == want[0].keys() and got[2].keys() == want[2].keys()
    assert ("first_frame_latent" in want[0]) == i2v and ("num_frames" in want[0]) == i2v
    assert got[1] == want[1]
    worst = 0.0
    for k, w in {**want[0], **{f"memory {k}": t for k, t in want[2].items()}}.items():
        g = got[0][k] if k in got[0] else got[2][k.split(" ", 1)[1]]
        worst = max(worst, _close(g, w)) if w.is_floating_point() else worst
        assert w.is_floating_point() or torch.equal(g, w), k
    print(f"ai-toolkit _latent_cache ({name}): {sorted(want[0])}, max abs {worst:.1e} (face vs the class)")
