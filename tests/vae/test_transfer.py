"""vae/engine/transfer.py without a GPU: which copies go through pinned memory, plain copies on the CPU,
and, with CPU copies made to land late as CUDA copies do (``DEFER``), every engine waits for what it
copied out before it reads it: the output, the maps between stages, parked tiles, blended tiles."""
from __future__ import annotations

import pytest
import torch

from vae.engine import exact, transfer

pytestmark = pytest.mark.usefixtures("one_thread")

CPU, CUDA, META = torch.device("cpu"), torch.device("cuda"), torch.device("meta")


def test_pinned_and_asynchronous_only_between_a_cuda_device_and_host_memory(monkeypatch):
    assert transfer.pins(CUDA, CPU) and transfer.pins(torch.device("cuda", 1), CPU)
    assert not any(transfer.pins(d, h) for d, h in [(CPU, CPU), (CUDA, CUDA), (META, META), (CPU, CUDA),
                                                    (torch.device("mps"), CPU)])
    monkeypatch.setattr(transfer, "ASYNC", False)            # the switch back to plain copies
    assert not transfer.pins(CUDA, CPU)


def test_on_the_cpu_every_copy_is_plain_and_done_at_once():
    t = transfer.Transfers()
    x = torch.randn(2, 3, 4, 5)
    got = []
    t.to_host(x, CPU, got.append)
    assert got[0] is x                                        # already there: handed on as it is
    c = t.copy_to_host(x, CPU)
    assert torch.equal(c, x) and c.data_ptr() != x.data_ptr()
    view = x[:, :, 1:3, 2:4]
    d = t.to_device(view, CPU, torch.channels_last)
    assert torch.equal(d, view) and d.is_contiguous(memory_format=torch.channels_last)
    assert t.to_device(x, CPU, copy=False) is x
    y = x.clone()
    s = y.untyped_storage()
    away = t.park(s, CPU)
    assert s.nbytes() == 0 and y.untyped_storage().nbytes() == 0       # emptied, still y's storage
    t.unpark(s, away)
    assert torch.equal(y, x) and y.untyped_storage()._cdata == s._cdata
    assert t.copied == 0                                      # nothing went asynchronously


def test_deferred_copies_land_only_when_waited_for(monkeypatch):
    monkeypatch.setattr(transfer, "DEFER", True)
    t = transfer.Transfers()
    x, dst = torch.randn(8), torch.zeros(8)
    t.to_host(x, CPU, dst.copy_)
    early = t.copy_to_host(x, CPU)
    assert not dst.any() and torch.isnan(early).all()        # in flight: nothing there yet
    x.fill_(7)                                                # the source changes after the copy was made
    t.wait()
    assert torch.equal(dst, early) and not (dst == 7).any()  # what was copied is what x was then
    assert t.copied == 2 * x.nbytes


def test_too_much_in_flight_lands_the_oldest(monkeypatch):
    monkeypatch.setattr(transfer, "DEFER", True)
    monkeypatch.setattr(transfer, "MAX_PENDING", 100)
    t = transfer.Transfers()
    a, b = torch.zeros(16), torch.zeros(16)                   # 64 bytes each
    t.to_host(torch.ones(16), CPU, a.copy_)
    assert not a.any()
    t.to_host(torch.ones(16), CPU, b.copy_)
    assert a.all() and not b.any()                            # 128 > 100: the first one landed


def test_empty_cache_between_stages_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    transfer.between_stages(CPU)
    transfer.between_stages(META)
    assert not calls
    transfer.between_stages(CUDA)
    assert calls == [1]
    monkeypatch.setattr(transfer, "EMPTY_CACHE_BETWEEN_STAGES", False)
    transfer.between_stages(CUDA)
    assert calls == [1]


@pytest.mark.parametrize("family", ["wan", "kl"])
def test_every_engine_waits_for_its_copies(monkeypatch, loaded, family):
    """Exact tiles one after the other (Wan: maps between stages, the output per chunk), exact tiles in
    rounds with parked tiles moved to new storages (KL), fast tiles blended, streamed chunks: the same
    result with copies that land late as with copies done at once. A read before the wait would find
    NaN (what a copy in flight leaves) and change it."""
    from helpers import diffusers_kl
    import vae
    v = loaded["wan"] if family == "wan" else vae.from_state_dict(diffusers_kl().state_dict())
    if family == "wan":
        z = torch.randn(1, 16, 3, 8, 8)
        calls = [dict(tile=32, mode="exact"), dict(tile=32, overlap=8), dict()]
    else:
        z = torch.randn(1, 4, 12, 10)                          # 2x: 2x2 tiles of 12 px
        calls = [dict(tile=12, mode="exact"), dict(tile=12, overlap=4)]
    cores = [[(0, 6), (6, 12)], [(0, 5), (5, 10)]]
    with torch.inference_mode():
        plain = [v.decode(z, **kw) for kw in calls]
        rounds = exact.run_exact(v.decode_fn(), v.model, z, cores, 1, 2, CPU) if family == "kl" else None
        monkeypatch.setattr(transfer, "DEFER", True)
        for kw, want in zip(calls, plain):
            assert torch.equal(v.decode(z, **kw), want), kw
        if family == "kl":             # paused tiles parked on new storages, which land late too
            parked = exact.run_exact(v.decode_fn(), v.model, z, cores, 1, 2, CPU, park_tiles="copy")
            assert (parked - rounds).abs().max() <= 1e-5         # new storages: other alignment, other rounding


class _FakeStream:
    def __init__(self, device=None):
        self.waits = 0

    def wait_stream(self, other) -> None:
        self.waits += 1


class _FakeEvent:
    made: list = []

    def __init__(self):
        self.recorded, self.queries, self.synced = None, 0, False
        _FakeEvent.made.append(self)

    def record(self, stream) -> None:
        self.recorded = stream

    def query(self) -> bool:            # in flight on the first look, done on the second
        self.queries += 1
        return self.queries > 1

    def synchronize(self) -> None:
        self.synced = True


def test_the_cuda_path_runs_on_fake_streams(monkeypatch, loaded):
    """The CUDA branch of every copy (staging, own stream, events, parked storages, pinned gathers) run
    on the CPU with stand-in streams and events: the same results, every copy recorded on the side
    stream after waiting for the compute stream, and no device-wide synchronize."""
    import contextlib

    from helpers import diffusers_kl
    import vae
    kl = vae.from_state_dict(diffusers_kl().state_dict())
    z_kl, z_wan = torch.randn(1, 4, 12, 10), torch.randn(1, 16, 3, 8, 8)
    cores = [[(0, 6), (6, 12)], [(0, 5), (5, 10)]]
    wan = loaded["wan"]
    with torch.inference_mode():
        want = [wan.decode(z_wan, tile=32, mode="exact"), wan.decode(z_wan, tile=32, overlap=8),
                kl.decode(z_kl, tile=12, overlap=4),
                exact.run_exact(kl.decode_fn(), kl.model, z_kl, cores, 1, 2, CPU)]
    compute, side = _FakeStream(), []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: side.append(_FakeStream()) or side[-1])
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("a device-wide synchronize"))
    monkeypatch.setattr(transfer, "pins", lambda device, host: True)
    monkeypatch.setattr(transfer, "_pinned", lambda like, memory_format=None: torch.empty(
        like.shape, dtype=like.dtype, memory_format=memory_format or transfer._format(like)))
    _FakeEvent.made = []
    with torch.inference_mode():
        got = [wan.decode(z_wan, tile=32, mode="exact"), wan.decode(z_wan, tile=32, overlap=8),
               kl.decode(z_kl, tile=12, overlap=4),
               exact.run_exact(kl.decode_fn(), kl.model, z_kl, cores, 1, 2, CPU, park_tiles="copy")]
    for g, w in zip(got, want):
        assert (g - w).abs().max() <= 1e-5
    assert len(_FakeEvent.made) > 20 and all(e.recorded is not None for e in _FakeEvent.made)
    assert all(e.synced or e.queries > 1 for e in _FakeEvent.made)      # each landed: waited for, or seen done
    assert side and sum(s.waits for s in side) == len(_FakeEvent.made)  # every copy after the compute stream
