"""bench/gpu_check.py without a GPU: ``--device cpu --small`` runs the check's own code at tiny sizes with
the tests' tiny models; its table is printed and written line by line; a row that fails, dies or
overruns its share of the time is reported in its line and the next row runs (rows that fail on purpose:
tests/bench/gpu_check_rows.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu_check  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import gpu_check_rows  # noqa: E402

SCRIPT = str(ROOT / "bench" / "gpu_check.py")
ROWS_SCRIPT = str(Path(__file__).parent / "gpu_check_rows.py")


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| row")]


def _run(tmp_path, *args, timeout=900, script=SCRIPT, env=None) -> tuple[str, list[list[str]]]:
    out = tmp_path / "table.md"
    proc = subprocess.run([sys.executable, script, "--device", "cpu", "--small", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=str(ROOT), env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = out.read_text()
    assert written.strip() in proc.stdout            # the file holds what was printed
    return written, _rows(written)


def test_small_run_of_rows_a_to_g(tmp_path):
    """Rows a-g at --small (row a on one family; n, two CPU ranks, only in the slow test): every line
    that checks something passed, the lines needing CUDA say so, and the calibration fit was printed."""
    text, rows = _run(tmp_path, "--rows", "abdekcfg", "--families", "kl")
    assert "**VAEKit GPU check** - CPU" in text and "torch " in text
    assert [r[0] for r in rows if r[1].startswith("kl (")] == ["a"]
    assert {r[0] for r in rows} == set("abdekcfg")
    bad = [r for r in rows if r[2] in ("FAIL", "error") or "stopped" in r[3]]
    assert not bad, bad
    checked = {r[0] for r in rows if r[2] == "ok"}
    assert checked >= set("abdecf"), checked            # each of these rows compared figures with a target
    assert {r[0] for r in rows if r[2] == "needs CUDA"} == set("bef")
    fit = [r for r in rows if r[1].startswith("fit of reserved")]
    assert fit and "factor" in fit[0][3]
    assert any(r[1].startswith("calibration in use on cpu") and "measured" in r[3] for r in rows)


@pytest.mark.slow
def test_the_whole_small_run(tmp_path):
    """Every row at --small, n (two CPU ranks) included (a few minutes on 2 cores: see docs/gpu.md)."""
    _, rows = _run(tmp_path, "--rows", gpu_check.ORDER, timeout=1800)
    assert {r[0] for r in rows} == set(gpu_check.ORDER)
    bad = [r for r in rows if r[2] in ("FAIL", "error")]
    assert not bad, bad
    assert [r for r in rows if r[0] == "g"][0][2] == "skipped"          # no --comfyui here


def test_a_failing_row_is_reported_and_the_next_runs(tmp_path, capsys):
    out = tmp_path / "t.md"
    gpu_check.main(["--device", "cpu", "--small", "--rows", "gk", "--comfyui", str(tmp_path / "no-comfyui"),
                    "--out", str(out)])
    rows = _rows(out.read_text())
    assert rows[0][:3] == ["g", "beside ComfyUI core", "error"] and "ModuleNotFoundError" in rows[0][3]
    assert any(r[0] == "k" and r[2] == "info" for r in rows)


def _by_row(rows: list[list[str]], key: str) -> list[list[str]]:
    return [r for r in rows if r[0] == key]


@pytest.mark.slow      # 30-60 s on 2 cores (tests/bench stays fast)
def test_a_row_that_dies_or_overruns_ends_alone(tmp_path):
    """Each row runs in a process of its own: one that dies (as a sticky device error can end it) gets a
    line with its exit and what it had reached; one that ignores its limit is killed; one stopped at its
    limit says what it reached; the rows after each of them run."""
    t0 = time.perf_counter()
    _, rows = _run(tmp_path, "--rows", "yhzg", "--limit", "45", script=ROWS_SCRIPT)
    assert time.perf_counter() - t0 < 90
    y = _by_row(rows, "y")
    assert y[0][1:3] == ["first", "info"]
    assert y[1][2] == "error" and "signal SIGABRT" in y[1][3] and gpu_check_rows.DEVICE_ERROR in y[1][3]
    assert "reached: 2/5 units of work" in y[1][3]
    h = _by_row(rows, "h")
    assert h[0][2] == "stopped" and "killed" in h[0][3] and "reached: a call that never returns" in h[0][3]
    z = _by_row(rows, "z")
    assert z[0][1:3] == ["first", "info"]
    assert z[1][2] == "stopped" and "at its limit" in z[1][3] and "reached: half of the work" in z[1][3]
    assert _by_row(rows, "g")[0][2] == "skipped"                    # no --comfyui given, or no time left


@pytest.mark.slow      # 30-60 s on 2 cores (tests/bench stays fast)
def test_rows_b_and_c_stopped_in_their_calls_say_what_they_reached(tmp_path):
    """Every progress report waits 10 minutes: rows b and c reach their limits inside their exact calls,
    and their lines give the units of work done, the time and the memory so far."""
    _, rows = _run(tmp_path, "--rows", "bc", "--limit", "60", script=ROWS_SCRIPT, env={"SLOW_PROGRESS": "1"})
    for key in "bc":
        stopped = [r for r in _by_row(rows, key) if r[2] == "stopped"]
        assert stopped, _by_row(rows, key)
        assert "units of work" in stopped[0][3] and "working set so far" in stopped[0][3], stopped


def test_each_row_has_its_share_of_the_time_left():
    env = SimpleNamespace(left=lambda: 300.0, small=False, comfyui=None, cuda=False)
    est = {k: gpu_check.ESTIMATE_S[k][0] for k in "bcg"}
    assert gpu_check.row_limit(env, "b", "cg") == pytest.approx(300 * est["b"] / (est["b"] + est["c"]))
    env.comfyui = "ComfyUI"                                    # now row g runs, and takes its share
    assert gpu_check.row_limit(env, "b", "cg") == pytest.approx(300 * est["b"] / sum(est.values()))


def test_fit_is_conservative():
    factor, fixed, envelope = gpu_check.fit([(100, 250), (200, 420), (400, 800)])
    assert 1.8 < factor < 2.0 and all(m <= factor * live + envelope for live, m in [(100, 250), (200, 420), (400, 800)])
    assert envelope >= fixed
