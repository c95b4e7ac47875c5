"""The device-apart check: every engine path run with the compute device apart from the host.

On a CPU the compute device and the host are one device, so a tensor given a storage of the other device,
an operation mixing the two, a host read of a copy still in flight or a memory figure predicted for the
wrong device passes every other test and fails only on a GPU. Here the VAE computes on the stand-in CUDA
device of tests/apart.py (real values, CUDA's device rules, streams whose copies land late), and each
call must give the host result: exact tiles meeting in rounds (their paused tiles parked on the host),
exact tiles one after another (maps between stages on the host), streamed chunks, fast tiles, the
model's own tiles, encodes, the out-of-memory replan, the NaN guard's ladder, Compile VAE's exact pieces,
several ranks exchanging through NCCL, and the nodes' memory figures. docs/gpu.md says what it covers and
what it cannot; ``python3 -m pytest tests/vae/test_device_apart.py`` runs it alone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import vae
from apart import Apart, device_of
from helpers import ROOT, count_parked, diffusers_kl
from vae.engine import exact

pytestmark = pytest.mark.usefixtures("one_thread")
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture(scope="module")
def kl():
    return vae.from_state_dict(diffusers_kl().state_dict())


def _on_device(v, calls, inputs, op="decode"):
    """Each call of ``calls`` on the host, then on the stand-in device: (host results, device results, stand-in)."""
    with torch.inference_mode():
        want = [getattr(v, op)(x, **kw) for x, kw in zip(inputs, calls)]
    try:
        with Apart() as dev:
            v.to("cuda")
            assert v.device == CUDA
            with torch.inference_mode():
                got = [getattr(v, op)(x, **kw) for x, kw in zip(inputs, calls)]
    finally:
        v.to("cpu")
    return want, got, dev


def _same(want, got, tol=1e-5):
    for w, g in zip(want, got):
        assert device_of(g) == CPU                  # results on the intermediate device, as asked
        assert (w - g).abs().max() <= tol


# ---- the stand-in itself ---------------------------------------------------------------------------

def test_the_stand_in_refuses_what_cuda_refuses():
    with Apart():
        d, h = torch.randn(4, device="cuda"), torch.randn(4)
        with pytest.raises(RuntimeError, match="same device"):
            d + h
        assert device_of(d + torch.tensor(2.0)) == CUDA            # a CPU scalar may join, as on a GPU
        with pytest.raises(RuntimeError, match="This is no longer allowed; the devices must match"):
            torch.empty(0, device="cuda").set_(h.untyped_storage())
        with pytest.raises(TypeError, match="numpy"):
            d.numpy()
        pinned = torch.empty(4, pin_memory=True)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            pinned.copy_(d, non_blocking=True)
            e = torch.cuda.Event()
            e.record(s)
        assert torch.isnan(pinned).all() and not e.query()          # in flight: a host read finds garbage
        e.synchronize()
        assert torch.equal(pinned, d.cpu())


# ---- exact tiles -----------------------------------------------------------------------------------

def test_exact_tiles_meeting_in_rounds_park_on_the_host(kl):
    """GroupNorm tiles meet in rounds; on a GPU their paused tiles wait on the host (parked), which must
    not hand a CUDA tensor a host storage (PyTorch refuses it), and the rounds' whole-tensor modules and
    re-cut slices run where the tiles compute, whatever device their payloads wait on."""
    z = torch.randn(1, 4, 12, 10)
    with pytest.MonkeyPatch.context() as mp:
        moved = count_parked(mp)
        want, got, dev = _on_device(kl, [dict(tile=12, mode="exact")], [z])
    _same(want, got)
    assert sum(moved) > 0                           # paused tiles really were parked
    assert dev.pinned_cached == 0                   # and the pinned blocks went back after the call


def test_pinned_blocks_go_back_after_a_call(kl, loaded):
    """CUDA's caching host allocator keeps every freed pinned block: after a call, the staging buffers and
    parked bytes it pinned are given back, not left page-locked in the process (fast tiles, exact tiles
    one after another, exact tiles in rounds)."""
    z = torch.randn(1, 4, 12, 10)
    _, _, dev = _on_device(kl, [dict(tile=12, overlap=4), dict(tile=12, mode="exact")], [z, z])
    assert dev.pinned_total > 0 and dev.pinned_cached == 0
    _, _, dev = _on_device(loaded["wan"], [dict(tile=32, mode="exact")], [torch.randn(1, 16, 3, 8, 8)])
    assert dev.pinned_total > 0 and dev.pinned_cached == 0


def test_exact_encode_in_rounds(kl):
    x = torch.rand(1, 3, 48, 40)
    want, got, _ = _on_device(kl, [dict(tile=24, mode="exact")], [x], "encode")
    _same(want, got)


def test_exact_tile_after_tile_and_streamed(loaded):
    """Wan: exact tiles one after another with maps between stages on the host, each tile streamed in
    time; a one-pass stream; fast tiles blended; and the encodes."""
    v = loaded["wan"]
    z = torch.randn(1, 16, 3, 8, 8)
    calls = [dict(tile=32, mode="exact"), dict(), dict(tile=32, overlap=8), dict(tile=32, mode="exact", tile_frames=4)]
    want, got, _ = _on_device(v, calls, [z] * len(calls))
    _same(want, got)
    x = torch.rand(1, 3, 9, 64, 64)
    want, got, _ = _on_device(v, [dict(tile=32, mode="exact"), dict()], [x, x], "encode")
    _same(want, got)


@pytest.mark.parametrize("family", ["mochi", "hunyuan_video15", "minimax", "ltx_diffusion", "svd"])
def test_other_engine_paths(loaded, family):
    """GroupNorm rounds streamed in time (Mochi), causal frame attention (HunyuanVideo 1.5), the model's
    own tiles (MiniMax), seeded in-network noise (LTX-2.5), frames in the batch (SVD)."""
    v = loaded[family]
    s = v.caps.spatial_ratio
    z = torch.randn(1, v.caps.latent_channels, 3, 6, 6) if v.takes_clips else \
        torch.randn(3, v.caps.latent_channels, 6, 6)
    kw = dict(tile=3 * s, mode="exact")
    if "seed" in v.caps.decode_options:
        kw["seed"] = 1
    want, got, _ = _on_device(v, [kw], [z])
    _same(want, got, 1e-4)


# ---- the replan, the guard, Compile VAE ------------------------------------------------------------

def test_out_of_memory_replan_on_the_device(kl, monkeypatch):
    """An out-of-memory error in the first plan: the call is planned again for half the budget, on the
    device, and the result is the host's."""
    import vae.handle as handle
    z = torch.randn(1, 4, 16, 16)
    with torch.inference_mode():
        want = kl.decode(z)
    run, failed = handle.VAE._engine, []

    def once(self, *args, **kwargs):
        if not failed:
            failed.append(1)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return run(self, *args, **kwargs)
    monkeypatch.setattr(handle.VAE, "_engine", once)
    try:
        with Apart():
            kl.to("cuda")
            with torch.inference_mode():
                got = kl.decode(z, mode="exact", budget=2 << 30)
    finally:
        kl.to("cpu")
    assert failed
    _same([want], [got])


def test_nan_guard_ladder_on_the_device(kl, monkeypatch):
    """fp16 tiles that overflow are redone up the ladder on the device (bf16 where the card has it, then
    fp32): the redo's copy of the model is made on the device, its input moved there, its output back."""
    from vae.engine import guard
    z = torch.randn(1, 4, 12, 10)
    with torch.inference_mode():
        want = kl.decode(z, tile=12, mode="exact")
    calls = []
    real = guard.finite

    def overflow_once(y):
        calls.append(y.dtype)
        return real(y) and len(calls) > 1
    monkeypatch.setattr(guard, "finite", overflow_once)
    try:
        with Apart():
            kl.to("cuda", torch.float16)
            with torch.inference_mode():
                got = kl.decode(z, tile=12, mode="exact")
    finally:
        kl.to("cpu", torch.float32)
    assert len(calls) > 1
    assert (got - want).abs().max() < 2e-2          # redone in a wider dtype than fp16


def test_compiled_exact_pieces_on_the_device(loaded):
    """Compile VAE's exact pieces: its copy of the model and the pieces its exact tiles call through, run
    as torch.compile's "force_eager" stance runs them (Dynamo cannot trace the stand-in: the device rules
    of Compile VAE's own code are checked here, not the compiler's)."""
    from vae.compile import compile_vae
    v = loaded["wan"]
    z = torch.randn(1, 16, 3, 8, 8)
    with torch.inference_mode():
        want = v.decode(z, tile=32, mode="exact")
    try:
        with Apart():
            v.to("cuda")
            c, _ = compile_vae(v, backend="eager")
            with torch.inference_mode(), torch.compiler.set_stance("force_eager"):
                got = c.decode(z, tile=32, mode="exact")
    finally:
        v.to("cpu")
    _same([want], [got], 1e-4)


# ---- several ranks -----------------------------------------------------------------------------------

def test_ranks_exchange_through_nccl_on_the_device(tmp_path, kl):
    """Two ranks, each computing on its stand-in device, the group answering as NCCL (device tensors only):
    exact tiles meeting in rounds (sums, whole modules, re-cut slices exchanged point to point) and tiles
    one after another give the one-process result."""
    from helpers import diffusers_qwen21
    g = torch.Generator().manual_seed(0)
    cases, want = [], {}
    for name, sd, x, kw in (
            ("kl", {k: t.contiguous() for k, t in diffusers_kl().state_dict().items()}, torch.randn(1, 4, 12, 12,
                                                                                               generator=g), 12),
            ("qwen21", {k: t.contiguous() for k, t in diffusers_qwen21().state_dict().items()},
             torch.randn(1, 64, 4, 4, generator=g), 32)):
        path = tmp_path / f"{name}.safetensors"
        save_file(sd, str(path))
        save_file({"x": x}, str(tmp_path / f"{name}.in.safetensors"))
        want[name] = vae.load(path).decode(x)
        cases.append({"name": name, "vae": str(path), "op": "decode", "input": str(tmp_path / f"{name}.in.safetensors"),
                      "kw": {"tile": kw}})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "dist_worker.py"), "--rank", str(r), "--world", "2",
                               "--init", f"file://{tmp_path / 'rendezvous'}", "--cases", str(tmp_path / "cases.json"),
                               "--out", str(out), "--apart"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    for r in range(2):
        status = json.loads((out / f"status.{r}.json").read_text())["status"]
        for name, w in want.items():
            assert status[name] == "ok", status[name]
            assert (load_file(str(out / f"{name}.{r}.safetensors"))["y"] - w).abs().max() <= 1e-4


# ---- exact tiles' own pieces ---------------------------------------------------------------------------

def test_a_whole_module_runs_where_the_tiles_compute(kl, monkeypatch):
    """At a whole-tensor round (attention at latent resolution) the module runs on the compute device,
    not on the host where parked tiles' payloads wait."""
    z = torch.randn(1, 4, 12, 10)
    with torch.inference_mode():
        want = kl.decode(z, tile=12, mode="exact")
    seen = []
    real = exact._answer

    def spy(expect, *args, **kwargs):
        if expect.kind == "whole":
            forward = expect.module.forward
            monkeypatch.setattr(expect.module, "forward",
                                lambda x, *a, **k: seen.append(device_of(x)) or forward(x, *a, **k))
        return real(expect, *args, **kwargs)
    monkeypatch.setattr(exact, "_answer", spy)
    try:
        with Apart():
            kl.to("cuda")
            with torch.inference_mode():
                got = kl.decode(z, tile=12, mode="exact")
    finally:
        kl.to("cpu")
    _same([want], [got])
    assert seen and set(seen) == {CUDA}


# ---- the nodes ---------------------------------------------------------------------------------------

def test_the_nodes_default_decode_on_the_device(pack, kl, monkeypatch):
    """Tiled Decode as ComfyUI runs it on a GPU machine: the weights wait on the CPU (the offload device),
    the memory manager is told the call's need on the load device before it loads them there, then the
    node's default (exact tiles, GroupNorm rounds with parked tiles) runs on the device, its result on the
    intermediate device."""
    import types
    from vaekit.nodes import _comfy, patcher
    from vaekit.nodes.socket import VAEKitVAE
    z = torch.randn(1, 4, 40, 36)
    with torch.inference_mode():
        want = kl.decode(z, tile=64, overlap=8, mode="exact")
    p = patcher.Patcher(kl.model, "cuda", "cpu")
    loads = []

    def load_models_gpu(models, memory_required=0, **kw):
        loads.append((memory_required, kl.device))
        for m in models:
            m.patch_model(device_to=m.load_device)
    mm = types.SimpleNamespace(load_models_gpu=load_models_gpu, intermediate_device=lambda: CPU,
                               get_free_memory=lambda device=None: torch.cuda.mem_get_info(device)[0],
                               throw_exception_if_processing_interrupted=lambda: None)
    monkeypatch.setattr(_comfy, "model_management", lambda: mm)
    monkeypatch.setitem(_comfy._patchers, kl.model, p)
    dec = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]()
    try:
        with Apart():
            need = kl.memory_needed(tuple(z.shape), tile=64, overlap=8, tile_frames=None, mode="exact", device="cuda")
            (images,) = dec.decode({"samples": z}, VAEKitVAE(kl), tile_size=64, overlap=8)
            assert kl.device == CUDA
    finally:
        kl.to("cpu")
    assert loads == [(need, CPU)] and need != kl.memory_needed(tuple(z.shape), tile=64, overlap=8, mode="exact")
    assert device_of(images) == CPU
    assert (images - want.movedim(1, -1)).abs().max() <= 1e-5
