"""Core's ``patcher`` contract (nodes/patcher.py) on our VAE socket: outside ComfyUI through the pack's
stand-in, inside a real ComfyUI through core's own memory manager, SUPIR Apply and Select VAE Device
(bench/comfyui_checks/check_patcher.py, when COMFYUI_DIR and COMFYUI_PYTHON name one)."""
from __future__ import annotations

import copy

import pytest
import torch

from helpers import IN_COMFYUI, ROOT, run_in_comfyui

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def vae(pack):
    from vaekit.nodes.socket import VAEKitVAE
    return VAEKitVAE(pack.vae.load(ROOT / "vae" / "demo" / "vaekit_demo.safetensors"))


@pytest.fixture
def z():
    return torch.randn(1, 8, 4, 4)


def _errors():
    from vaekit.vae.errors import VAEKitError
    return VAEKitError


def test_the_patcher_answers_the_memory_managers_reads(vae):
    p = vae.patcher
    model = vae.first_stage_model
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert p.model is model and p is vae.patcher                      # one patcher per VAE until a node sets one
    assert (p.load_device, p.offload_device, p.current_loaded_device()) == (torch.device("cpu"),) * 3
    assert p.model_size() == size == vae.model_size() and p.loaded_size() == size
    assert p.model_dtype() == torch.float32 and not p.is_dynamic() and not vae.is_dynamic()
    assert vae.device == torch.device("cpu") and vae.vae_dtype == torch.float32
    c = p.clone()
    assert c is not p and c.model is model and c.parent is p and p.is_clone(c) and c.cached_patcher_init
    assert c.patch_model(device_to="cpu") is model and c.detach() is model


def test_select_device_style_nodes_run_on_a_copy(vae, z):
    """Select VAE Device's steps: a shallow copy, a cloned patcher retargeted, the model and device set
    back on the copy: the copy decodes as the original, and the original keeps its own patcher."""
    before = vae.decode(z)
    other = copy.copy(vae)
    other.patcher = other.patcher.clone()
    other.patcher.offload_device = torch.device("cpu")
    other.first_stage_model = other.patcher.model
    other.device = "cpu"
    assert other.patcher is not vae.patcher and other.patcher.parent is vae.patcher
    assert torch.equal(other.decode(z), before)


def test_a_fresh_copy_of_the_model_becomes_the_copys_own(vae, z, pack):
    """A node that hands the socket another copy of its model (a multi-GPU clone, a deep copy in a new
    patcher): the copy's VAE runs that copy; the original VAE its own."""
    from vaekit.nodes.patcher import Patcher, reload
    before = vae.decode(z)
    fresh = reload(*vae.patcher.cached_patcher_init[1])          # the VAE's file, read again
    assert isinstance(fresh, Patcher) and fresh.model is not vae.first_stage_model
    other = copy.copy(vae)
    other.patcher = fresh
    assert other.first_stage_model is fresh.model and vae.first_stage_model is not fresh.model
    assert torch.equal(other.decode(z), before)
    with torch.no_grad():
        for t in fresh.model.parameters():
            t.mul_(0.5)
    assert not torch.equal(other.decode(z), before) and torch.equal(vae.decode(z), before)
    deep = copy.deepcopy(vae.first_stage_model)
    other.first_stage_model = deep                               # and through first_stage_model
    assert other.patcher.model is deep and torch.equal(other.decode(z), before)


def test_what_cannot_be_served_is_refused_naming_the_attribute(vae, z):
    with pytest.raises(_errors(), match="input 'vae.first_stage_model': a node set this VAE's model to a Linear"):
        vae.first_stage_model = torch.nn.Linear(2, 2)
    with pytest.raises(_errors(), match="input 'vae.patcher': .* which has no model, load_device, offload_device"):
        vae.patcher = object()
    key = next(iter(vae.first_stage_model.state_dict()))
    with pytest.raises(_errors(), match=r"input 'vae.patcher': a node patches 1 of 1 weight\(s\) this VAE .* has no "
                                        r"weight for \('encoder.conv_in.weight'\); they would be dropped"):
        vae.patcher.clone().add_patches({"encoder.conv_in.weight": (torch.zeros(1),)})
    with pytest.raises(_errors(), match="outside ComfyUI nothing applies weight patches"):
        vae.patcher.clone().add_patches({key: (torch.zeros(1),)})
    with pytest.raises(AttributeError, match="vae.patcher.hook_patches: VAEKit's patcher outside ComfyUI answers"):
        vae.patcher.hook_patches
    assert torch.isfinite(vae.decode(z)).all()                   # nothing half-done


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks(vae):
    from vaekit.vae.errors import InputError
    with pytest.raises(InputError, match="input 'vae.device': 'cuda': CUDA is not available here"):
        vae.device = "cuda"


def test_dtype_and_output_device(vae, z):
    vae.output_device = "cpu"
    vae.vae_dtype = torch.bfloat16                               # our VAE computes in its weights' dtype
    assert next(vae.first_stage_model.parameters()).dtype == torch.bfloat16
    assert vae.decode(z).device == torch.device("cpu")


def test_our_nodes_load_through_the_sockets_patcher(vae, z, pack):
    """A node that set the socket's patcher: our own nodes (given the socket) load through it too."""
    from vaekit.nodes import _comfy
    from vaekit.nodes.socket import as_engine
    other = copy.copy(vae)
    other.patcher = vae.patcher.clone()
    handle = as_engine(other, "test")
    assert _comfy.registered(handle) is other.patcher


@IN_COMFYUI
def test_core_nodes_that_use_the_patcher_run_with_our_vae():
    assert "7 of 7 checks passed" in run_in_comfyui("check_patcher.py")
