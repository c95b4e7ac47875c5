"""A self-contained demo: a small TAESD-architecture VAE trained from scratch on public-domain /
CC0 images (``vaekit_demo.safetensors``, see ``vae/demo/train.py``) and a held-out public-domain
sample image (``vaekit_sample.png``, NASA's astronaut photo from scikit-image, never seen in training).

``run_demo()`` encodes and decodes the sample untiled and tiled and reports the reconstruction
PSNR, the seam error that tiling adds to decoding, the times and the peak memory. It needs only
the ``vae`` package: ``python -m vae demo``."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Optional, Union

import torch

HERE = Path(__file__).resolve().parent
WEIGHTS = HERE / "vaekit_demo.safetensors"
SAMPLE = HERE / "vaekit_sample.png"

__all__ = ["run_demo", "WEIGHTS", "SAMPLE"]


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """dB, on 0..1 pixels (the demo, the TAEF2 bench)."""
    mse = torch.mean((a.double() - b.double()) ** 2).item()
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def peak_memory_mib() -> Optional[float]:
    """The process's peak resident memory (ru_maxrss), or None where ``resource`` is missing (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 2 ** 10    # bytes on macOS, KiB elsewhere


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def run_demo(out_dir: Union[str, Path, None] = None, tile: int = 256, overlap: int = 32,
             image: Union[str, Path, None] = None, weights: Union[str, Path, None] = None,
             size: Optional[int] = None, verbose: bool = True) -> dict:
    """Encode + decode the sample untiled and tiled (``tile``/``overlap`` in pixels), write the
    reconstructions to ``out_dir`` (default: none written, nothing left behind), print a table, return
    the figures.

    ``image``/``weights`` replace the shipped sample/demo VAE; ``size`` centre-crops the image to
    at most ``size`` x ``size`` pixels first (a quicker run)."""
    from ..engine import tiling
    from ..files.imageio import read_image, write_image
    from ..loading import load

    vae = load(weights or WEIGHTS)
    r = vae.caps.spatial_ratio_packed
    img = read_image(image or SAMPLE)
    h, w = img.shape[:2]
    if size:
        h, w = min(h, size), min(w, size)
    h, w = h // r * r, w // r * r
    top, left = (img.shape[0] - h) // 2, (img.shape[1] - w) // 2
    img = img[top: top + h, left: left + w]
    x = img.permute(2, 0, 1)[None].contiguous()

    vae.decode(vae.encode(torch.zeros(1, 3, 4 * r, 4 * r)))     # warm-up: one-time backend setup is not timed

    z, t_enc = _timed(lambda: vae.encode(x))
    rec, t_dec = _timed(lambda: vae.decode(z))
    z_t, t_enc_t = _timed(lambda: vae.encode(x, tile=tile, overlap=overlap))
    rec_t, t_dec_t = _timed(lambda: vae.decode(z_t, tile=tile, overlap=overlap))
    seam, t_seam = _timed(lambda: vae.decode(z, tile=tile, overlap=overlap))   # same latent as `rec`
    lat = vae.caps.spatial_ratio
    tiles = tiling.tile_count(tiling.plan_grid((h // lat, w // lat), tile, overlap, lat))

    files = {}
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {"original": out / "original.png", "untiled": out / "reconstruction_untiled.png",
                 "tiled": out / "reconstruction_tiled.png"}
        for key, t in (("original", x), ("untiled", rec), ("tiled", rec_t)):
            write_image(files[key], t[0].permute(1, 2, 0))

    result = {
        "model": vae.name, "image_size": (w, h), "tile": tile, "overlap": overlap, "tiles": tiles,
        "psnr_untiled_db": psnr(rec, x), "psnr_tiled_db": psnr(rec_t, x),
        "seam_max_abs": (seam - rec).abs().max().item(), "seam_psnr_db": psnr(seam, rec),
        "time_untiled_s": t_enc + t_dec, "time_tiled_s": t_enc_t + t_dec_t,
        "time_encode_s": t_enc, "time_decode_s": t_dec, "time_encode_tiled_s": t_enc_t,
        "time_decode_tiled_s": t_dec_t, "time_seam_decode_s": t_seam,
        "peak_memory_mib": peak_memory_mib(), "out_dir": str(out_dir) if out_dir else None,
        "files": {k: str(v) for k, v in files.items()},
    }
    if verbose:
        print(_table(result))
    return result


def _table(r: dict) -> str:
    def db(v: float) -> str:
        return "exact" if math.isinf(v) else f"{v:.2f}"

    mem = r["peak_memory_mib"]
    lines = [
        f"VAEKit demo: {r['model']}",
        f"image {r['image_size'][0]}x{r['image_size'][1]}; tiled = {r['tile']} px tiles, {r['overlap']} px overlap "
        f"({r['tiles']} tile{'s' if r['tiles'] != 1 else ''})",
        "",
        f"  {'':34s}{'PSNR (dB)':>10s}{'time (s)':>10s}",
        f"  {'untiled encode + decode':34s}{db(r['psnr_untiled_db']):>10s}{r['time_untiled_s']:>10.2f}",
        f"  {'tiled encode + decode':34s}{db(r['psnr_tiled_db']):>10s}{r['time_tiled_s']:>10.2f}",
        f"  {'seam: tiled vs untiled decode':34s}{db(r['seam_psnr_db']):>10s}{r['time_seam_decode_s']:>10.2f}"
        f"   (same latent; max abs {r['seam_max_abs']:.4f})",
        "",
        f"  peak memory (process RSS): {'n/a' if mem is None else f'{mem:.0f} MiB'}",
        f"  reconstructions written to {r['out_dir']}" if r["out_dir"] else
        "  reconstructions not written (--output FOLDER keeps them)",
    ]
    return "\n".join(lines)
