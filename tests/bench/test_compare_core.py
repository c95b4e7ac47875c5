"""bench/comfyui_checks/compare_core.py without ComfyUI core: every family declared with its cases, a dry
build and a section of docs/core_differences.md, ours loading a family's file at a tiny size, and --check's
verdict on parity rows."""
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from helpers import ROOT

SCRIPT = ROOT / "bench" / "comfyui_checks" / "compare_core.py"
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "bench" / "comfyui_checks")]
from core_families import FAMILIES  # noqa: E402
from harness import comfy_core  # noqa: E402


def test_every_family_declares_its_cases_and_dry_build():
    for name, fam in FAMILIES.items():
        assert fam.dry, name
        sizes = fam.variants(SimpleNamespace(sizes="tiny,published,int8,tiny_int8")) if fam.variants else [""]
        for size in sizes:
            cases = fam.cases(size) if callable(fam.cases) else fam.cases
            assert cases and all(c.op in ("decode", "encode") for c in cases.values()), (name, size)
            assert all(k in cases for k in fam.quick), name


def test_every_family_has_one_section_of_documented_differences_and_list_prints_it():
    from compare_core import differences
    docs = differences()
    assert sorted(docs) == sorted(FAMILIES) and all(docs.values())
    out = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for name, text in docs.items():
        assert f"{name}: {FAMILIES[name].title}\n    {text.splitlines()[0]}" in out.stdout


@pytest.mark.parametrize("family", ["stage_a", "seedvr2", "wan", "hunyuan_video", *(pytest.param(f, marks=pytest.mark.slow)
                                                         for f in ("ltx_diffusion", "mage", "minimax"))])
def test_dry_builds_ours_on_the_family_file(family):
    out = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--family", family], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"{family}: ours ") and "decode" in out.stdout and "encode" in out.stdout


def test_the_runners_import_the_families_as_a_package():
    """bench/run.py's writers (harness/families.py) import core_families.py with bench/ alone on the path."""
    code = "import sys; sys.path[:0] = [sys.argv[1]]; import comfyui_checks.core_families"
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "bench")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_check_fails_only_parity_rows_over_the_tolerance(capsys):
    table = comfy_core.Table(tol=1e-4, relative_encode=True)
    x = torch.zeros(1, 3, 4, 4)
    table.add("same", x, x)
    table.add("off, not parity", x, x + 1, parity=False)
    table.add("off", x, x + 1e-3)
    table.add("encode, small relative", x + 100, x + 100.005, kind="encode")
    assert comfy_core.failed(table.rows, 1e-4, relative_encode=True) == ["off"]
    assert comfy_core.failed(table.rows, 1e-4) == ["off", "encode, small relative"]
    assert "FAIL" in capsys.readouterr().out


def test_drop_in_scale_is_the_slope_of_ours_on_core():
    from core_dropin import scale
    core = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    assert scale(2 * core + 1, core) == pytest.approx(2.0)
    assert scale(core, core[:1]) != scale(core, core[:1])         # NaN where the shapes differ
