"""TAEF2 and fast tiling: the README's "taef2 fast tiling" figures, on the real weights.

    python bench/bench_taef2_tiling.py                 # weights from $VAEKIT_TAEF2_DIR or ../shared/data
    python bench/bench_taef2_tiling.py --tile 256 --overlap 32

TAEF2's mid blocks pool over the whole image (a GroupNorm branch), so a tile sees other statistics
than the whole image: fast tiles show seams that exact mode does not. Prints PSNR (dB, 0..1 pixels)
against the sample photo (vae/demo/vaekit_sample.png) for the untiled round trip, a tiled decode of
the untiled latent, a tiled encode + tiled decode, and exact tiles both ways. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import vae  # noqa: E402
from vae.demo import psnr  # noqa: E402
from vae.files.imageio import read_image  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", type=Path, default=Path(os.environ.get("VAEKIT_TAEF2_DIR")
                                                             or ROOT.parent / "shared" / "data"),
                   help="folder with taef2_encoder.pth and taef2_decoder.pth")
    p.add_argument("--tile", type=int, default=256)
    p.add_argument("--overlap", type=int, default=32)
    a = p.parse_args()
    if not (a.weights / "taef2_encoder.pth").is_file():
        sys.exit(f"no taef2_encoder.pth in {a.weights}: set VAEKIT_TAEF2_DIR or pass --weights")
    v = vae.load(a.weights / "taef2_encoder.pth")          # finds the decoder beside it
    x = read_image(ROOT / "vae" / "demo" / "vaekit_sample.png").movedim(-1, 0)[None]
    t = dict(tile=a.tile, overlap=a.overlap)
    with torch.inference_mode():
        z = v.encode(x)
        rows = {"untiled encode + decode": v.decode(z),
                f"untiled encode, fast tiled decode {a.tile}/{a.overlap}": v.decode(z, **t),
                f"fast tiled encode + decode {a.tile}/{a.overlap}": v.decode(v.encode(x, **t), **t),
                f"exact tiled encode + decode {a.tile}": v.decode(v.encode(x, tile=a.tile, mode="exact"),
                                                                  tile=a.tile, mode="exact")}
    print(f"TAEF2, {x.shape[3]}x{x.shape[2]} sample photo, PSNR against the photo:")
    for name, y in rows.items():
        print(f"  {name:<44} {psnr(y, x):6.2f} dB")


if __name__ == "__main__":
    main()
