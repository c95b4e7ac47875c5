"""Exact within a memory budget: tiles run one after the other where they need not meet (vae/engine/stages.py),
paused tiles wait on the offload device where they must (vae/engine/park.py), and the planner picks tile and
chunk for a budget from the meta-device measurement (vae/engine/budget.py, vae/engine/memory.py)."""
from __future__ import annotations

import logging

import pytest
import torch

import vae
from helpers import count_parked, diffusers_kl
from vae.engine import budget, exact, memory
from vae.errors import InputError
from video_families import USER_TILED

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def kl():
    return vae.from_state_dict(diffusers_kl(widths=(32, 64, 64), layers=2).state_dict())


def _major(v, x, decode: bool, chunks=None) -> bool:
    r = v.caps.spatial_ratio
    fn = v.decode_fn() if decode else v.encode_fn()
    with torch.inference_mode():
        return exact.tile_major(fn, v.model, x, *((1, r) if decode else (r, 1)), chunks)


@pytest.mark.parametrize("family", USER_TILED)        # own tiles: exact = its definition (test_minimax.py)
def test_tile_major_order_equals_one_pass_for_every_family_that_allows_it(loaded, family):
    """Tile after tile, each through all its chunks with its own caches, maps between stages: the
    one-pass result, both ways. A family whose tiles share GroupNorm statistics cannot (and says so)."""
    v = loaded[family]
    r, rt = v.caps.spatial_ratio, v.caps.temporal_ratio
    z = torch.randn(1, v.caps.latent_channels, 4, 7, 6)
    x = torch.rand(1, 3, v.frames_for(4), 7 * r, 6 * r)
    major = _major(v, z, True)
    assert major == (v.caps.norm in ("rms", "none")), family
    if not major:
        with pytest.raises(ValueError, match="GroupNorm"), torch.inference_mode():
            exact.run_exact(v.decode_fn(), v.model, z, [[(0, 3), (3, 7)], [(0, 3), (3, 6)]], 1, r, CPU, order="tiles")
        return
    streams = v.caps.stream_decode
    kw = dict(tile=3 * r, mode="exact", tile_frames=rt if streams else None)
    assert (v.decode(z, **kw) - v.decode(z)).abs().max() <= 1e-5
    kw = dict(tile=3 * r, mode="exact", tile_frames=rt if v.caps.stream_encode else None)
    assert (v.encode(x, **kw) - v.encode(x)).abs().max() <= 1e-5


def test_tile_major_runs_one_tile_at_a_time(loaded):
    """The stage engine's working set: on the meta measurement (live bytes, before the calibration's
    fixed part), one interior tile of a 4x4 grid needs less than a quarter of an untiled pass, and the
    same for 4x the frames (caches end with the tile)."""
    v = loaded["wan"]
    r = v.caps.spatial_ratio
    shape = (1, 16, 3, 32, 32)
    whole = budget.predict(v, v.call_for("decode", shape, tile_frames=4), CPU, CPU).live
    tiled = budget.predict(v, v.call_for("decode", shape, tile=8 * r, mode="exact", tile_frames=4), CPU, CPU)
    longer = budget.predict(v, v.call_for("decode", (1, 16, 12, 32, 32), tile=8 * r, mode="exact", tile_frames=4),
                            CPU, CPU)
    assert tiled.live < whole / 4
    assert longer.live == tiled.live and longer.maps > tiled.maps > 0


def test_paused_tiles_moved_to_new_storage_change_nothing(kl, loaded):
    """Parking a paused tile empties its storages (on a GPU: their bytes to host memory) and refills them
    when it resumes. Forced on the CPU, a read of a parked storage, a pointer kept into it or a broken
    alias would change the result; it does not, and the tiles' activations are what is parked."""
    z = torch.randn(1, 4, 24, 20)
    cores = [[(0, 12), (12, 24)], [(0, 10), (10, 20)]]
    with torch.inference_mode(), pytest.MonkeyPatch.context() as mp:
        moved = count_parked(mp)
        plain = exact.run_exact(kl.decode_fn(), kl.model, z, cores, 1, 4, CPU)
        assert not moved                          # CPU: the offload device is the compute device
        parked = exact.run_exact(kl.decode_fn(), kl.model, z, cores, 1, 4, CPU, park_tiles="copy")
    with torch.inference_mode():
        whole = kl.decode_fn()(z)                 # unclamped, as the tiles' outputs
    assert (parked - plain).abs().max() <= 1e-5 and (plain - whole).abs().max() <= 1e-4
    tile_map = 64 * (12 * 4) * (10 * 4) * 4      # one tile's full-resolution activation map, bytes
    assert len(moved) > 10 and max(moved) >= tile_map
    m = loaded["mochi"]                           # streamed in time: the caches move too
    z = torch.randn(1, 12, 3, 6, 6)
    chunks = ([(0, 1), (1, 2), (2, 3)], [(0, 1), (1, 7), (7, 13)])
    with torch.inference_mode():
        out = exact.run_exact(m.decode_fn(), m.model, z, [[(0, 3), (3, 6)]] * 2, 1, 8, CPU, chunks=chunks,
                              park_tiles="copy")
    with torch.inference_mode():
        assert (out - m.decode_fn()(z)).abs().max() <= 1e-5


def test_parked_tiles_leave_the_device_in_the_measurement(kl):
    """With host memory as the offload device, the measured device working set of tiles meeting in
    rounds drops to about one tile's (the paused ones wait on the host; live bytes, before calibration)."""
    call = kl.call_for("decode", (1, 4, 96, 96), tile=64, mode="exact")
    on_cpu = budget.predict(kl, call, CPU, CPU)
    on_gpu = budget.predict(kl, call, torch.device("cuda"), CPU)
    assert on_gpu.live < on_cpu.live / 4 and on_gpu.maps > on_cpu.maps


def test_tracker_counts_live_storage_not_views():
    x = torch.empty(1000, device="meta")

    def call():
        a = x * 2                 # 4000 bytes
        v = a[:10]                # a view: nothing
        a.mul_(3)                 # in place: nothing
        b = a + v.sum()           # 4000 more (and a scalar)
        del a, v
        c = b * 2                 # b + c alive: 8000
        return c
    m = memory.measure(call, (x,))
    assert 12000 <= m.device <= 12100      # the input, then at most three 1000-float tensors alive


def test_a_map_born_on_the_offload_device_never_counts_on_the_compute_device():
    """A stage map (vae/engine/stages.py) is allocated, written through views and read back as slices; only
    the slice copied back for a tile is compute-device memory."""
    x = torch.empty(1000, device="meta")

    def call():
        with memory.placed_away():
            m = torch.empty(100_000, device="meta").zero_()      # 400 kB on the offload device
        m[:1000] = x * 2                  # a temporary on the device, written into the map: 4000
        part = m[5000:6000].clone()       # one slice back: 4000
        return m, part
    got = memory.measure(call, (x,))
    assert 8000 <= got.device <= 12100 and got.offload == 400_000


def test_the_output_born_where_it_lives_counts_nowhere_not_even_at_its_birth():
    """The output is allocated inside the call, where it lives (counted apart by the planner): the op
    that makes it sets no peak of the compute device. Reported after its birth instead, it did:
    LTX-Video 0.9's 220 MiB output at 512x768x49 in 128 px tiles was 231 MiB of the predicted live peak
    where a tile holds 205."""
    x = torch.empty(1000, device="meta")

    def call():
        with memory.placed_away(count=False):
            out = torch.empty(1_000_000, device="meta")
        out[:1000] = x * 2                # a temporary on the device, written into the output: 4000
        return out
    got = memory.measure(call, (x,))
    assert 8000 <= got.device <= 8100 and got.offload == 0


def test_an_exact_decode_whose_output_outweighs_its_tiles_predicts_the_tiles(loaded):
    """A video decode in small exact tiles: the live peak is a tile's, below the output's bytes (which the
    plan counts once, apart, on the output device)."""
    v = loaded["ltx"]
    r = v.caps.spatial_ratio
    call = v.call_for("decode", (1, v.caps.latent_channels, 5, 12, 12), tile=2 * r, mode="exact")
    p = budget.predict(v, call, CPU, CPU)
    assert p.live < p.output / 2, (p.live, p.output)


def test_the_planner_tries_tiles_down_to_the_widget_minimum_or_4_latent_pixels(loaded):
    """The smallest tile the planner tries: 4 latent pixels, or 64 px (the nodes' widget minimum) where
    that is fewer (LTX-Video's 32x latent: 2 latent pixels, where a quarter of one pass's working set fits
    at 512x768x49)."""
    for name, least in (("ltx", 64), ("wan", 32)):
        v = loaded[name]
        call = v.call_for("decode", (1, v.caps.latent_channels, 3, 16, 24), mode="exact")
        assert budget._candidates(v, call, None)[-1] == least, name


def test_a_convolutions_copies_count_on_the_cpu_only():
    """On the CPU every convolution reorders its weight (a transient copy as large as the weight): a
    wide convolution on a small input needs its weight's bytes again, which no factor over the
    activations gives (HunyuanVideo 1.5's up-sampler). A volumetric input in the contiguous layout is
    reordered too (the larger of input and output); channels-last is not. Devices that make no such
    copy are not charged."""
    conv = torch.nn.Conv3d(256, 1024, 3, padding=1).to("meta")
    weight = conv.weight.numel() * 4                     # 28 MiB
    x = torch.empty(1, 256, 2, 4, 4, device="meta")
    out = 4 * 2 * 4 * 4 * 1024
    m = memory.measure(lambda: conv(x), (x,), conv)
    assert m.device < weight / 100                       # activations: the input and the output
    assert m.copies == m.device + weight + out
    assert memory.working(m, CPU) >= weight
    assert memory.working(m, torch.device("cuda")) == memory.calibrated(m.device, torch.device("cuda"))
    wide = torch.nn.Conv3d(8, 8, 3, padding=1).to("meta")
    for fmt, extra in ((torch.contiguous_format, 1), (torch.channels_last_3d, 0)):
        y = torch.empty(1, 8, 4, 32, 32, device="meta").contiguous(memory_format=fmt)
        m = memory.measure(lambda: wide(y), (y,), wide)
        assert m.copies == m.device + wide.weight.numel() * 4 + extra * y.numel() * 4


@pytest.mark.parametrize("name", ["wan", "kl"])
def test_the_plan_never_exceeds_its_budget_and_takes_the_largest_tile_that_fits(loaded, kl, name):
    """Wan on the CPU (tiles one after the other); SD-shape KL planned for a GPU, whose paused tiles wait
    in host memory (on the CPU they are all alive whatever the tile)."""
    v = loaded["wan"] if name == "wan" else kl
    dev = CPU if name == "wan" else torch.device("cuda")
    shape = (1, 16, 5, 32, 32) if name == "wan" else (1, 4, 64, 64)
    call = v.call_for("decode", shape, mode="exact")
    whole = budget.plan(v, call, 1 << 40, dev, CPU, CPU)
    assert whole.call.tile >= 32 * v.caps.spatial_ratio        # untiled fits a huge budget
    small = budget.predict(v, v.call_for("decode", shape, tile=16 * v.caps.spatial_ratio, mode="exact"), dev, CPU)
    small = budget.on_device(small, dev, CPU, CPU)
    for share in (0.9, 0.6, 0.3):
        b = int(small + share * (whole.on_device() - small))
        p = budget.plan(v, call, b, dev, CPU, CPU)
        assert p.on_device() <= b
        sizes = budget._candidates(v, call, None)
        i = sizes.index(p.call.tile)
        if i > 0:                 # the next larger tile would not have fit
            larger = budget.predict(v, v.call_for("decode", shape, tile=sizes[i - 1], mode="exact"), dev, CPU)
            assert budget.on_device(larger, dev, CPU, CPU) > b


def test_an_impossible_budget_names_the_smallest_that_works(loaded):
    v = loaded["wan"]
    with pytest.raises(InputError, match=r"budget.*no tile or chunk fits a memory budget.*at least [0-9.]+ GB"):
        v.decode(torch.randn(1, 16, 3, 16, 16), mode="exact", budget=4096)


def _need(v, shape, **kw) -> int:
    return budget.on_device(budget.predict(v, v.call_for("encode", shape, mode="exact", **kw), CPU, CPU), CPU, CPU, CPU)


def test_an_exact_encode_within_a_budget_streams_the_clip_then_tiles_it(loaded):
    """The issue's origin case in small: LTX's encoder is causal, so when one pass does not fit the
    planner keeps the frame whole and cuts the clip in time (a chunk costs no recomputation), the
    longest chunk that fits; below one latent frame's need it tiles too, each tile streamed. Every
    plan fits its budget; the streamed one gives the latents and the posterior of one pass (exact tiles
    streamed in time: test_exact.py, test_posterior.py)."""
    v = loaded["ltx"]
    r, s = v.caps.temporal_ratio, v.caps.spatial_ratio
    x = torch.rand(1, 3, 1 + 2 * r, 16 * s, 16 * s)          # large enough for 4-pixel tiles to save memory
    need = {n: _need(v, x.shape, tile_frames=n * r) for n in (1, 2)}     # untiled, n latent frames a chunk
    whole, tiled = _need(v, x.shape), _need(v, x.shape, tile=4 * s, tile_frames=r)
    assert tiled < need[1] < whole          # (2 latent frames a chunk are the whole clip but its first frame)
    one = v.encode(x), v.encode(x, posterior=True)
    for b in ((need[1] + whole) // 2, (tiled + need[1]) // 2):
        p = budget.plan(v, v.call_for("encode", x.shape, mode="exact"), b, CPU, CPU, CPU)
        fits = [n for n, m in need.items() if m <= b]
        assert p.on_device() <= b and p.route.chunk == (max(fits) if fits else 1), b
        assert (p.route.cores is not None) == (not fits) and "latent frame" in p.describe()
        if not fits:
            continue
        assert (v.encode(x, mode="exact", budget=b) - one[0]).abs().max() <= 1e-4
        for got, want in zip(v.encode(x, mode="exact", budget=b, posterior=True), one[1]):
            assert (got - want).abs().max() <= 1e-4


def test_an_encode_that_fits_no_budget_names_the_frames_and_the_smallest_budget(loaded):
    """The refusal of an encode speaks of what to encode (not of a latent to decode), names a budget
    that the smallest plan fits, and says when the encoder cannot run in time chunks and why (from
    its capabilities: HunyuanVideo 1.0 and CogVideoX normalise over the whole clip)."""
    ltx, hv = loaded["ltx"], loaded["hunyuan_video"]
    x = torch.rand(1, 3, 17, 64, 64)
    with pytest.raises(InputError, match=r"budget.*this encode.*at least ([0-9.]+) GB.*shorter clip or smaller "
                                         r"frames \(fewer pixel frames or pixels\)") as e:
        ltx.encode(x, mode="exact", budget=4096)
    assert "decode" not in str(e.value) and "latent frame a chunk" in str(e.value)
    smallest = float(str(e.value).split("at least ")[1].split(" GB")[0])
    assert ltx.encode(x, mode="exact", budget=float(smallest)).shape == ltx.encode(x).shape
    for v in (hv, loaded["cogvideox"]):      # CogVideoX: one pass over the clip, GroupNorm over all its frames
        assert not budget.streams(v, v.call_for("encode", (1, 3, 9, 32, 32), mode="exact"))
        with pytest.raises(InputError, match="normalises over the whole clip.*whole clip in every tile"):
            v.encode(torch.rand(1, 3, 9, 32, 32), mode="exact", budget=4096)


def test_a_planned_call_logs_its_plan_and_gives_the_exact_result(loaded, caplog):
    v = loaded["wan"]
    z = torch.randn(1, 16, 5, 32, 24)
    smallest = budget.predict(v, v.call_for("decode", z.shape, tile=64, mode="exact", tile_frames=4), CPU, CPU)
    with caplog.at_level(logging.INFO, logger="VAEKit"):
        out = v.decode(z, mode="exact", budget=budget.on_device(smallest, CPU, CPU, CPU) * 11 // 10)
    assert (out - v.decode(z)).abs().max() <= 1e-5
    line = next(r.message for r in caplog.records if "predicted on cpu" in r.message)
    assert "exact" in line and "px tiles" in line and "budget" in line and "output" in line


def test_the_cpu_allocator_is_trimmed_when_it_grows_however_far_from_the_calls_limit(monkeypatch):
    """``keep_within`` trims when the resident memory has risen a thirty-second of the call's limit above
    the lowest it was at a check since the last trim, also far below the limit: the stretch after a
    check needs the room the allocator's freed blocks would hold (Wan 2.1 512x768x9 in 1.25 GiB went
    over its plan while they were kept until seven eighths of it). Outside ``host_limit`` (or on
    another device) never."""
    rss, trims = [1000], []
    monkeypatch.setattr(memory, "_resident", lambda: rss[0])
    monkeypatch.setattr(memory, "trim", lambda: trims.append(rss[0]))
    memory.keep_within()
    with memory.host_limit(3200, torch.device("meta")):
        rss[0] = 5000
        memory.keep_within()
    assert trims == []
    rss[0] = 1000
    with memory.host_limit(3200, CPU):          # trims once at the start: where the call begins
        assert trims == [1000]
        # 100 = 3200 / 32: 1100 is not past it, 1101 is (and far below 1000 + 7/8 of the limit)
        for r in (1100, 1101, 1150, 1202, 1050, 1140, 1151):
            rss[0] = r
            memory.keep_within()
    assert trims == [1000, 1101, 1202, 1151]
    rss[0] = 9000
    memory.keep_within()
    assert len(trims) == 4


def test_a_budgeted_call_on_the_cpu_holds_the_allocator_to_its_plan(loaded, monkeypatch):
    """Inside a planned call on the CPU, the exact engine checks the resident memory at its re-cut
    points against the plan's prediction (vae/engine/memory.py: host_limit); the planner's dry runs
    before it check against nothing."""
    v = loaded["wan"]
    z = torch.randn(1, 16, 3, 32, 24)
    limits = []
    monkeypatch.setattr(memory, "keep_within", lambda: limits.append(memory._HOST_LIMIT.get()))
    smallest = budget.predict(v, v.call_for("decode", z.shape, tile=64, mode="exact", tile_frames=4), CPU, CPU)
    b = budget.on_device(smallest, CPU, CPU, CPU) * 11 // 10
    p = budget.plan(v, v.call_for("decode", z.shape, mode="exact"), b, CPU, CPU, CPU)
    v.decode(z, mode="exact", budget=b)
    run = [h for h in limits if h is not None]
    assert run and len(run) < len(limits) and all(h.limit == p.on_device() for h in run)
    assert memory._HOST_LIMIT.get() is None


def test_out_of_memory_replans_with_half_the_budget(loaded, monkeypatch, caplog):
    v = loaded["wan"]
    seen = []
    real = budget.plan

    def plan(handle, call, b, **where):
        seen.append(b)
        p = real(handle, call, b, **where)
        if len(seen) == 1:
            monkeypatch.setattr(v, "_engine", lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("x")))
        else:
            monkeypatch.undo()
            monkeypatch.setattr(budget, "plan", plan)
        return p
    monkeypatch.setattr(budget, "plan", plan)
    z = torch.randn(1, 16, 2, 16, 16)
    out = v.decode(z, mode="exact", budget=1 << 34)
    assert seen[:2] == [1 << 34, 1 << 33] and out.shape[2] == 5


def test_exact_is_the_default_of_the_tiled_nodes_and_the_cli(pack):
    from vae.cli.commands import _parser
    for name in ("VAEKitTiledDecode", "VAEKitTiledEncode"):
        spec = pack.NODE_CLASS_MAPPINGS[name].INPUT_TYPES()["optional"]
        assert spec["mode"][0][0] == "exact" and spec["mode"][1]["default"] == "exact"
        assert "fast" in spec["mode"][0] and "seams" in spec["mode"][1]["tooltip"]
        assert spec["max_memory"][1]["default"] == 0.0
    a = _parser().parse_args(["decode", "--vae", "v.safetensors", "z.latent"])
    assert a.mode == "exact" and a.max_memory is None
