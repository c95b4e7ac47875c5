"""Video decode benchmark: VAEKit's video VAEs against diffusers' at the published configs, on the
CPU, in one run.

    python bench/bench_video.py                       # every family, latent 1 x C x 3 x 8 x 8
    python bench/bench_video.py --families ltx2,ltx2.3  # LTX-2 and LTX-2.3
    python bench/bench_video.py --families ltx,magvit # a subset
    python bench/bench_video.py --families mochi --frames 11 --size 4   # past Mochi's 55 divergent frames
    python bench/bench_video.py --frames 5 --json out.json
    python bench/bench_video.py --families hunyuan_video15 --frames 5 --size 12 --repeat 1 \
        --modes one-pass,default,framewise,exact            # our decode modes beside diffusers' one pass

For each family a diffusers model at its published config (diffusers' default, except for LTX-2 and
LTX-2.3, whose published flags its conversion script sets) is built with random weights under a
fixed seed and saved to a temporary .safetensors file; both libraries load those same weights. Every
(family, library) runs in its own subprocess, so peak RSS is per run (the peak mark is reset after
loading, as in bench_decode.py: ``working set`` = peak RSS during the decodes - RSS after load).
Both outputs are mapped to 0..1 and compared (LTX with zero padding on both sides: ours pads the
decoder with reflect by default, as ComfyUI does): max abs difference over all frames, and for Mochi,
whose original (genmo/ComfyUI) frame semantics we follow while diffusers differs in the early
frames, also the first frame from which every later frame agrees within 1e-4. Nothing is asserted.

``--modes`` runs our decode several ways, each in its own subprocess and compared with diffusers'
one pass: ``default`` (the handle's own choice: the model's stream chunks where it has them, e.g.
HunyuanVideo 1.5's two latent frames), ``one-pass`` (one chunk of the whole clip), ``framewise``
(one latent frame at a time through the causal caches), ``exact`` (2 x 2 exact spatial tiles, each
streamed one latent frame at a time: the smallest working set). Streaming modes only differ from
one pass for models that stream (the others take overlapping temporal tiles there).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from harness.measure import run_child
from harness.workers import diffusers_from_file, measure_saved

ROOT = Path(__file__).resolve().parents[1]
SEED = 0

# LTX-2's published flags (diffusers scripts/convert_ltx2_to_diffusers.py); its defaults say causal decoder
LTX2_FLAGS = dict(decoder_causal=False, spatial_compression_ratio=32, temporal_compression_ratio=8)
LTX23 = dict(block_out_channels=(256, 512, 1024, 1024), layers_per_block=(4, 6, 4, 2, 2),
             decoder_block_out_channels=(256, 512, 512, 1024), decoder_layers_per_block=(4, 6, 4, 2, 2),
             decoder_spatio_temporal_scaling=(True,) * 4, decoder_inject_noise=(False,) * 5,
             upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
             upsample_residual=(False,) * 4, upsample_factor=(2, 2, 1, 2), decoder_spatial_padding_mode="zeros")

# family -> (diffusers class, constructor kwargs, latent channels)
FAMILIES = {
    "mochi": ("AutoencoderKLMochi", {}, 12),
    "ltx": ("AutoencoderKLLTXVideo", {}, 128),                # 0.9.0 = the default config
    "ltx2": ("AutoencoderKLLTX2Video", LTX2_FLAGS, 128),      # 2.0: the default shapes, published flags
    "ltx2.3": ("AutoencoderKLLTX2Video", {**LTX23, **LTX2_FLAGS}, 128),
    "hunyuan_video": ("AutoencoderKLHunyuanVideo", {}, 16),
    "magvit": ("AutoencoderKLMagvit", {}, 16),
    "hunyuan_video15": ("AutoencoderKLHunyuanVideo15", {}, 32),
}
MODES = ("default", "one-pass", "framewise", "exact")


def _diffusers(family: str, weights: Path):
    import diffusers

    cls_name, kwargs, _ = FAMILIES[family]
    model = diffusers_from_file(getattr(diffusers, cls_name), weights, **kwargs).requires_grad_(False)
    # one pass, no framewise/temporal tiling (HunyuanVideo turns framewise decoding on by default)
    for flag in ("use_framewise_decoding", "use_framewise_encoding", "use_tiling"):
        if hasattr(model, flag):
            setattr(model, flag, False)

    def decode(z):
        return (model.decode(z).sample / 2 + 0.5).clamp_(0, 1)
    return model, decode


def _ours(family: str, weights: Path, mode: str = "default"):
    sys.path.insert(0, str(ROOT))
    import vae

    v = vae.load(weights)
    if family == "ltx":      # ours pads LTX's decoder with reflect, as ComfyUI; diffusers with zeros
        from vae.archs import ltx
        ltx.set_decoder_padding(v.model, "zeros")
    r, s = v.caps.temporal_ratio, v.caps.spatial_ratio

    def decode(z):
        t, h, w = z.shape[2:]
        opts = {"default": {}, "one-pass": dict(tile_frames=r * t), "framewise": dict(tile_frames=r),
                "exact": dict(tile_frames=r, tile=(-(-h // 2) * s, -(-w // 2) * s), mode="exact")}[mode]
        return v.decode(z, **opts)
    return v.model, decode


def worker(args) -> None:
    tmp = Path(args.tmp)
    weights = tmp / f"{args.family}.safetensors"
    build = lambda: (_diffusers(args.family, weights) if args.worker == "diffusers"
                     else _ours(args.family, weights, args.worker.split(":", 1)[1]))
    measure_saved(args.threads, tmp / f"{args.family}_latent.npy", build,
                  tmp / f"{args.family}_{args.worker.replace(':', '_')}", args.repeat)


def _prepare(family: str, tmp: Path, frames: int, size: int) -> None:
    import diffusers
    import numpy as np
    import torch
    from safetensors.torch import save_file

    cls_name, kwargs, channels = FAMILIES[family]
    torch.manual_seed(SEED)
    model = getattr(diffusers, cls_name)(**kwargs)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / f"{family}.safetensors"))
    g = torch.Generator().manual_seed(SEED)
    np.save(tmp / f"{family}_latent.npy", torch.randn(1, channels, frames, size, size, generator=g).numpy())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--frames", type=int, default=3, help="latent frames")
    p.add_argument("--size", type=int, default=8, help="latent height and width")
    p.add_argument("--repeat", type=int, default=2, help="timed calls per run (no warm-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--modes", default="default", help="our decode modes, comma list of: " + ", ".join(MODES))
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--family", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    p.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.prepare:
        return _prepare(args.family, Path(args.tmp), args.frames, args.size)
    if args.worker:
        return worker(args)

    import numpy as np      # the parent stays small: children's ru_maxrss starts at the parent's peak

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    me = [sys.executable, str(Path(__file__).resolve())]
    print(f"video decode benchmark: latent 1 x C x {args.frames} x {args.size} x {args.size}, fp32, "
          f"{args.threads} threads, {args.repeat} timed call(s), published configs, random weights")
    print(f"torch {metadata.version('torch')}, diffusers {metadata.version('diffusers')}, "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    rows = {}
    for family in [f.strip() for f in args.families.split(",") if f.strip()]:
        with tempfile.TemporaryDirectory(prefix="vaekit-video-") as d:
            common = ["--family", family, "--tmp", d, "--frames", str(args.frames), "--size", str(args.size)]
            print(f"  {family}: building the default-config model ...", flush=True)
            if not run_child(me + ["--prepare"] + common, env):
                continue
            runs = {}
            for lib in ["diffusers"] + [f"ours:{m.strip()}" for m in args.modes.split(",")]:
                print(f"    decoding with {lib} ...", flush=True)
                if run_child(me + ["--worker", lib, "--repeat", str(args.repeat), "--threads", str(args.threads)]
                             + common, env):
                    runs[lib] = json.loads(Path(d, f"{family}_{lib.replace(':', '_')}.json").read_text())
            for lib in [k for k in runs if k != "diffusers"]:
                res = {"diffusers": runs.get("diffusers"), "ours": runs[lib]}
                if res["diffusers"]:
                    a, b = (np.load(Path(d, f"{family}_{name}.npy")).astype(np.float64)
                            for name in (lib.replace(":", "_"), "diffusers"))
                    if a.shape == b.shape:
                        per_frame = np.abs(a - b).max(axis=(0, 1, 3, 4))
                        res["max_abs"] = float(per_frame.max())
                        bad = np.nonzero(per_frame > 1e-4)[0]
                        res["agree_from_frame"] = int(bad[-1] + 1) if len(bad) else 0
                        res["frames"] = int(a.shape[2])
                    else:
                        res["shape_mismatch"] = [list(a.shape), list(b.shape)]
                mode = lib.split(":", 1)[1]
                rows[family if args.modes == "default" else f"{family} {mode}"] = res

    print()
    head = (f"{'family':<24} {'frames':>6} {'diffusers s':>12} {'ours s':>8} {'ratio':>6} {'cpu ratio':>9} "
            f"{'diff. work MiB':>15} {'ours work MiB':>14} {'diff. peak':>11} {'ours peak':>10} "
            f"{'max abs':>9} {'agree from':>10}")
    print(head)
    print("-" * len(head))
    for family, r in rows.items():
        dif, our = r.get("diffusers"), r.get("ours")
        if not dif or not our:
            print(f"{family:<24} failed")
            continue
        print(f"{family:<24} {r.get('frames', '-'):>6} {dif['best_s']:>12.2f} {our['best_s']:>8.2f} "
              f"{our['best_s'] / dif['best_s']:>6.2f} {our['cpu_s'] / dif['cpu_s']:>9.2f} "
              f"{dif['working_set_mib']:>15.0f} {our['working_set_mib']:>14.0f} "
              f"{dif['peak_rss_mib']:>11.0f} {our['peak_rss_mib']:>10.0f} {r.get('max_abs', float('nan')):>9.1e} "
              f"{r.get('agree_from_frame', '-'):>10}")
    print("\nratio = ours / diffusers best time (lower is faster); cpu ratio = the same for the process CPU time of "
          "those calls (less sensitive to other processes); work = peak RSS during decoding - RSS after "
          "load; 'agree from' = first frame from which all frames agree within 1e-4 (0 = all).")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
