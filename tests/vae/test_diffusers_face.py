"""vae.diffusers: the face against diffusers' own classes on the same weights (decode, the posterior's
mean/logvar/std/var/mode/kl/parameters, sample() from the same generator, the config pipelines read), the
same calls within a budget below one pass equal to one pass, and the refusals of what it cannot honour."""
from __future__ import annotations


import sys

import pytest
import torch
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import vae

from diffusers_face_common import (assert_budget_gives_one_pass, assert_decode_equal, assert_posterior_equal,
                                   budget_between, close, config_differences, pixels, save)
from helpers import diffusers_kl, diffusers_tiny, jitter_gammas
from vae.errors import InputError, LoadError

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")



def wan21():
    torch.manual_seed(0)
    return jitter_gammas(diffusers.AutoencoderKLWan(base_dim=8, z_dim=16))


def wan22():
    torch.manual_seed(0)
    return jitter_gammas(diffusers.AutoencoderKLWan(
        base_dim=8, decoder_base_dim=12, z_dim=12, is_residual=True, patch_size=2, in_channels=12, out_channels=12,
        scale_factor_spatial=16, latents_mean=[0.1 * i for i in range(12)], latents_std=[1 + 0.1 * i for i in range(12)]))


def qwen():
    torch.manual_seed(0)
    return jitter_gammas(diffusers.AutoencoderKLQwenImage(base_dim=8, z_dim=16))


# name -> (diffusers model, how the face is loaded: "file" (a single file, name) or "folder", pixels, latent)
CASES = {
    "kl-sd": (lambda: diffusers_kl(latent_channels=4), "folder", (2, 3, 16, 24), (2, 4, 8, 12)),
    "kl-flux": (lambda: diffusers_kl(latent_channels=16, quant=False), "flux_ae.safetensors", (1, 3, 16, 16),
                (1, 16, 8, 8)),
    "tiny": (lambda: diffusers_tiny(latent_channels=4), "taesdxl.safetensors", (1, 3, 32, 40), (1, 4, 4, 5)),
    "wan21": (wan21, "wan_2.1_vae.safetensors", (1, 3, 5, 16, 24), (1, 16, 2, 2, 3)),
    "wan22": (wan22, "folder", (1, 3, 5, 32, 32), (1, 12, 2, 2, 2)),
    "qwen": (qwen, "qwen_image_vae.safetensors", (1, 3, 1, 16, 24), (1, 16, 1, 2, 3)),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    make, how, px, lat = CASES[request.param]
    ref = make()
    return request.param, ref, save(ref, how, tmp_path_factory.mktemp(request.param)), px, lat


def test_decode_and_encode_equal_the_diffusers_class(case):
    name, ref, path, px, lat = case
    face = vae.diffusers.load(path)
    assert face.config["_class_name"] == type(ref).__name__
    x, z = pixels(px), torch.randn(lat, generator=torch.Generator().manual_seed(1))
    assert_decode_equal(face, ref, z)
    if name == "tiny":
        with torch.no_grad():
            want = ref.encode(x).latents
        close(face.encode(x).latents, want)
        close(face.encode(x, return_dict=False)[0], want)
        return
    assert_posterior_equal(face, ref, x)


def test_config_has_the_class_keys_and_values(case):
    """Every key of diffusers' config of the same model, with its value (lists as JSON gives them), and
    the attributes the class sets that pipelines read."""
    name, ref, path, *_ = case
    face = vae.diffusers.load(path)
    differ = config_differences(face, ref)
    if name == "kl-flux":       # the file names Flux.1: its published latent space (the model kept the class default)
        assert differ.pop("scaling_factor") == (0.3611, 0.18215) and differ.pop("shift_factor") == (0.1159, None)
        assert differ.pop("sample_size") == (1024, 32)
    assert not differ
    assert face.config.latent_channels if "kl" in name else True
    assert face.dtype == torch.float32 and face.device == torch.device("cpu")


@pytest.mark.parametrize("op", ["decode", "encode"])
def test_a_budget_below_one_pass_gives_one_pass(case, op, caplog):
    """The same call within a budget halfway between small exact tiles' need and one pass's: planned in exact tiles
    (the log says so), equal to the face without a budget."""
    name, ref, path, px, lat = case
    grow = 8 if name == "tiny" else 4          # TAESD's receptive field is wide: tiles save from 256 px on
    base = px if op == "encode" else lat
    shape = tuple(base[:-2]) + (base[-2] * grow, base[-1] * grow)
    h = vae.diffusers.load(path).handle
    if h.caps.norm.startswith("groupnorm"):
        pytest.skip("tiles that share GroupNorm statistics all stay alive on the CPU (paused ones wait in host "
                    "memory): a budget saves memory on a GPU only (tests/vae/test_budget.py)")
    if name == "wan22" and op == "encode":
        pytest.skip("at this size Wan 2.2's 16x tiles with their halo cover the image: no plan below one pass")
    side = max(shape[-2:]) * (h.caps.spatial_ratio if op == "decode" else 1)       # pixels
    tile = max(side // 4, 4 * h.caps.spatial_ratio)      # the planner's smallest tiles are 4 latent pixels
    x = pixels(shape) if op == "encode" else torch.randn(shape)
    assert_budget_gives_one_pass(path, op, x, tile, caplog)


class _WholeCopies(TorchDispatchMode):
    """The ops that create a tensor of ``x``'s shape in storage of their own: copies of the whole input."""
    def __init__(self, x):
        super().__init__()
        self.shape, self.storage, self.ops = tuple(x.shape), x.untyped_storage().data_ptr(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if (torch.is_tensor(t) and t.is_floating_point() and tuple(t.shape) == self.shape and not t.is_meta
                    and t.untyped_storage().data_ptr() != self.storage):
                self.ops.append(func.__name__)
        return out


@pytest.mark.parametrize("name", ["wan21", "qwen"])
def test_encode_maps_pixels_tile_by_tile_never_copying_the_whole_input(name, tmp_path):
    """diffusers' pixels (-1..1) reach the model's range tile by tile: within a budget of small tiles the face
    makes no copy of the whole input (which no plan of the budget counts), and gives the result without one."""
    make, how, px, _ = CASES[name]
    path = save(make(), how, tmp_path)
    shape = tuple(px[:-2]) + (px[-2] * 4, px[-1] * 4)
    x = pixels(shape)
    one = vae.diffusers.load(path)
    small = vae.diffusers.load(path, budget=budget_between(one, "encode", shape, 32))
    with _WholeCopies(x) as seen:
        got = small.encode(x).latent_dist.mean
    assert seen.ops == []
    close(got, one.encode(x).latent_dist.mean, 1e-5)


class _OfShape(TorchDispatchMode):
    """The ops that create a tensor of ``shape`` (any dtype) in storage of their own (not the planner's meta
    tensors)."""
    def __init__(self, shape):
        super().__init__()
        self.shape, self.ops = tuple(shape), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        mine = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if torch.is_tensor(t)}
        for t in tree_flatten(out)[0]:
            if (torch.is_tensor(t) and tuple(t.shape) == self.shape and not t.is_meta
                    and t.untyped_storage().data_ptr() not in mine):
                self.ops.append(func.__name__.split(".")[0])
        return out


@pytest.mark.parametrize("name", ["wan21", "qwen"])
def test_decode_makes_its_output_and_nothing_of_its_size_besides(name, tmp_path):
    """Within a budget of small tiles, a decode allocates one output and the ordinary tensor it hands back
    (the engine's is an inference tensor); none of the size of the output besides (which no plan counts):
    not -1..1 by ``y * 2 - 1`` (two more clips), not the NaN check's mask and ``abs`` (LTX-Video at
    512x768x49: 385 MiB over the plan, measured)."""
    make, how, px, _ = CASES[name]
    path = save(make(), how, tmp_path)
    one = vae.diffusers.load(path)
    h = one.handle
    shape = tuple(px[:-2]) + (px[-2] * 4, px[-1] * 4)
    z = torch.randn(*shape[:1], h.caps.latent_channels, *shape[2:-2], *(n // h.caps.spatial_ratio for n in shape[-2:]))
    want = one.decode(z).sample
    small = vae.diffusers.load(path, budget=budget_between(one, "decode", tuple(z.shape), 32))
    with _OfShape(want.shape) as seen:
        got = small.decode(z).sample
    assert sorted(seen.ops) == ["clone", "empty"], seen.ops
    close(got, want, 1e-5)


@pytest.fixture(scope="module")
def kl_folder(tmp_path_factory):
    ref = diffusers_kl(latent_channels=4)
    folder = tmp_path_factory.mktemp("kl") / "vae"
    ref.save_pretrained(folder)
    return ref, folder


def test_refusals_name_what_cannot_be_honoured(kl_folder):
    _, folder = kl_folder
    face = vae.diffusers.load(folder)
    x = pixels((1, 3, 16, 16))
    with pytest.raises(InputError, match="'tiling'"):
        face.encode(x, tiling=True)
    with pytest.raises(InputError, match="requires gradients"):
        face.encode(x.clone().requires_grad_())
    with pytest.raises(InputError, match=r"\[-1, 1\]"):
        face.encode(x * 1.5)
    with pytest.raises(InputError, match="without gradients"):
        face.requires_grad_(True)
    with pytest.raises(InputError, match="read-only"):
        face.config.scaling_factor = 1.0
    with pytest.raises(AttributeError, match="not 'tiled_decode'"):
        face.tiled_decode
    with pytest.raises(InputError, match="config has no nonsense"):
        vae.diffusers.load(folder, config={"nonsense": 1})
    with pytest.raises(LoadError, match="latent_channels=16.*weights"):
        vae.diffusers.load(folder, config={"latent_channels": 16})


def test_a_config_that_names_another_class_is_refused(kl_folder, tmp_path):
    ref, folder = kl_folder
    other = tmp_path / "vae"
    other.mkdir()
    (other / "config.json").write_text((folder / "config.json").read_text().replace("AutoencoderKL", "AutoencoderKLWan"))
    (other / "diffusion_pytorch_model.safetensors").write_bytes((folder / "diffusion_pytorch_model.safetensors").read_bytes())
    with pytest.raises(LoadError, match="names AutoencoderKLWan.*AutoencoderKL"):
        vae.diffusers.load(tmp_path)


def test_statistics_the_weights_do_not_tell_are_asked_for(tmp_path):
    """Wan 2.2's 48 (here 12) channels: latents_mean/std only from a folder or config=."""
    ref = wan22()
    path = tmp_path / "wan2.2_vae.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    with pytest.raises(LoadError, match="latents_mean, latents_std"):
        vae.diffusers.load(path)
    stats = dict(latents_mean=list(ref.config.latents_mean), latents_std=list(ref.config.latents_std))
    assert vae.diffusers.load(path, config=stats).config.latents_std == stats["latents_std"]


def test_a_module_that_pipelines_move_and_read(kl_folder):
    """A torch.nn.Module holding our model: .to() moves and casts it (the handle follows), results come in
    its dtype as ordinary tensors (a trainer's autograd can use them), the switches are accepted."""
    ref, folder = kl_folder
    face = vae.diffusers.load(folder)
    assert isinstance(face, torch.nn.Module) and any(p is q for p in face.parameters() for q in face.handle.model.parameters())
    face.enable_tiling(tile_sample_min_height=64)
    face.enable_slicing()
    assert face.use_tiling and face.use_slicing and not face.use_framewise_decoding
    assert face.eval() is face and face.requires_grad_(False) is face
    x = pixels((1, 3, 16, 16))
    mean = face.encode(x).latent_dist.mean
    assert not mean.is_inference() and not mean.requires_grad
    w = torch.ones_like(mean, requires_grad=True)
    (w * mean).sum().backward()            # an ordinary tensor: autograd saves it
    assert face.to(torch.float64) is face and face.dtype == torch.float64 == face.handle.dtype
    assert next(face.post_quant_conv.parameters()).dtype == torch.float64
    assert face.encode(x.double()).latent_dist.mean.dtype == torch.float64
    assert face.decode(mean.double()).sample.dtype == torch.float64


def test_no_diffusers_import_at_run_time(kl_folder):
    """The face in a fresh interpreter: diffusers is never imported."""
    import subprocess
    _, folder = kl_folder
    code = ("import sys, torch, vae; f = vae.diffusers.load(sys.argv[1]); "
            "f.decode(torch.randn(1, 4, 4, 4)); print('diffusers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=True,
                         cwd=str(__import__("helpers").ROOT))
    assert out.stdout.strip() == "False"


def test_private_encode_gives_the_class_moments_where_the_class_has_it(case):
    """``_encode`` (finetrainers' precompute caches its moments): ``[mean; log-variance]`` as the class's,
    and absent where the class has none (AutoencoderTiny)."""
    name, ref, path, px, _ = case
    face = vae.diffusers.load(path)
    if not hasattr(ref, "_encode"):
        assert not hasattr(face, "_encode")
        return
    x = pixels(px)
    with torch.no_grad():
        close(face._encode(x), ref._encode(x))
