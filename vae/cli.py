"""Command line: `python -m vae <command>` from the repo root. No ComfyUI needed.

  demo                          encode+decode a sample image with the shipped demo VAE (no downloads)
  info VAE_FILE                 what the loader detects in a file
  decode --vae F LATENT.latent  decode a ComfyUI .latent file to PNG(s)
  encode --vae F IMAGE...       encode images to a ComfyUI .latent file
  run WORKFLOW_API.json         run an API-format workflow from workflows/ in-process
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

from . import load
from .errors import VAEKitError
from .imageio import read_image, write_image
from .latents import read_latent_file, write_latent_file

ROOT = Path(__file__).resolve().parents[1]


def _peak_mib() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cmd_info(a) -> None:
    v = load(a.vae)
    c = v.caps
    print(f"{a.vae}: {v.name}")
    print(f"  latent channels {c.latent_channels_packed} (model grid {c.latent_channels}), spatial ratio "
          f"{c.spatial_ratio_packed}, value range {c.value_range}, attention {c.has_attention}, norm {c.norm}")
    print(f"  encoder {c.can_encode}, decoder {c.can_decode}; config {v.config}")


def cmd_decode(a) -> None:
    v = load(a.vae)
    z = read_latent_file(a.latent)
    t = time.perf_counter()
    images = v.decode(z, tile=a.tile, overlap=a.overlap)
    dt = time.perf_counter() - t
    out = Path(a.output or Path(a.latent).with_suffix(""))
    for i, img in enumerate(images):
        path = out.with_name(f"{out.name}_{i:05d}.png")
        write_image(path, img.movedim(0, -1))
        print(f"wrote {path}")
    print(f"decoded {tuple(z.shape)} -> {tuple(images.shape)} in {dt:.2f} s, peak RSS {_peak_mib():.0f} MiB")


def cmd_encode(a) -> None:
    v = load(a.vae)
    x = torch.stack([read_image(p) for p in a.images]).movedim(-1, 1)
    t = time.perf_counter()
    z = v.encode(x, tile=a.tile, overlap=a.overlap)
    out = a.output or str(Path(a.images[0]).with_suffix(".latent"))
    write_latent_file(out, z)
    print(f"encoded {tuple(x.shape)} -> {tuple(z.shape)} in {time.perf_counter() - t:.2f} s, wrote {out}")


def _pack():
    """The node pack imported as a package (its nodes use relative imports), without ComfyUI."""
    if "vaekit" in sys.modules:
        return sys.modules["vaekit"]
    spec = importlib.util.spec_from_file_location("vaekit", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vaekit"] = mod
    spec.loader.exec_module(mod)
    return mod


def cmd_run(a) -> None:
    _pack()
    from vaekit.nodes.headless import run_prompt   # noqa: E402 (the package exists only now)
    prompt = json.loads(Path(a.workflow).read_text())
    prompt = prompt.get("prompt", prompt)
    t = time.perf_counter()
    ui = run_prompt(prompt, input_dir=a.input, output_dir=a.output, model_dirs=a.models)
    for nid, out in ui.items():
        for kind, files in out.items():
            for f in files:
                print(f"node {nid}: {kind[:-1]} {f}")
    print(f"ran {len(prompt)} nodes in {time.perf_counter() - t:.2f} s, peak RSS {_peak_mib():.0f} MiB")


def cmd_demo(a) -> None:
    from .demo import run_demo
    run_demo(out_dir=a.output, tile=a.tile, overlap=a.overlap)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vae", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("demo", help="run the embedded demo")
    s.add_argument("--output", help="folder for the reconstructions")
    s.add_argument("--tile", type=int, default=256)
    s.add_argument("--overlap", type=int, default=32)
    s.set_defaults(fn=cmd_demo)
    s = sub.add_parser("info", help="describe a VAE file")
    s.add_argument("vae")
    s.set_defaults(fn=cmd_info)
    for name, fn in (("decode", cmd_decode), ("encode", cmd_encode)):
        s = sub.add_parser(name)
        s.add_argument("--vae", required=True, help="VAE file (or a TAESD pair by stem)")
        s.add_argument("--tile", type=int, default=512, help="tile size in pixels (0: untiled)")
        s.add_argument("--overlap", type=int, default=64, help="tile overlap in pixels")
        s.add_argument("-o", "--output")
        if name == "decode":
            s.add_argument("latent")
        else:
            s.add_argument("images", nargs="+")
        s.set_defaults(fn=fn)
    s = sub.add_parser("run", help="run an API-format workflow in-process")
    s.add_argument("workflow")
    s.add_argument("--models", action="append", help="folder(s) with VAE files (or vae/ and vae_approx/)")
    s.add_argument("--input", help="folder LoadImage/LoadLatent read from")
    s.add_argument("--output", default="output", help="folder SaveImage/SaveLatent write to")
    s.set_defaults(fn=cmd_run)
    a = p.parse_args(argv)
    try:
        a.fn(a)
    except VAEKitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
