"""The temporal seam of LTX-2's non-causal decoder: our temporal tiles / frame-wise chunks against our
one-pass decode, next to diffusers' temporal tiling against its own one pass, on the same latent and
the same weights, in one run.

    python bench/bench_ltx2_seam.py                       # LTX-2.0, latent 1 x 128 x 12 x 2 x 2
    python bench/bench_ltx2_seam.py --version 2.3 --frames 16

The published config (diffusers AutoencoderKLLTX2Video with the flags of its conversion script),
random weights under a fixed seed, saved to a temporary .safetensors file that both libraries load;
fp32, CPU. Rows:
  ours one pass            VAE.decode(z)
  ours tiles T/O           VAE.decode(z, tile_frames=8T, overlap_frames=8O): tiles of T latent frames
                           sharing O (Frame-wise Decode with frames_per_chunk=T, overlap=O runs the same)
  diffusers one pass       AutoencoderKLLTX2Video.decode(z)
  diffusers tiles A/B      use_framewise_decoding with tile_sample_min_num_frames=A, stride B (pixel
                           frames; its default is 16/8: 2 latent frames + 1 of context, stride 1)
Errors are on 0..1 pixels against the same library's one pass: max, PSNR, and how many frames are
exact (<= 1e-5); ``frames >= reach`` is the max error over frames more than the decoder's reach
(``vae.archs.ltx.decoder_reach``) from every tile edge, which is 0 up to rounding wherever such frames
exist. Random weights exaggerate the seams; the point is where they are and how overlap changes them.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_video import FAMILIES  # noqa: E402


def _psnr(err: torch.Tensor) -> float:
    mse = float(err.square().mean())
    return float("inf") if mse == 0 else 10 * math.log10(1 / mse)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--version", choices=("2.0", "2.3"), default="2.0")
    p.add_argument("--frames", type=int, default=12, help="latent frames")
    p.add_argument("--size", type=int, default=2, help="latent height and width")
    p.add_argument("--ours", default="2/1,4/1,4/2,8/4", help="our temporal tiles T/O in latent frames")
    p.add_argument("--theirs", default="16/8,32/16,64/32", help="diffusers' tile/stride in pixel frames")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    import diffusers
    from safetensors.torch import save_file

    import vae
    from vae.engine import tiling
    from vae.archs import ltx

    cls, kwargs, channels = FAMILIES["ltx2" if args.version == "2.0" else "ltx2.3"]
    torch.manual_seed(0)
    ref = getattr(diffusers, cls)(**kwargs).eval()
    for flag in ("use_framewise_decoding", "use_framewise_encoding", "use_tiling"):
        setattr(ref, flag, False)
    z = torch.randn(1, channels, args.frames, args.size, args.size, generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ltx2.safetensors"
        save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
        ours = vae.load(path)
    reach = ltx.decoder_reach(ours.model.config)
    print(f"LTX-{args.version} published config, random weights; latent 1 x {channels} x {args.frames} x "
          f"{args.size} x {args.size}; decoder reach {reach} latent frames; torch {torch.__version__}, "
          f"diffusers {diffusers.__version__}, {args.threads} threads, fp32")

    def timed(fn):
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = fn()
        return out, time.perf_counter() - t0

    def diffusers_decode():
        return (ref.decode(z).sample / 2 + 0.5).clamp_(0, 1)

    rows = []
    ours_full, t_ours = timed(lambda: ours.decode(z))
    theirs_full, t_theirs = timed(diffusers_decode)
    parity = (ours_full - theirs_full).abs().max().item()
    rows.append(("ours one pass", 1, "-", "-", "-", "-", t_ours))
    for spec in filter(None, args.ours.split(",")):
        t, o = map(int, spec.split("/"))
        out, secs = timed(lambda: ours.decode(z, tile_frames=8 * t, overlap_frames=8 * o))
        plan = tiling.plan_frames(args.frames, 8 * t, 8 * o, 8)
        err = (out - ours_full).abs().amax(dim=(0, 1, 3, 4))
        edges = {e for a, b in plan.spans for e in (a, b) if 0 < e < args.frames}
        lat = [0] + [1 + (f - 1) // 8 for f in range(1, err.numel())]
        far = [i for i, la in enumerate(lat) if min(abs(la - e) for e in edges) > reach] if edges else []
        rows.append((f"ours tiles {t}/{o}", len(plan.spans), f"{err.max().item():.3g}", f"{_psnr(out - ours_full):.1f}",
                     f"{int((err <= 1e-5).sum())}/{err.numel()}",
                     f"{err[far].max().item():.1e}" if far else "none", secs))
    rows.append(("diffusers one pass", 1, "-", "-", "-", "-", t_theirs))
    ref.use_framewise_decoding = True
    for spec in filter(None, args.theirs.split(",")):
        a, b = map(int, spec.split("/"))
        ref.tile_sample_min_num_frames, ref.tile_sample_stride_num_frames = a, b
        out, secs = timed(diffusers_decode)
        err = (out - theirs_full).abs().amax(dim=(0, 1, 3, 4))
        tiles = len(range(0, args.frames, b // 8)) if args.frames > a // 8 else 1
        rows.append((f"diffusers tiles {a}/{b}", tiles, f"{err.max().item():.3g}", f"{_psnr(out - theirs_full):.1f}",
                     f"{int((err <= 1e-5).sum())}/{err.numel()}", "-", secs))

    head = f"{'run':<24} {'tiles':>5} {'max abs':>9} {'PSNR dB':>8} {'exact frames':>13} {'far from seams':>15} {'time s':>7}"
    print(head)
    print("-" * len(head))
    for name, n, mx, ps, ex, far, secs in rows:
        print(f"{name:<24} {n:>5} {mx:>9} {ps:>8} {ex:>13} {far:>15} {secs:>7.1f}")
    print(f"\nours one pass vs diffusers one pass (parity): max abs {parity:.2e}")


if __name__ == "__main__":
    main()
