"""Out of memory: a decode or encode whose tile raises torch.OutOfMemoryError is retried with spatial
tiles of half the size (said in the log), as core falls back to tiles; a call that asked for one pass is
retried in exact tiles (its own result). The error is injected by a model that refuses inputs larger
than a budget, from inside the tile, as a CUDA allocation fails mid-forward; what the failed attempt held
is freed before the retry."""
from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch

import vae
from helpers import diffusers_kl

pytestmark = pytest.mark.usefixtures("one_thread")


def _budget(v, latent_side: int, what: str = "decode", error=None):
    """Make ``v``'s model raise ``error`` (default: OutOfMemoryError) for inputs wider than ``latent_side``
    latent pixels."""
    real = getattr(v.model, what)
    px = 1 if what == "decode" else v.caps.spatial_ratio
    calls = []

    def limited(x, *a, **k):
        calls.append(tuple(x.shape[-2:]))
        if max(x.shape[-2:]) > latent_side * px:
            raise error or torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(x, *a, **k)
    setattr(v.model, what, limited)
    return calls


@pytest.fixture
def kl():
    return vae.from_state_dict(diffusers_kl(widths=(32, 32)).state_dict())     # 2x


def test_untiled_decode_that_runs_out_of_memory_is_retried_in_exact_tiles(kl, caplog):
    z = torch.randn(1, 4, 16, 12)
    want = kl.decode(z)                                # one pass: what the retry must still give
    _budget(kl, 10)
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        out = kl.decode(z)
    assert (out - want).abs().max() <= 1e-5            # fp32 rounding of other tile shapes
    assert "out of memory with no tiles; retrying with 16x16 px exact tiles" in caplog.text


# what cuDNN's plan search raises when no plan could run (see the test below)
CUDNN_NO_ENGINE = ("GET was unable to find an engine to execute this computation",
                   "FIND was unable to find an engine to execute this computation")


@pytest.mark.parametrize("message", CUDNN_NO_ENGINE)
def test_a_cudnn_plan_search_that_failed_for_memory_is_replanned(kl, caplog, message):
    """A convolution whose every cuDNN plan failed to get its workspace raises cuDNN's engine-search
    message, not OutOfMemoryError; the out-of-memory retry (and the cache runner's replan, which asks
    the same ``out_of_memory``) takes it for what it is.

    Where the message comes from: PyTorch's aten/src/ATen/native/cudnn/Conv_v8.cpp (pytorch/pytorch at
    06ca69ca4e9b). Each plan whose workspace cannot be allocated is skipped (``try_configs`` and
    ``try_plans`` catch its c10::OutOfMemoryError), and when none is left ``run_single_conv`` ends in
    ``TORCH_CHECK(false, "GET was unable to find an engine to execute this computation")`` (heuristic
    plans: torch.backends.cudnn.benchmark off) or ``try_plans`` in ``"FIND was unable ..."`` (benchmark
    on): a RuntimeError in Python."""
    from vae.engine.replan import out_of_memory
    assert out_of_memory(RuntimeError(message))
    z = torch.randn(1, 4, 16, 12)
    want = kl.decode(z)
    _budget(kl, 10, error=RuntimeError(message))
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        out = kl.decode(z)
    assert (out - want).abs().max() <= 1e-5
    assert "out of memory with no tiles; retrying with 16x16 px exact tiles" in caplog.text


def test_fast_tiles_asked_stay_fast(kl, caplog):
    z = torch.randn(1, 4, 16, 16)
    want = kl.decode(z, tile=8, overlap=2)             # 4 latent pixels a tile (+1 overlap): what the retry gives
    _budget(kl, 6)
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        out = kl.decode(z, tile=16, overlap=2)
    assert torch.equal(out, want) and "retrying with 8x8 px fast tiles" in caplog.text


def test_what_the_failed_attempt_held_is_freed_before_the_retry(kl, caplog):
    """Tiles that allocate, then fail (as a CUDA allocation fails mid-forward): their tensors stay alive
    in the frames of the exception's traceback (the exact run's tile threads, the engine's own frames,
    which hold the error in a reference cycle). The retry must not start with them still held: on a GPU
    they are the memory it needs."""
    real, failed, alive = kl.model.decode, [], []

    def allocating(x, *a, **k):
        work = torch.empty(16 << 20, dtype=torch.uint8)          # the attempt's activations
        if max(x.shape[-2:]) > 6:
            failed.append(weakref.ref(work))
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        alive.append(sum(r() is not None for r in failed))       # a tile of the retry runs
        return real(x, *a, **k)
    kl.model.decode = allocating
    gc.disable()                     # no collection by chance between the attempts: only the handle's
    try:
        with caplog.at_level(logging.WARNING, logger="VAEKit"):
            kl.decode(torch.randn(1, 4, 16, 16), mode="exact", tile=16)    # 2x2 tiles of 8, then 4x4 of 4
    finally:
        gc.enable()
    assert caplog.text.count("retrying with") == 1 and len(failed) == 4
    assert alive and max(alive) == 0


def test_tiles_halve_until_they_fit_and_exact_mode_stays_exact(kl, caplog):
    z = torch.randn(1, 4, 16, 16)
    untiled = kl.decode(z)
    calls = _budget(kl, 6)
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        out = kl.decode(z, tile=24, mode="exact")
    assert caplog.text.count("retrying with") == 2                        # 24 -> 12 -> 8 px... until it fits
    assert (out - untiled).abs().max() <= 1e-4 and max(max(c) for c in calls[-3:]) <= 6


def test_encode_retries_too(kl, caplog):
    x = torch.rand(1, 3, 32, 32)
    want = kl.encode(x)
    _budget(kl, 8, "encode")
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        assert (kl.encode(x) - want).abs().max() <= 1e-5
    assert "encode: out of memory with no tiles; retrying with 16x16 px exact tiles" in caplog.text


def test_a_tile_that_never_fits_raises_the_original_error(kl):
    _budget(kl, 1)
    with pytest.raises(torch.OutOfMemoryError):
        kl.decode(torch.randn(1, 4, 16, 16))


def test_other_errors_are_not_retried(kl):
    calls = []

    def broken(x, *a, **k):
        calls.append(1)
        raise RuntimeError("shape mismatch")
    kl.model.decode = broken
    with pytest.raises(RuntimeError, match="shape mismatch"):
        kl.decode(torch.randn(1, 4, 8, 8))
    assert len(calls) == 1


# ---- what a call asks the memory manager for -----------------------------------------------------

def test_memory_needed_follows_the_unit_of_work(loaded):
    """Measured on the meta device from one tile of one chunk: smaller tiles and chunks need less; a
    streamed clip needs the same for 4x the frames."""
    v = loaded["wan"]
    whole = v.memory_needed((1, 16, 9, 16, 16))
    tiled = v.memory_needed((1, 16, 9, 16, 16), tile=64)
    assert 0 < tiled < whole
    assert v.memory_needed((1, 16, 36, 16, 16)) == whole              # one latent frame a chunk either way
    assert v.memory_needed((1, 16, 9, 16, 16), tile_frames=64) > whole   # a 9-frame chunk holds more
    assert v.memory_needed((1, 3, 9, 128, 128), "encode") > 0


def _loads_to_cuda(handle, monkeypatch):
    """ComfyUI as on a GPU machine, without a GPU: a stand-in memory manager that records its loads (and
    loads nothing), and a patcher whose load device is ``cuda`` while the weights wait on the CPU, its
    offload device, as they do until ``load_models_gpu`` moves them."""
    import types
    from vaekit.nodes import _comfy, patcher
    calls = []
    mm = types.SimpleNamespace(load_models_gpu=lambda models, **kw: calls.append(kw),
                               intermediate_device=lambda: torch.device("cpu"),
                               throw_exception_if_processing_interrupted=lambda: None)
    monkeypatch.setattr(_comfy, "model_management", lambda: mm)
    monkeypatch.setitem(_comfy._patchers, handle.model, patcher.Patcher(handle.model, "cuda", "cpu"))
    return calls


def _cuda_need(handle, shape, op="decode", **asked) -> int:
    """What a call needs on CUDA, from the planner itself (outputs and maps on the CPU)."""
    from vae.engine import budget
    call = handle.call_for(op, tuple(shape), **asked)
    return budget.predict(handle, call, torch.device("cuda"), torch.device("cpu")).device


def test_the_comfyui_path_tells_the_memory_manager_the_load_devices_need(pack, monkeypatch):
    """Inside ComfyUI the nodes load the VAE through its memory manager with ``memory_required`` set to
    what the call needs on the device it will run on: asked before the load, while the weights still sit
    on the offload device (the CPU), the need is still the load device's (CUDA's calibration, no CPU
    convolution copies), not the CPU's."""
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    from video_families import tiny_state_dict
    handle = from_state_dict(tiny_state_dict("wan"))
    calls = _loads_to_cuda(handle, monkeypatch)
    dec = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]()
    z = torch.randn(1, 16, 3, 12, 12)          # 96 px: tiled by the widget's smallest tile
    dec.decode({"samples": z}, VAEKitVAE(handle), tile_size=64, overlap=8, temporal_size=64, temporal_overlap=8)
    asked = dict(tile=64, overlap=8, tile_frames=4, mode="exact")
    cuda = _cuda_need(handle, z.shape, **asked)
    assert handle.device.type == "cpu"
    assert calls[-1]["memory_required"] == cuda != handle.memory_needed(z.shape, **asked)


def test_frame_wise_decode_tells_the_memory_manager_the_need_of_the_call_it_runs(pack, monkeypatch):
    """Frame-wise Decode loads the VAE with ``memory_required`` measured for the call it then runs (one
    set of keywords for both, nodes/call.py): its spatial tiles with their overlap and its chunks with
    theirs, which a tile's working set grows with."""
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    from video_families import tiny_state_dict
    handle = from_state_dict(tiny_state_dict("wan"))
    calls = _loads_to_cuda(handle, monkeypatch)
    node = pack.NODE_CLASS_MAPPINGS["VAEKitFramewiseDecode"]()
    z = torch.randn(1, 16, 3, 12, 12)
    node.decode({"samples": z}, VAEKitVAE(handle), frames_per_chunk=1, overlap=1, tile_size=64, tile_overlap=32)
    run = dict(tile=64, overlap=32, tile_frames=4, overlap_frames=4)
    assert calls[-1]["memory_required"] == _cuda_need(handle, z.shape, **run) != _cuda_need(
        handle, z.shape, tile=64, tile_frames=4)


def test_memory_needed_predicts_for_the_device_named(loaded):
    """``device`` names where the call runs; without it, where the weights are: a CUDA prediction on this
    CPU-only build is the planner's for CUDA (its calibration, parked exact tiles), the default the CPU's."""
    v = loaded["wan"]
    shape = (1, 16, 3, 16, 16)
    assert v.memory_needed(shape) == v.memory_needed(shape, device="cpu")
    for mode in ("fast", "exact"):
        cuda = v.memory_needed(shape, device="cuda", tile=64, mode=mode)
        assert cuda == _cuda_need(v, shape, tile=64, mode=mode) != v.memory_needed(shape, tile=64, mode=mode)


def test_memory_needed_of_a_models_own_units_predicts_for_the_device_named(loaded):
    """A model whose tiles are its definition (MiniMax H3) measures one of its units, for ``device`` too."""
    from vae.engine import memory
    v = loaded["minimax"]
    shape = (1, v.caps.latent_channels, 3, 8, 8)
    unit = v.caps.own_tiling.plan("decode", shape).unit_input(1, v.caps.latent_channels)
    live = memory.unit_bytes(v.model, "decode", tuple(unit), v.dtype)
    cuda = memory.working(live, torch.device("cuda"))
    assert v.memory_needed(shape, device="cuda") == cuda != v.memory_needed(shape)



def test_core_memory_hooks_on_our_vae_answer_with_our_measurement(pack):
    """Core's ``comfy.sd.VAE`` memory hooks, asked of our VAE on a socket (model-layout shapes, as core
    passes them): the need measured for our architecture, and tiling handled inside."""
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    from video_families import tiny_state_dict
    handle = from_state_dict(tiny_state_dict("wan"))
    v = VAEKitVAE(handle)
    assert v.handles_tiling is True
    assert v.memory_used_decode((1, 16, 3, 8, 8), torch.float32) == handle.memory_needed((1, 16, 3, 8, 8)) > 0
    assert v.memory_used_encode((1, 3, 9, 64, 64), torch.float32) == handle.memory_needed((1, 3, 9, 64, 64), "encode") > 0
    assert v.memory_used_decode((1, 16, 6, 16, 16)) > v.memory_used_decode((1, 16, 3, 8, 8))


def test_core_memory_hooks_answer_for_the_load_device(pack, monkeypatch):
    """Core asks ``memory_used_*`` before it loads the VAE: the figure is the load device's (CUDA), not
    the offload device's where the weights wait (the CPU)."""
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    from video_families import tiny_state_dict
    handle = from_state_dict(tiny_state_dict("wan"))
    _loads_to_cuda(handle, monkeypatch)
    v = VAEKitVAE(handle)
    shape = (1, 16, 3, 8, 8)
    assert v.memory_used_decode(shape, torch.float32) == _cuda_need(handle, shape) != handle.memory_needed(shape)
    image = (1, 3, 9, 64, 64)
    assert v.memory_used_encode(image) == _cuda_need(handle, image, "encode") != handle.memory_needed(image, "encode")
