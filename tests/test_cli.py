"""The headless main job: `python -m vae ...` from the repo root, as the README gives it; and the
CLI's contract for mistakes: one line per error, exit 2 for usage and 1 for failures, no traceback
unless --debug, outputs checked before any work, whole writes, counters, prefixes confined."""
from __future__ import annotations

import errno
import json
import subprocess
import sys

import pytest
import torch

from helpers import ROOT

DEMO = ROOT / "vae" / "demo"
WEIGHTS = DEMO / "vaekit_demo.safetensors"


def vae_cli(*args, cwd=ROOT):
    r = subprocess.run([sys.executable, "-m", "vae", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                       timeout=300)
    return r.returncode, r.stdout + r.stderr


def test_info_encode_decode_run(tmp_path):
    code, out = vae_cli("info", WEIGHTS)
    assert code == 0 and "TAESD family" in out
    latent = tmp_path / "sample.latent"
    code, out = vae_cli("encode", "--vae", WEIGHTS, "--tile", 256, "--overlap", 32,
                        "-o", latent, DEMO / "vaekit_sample.png")
    assert code == 0 and latent.is_file(), out
    code, out = vae_cli("decode", "--vae", WEIGHTS, "-o", tmp_path / "dec", latent)
    assert code == 0 and (tmp_path / "dec_00001_.png").is_file(), out
    code, out = vae_cli("run", "workflows/image_tiled_roundtrip_api.json", "--models", DEMO, "--input", DEMO,
                        "--output", tmp_path / "out")
    assert code == 0 and "vaekit_roundtrip_00001_.png" in out, out


def test_bad_file_is_one_line_without_traceback(tmp_path):
    bad = tmp_path / "vae.safetensors"
    bad.write_bytes(b"\x00" * 12)
    code, out = vae_cli("info", bad)
    assert code == 1 and out.startswith("vae: error: ") and out.count("\n") == 1 and "Traceback" not in out


# ---- in-process: the same main(), without a new interpreter per case ---------------------------

@pytest.fixture
def cli(capsys):
    from vae.cli import commands as module

    def run(*args):
        code = module.main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err
    return run


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 64x64 crop of the sample as PNG, its latent, and an input folder holding both."""
    from vae.files.imageio import read_image, write_image
    from vae.files.latents import write_latent_file
    import vae
    d = tmp_path_factory.mktemp("inputs")
    img = read_image(DEMO / "vaekit_sample.png")[:64, :64]
    write_image(d / "small.png", img)
    write_latent_file(d / "small.latent", vae.load(WEIGHTS).encode(img.movedim(-1, 0)[None]))
    write_latent_file(d / "four_channels.latent", torch.randn(1, 4, 8, 8))
    (d / "batch.latent").write_bytes((d / "small.latent").read_bytes())
    return d


def _one_line(err: str) -> str:
    assert err.startswith("vae: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_usage_mistakes_exit_2(cli, small):
    for args, expect in ((("frobnicate",), "invalid choice: 'frobnicate'"),
                         (("decode", small / "small.latent"), "the following arguments are required: --vae"),
                         (("decode", "--vae", WEIGHTS, "--tile", "x", small / "small.latent"), "invalid int value"),
                         (("decode", "--vae", WEIGHTS, "--tile", 16, small / "small.latent"), "--tile 16: tiles are 0"),
                         (("encode", "--vae", WEIGHTS, "--overlap", -8, small / "small.png"), "--overlap -8")):
        code, out, err = cli(*args)
        assert code == 2 and expect in _one_line(err), (args, err)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a VAE is loaded: the mistake must be found before any work."""
    from vae.cli import commands as module

    def load(*a, **k):
        raise AssertionError("the VAE was loaded before the mistake was reported")
    monkeypatch.setattr(module, "load", load)


def test_failures_exit_1_before_any_work(cli, small, tmp_path, no_work):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "exists.latent").write_bytes(b"")
    for args, expect in (
            (("decode", "--vae", WEIGHTS, "-o", tmp_path / "missing" / "dec", small / "small.latent"),
             "the output folder '" + str(tmp_path / "missing") + "' does not exist. Fix: create it first"),
            (("decode", "--vae", WEIGHTS, "-o", tmp_path / "file.txt" / "dec", small / "small.latent"),
             "is a file, not a folder"),
            (("decode", "--vae", WEIGHTS, "-o", tmp_path / "dec", small / "small.png"),
             "'small.png' is a PNG image, not a ComfyUI .latent file. Fix: to encode an image, run"),
            (("decode", "--vae", WEIGHTS, "-o", tmp_path / "dec", tmp_path / "nope.latent"), "no latent file at"),
            (("encode", "--vae", WEIGHTS, "-o", tmp_path / "exists.latent", small / "small.png"),
             "exists. Fix: choose another name, or pass --overwrite"),
            (("encode", "--vae", WEIGHTS, "-o", tmp_path / "x.latent", tmp_path / "nope.png"), "no image at"),
            (("encode", "--vae", WEIGHTS, "-o", tmp_path / "x.latent", small / "small.latent"),
             "cannot read 'small.latent' as an image: it is a safetensors file"),
            (("run", ROOT / "workflows" / "image_tiled_roundtrip.json", "--output", tmp_path),
             "is a UI-format workflow (what you drag into ComfyUI); this runs the API format. Fix: run "
             "'image_tiled_roundtrip_api.json'"),
            (("run", tmp_path / "file.txt"), "'file.txt' is not valid JSON")):
        code, out, err = cli(*args)
        assert code == 1 and expect in _one_line(err), (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists.latent", "file.txt"]


def test_unwritable_output_folder(cli, small, tmp_path, monkeypatch, no_work):
    import tempfile

    def refuse(*a, **k):     # tests may run as root, whom permissions do not stop
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    code, out, err = cli("decode", "--vae", WEIGHTS, "-o", tmp_path / "dec", small / "small.latent")
    assert code == 1 and "cannot write to the output folder" in _one_line(err) and "Permission denied" in err


def test_debug_shows_the_traceback(cli, tmp_path):
    code, out, err = cli("--debug", "decode", "--vae", WEIGHTS, "-o", tmp_path / "nope" / "x", tmp_path / "a.latent")
    assert code == 1 and "Traceback" in err and err.rstrip().splitlines()[-1].startswith("vae: error: ")


def test_decode_counts_up_like_save_image(cli, small, tmp_path):
    for _ in range(2):
        assert cli("decode", "--vae", WEIGHTS, "-o", tmp_path / "dec", small / "small.latent")[0] == 0
    (tmp_path / "dec_00007_.png").write_bytes(b"")          # ComfyUI continues after the highest number
    assert cli("decode", "--vae", WEIGHTS, "-o", tmp_path, small / "small.latent")[0] == 0   # a folder: latent's name
    assert cli("decode", "--vae", WEIGHTS, "-o", tmp_path / "dec", small / "small.latent")[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dec_00001_.png", "dec_00002_.png", "dec_00007_.png",
                                                          "dec_00008_.png", "small_00001_.png"]


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_leaves_nothing(cli, small, tmp_path, monkeypatch, error):
    from vae.cli import commands as module
    from vae.files.imageio import write_image
    calls = []

    def second_fails(path, image):
        calls.append(path)
        if len(calls) == 2:
            path.write_bytes(b"half a PNG")
            raise error
        write_image(path, image)
    monkeypatch.setattr(module, "write_image", second_fails)
    batch = small / "batch2.latent"
    from vae.files.latents import read_latent_file, write_latent_file
    write_latent_file(batch, read_latent_file(small / "small.latent").repeat(3, 1, 1, 1))
    code, out, err = cli("decode", "--vae", WEIGHTS, "-o", tmp_path / "dec", batch)
    assert code == (130 if isinstance(error, KeyboardInterrupt) else 1) and "no partly written output" in _one_line(err)
    assert list(tmp_path.iterdir()) == []                    # neither the first PNG nor any temporary


def test_latent_write_failure_leaves_no_partial_file(tmp_path, monkeypatch):
    import safetensors.torch
    from vae.files.latents import write_latent_file

    def half(tensors, path):
        open(path, "wb").write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(safetensors.torch, "save_file", half)
    with pytest.raises(OSError):
        write_latent_file(tmp_path / "x.latent", torch.zeros(1, 4, 2, 2))
    assert list(tmp_path.iterdir()) == []


def _workflow(tmp_path, prefix: str, latent: str = "small.latent"):
    prompt = json.loads((ROOT / "workflows" / "image_tiled_decode_api.json").read_text())
    for node in prompt.values():
        if "filename_prefix" in node["inputs"]:
            node["inputs"]["filename_prefix"] = prefix
        if "latent" in node["inputs"]:
            node["inputs"]["latent"] = latent
    path = tmp_path / "wf_api.json"
    path.write_text(json.dumps(prompt))
    return path


@pytest.mark.parametrize("prefix", ["../../escaped", "/tmp/vaekit_absolute", "sub/../../escaped"])
def test_run_confines_filename_prefix_before_any_work(cli, small, tmp_path, prefix, no_work):
    out = tmp_path / "deep" / "out"
    code, _, err = cli("run", _workflow(tmp_path, prefix), "--models", DEMO, "--input", small, "--output", out)
    assert code == 1 and "filename_prefix" in _one_line(err) and "outside the output folder" in err
    assert not list(tmp_path.rglob("*escaped*")) and not list(out.iterdir())


def test_run_prefix_subfolders_and_counters(cli, small, tmp_path):
    wf = _workflow(tmp_path, "clips/%width%x%height%/dec")
    for _ in range(2):
        code, out, err = cli("run", wf, "--models", DEMO, "--input", small, "--output", tmp_path / "out")
        assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out" / "clips" / "64x64").iterdir()) == ["dec_00001_.png",
                                                                                       "dec_00002_.png"]


def test_node_errors_in_run_are_the_clis_error_class(pack, cli, small, tmp_path):
    """The nodes import the library as vaekit.vae; it is the same module as the CLI's vae, so the
    CLI's `except VAEKitError` catches a node's error: one line, no 'internal error'."""
    import vae
    import vaekit.vae.errors
    assert vaekit.vae.errors.VAEKitError is vae.VAEKitError and vaekit.vae.VAE is vae.VAE
    code, out, err = cli("run", _workflow(tmp_path, "x", "four_channels.latent"), "--models", DEMO,
                         "--input", small, "--output", tmp_path / "out")
    assert code == 1 and "internal error" not in _one_line(err)
    assert "Tiled Decode (VAEKit): input 'samples': this latent has 4 channels" in err


def test_a_handle_from_the_library_is_a_vae_to_the_nodes(pack):
    import vae
    handle = vae.load(WEIGHTS)
    (images,) = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]().decode({"samples": torch.randn(1, 8, 4, 4)}, handle)
    assert images.shape == (1, 32, 32, 3)


# ---- progress bar: on a terminal only, never with --quiet ---------------------------------------

class _Terminal:
    """stderr as a terminal: what is written, and isatty() True."""

    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def isatty(self):
        return True


def test_the_bar_counts_up_and_ends_its_line():
    import io

    from vae.progress import terminal_bar
    term = _Terminal()
    bar = terminal_bar(term, label="tiles", min_interval=0)
    for done in range(1, 5):
        bar(done, 4)
    assert "[" + "#" * 15 + "." * 15 + "]    2/4 tiles" in term.text and "ETA" in term.text
    assert term.text.endswith("\n") and term.text.count("\n") == 1 and "4/4 tiles" in term.text
    assert terminal_bar(io.StringIO()) is None                 # a file or a pipe: nothing at all
    assert terminal_bar(term, quiet=True) is None


@pytest.mark.parametrize("quiet", [False, True])
def test_decode_and_run_draw_the_bar_on_a_terminal_unless_quiet(small, tmp_path, monkeypatch, quiet):
    from vae.cli import commands as module
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    flag = ["-q"] if quiet else []
    assert module.main(["decode", "--vae", str(WEIGHTS), "--tile", "64", "--overlap", "16", *flag,
                        "-o", str(tmp_path / "dec"), str(small / "small.latent")]) == 0
    decoded = term.text
    assert module.main(["run", str(ROOT / "workflows" / "image_tiled_roundtrip_api.json"), "--models", str(DEMO), "--input",
                        str(DEMO), "--output", str(tmp_path / "out"), *flag]) == 0
    if quiet:
        assert term.text == ""
    else:
        assert "tiles" in decoded and decoded.endswith("\n")
        assert term.text[len(decoded):].count("/") >= 2        # the workflow's encode and decode bars


class _Pipe(_Terminal):
    """stderr redirected to a file or a pipe."""

    def isatty(self):
        return False


@pytest.mark.parametrize("stream, drawn", [(_Terminal, True), (_Pipe, False)])
def test_encode_draws_the_bar_only_on_a_terminal(small, tmp_path, monkeypatch, stream, drawn):
    from vae.cli import commands as module
    err = stream()
    monkeypatch.setattr(sys, "stderr", err)
    assert module.main(["encode", "--vae", str(WEIGHTS), "--tile", "256", "--overlap", "32",
                        "-o", str(tmp_path / "s.latent"), str(DEMO / "vaekit_sample.png")]) == 0
    if drawn:      # 512 px in 256 px tiles: 2x2
        assert "1/4 tiles" in err.text and "4/4 tiles" in err.text and err.text.endswith("\n")
    else:
        assert err.text == ""


def test_the_eta_counts_the_first_tile(monkeypatch):
    """The bar is made before the work; its first call comes one tile later."""
    from vae import progress
    clock = iter([0.0, 10.0, 20.0, 30.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    term = _Terminal()
    bar = progress.terminal_bar(term, label="chunks", min_interval=0)   # made at 0 s
    bar(1, 3)                                                          # one chunk took 10 s
    assert "1/3 chunks  10.0 s, ETA 20.0 s" in term.text
    bar(2, 3)
    bar(3, 3)
    assert term.text.endswith("3/3 chunks  30.0 s   \n")


# ---- a new user's frictions and a hostile runner's inputs ---------------------------------------

def test_run_names_the_option_a_workflow_needs(cli, small, tmp_path, no_work):
    wf = _workflow(tmp_path, "x")
    code, _, err = cli("run", wf, "--models", DEMO, "--output", tmp_path / "out")
    assert code == 1 and "reads 'small.latent' from the input folder, but no input folder was given" in _one_line(err)
    assert "--input FOLDER" in err and "TypeError" not in err


def test_run_without_models_names_the_option(cli, small, tmp_path):
    code, _, err = cli("run", _workflow(tmp_path, "x"), "--input", small, "--output", tmp_path / "out")
    assert code == 1 and "not found in the 'vae' or 'vae_approx' model folders (no model folder was given)" in \
        _one_line(err) and "--models FOLDER" in err


def test_a_folder_where_a_file_is_expected(cli, small, tmp_path, no_work):
    folder = tmp_path / "looks_like.latent"
    (folder / "inner").mkdir(parents=True)
    (small / "dir.latent").mkdir(exist_ok=True)                  # named like a latent, in the input folder
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for args, expect in (
            (("decode", "--vae", WEIGHTS, "-o", tmp_path / "dec", folder), f"'{folder}' is a folder, not a latent file"),
            (("encode", "--vae", WEIGHTS, "-o", tmp_path / "x.latent", small), f"'{small}' is a folder, not an image. "
                                                                            "It holds 'small.png'"),
            (("run", tmp_path, "--output", tmp_path / "out"), f"'{tmp_path}' is a folder, not a workflow file"),
            (("run", _workflow(tmp_path / "a", "x", "dir.latent"), "--models", DEMO, "--input", small, "--output",
              tmp_path / "out"), f"LoadLatent.latent: '{small / 'dir.latent'}' is a folder, not a latent file"),
            (("run", _workflow(tmp_path / "b", "x"), "--models", WEIGHTS, "--input", small, "--output",
              tmp_path / "out"), "is a file, not a folder")):
        code, out, err = cli(*args)
        assert code == 1 and expect in _one_line(err) and "no file at" not in err and "no latent file" not in err, \
            (args, err)
    (small / "dir.latent").rmdir()


def test_run_never_reports_an_output_it_did_not_write(pack, cli, small, tmp_path, monkeypatch):
    """A save node that lists a file it did not write (here: its writer returns the names and writes
    nothing) is a failure, not 'node N: image ...'."""
    from vaekit.nodes import headless
    monkeypatch.setattr(headless, "_save_all", lambda prefix, ext, items, write, *a: [str(tmp_path / f"{prefix}.png")])
    code, out, err = cli("run", _workflow(tmp_path, "x"), "--models", DEMO, "--input", small,
                         "--output", tmp_path / "out")
    assert code == 1 and "SaveImage reported" in _one_line(err) and "which is not there" in err and "node " not in out


def test_help_shows_the_default_tile_and_overlap(cli):
    from vae.cli import commands as module
    for command in ("decode", "encode"):
        text = module._parser()._subparsers._group_actions[0].choices[command].format_help()
        assert "default: 512" in text and "(default: 64)" in text


def test_demo_and_info_take_quiet_and_the_demo_leaves_nothing(cli, tmp_path, monkeypatch):
    import tempfile
    import vae.demo
    seen = {}
    monkeypatch.setattr(vae.demo, "run_demo", lambda **kw: seen.update(kw))
    assert cli("demo", "-q")[:2] == (0, "") and seen["verbose"] is False and seen["out_dir"] is None
    code, out, err = cli("info", "-q", WEIGHTS)
    assert code == 0 and "TAESD family" in out
    monkeypatch.undo()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))     # where a temporary folder would go
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                                    # a 64 px image: hand-offs cost more than maths
    try:
        r = vae.demo.run_demo(tile=64, overlap=8, size=64, verbose=False)
    finally:
        torch.set_num_threads(threads)
    assert r["files"] == {} and r["out_dir"] is None and list(tmp_path.iterdir()) == []


def test_exact_mode_counts_tiles_like_fast_mode(tmp_path, monkeypatch):
    """Exact mode's engine reports rounds of its tiles; the bar counts the tiles, as in fast mode."""
    from vae.cli import commands as module
    from vae.files.imageio import read_image, write_image
    write_image(tmp_path / "128.png", read_image(DEMO / "vaekit_sample.png")[:128, :128])
    counts = {}
    for mode in ("fast", "exact"):
        term = _Terminal()
        monkeypatch.setattr(sys, "stderr", term)
        assert module.main(["encode", "--vae", str(WEIGHTS), "--tile", "64", "--overlap", "16", "--mode", mode,
                            "-o", str(tmp_path / f"{mode}.latent"), str(tmp_path / "128.png")]) == 0
        counts[mode] = term.text.rstrip().rsplit("\r", 1)[-1].split("]")[1].split()[:2]
    assert counts["fast"] == counts["exact"] == ["4/4", "tiles"]


def test_the_console_script_runs_from_any_folder(tmp_path):
    """`pip install -e .` puts `vaekit` (pyproject's [project.scripts]) on the PATH; here its function
    runs from another folder with the checkout importable, as the editable install makes it."""
    import os
    tomllib = pytest.importorskip("tomllib")
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["vaekit"]
    module, func = target.split(":")
    code = (f"import sys, {module}\n"
            f"for argv in (['info', {str(WEIGHTS)!r}], ['decode', '--tile']):\n"
            f"    sys.argv = ['vaekit', *argv]\n"
            f"    try:\n        {module}.{func}()\n"
            f"    except SystemExit as e:\n        print('exit', e.code, flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "TAESD family" in r.stdout and "exit 0" in r.stdout and "exit 2" in r.stdout, r.stdout + r.stderr
    assert r.stderr.startswith("vaekit: error: ") and "`vaekit decode --help`" in r.stderr


def test_without_torch_the_cli_says_what_to_install():
    code = ("import sys, runpy; sys.modules['torch'] = None; sys.argv = ['vae', '--help']; "
            "runpy.run_module('vae', run_name='__main__', alter_sys=True)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("vae: error: VAEKit needs PyTorch") and "pip install" in r.stderr
