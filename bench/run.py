"""Every benchmark by what it measures: ``python3 bench/run.py KIND [options]`` (``KIND --help`` for its own).

    decode       decode table: our runs beside diffusers and ComfyUI core, one family or several (decode.py)
    encode       the same for encodes, budgets included (decode.py)
    face         diffusers' class beside vae.diffusers' face on the same file, with and without a budget (decode.py)
    budget       decode table with the planner's predictions; ``--plans GB``: the plans only (decode.py)
    framewise    temporal tiles against one pass, ours and diffusers', per frame (framewise.py)
    roundtrip    encode + decode of the sample photo on real weights (TAEF2), PSNR (framewise.py)
    compile      eager against Compile VAE (compile.py)
    distributed  exact decode across 1, 2, 3 ranks (distributed.py)
    cache        the latent cache beside musubi-tuner's (cache.py)
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = {"decode": ("decode", {}), "encode": ("decode", {"op": "encode"}), "budget": ("decode", {"predict": True}),
         "face": ("decode", {"face": True}),
         "framewise": ("framewise", {}), "roundtrip": ("framewise", {"roundtrip": True}),
         "compile": ("compile", {}), "distributed": ("distributed", {}), "cache": ("cache", {})}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in KINDS:
        sys.exit(__doc__)
    module, options = KINDS[sys.argv[1]]
    __import__(module).main(sys.argv[2:], **options)


if __name__ == "__main__":
    main()
