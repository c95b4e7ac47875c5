"""bench/run.py and the declarations it reads (bench/harness/families.py, runs.py): inputs of the declared
shapes, run parameters, and one decode table run end to end."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from harness import runs  # noqa: E402
from harness.families import FAMILIES, shape  # noqa: E402


@pytest.mark.parametrize("family, op, size, want", [
    ("wan", "decode", "64x96x17", (1, 16, 5, 8, 12)),
    ("wan", "encode", "64x96x17", (1, 3, 17, 64, 96)),
    ("kl", "decode", "64x64x1", (1, 4, 8, 8)),
    ("minimax", "decode", "64x64x39", (1, 24, 12, 4, 4)),       # 17k + 5 frames -> 5k + 2 latent frames
    ("svd", "decode", "64x64x6", (6, 4, 8, 8)),                # the LATENT's frames on its batch axis
])
def test_inputs_have_the_declared_shapes(family, op, size, want):
    assert shape(FAMILIES[family], op, size) == want


def test_a_run_parameter_names_its_tile_and_overlap():
    a = SimpleNamespace(family="wan", tile="", param="")
    assert runs.tile_of(a) == (FAMILIES["wan"].tile, FAMILIES["wan"].tile // 4)
    assert runs.tile_of(SimpleNamespace(**{**vars(a), "param": "512/64"})) == (512, 64)
    assert runs.tile_of(SimpleNamespace(**{**vars(a), "tile": "256"})) == (256, 64)


def test_run_without_a_kind_lists_the_kinds():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py")], capture_output=True, text=True)
    assert out.returncode and "distributed" in out.stderr and "framewise" in out.stderr


@pytest.mark.slow      # ~20 s on 2 cores: three runs, each in its own process
def test_a_decode_table_runs_each_run_in_its_own_process():
    pytest.importorskip("diffusers")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "decode", "--family", "kl", "--size",
                          "32x32x1", "--kinds", "one_pass,exact@16,diffusers"], capture_output=True, text=True)
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()
            if line.split()[:1] and line.split()[0] in ("one_pass", "exact@16", "diffusers")}
    assert "FAILED" not in out.stdout and set(rows) == {"one_pass", "exact@16", "diffusers"}, out.stdout + out.stderr
    assert float(rows["exact@16"][6]) < 1e-4 and float(rows["diffusers"][6]) < 1e-4     # max err vs one pass


def test_a_relative_budget_is_a_share_of_the_least_one_pass_before_it():
    import decode
    rows = [dict(run="diffusers", working_set_mib=4096.0), dict(run="face", working_set_mib=2048.0),
            dict(run="face@0.1", working_set_mib=100.0)]        # a run with a parameter is no one pass
    assert decode._resolved("face@0.25x", rows) == "face@0.5000"
    assert decode._resolved("face@1.5", rows) == "face@1.5" and decode._resolved("face", []) == "face"
    with pytest.raises(SystemExit):
        decode._resolved("face@0.25x", rows[2:])


@pytest.mark.slow      # six processes, each loading an SD-shape VAE: about a minute of CPU
def test_a_face_table_runs_diffusers_and_the_face_on_the_same_file():
    """Decode then encode: diffusers' class, the face, the face within a budget, each its own process."""
    pytest.importorskip("diffusers")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "face", "--family", "kl", "--size",
                          "32x32x1", "--kinds", "diffusers,face,face@2"], capture_output=True, text=True)
    tables = out.stdout.split("published config")[1:]
    assert "FAILED" not in out.stdout and len(tables) == 2, out.stdout + out.stderr
    for op, text in zip(("decode", "encode"), tables):
        rows = {line.split()[0]: line.split() for line in text.splitlines()
                if line.split()[:1] and line.split()[0] in ("diffusers", "face", "face@2")}
        assert f"; {op} at" in text and set(rows) == {"diffusers", "face", "face@2"}, text
        assert float(rows["face"][6]) < 1e-4 and float(rows["face@2"][6]) < 1e-4     # max err vs diffusers
