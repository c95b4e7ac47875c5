"""``vaekit cache``: the latent cache for trainers (vae/cache/, docs/cache.md) on the command line."""
from __future__ import annotations

import argparse
import sys


def _frames(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.replace(";", ",").split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of frame counts (e.g. 1,25,49)") from None


def add(command, quiet: dict) -> None:
    s = command("cache", cmd_cache, help="cache the latents of a dataset for a trainer (docs/cache.md)",
                description="Encode every image and video clip of a dataset, exactly (equal to one untiled pass) "
                            "within --max-memory, into one latent file per item in a trainer's layout; a manifest "
                            "in the output folder keeps the cache current: a rerun redoes only what changed.")
    s.add_argument("inputs", nargs="+", help="folders, list files (.txt/.jsonl/.json/.csv) or musubi-tuner dataset "
                                             "configs (.toml)")
    s.add_argument("--vae", required=True, help="the VAE file")
    s.add_argument("-o", "--output", help="the cache folder (a musubi-tuner config's cache_directory wins)")
    s.add_argument("--format", choices=("vaekit", "musubi", "ltx2", "simpletuner"), default="vaekit",
                   help="vaekit: mean and log-variance (ours); musubi: musubi-tuner's files (--arch); ltx2: LTX-2's "
                        "trainer's .pt files; simpletuner: SimpleTuner's VAE cache, images (--model-family) "
                        "(default: %(default)s)")
    s.add_argument("--arch", help="musubi-tuner's architecture: wan, hv, hv15, qi, f2d, f2k4b, f2k9b, or ltx2 (the "
                                  "LTX-2 fork's; named, never the default) (default: the one this VAE's latents train)")
    g = s.add_argument_group("buckets")
    g.add_argument("--resolution", help="WxH: buckets of this area, by aspect ratio (musubi-tuner's rule); default: "
                                        "each source's own size rounded down to the bucket step")
    g.add_argument("--buckets", help="explicit buckets WxHxF;WxHxF (LTX-2's trainer's rule: nearest aspect ratio, "
                                     "then most frames)")
    g.add_argument("--bucket-step", type=int, help="bucket sizes are multiples of this (default: 16 musubi, 32 ltx2, "
                                                   "the VAE's ratio otherwise)")
    g.add_argument("--no-bucket", dest="enable_bucket", action="store_false",
                   help="one bucket: the --resolution itself")
    g.add_argument("--no-upscale", action="store_true", help="a smaller source keeps its size (rounded to the step)")
    g = s.add_argument_group("simpletuner", "SimpleTuner's settings, as its config and dataloader config name them "
                                            "(--resolution: its pixel resolution, e.g. 1024)")
    g.add_argument("--model-family", help="its model_family: sdxl, sd3, flux, qwen_image, wan, ltxvideo, ltxvideo2 "
                                          "(hunyuanvideo is refused: see docs/cache.md)")
    g.add_argument("--resolution-type", default="pixel", help="pixel (area and pixel_area are refused: their sizes "
                                                              "depend on SimpleTuner's file order)")
    g.add_argument("--crop", action="store_true", help="crop: true (refused: its crops are unseeded)")
    g.add_argument("--crop-style", choices=("center", "corner", "random"),
                   help="where the bucket is cut from the resize: center or corner (random is refused: unseeded)")
    g.add_argument("--aspect-bucket-alignment", type=int,
                   help="bucket sizes are multiples of this (default: what SimpleTuner enforces for the family: "
                        "64 sdxl/sd3/flux/ltxvideo, 32 qwen_image/wan)")
    g.add_argument("--video-min-frames", type=int, help="its video.min_frames: videos with fewer frames (on the "
                   "frame rule) are not cached (default: --frames, its num_frames)")
    g.add_argument("--video-max-frames", type=int, help="its video.max_frames: videos with more frames (on the frame "
                                                        "rule) are not cached")
    g.add_argument("--bucket-strategy", choices=("aspect_ratio", "resolution_frames"), default="aspect_ratio",
                   help="its video.bucket_strategy: resolution_frames keys a video's bucket WxH@frames in the JSON")
    g.add_argument("--frame-interval", type=int, help="its video.frame_interval (resolution_frames: bucket frames "
                                                      "rounded down to a multiple of it)")
    g.add_argument("--id", help="the dataset's id (names its aspect_ratio_bucket_*_{id}.json files)")
    g.add_argument("--instance-data-dir", help="the dataset's instance_data_dir as its config gives it (the paths in "
                                               "the JSON files; default: the input folder)")
    g = s.add_argument_group("frames")
    g.add_argument("--frames", type=_frames, default=(1,), help="clip lengths in frames, e.g. 1,25,49; each is "
                   "rounded down to the VAE's frame rule (1+4k Wan/HunyuanVideo, 1+8k LTX) (default: 1)")
    g.add_argument("--extraction", choices=("head", "chunk", "slide", "uniform", "full"), default="head",
                   help="head: the first N frames; chunk: consecutive N-frame pieces; slide: every --stride frames; "
                        "uniform: --sample windows spread evenly; full: all frames up to --max-frames")
    g.add_argument("--stride", dest="frame_stride", type=int, default=1, help="slide: frames between clip starts")
    g.add_argument("--sample", dest="frame_sample", type=int, default=1, help="uniform: clips per video")
    g.add_argument("--max-frames", type=int, default=129, help="full: at most this many frames (default: 129)")
    g.add_argument("--fps", type=float, help="thin every video to this frame rate first (never repeats frames)")
    g = s.add_argument_group("the encode")
    g.add_argument("--mode", choices=("exact", "fast"), default="exact",
                   help="exact (default): equal to one untiled pass; fast: blended tiles")
    g.add_argument("--max-memory", metavar="GB", help="device memory budget, e.g. 1.5 or 512MB: the planner picks "
                                                      "tile and chunk per bucket")
    g.add_argument("--tile", type=int, default=512, help="largest tile in pixels (0: untiled; default: 512)")
    g.add_argument("--overlap", type=int, default=64, help="fast mode's tile overlap in pixels (default: 64)")
    g.add_argument("--dtype", default="float32", help="compute dtype: float32 (default), bfloat16, float16")
    g.add_argument("--save-dtype", help="stored dtype (default: the format's: float32 vaekit, bfloat16 ltx2, "
                                        "musubi-tuner's per architecture)")
    g.add_argument("--device", help="e.g. cuda:0 or cpu (default: cuda if present)")
    g.add_argument("--devices", help="share whole items among devices, e.g. cuda:0,cuda:1 (one process and VAE each)")
    g = s.add_argument_group("the run")
    g.add_argument("--timeout", type=float, default=600, help="seconds per source, reading and encoding (default: 600)")
    g.add_argument("--threads", type=int, default=2, help="video decoder threads per source (default: 2)")
    g.add_argument("--dry-run", action="store_true", help="buckets, item counts, the plan and predicted memory per "
                                                          "bucket, and a time estimate from a first item; writes nothing")
    g.add_argument("--verify", type=int, default=0, metavar="N",
                   help="after the run: decode N random items (PSNR against the source) and encode them untiled "
                        "(max |cached - untiled|)")
    g.add_argument("--prune", action="store_true", help="remove outputs of earlier runs whose source is gone")
    g.add_argument("--seed", type=int, default=0, help="the --verify pick (default: 0)")
    s.add_argument("-q", "--quiet", **quiet)


def cmd_cache(a) -> int:
    from ..cache.options import CacheOptions
    from ..cache.runner import run
    fields = set(CacheOptions.__dataclass_fields__)
    opts = CacheOptions(**{k: v for k, v in vars(a).items() if k in fields})
    result = run(opts, say=print, stream=sys.stderr)
    return 1 if result.failed else 0
