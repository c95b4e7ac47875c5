"""Exact mode across ranks (torch.distributed, gloo, one process per rank on this CPU): every rank's
result equals the single-process untiled one within 1e-4 for the image families and one video family per
engine path (every video family under -m slow), decode
and encode, the time axis streamed and not (fast mode: the single-process tiled result); a failure or an interrupt on one rank ends the call on
every rank with that rank's message, and the ranks go on to the next call together.

Spawning a rank costs seconds (torch's import), so one launch per world size runs every case."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import mage_tiny
from helpers import ROOT, diffusers_hunyuan_image21, diffusers_kl, diffusers_qwen21, hunyuan_image3_file
from video_families import FAMILIES, OWN_TILES, RATIOS, tiny_state_dict

import vae

DEMO = ROOT / "vae" / "demo" / "vaekit_demo.safetensors"      # TAESD architecture, 8x
# latent sides where 2-latent tiles of a 4-latent map are too few: LTX-2.5's exact tiles merge an edge core
# narrower than its attention window into the neighbour (vae/engine/exact.py: edge_cores), one tile at 4
WIDE = {"ltx_diffusion": 8}


def _cases(d, families) -> tuple[list[dict], dict]:
    """The cases (the image families' and ``families``') and, per case, the single-process untiled result."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    cases, want = [], {}

    def add(name, path, op, x, mode="exact", **kw):
        """exact: the untiled result is the reference; fast: the single-process tiled one."""
        save_file({"x": x.contiguous()}, str(d / f"{name}.in.safetensors"))
        v = vae.load(path)
        steps = []                                  # the single-process run's work, in steps
        tiled = getattr(v, op)(x, mode=mode, progress=lambda done, total: steps.append(total), **kw)
        want[name] = getattr(v, op)(x) if mode == "exact" else tiled
        want[name + ".steps"] = steps[-1]
        cases.append({"name": name, "vae": str(path), "op": op, "input": str(d / f"{name}.in.safetensors"),
                      "kw": kw, "mode": mode})
    kl = d / "kl.safetensors"
    save_file({k: t.contiguous() for k, t in diffusers_kl().state_dict().items()}, str(kl))
    add("kl-decode", kl, "decode", torch.randn(1, 4, 12, 12, generator=g), tile=12)        # 3x3 tiles
    add("kl-encode", kl, "encode", torch.rand(1, 3, 24, 24, generator=g), tile=12)
    add("taesd-decode", DEMO, "decode", torch.randn(1, 8, 6, 6, generator=g), tile=24)     # 2x2 tiles
    qwen21 = d / "qwen21.safetensors"            # the Wan family's image variant (RMS norms, mid attention)
    save_file({k: t.contiguous() for k, t in diffusers_qwen21().state_dict().items()}, str(qwen21))
    add("qwen21-decode", qwen21, "decode", torch.randn(1, 64, 4, 4, generator=g), tile=32)
    add("qwen21-encode", qwen21, "encode", torch.rand(1, 3, 64, 64, generator=g), tile=32)
    # fast mode: independent tiles, each rank blends its share; the sum is the one-process result
    add("kl-decode-fast", kl, "decode", torch.randn(1, 4, 12, 12, generator=g), mode="fast", tile=12, overlap=4)
    add("taesd-encode-fast", DEMO, "encode", torch.rand(1, 3, 64, 64, generator=g), mode="fast", tile=32, overlap=8)
    for family in families:
        path = d / f"{family}.safetensors"
        save_file(tiny_state_dict(family), str(path))
        v = vae.load(path)
        s, r = RATIOS[family]
        n = WIDE.get(family, 4)
        z = torch.randn(1, v.caps.latent_channels, 3, n, n, generator=g)
        x = torch.rand(1, 3, 1 + 2 * r, n * s, n * s, generator=g)
        if family in OWN_TILES:     # its own units (2 chunks x 2x2 tiles of 256 px; 2x2 encode tiles) are shared
            z = torch.randn(1, v.caps.latent_channels, 8, 18, 17, generator=g)
            x = torch.rand(1, 3, 1, 18 * s, 17 * s, generator=g)
        add(f"{family}-decode", path, "decode", z, tile=2 * s)
        add(f"{family}-encode", path, "encode", x, tile=2 * s)
        if v.caps.stream_decode:              # each tile streams its chunks through its causal caches
            add(f"{family}-decode-streamed", path, "decode", z, tile=2 * s, tile_frames=r)
        if v.caps.stream_encode:
            add(f"{family}-encode-streamed", path, "encode", x, tile=2 * s, tile_frames=1 + r)
    hy21, hy3 = d / "hunyuan_image21.safetensors", d / "hunyuan_image3.safetensors"   # GroupNorm, DC-AE resamplers
    save_file({k: t.contiguous() for k, t in diffusers_hunyuan_image21().state_dict().items()}, str(hy21))
    save_file(hunyuan_image3_file(), str(hy3))                                      # 3.0: an image as four frames
    add("hunyuan_image21-decode", hy21, "decode", torch.randn(1, 64, 4, 4, generator=g), tile=64)
    add("hunyuan_image3-encode", hy3, "encode", torch.rand(1, 3, 64, 64, generator=g), tile=32)
    mage = d / "mage.safetensors"              # whole-image gates and windowed attention (tests/mage_tiny.py)
    save_file(mage_tiny.file_layout(mage_tiny.canonical()), str(mage))
    add("mage-decode", mage, "decode", torch.randn(1, 16, 6, 6, generator=g), tile=8)
    add("mage-encode", mage, "encode", torch.rand(1, 3, 24, 24, generator=g), tile=8)
    x = torch.randn(1, 4, 12, 12, generator=g)
    save_file({"x": x}, str(d / "fail.in.safetensors"))
    for name, extra in (("fail", {"fail_rank": 1}), ("interrupt", {"interrupt_rank": 0}), ("after", {})):
        cases.append({"name": name, "vae": str(kl), "op": "decode", "input": str(d / "fail.in.safetensors"),
                      "kw": {"tile": 12}, **extra})
    want["after"] = vae.load(kl).decode(x)
    return cases, want


def _launch(d, world: int, cases: list[dict]) -> list[dict]:
    (d / "cases.json").write_text(json.dumps(cases))
    out = d / f"world{world}"
    out.mkdir()
    init = f"file://{d / f'rendezvous{world}'}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "dist_worker.py"), "--rank", str(r), "--world",
                               str(world), "--init", init, "--cases", str(d / "cases.json"), "--out", str(out)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    reports = [json.loads((out / f"status.{r}.json").read_text()) for r in range(world)]
    return [r["status"] | {"_dir": str(out), "_steps": r["steps"]} for r in reports]


# the default run's video families: one per engine path (causal streams, GroupNorm rounds, causal frame
# attention, the model's own units, windowed attention, streaming memory, one unit, frames in the batch);
# every family in test_every_video_family_across_ranks (-m slow)
PATHS = ("wan", "mochi", "hunyuan_video15", "minimax", "ltx_diffusion", "taehv", "taeh3", "svd")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    return d, *_cases(d, PATHS)


@pytest.mark.parametrize("world", [2, 3])
def test_exact_across_ranks_equals_the_untiled_result(prepared, world):
    _check(*prepared, world)


@pytest.mark.slow
def test_every_video_family_across_ranks(tmp_path):
    _check(tmp_path, *_cases(tmp_path, FAMILIES), 2)


def _check(d, cases: list[dict], want: dict, world: int) -> None:
    status = _launch(d, world, cases)
    out = status[0]["_dir"]
    for case in cases:
        name = case["name"]
        if name in ("fail", "interrupt"):
            continue
        for rank in range(world):
            assert status[rank][name] == "ok", (name, rank, status[rank][name])
            y = load_file(f"{out}/{name}.{rank}.safetensors")["y"]
            assert y.shape == want[name].shape, name
            assert (y - want[name]).abs().max() <= 1e-4, (name, rank, (y - want[name]).abs().max().item())
        # the work was split: each rank ran only its tiles, together exactly the single-process run's (a call
        # of one unit, taeh3's clip here, runs on one rank: a rank without work reports no steps)
        if name == "after" or want[name + ".steps"] == 1:
            continue
        shares = [status[rank]["_steps"].get(name, 0) for rank in range(world)]
        assert sum(shares) == want[name + ".steps"] and max(shares) < want[name + ".steps"], (name, shares)
    # a failure on rank 1: every rank stops with rank 1's message
    for rank in range(world):
        assert status[rank]["fail"].startswith(f"RankFailed: rank 1 of {world} failed, so every rank stopped"), status[rank]["fail"]
        assert "injected failure on rank 1" in status[rank]["fail"]
    # an interrupt on rank 0: rank 0 is interrupted, the others stop saying so
    assert status[0]["interrupt"].startswith("KeyboardInterrupt")
    for rank in range(1, world):
        assert status[rank]["interrupt"].startswith(f"RankFailed: rank 0 of {world} failed") and "KeyboardInterrupt" in \
            status[rank]["interrupt"]
    # nothing left behind: the next call on the same VAE and group is exact again ("after" checked above)


def test_without_a_process_group_the_call_is_local_and_says_how():
    from vae.engine import distributed
    assert distributed.current() is distributed.LOCAL
    with pytest.raises(vae.VAEKitError, match="init_process_group"):
        with distributed.ranks():
            pass


def test_a_host_tensor_is_summed_through_the_device_in_bounded_pieces(tmp_path):
    """Under NCCL a host map (the whole output, a stage's map) is all-reduced through the GPU: piece by piece,
    so the GPU never holds the whole map beside the plan. Gloo ranks with the backend's device set apart
    from the tensors' stand in; the sum equals the whole-tensor sum."""
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "sum_check.py"), "--rank", str(r), "--world", "2",
                               "--init", init], env={**os.environ, "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    runs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, runs):
        assert p.returncode == 0, err[-3000:]
    for out, _ in runs:
        for name, r in json.loads(out.strip().splitlines()[-1]).items():
            assert r["same"], name                                   # summed into the caller's tensor
            assert not r["inside"], name                             # reduced in a buffer, not in the host tensor
            assert max(r["pieces"]) <= 4096 and sum(r["pieces"]) == r["bytes"], (name, r["pieces"])
            assert len(r["pieces"]) == -(-r["bytes"] // 4096), (name, r["pieces"])
