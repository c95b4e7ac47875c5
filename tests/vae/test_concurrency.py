"""One VAE shared by concurrent calls: every mode gives the sequential result and leaves the shared
modules as they were (run state belongs to the call, vae/run.py). The races seen before (exact runs
leaving wrapper forwards installed, a frame-wise decode beside a plain one returning wrong frames)
showed in 7 of 10 trials; each case here runs 10 trials of several calls at once."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from helpers import diffusers_kl, module_attrs

TRIALS = 10


def _together(calls) -> list:
    """Start every call at once (a barrier), wait for all; errors are raised."""
    barrier = threading.Barrier(len(calls))

    def go(call):
        barrier.wait()
        return call()
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(go, c) for c in calls]]


def _check(vae, calls: dict) -> None:
    attrs = module_attrs(vae.model)
    alone = {name: call() for name, call in calls.items()}
    for _ in range(TRIALS):
        got = _together(list(calls.values()))
        for name, y in zip(calls, got):
            assert y.shape == alone[name].shape, name
            assert (y - alone[name]).abs().max().item() <= 1e-6, name
    assert module_attrs(vae.model) == attrs


def test_video_vae_every_mode_at_once(loaded):
    v = loaded["magvit"]
    z = torch.randn(1, 16, 4, 4, 4, generator=torch.Generator().manual_seed(1))
    x = torch.rand(1, 3, 9, 32, 32, generator=torch.Generator().manual_seed(2))
    _check(v, {
        "plain": lambda: v.decode(z),
        "framewise+tiles": lambda: v.decode(z, tile_frames=4, tile=16, overlap=8),
        "exact+stream": lambda: v.decode(z, tile=16, tile_frames=4, mode="exact"),
        "encode streamed": lambda: v.encode(x, tile_frames=4),
    })


def test_image_vae_exact_runs_at_once():
    import vae
    v = vae.from_state_dict(diffusers_kl(widths=(32, 32)).state_dict())
    z = torch.randn(1, 4, 12, 10, generator=torch.Generator().manual_seed(3))
    x = torch.rand(1, 3, 48, 40, generator=torch.Generator().manual_seed(4))
    _check(v, {
        "exact a": lambda: v.decode(z, tile=32, mode="exact"),
        "exact b": lambda: v.decode(z, tile=48, mode="exact"),
        "fast": lambda: v.decode(z, tile=32, overlap=16),
        "exact encode": lambda: v.encode(x, tile=16, mode="exact"),
    })


def test_a_failed_call_beside_others_changes_nothing(loaded):
    """An interrupt in one thread's exact run does not disturb a concurrent one, and leaves nothing."""
    v = loaded["mochi"]
    z = torch.randn(1, 12, 3, 4, 4, generator=torch.Generator().manual_seed(5))
    want = v.decode(z, tile=16, mode="exact")
    attrs = module_attrs(v.model)

    def stop(done, total):
        if done > 3:
            raise KeyboardInterrupt

    def interrupted():
        with pytest.raises(KeyboardInterrupt):
            v.decode(z, tile=16, mode="exact", progress=stop)
        return want
    for _ in range(4):
        got = _together([interrupted, lambda: v.decode(z, tile=16, mode="exact")])
        assert (got[1] - want).abs().max().item() <= 1e-6
    assert module_attrs(v.model) == attrs
