"""bench/gpu_check.py without a GPU: ``--device cpu --small`` runs the check's own code at tiny sizes with
the tests' tiny models; its table is printed and written line by line; a row that fails is reported in
its line and the next row runs; the time guard skips what would not fit and stops a row that overruns."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu_check  # noqa: E402

SCRIPT = str(ROOT / "bench" / "gpu_check.py")


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| row")]


def _run(tmp_path, *args, timeout=900) -> tuple[str, list[list[str]]]:
    out = tmp_path / "table.md"
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--small", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
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
                    "--out", str(out), "--workers", "1"])
    rows = _rows(out.read_text())
    assert rows[0][:3] == ["g", "beside ComfyUI core", "error"] and "ModuleNotFoundError" in rows[0][3]
    assert any(r[0] == "k" and r[2] == "info" for r in rows)


def _overrunning_row(monkeypatch) -> None:
    """Row z: one line, then 30 s of work (estimated at 1 s)."""
    def slow(env):
        yield gpu_check.Line("first", "info", "measured before the limit")
        time.sleep(30)
        yield gpu_check.Line("never", "info", "")
    monkeypatch.setitem(gpu_check.ROWS, "z", ("a row that overruns", slow))
    monkeypatch.setitem(gpu_check.ESTIMATE_S, "z", (1, 1))


def test_the_time_guard_skips_and_stops(tmp_path, monkeypatch):
    _overrunning_row(monkeypatch)
    out = tmp_path / "t.md"
    t0 = time.perf_counter()
    gpu_check.main(["--device", "cpu", "--small", "--rows", "zc", "--limit", "4", "--out", str(out), "--workers", "1"])
    assert time.perf_counter() - t0 < 25
    rows = _rows(out.read_text())
    assert rows[0][1:3] == ["first", "info"]
    assert rows[1][2] == "skipped" and "stopped at the run's time limit" in rows[1][3]
    assert rows[2][0] == "c" and rows[2][2] == "skipped"                  # the rest: not started


def test_a_row_past_its_own_limit_is_stopped_and_the_next_runs(tmp_path, monkeypatch):
    _overrunning_row(monkeypatch)
    monkeypatch.setattr(gpu_check, "row_limit", lambda env, key: 2 if key == "z" else 60)
    out = tmp_path / "t.md"
    t0 = time.perf_counter()
    gpu_check.main(["--device", "cpu", "--small", "--rows", "zg", "--out", str(out), "--workers", "1"])
    assert time.perf_counter() - t0 < 25
    rows = _rows(out.read_text())
    assert rows[1][2] == "skipped" and "stopped at its own limit" in rows[1][3]
    assert rows[2][:3] == ["g", "beside ComfyUI core", "skipped"]        # ran: no --comfyui given


def test_fit_is_conservative():
    factor, fixed, envelope = gpu_check.fit([(100, 250), (200, 420), (400, 800)])
    assert 1.8 < factor < 2.0 and all(m <= factor * live + envelope for live, m in [(100, 250), (200, 420), (400, 800)])
    assert envelope >= fixed
