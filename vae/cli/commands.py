"""Command line: `vaekit <command>` from any folder after `pip install -e .` in the repository, or
`python -m vae <command>` from the repository root. No ComfyUI needed.

  demo                          encode+decode a sample image with the shipped demo VAE (no downloads)
  info VAE_FILE                 what the loader detects in a file
  decode --vae F LATENT.latent  decode a ComfyUI .latent file to PNGs named as ComfyUI's Save Image
  encode --vae F IMAGE...       encode images to a ComfyUI .latent file
  run WORKFLOW_API.json         run an API-format workflow from workflows/ in-process
  cache --vae F INPUT... -o DIR cache a dataset's latents for a trainer, exactly (docs/cache.md)

A progress bar (tiles or chunks done, elapsed, ETA) goes to stderr when it is a terminal; -q hides it.
decode/encode --devices cuda:0,cuda:1 (or cpu,cpu) share the tiles among worker processes, one per
extra device; launched by torchrun (torchrun --nproc-per-node N -m vae decode ...) the ranks share
them and rank 0 writes.
Errors: one line each on stderr ("vae: error: ..."), exit status 2 for a usage mistake, 1 for a
failure (a missing or unreadable file, an input the VAE cannot take), 130 when interrupted; --debug
adds the traceback. Outputs are checked before any work, written whole or not at all, and never
overwrite earlier outputs (decode and run count up as ComfyUI does; encode refuses an existing file
unless --overwrite).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
from pathlib import Path

import torch

from .. import checks, load, progress, workers
from ..files import filekind, outputs
from ..errors import InputError, VAEKitError
from ..files.imageio import read_image, write_image
from ..files.latents import read_latent_file, write_latent_file

PROG = "vae"          # the name errors start with ("vae: error: ..."), as the tests and scripts read them


class UsageError(InputError):
    """A command-line value that cannot be right whatever the files hold (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):     # one line, not argparse's usage block
        raise UsageError(f"{message} (`{self.prog} --help` lists the options).")


def _peak_mib() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _check_tiling(a) -> None:
    if a.tile < 0 or 0 < a.tile < checks.MIN_TILE_PX:
        raise UsageError(f"--tile {a.tile}: tiles are 0 (untiled) or at least {checks.MIN_TILE_PX} pixels; smaller "
                         "ones run many times slower.")
    if a.overlap < 0:
        raise UsageError(f"--overlap {a.overlap}: the overlap is 0 or more pixels.")


def _exists(path: str, what: str, suffixes: tuple[str, ...] = ()) -> Path:
    """A file given on the command line: missing, a folder, or not a regular file is said as such."""
    wrong = filekind.wrong_path(path, what, suffixes)
    if wrong:
        raise InputError(wrong[0], input=what, fix=wrong[1])
    return Path(path)


def _folder(path: str, option: str) -> Path:
    wrong = filekind.wrong_folder(path)
    if wrong:
        raise InputError(wrong[0], input=option, fix=wrong[1])
    return Path(path)


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".npy")


def cmd_info(a) -> None:
    v = load(a.vae)
    c = v.caps
    print(f"{a.vae}: {v.name}")
    print(f"  latent channels {c.latent_channels_packed} (model grid {c.latent_channels}), spatial ratio "
          f"{c.spatial_ratio_packed}, value range {c.value_range}, attention {c.has_attention}, norm {c.norm}")
    print(f"  encoder {c.can_encode}, decoder {c.can_decode}; config {v.config}")


def _decode_target(a) -> tuple[Path, str]:
    """(output folder, file name prefix): -o names a prefix ('out/dec' -> out/dec_00001_.png) or an
    existing folder (files named after the latent); default: beside the latent."""
    latent = Path(a.latent)
    target = Path(a.output) if a.output else latent.with_suffix("")
    if target.is_dir():
        return target, latent.stem
    return target.parent, target.name


def _budget(a) -> dict:
    """``--max-memory`` as the library's ``budget``; the plan goes to stderr (logger "VAEKit")."""
    from ..engine.budget import parse
    b = parse(a.max_memory)
    if b:
        log = logging.getLogger("VAEKit")
        if not log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(f"{_name}: %(message)s"))
            log.addHandler(handler)
        log.setLevel(logging.INFO)
    return {"budget": b} if b else {}


def _bar(v, op: str, a):
    """The progress bar of a decode/encode: the engines report tiles x time chunks (a model that streams
    runs each tile chunk by chunk), in fast and exact mode alike."""
    streams = v.is_video and (v.caps.stream_decode if op == "decode" else v.caps.stream_encode)
    return progress.terminal_bar(sys.stderr, a.quiet, label="tile chunks" if streams else "tiles")


def cmd_decode(a) -> None:
    _check_tiling(a)
    folder, prefix = _decode_target(a)
    outputs.check_writable(folder, "-o")
    _, name, counter = outputs.save_path(prefix, folder, input="-o")      # before the work, as below
    z = read_latent_file(a.latent)
    v = load(a.vae)
    t = time.perf_counter()
    with progress.reporting(_bar(v, "decode", a)):
        images = workers.cli_call(v, "decode", z, a.devices, progress.current(), tile=a.tile, overlap=a.overlap,
                                  mode=a.mode, **_budget(a))
    if images is None:              # a torchrun rank other than 0: rank 0 writes
        return
    dt = time.perf_counter() - t
    counter = outputs.save_path(prefix, folder, input="-o")[2]          # files may have appeared meanwhile
    paths = [outputs.numbered(folder, name, counter + i, ".png") for i in range(len(images))]
    with outputs.AtomicFiles() as files:
        for path, img in zip(paths, images):
            write_image(files.temp(path), img.movedim(0, -1))
    for path in paths:
        print(f"wrote {path}")
    print(f"decoded {tuple(z.shape)} -> {tuple(images.shape)} in {dt:.2f} s, peak RSS {_peak_mib():.0f} MiB")


def cmd_encode(a) -> None:
    _check_tiling(a)
    out = Path(a.output or Path(a.images[0]).with_suffix(".latent"))
    outputs.check_writable(out.parent, "-o")
    outputs.one_file(out, a.overwrite, "-o")
    for p in a.images:
        _exists(p, "image", IMAGE_SUFFIXES)
    x = [read_image(p) for p in a.images]
    sizes = {tuple(i.shape) for i in x}
    if len(sizes) > 1:
        raise InputError(f"the images have different sizes ({', '.join('x'.join(map(str, s[1::-1])) for s in sizes)}); "
                         "one .latent file holds one batch of one size.", input="images",
                         fix="encode them separately, or resize them to one size first.")
    v = load(a.vae)
    x = torch.stack(x).movedim(-1, 1)
    t = time.perf_counter()
    with progress.reporting(_bar(v, "encode", a)):
        z = workers.cli_call(v, "encode", x, a.devices, progress.current(), tile=a.tile, overlap=a.overlap,
                             mode=a.mode, **_budget(a))
    if z is None:
        return
    outputs.one_file(out, a.overwrite, "-o")
    write_latent_file(out, z)
    print(f"encoded {tuple(x.shape)} -> {tuple(z.shape)} in {time.perf_counter() - t:.2f} s, wrote {out}")


def cmd_run(a) -> None:
    from .pack import load_pack
    load_pack()
    from vaekit.nodes.headless import read_workflow, run_prompt   # noqa: E402 (the package exists only now)
    prompt = read_workflow(a.workflow)
    for d, what in [(a.input, "--input"), *((m, "--models") for m in a.models or ())]:
        if d is not None:
            _folder(d, what)
    outputs.check_writable(a.output, "--output", create=True)       # ComfyUI creates its output folder too
    t = time.perf_counter()
    with progress.reporting(progress.terminal_bar(sys.stderr, a.quiet)):     # the nodes' tiles and chunks
        ui = run_prompt(prompt, input_dir=a.input, output_dir=a.output, model_dirs=a.models)
    for nid, out in ui.items():        # every file listed here was checked to be there (run_prompt)
        for kind, files in out.items():
            if kind != "animated":
                for f in files:
                    print(f"node {nid}: {kind[:-1]} {f}")
    print(f"ran {len(prompt)} nodes in {time.perf_counter() - t:.2f} s, peak RSS {_peak_mib():.0f} MiB")


def cmd_demo(a) -> None:
    from ..demo import run_demo
    _check_tiling(a)
    if a.output:
        outputs.check_writable(a.output, "--output", create=True)
    run_demo(out_dir=a.output, tile=a.tile, overlap=a.overlap, verbose=not a.quiet)


def _parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="print the traceback of an error")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    def command(name: str, fn, **kw) -> argparse.ArgumentParser:
        s = sub.add_parser(name, **kw)
        s.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the traceback of an error")
        s.set_defaults(fn=fn)
        return s

    quiet = dict(action="store_true", help="no progress bar or table (the bar is drawn only on a terminal)")
    s = command("demo", cmd_demo, help="run the embedded demo")
    s.add_argument("--output", help="folder for the reconstructions (default: none written)")
    s.add_argument("--tile", type=int, default=256, help="tile size in pixels (default: %(default)s)")
    s.add_argument("--overlap", type=int, default=32, help="tile overlap in pixels (default: %(default)s)")
    s.add_argument("-q", "--quiet", **{**quiet, "help": "print nothing but errors"})
    s = command("info", cmd_info, help="describe a VAE file")
    s.add_argument("vae")
    s.add_argument("-q", "--quiet", **{**quiet, "help": "accepted for symmetry; info draws no bar"})
    for name, fn in (("decode", cmd_decode), ("encode", cmd_encode)):
        s = command(name, fn, help=f"{name} with a VAE file")
        s.add_argument("--vae", required=True, help="VAE file (or a TAESD pair by stem)")
        s.add_argument("--tile", type=int, default=512,
                       help="tile size in pixels (0: untiled; else at least 64; default: %(default)s)")
        s.add_argument("--overlap", type=int, default=64, help="tile overlap in pixels (default: %(default)s)")
        if name == "decode":
            s.add_argument("-o", "--output", help="file name prefix (out/dec -> out/dec_00001_.png, counting up "
                                                  "past existing files) or an existing folder")
            s.add_argument("latent")
        else:
            s.add_argument("-o", "--output", help="the .latent file to write (default: beside the first image)")
            s.add_argument("--overwrite", action="store_true", help="replace an existing output file")
            s.add_argument("images", nargs="+")
        s.add_argument("-q", "--quiet", **quiet)
        s.add_argument("--mode", choices=("exact", "fast"), default="exact",
                       help="exact (default): the untiled result, no seams (vae/engine/exact.py); fast: blended tiles")
        s.add_argument("--max-memory", metavar="GB", default=None,
                       help="memory budget on the device, e.g. 4 or 4GB (or 512MB): the largest tile (at most "
                            "--tile) and chunk that fit, planned before the work and printed (vae/engine/budget.py)")
        s.add_argument("--devices", help="share the tiles among devices, e.g. cuda:0,cuda:1 or cpu,cpu (one worker "
                                         "process per extra device); under torchrun the ranks share them anyway")
    s = command("run", cmd_run, help="run an API-format workflow in-process")
    s.add_argument("-q", "--quiet", **quiet)
    s.add_argument("workflow")
    s.add_argument("--models", action="append", help="folder with the VAE files the workflow loads (or with vae/ "
                                                      "and vae_approx/ subfolders); repeat for more folders")
    s.add_argument("--input", help="folder LoadImage/LoadLatent read from (needed when the workflow has them)")
    s.add_argument("--output", default="output", help="folder SaveImage/SaveLatent write to (created if missing)")
    from .cache import add as add_cache
    add_cache(command, quiet)
    return p


_name = PROG


def _say(message: str) -> None:
    print(f"{_name}: error: {' '.join(message.split())}", file=sys.stderr)


def main(argv=None, prog: str = PROG) -> int:
    """``prog``: the command as the user typed it (``vaekit``, ``python -m vae``), for usage hints."""
    global _name
    _name = "vaekit" if prog == "vaekit" else PROG
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        a = _parser(prog).parse_args(argv)
        code = a.fn(a)             # a command may end with a status of its own (cache: 1 if items failed)
    except UsageError as e:
        _say(str(e))
        return 2
    except VAEKitError as e:
        if debug:
            traceback.print_exc()
        for line in getattr(e, "problems", None) or [str(e)]:
            _say(line)
        return 1
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        _say("interrupted (no partly written output is left).")
        return 130
    except OSError as e:            # a file system refusal (disk full, permissions) while working
        if debug:
            traceback.print_exc()
        _say(f"{e.strerror or e}" + (f": '{e.filename}'" if e.filename else "") + " (no partly written output is "
             "left).")
        return 1
    except Exception as e:   # noqa: BLE001 (no traceback for the user; --debug shows it)
        if debug:
            traceback.print_exc()
        _say(f"{type(e).__name__}: {e} (an internal error: run again with --debug for the traceback and please "
             "report it).")
        return 1
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
