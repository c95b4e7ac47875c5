"""Temporal tiles against one pass, per frame: our temporal tiles (Frame-wise Decode's chunks) against our
one-pass decode, next to diffusers' frame-wise decoding against its own one pass, same weights, same latent,
in this process (CPU, fp32).

    python3 bench/run.py framewise --family ltx2 --size 64x64x89                      # LTX-2's temporal seam
    python3 bench/run.py framewise --family ltx2.3 --size 64x64x121 --ours 4/2 --theirs 16/8
    python3 bench/run.py roundtrip --tile 256 --overlap 32                             # TAEF2, real weights

Rows: ``ours tiles T/O`` = ``VAE.decode(z, tile_frames=rT, overlap_frames=rO)`` (tiles of T latent frames
sharing O); ``diffusers tiles A/B`` = use_framewise_decoding with tile_sample_min_num_frames=A, stride B
(pixel frames). Errors on 0..1 pixels against the same library's one pass: max, PSNR, frames exact
(<= 1e-5), and ``far from seams``: the max error over frames farther than the decoder's reach from every
tile edge (LTX: ``vae.archs.ltx_config.decoder_reach``), 0 up to rounding wherever such frames exist.

``roundtrip``: TAEF2's real weights (``--weights`` or $VAEKIT_TAEF2_DIR, else ../shared/data) on the sample
photo (vae/demo/vaekit_sample.png): PSNR against the photo of the untiled round trip, a fast tiled decode of
the untiled latent, fast tiles both ways, exact tiles both ways (TAEF2's mid blocks pool over the image).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from harness.families import FAMILIES, SEED, shape, write_weights  # noqa: E402


def _timed(fn):
    import torch
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = fn()
    return out, time.perf_counter() - t0


def _row(name: str, tiles: int, out, full, secs: float, far=None) -> str:
    err = (out - full).abs().amax(dim=(0, 1, 3, 4))
    mse = float((out - full).square().mean())
    psnr = math.inf if mse == 0 else 10 * math.log10(1 / mse)
    far_err = "-" if far is None else f"{err[far].max().item():.1e}" if far else "none"
    return (f"{name:<24} {tiles:>5} {err.max().item():>9.3g} {psnr:>8.1f} {f'{int((err <= 1e-5).sum())}/{err.numel()}':>13} "
            f"{far_err:>15} {secs:>7.1f}")


def _far_frames(plan, frames: int, pixel_frames: int, r: int, reach) -> list:
    """Pixel frames farther than ``reach`` latent frames from every inner tile edge."""
    edges = {e for a, b in plan.spans for e in (a, b) if 0 < e < frames}
    if reach is None or not edges:
        return []
    latent = [0] + [1 + (f - 1) // r for f in range(1, pixel_frames)]
    return [i for i, la in enumerate(latent) if min(abs(la - e) for e in edges) > reach]


def seams(a) -> None:
    import diffusers
    import torch
    import vae
    from vae.engine import tiling
    torch.set_num_threads(a.threads)
    family = FAMILIES[a.family]
    with tempfile.TemporaryDirectory() as d:
        ours = vae.load(write_weights(family, Path(d)))
        from harness.workers import diffusers_from_file
        ref = diffusers_from_file(getattr(diffusers, family.diffusers), Path(d) / "diffusers.safetensors", **family.kwargs)
    dims = shape(family, "decode", a.size or family.size)
    z = torch.randn(*dims, generator=torch.Generator().manual_seed(SEED))
    r, t = family.temporal, dims[2]
    from vae.archs import ltx_config       # the decoder's reach is known for LTX's
    reach = ltx_config.decoder_reach(ours.config) if isinstance(ours.config, ltx_config.LTXConfig) else None
    print(f"{family.title}, published config, random weights; latent {tuple(dims)}; decoder reach {reach} latent "
          f"frames; {a.threads} threads, fp32")
    decode_theirs = lambda: (ref.decode(z).sample / 2 + 0.5).clamp_(0, 1)           # noqa: E731
    ours_full, t_ours = _timed(lambda: ours.decode(z))
    theirs_full, t_theirs = _timed(decode_theirs)
    print(f"{'run':<24} {'tiles':>5} {'max abs':>9} {'PSNR dB':>8} {'exact frames':>13} {'far from seams':>15} {'time s':>7}")
    print(f"{'ours one pass':<24} {1:>5} {'-':>9} {'-':>8} {'-':>13} {'-':>15} {t_ours:>7.1f}")
    for spec in filter(None, a.ours.split(",")):
        n, o = map(int, spec.split("/"))
        out, secs = _timed(lambda: ours.decode(z, tile_frames=r * n, overlap_frames=r * o))
        plan = tiling.plan_frames(t, r * n, r * o, r)
        far = _far_frames(plan, t, out.shape[2], r, reach)
        print(_row(f"ours tiles {n}/{o}", len(plan.spans), out, ours_full, secs, far), flush=True)
    print(f"{'diffusers one pass':<24} {1:>5} {'-':>9} {'-':>8} {'-':>13} {'-':>15} {t_theirs:>7.1f}")
    ref.use_framewise_decoding = True
    for spec in filter(None, a.theirs.split(",")):
        n, o = map(int, spec.split("/"))
        ref.tile_sample_min_num_frames, ref.tile_sample_stride_num_frames = n, o
        out, secs = _timed(decode_theirs)
        tiles = len(range(0, t, o // r)) if t > n // r else 1
        print(_row(f"diffusers tiles {n}/{o}", tiles, out, theirs_full, secs), flush=True)
    print(f"\nours one pass vs diffusers one pass (parity): max abs {(ours_full - theirs_full).abs().max().item():.2e}")


def taef2_roundtrip(a) -> None:
    import torch
    import vae
    from vae.demo import psnr
    from vae.files.imageio import read_image
    folder = Path(a.weights or os.environ.get("VAEKIT_TAEF2_DIR") or BENCH.parents[1] / "shared" / "data")
    if not (folder / "taef2_encoder.pth").is_file():
        sys.exit(f"no taef2_encoder.pth in {folder}: set VAEKIT_TAEF2_DIR or pass --weights")
    v = vae.load(folder / "taef2_encoder.pth")          # finds the decoder beside it
    x = read_image(BENCH.parent / "vae" / "demo" / "vaekit_sample.png").movedim(-1, 0)[None]
    tile, ov = int(a.tile), a.overlap
    t = dict(tile=tile, overlap=ov)
    with torch.inference_mode():
        z = v.encode(x)
        rows = {"untiled encode + decode": v.decode(z),
                f"untiled encode, fast tiled decode {tile}/{ov}": v.decode(z, **t),
                f"fast tiled encode + decode {tile}/{ov}": v.decode(v.encode(x, **t), **t),
                f"exact tiled encode + decode {tile}": v.decode(v.encode(x, tile=tile, mode="exact"),
                                                                tile=tile, mode="exact")}
    print(f"TAEF2, {x.shape[3]}x{x.shape[2]} sample photo, PSNR against the photo:")
    for name, y in rows.items():
        print(f"  {name:<44} {psnr(y, x):6.2f} dB")


def main(argv=None, roundtrip: bool = False) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="ltx2", help="a video family with a diffusers reference")
    p.add_argument("--size", help="HxWxT pixels and frames (default: 64x64x89)")
    p.add_argument("--ours", default="2/1,4/1,4/2,8/4", help="our temporal tiles T/O in latent frames")
    p.add_argument("--theirs", default="16/8,32/16,64/32", help="diffusers' tile/stride in pixel frames")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--weights", help="roundtrip: folder with taef2_encoder.pth and taef2_decoder.pth")
    p.add_argument("--tile", default="256", help="roundtrip: tile, pixels")
    p.add_argument("--overlap", type=int, default=32, help="roundtrip: overlap, pixels")
    a = p.parse_args(argv)
    a.size = a.size or "64x64x89"
    (taef2_roundtrip if roundtrip else seams)(a)


if __name__ == "__main__":
    main()
