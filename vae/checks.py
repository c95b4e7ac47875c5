"""Input checks where tensors and tiling arguments enter the library, with fixes that fit the numbers
given. The handle's ``check_latent`` / ``check_image`` and the tile planners call these first, so
nothing degenerate reaches a model (where it would end in a raw torch error or a nonsense fix).

Decisions (README, Reliability):
- uint8 images are converted (/255): the type fixes the range, so the conversion is exact. Other
  integer and bool images are refused: their range is not known (0..255? 0..65535? a mask?).
- Float images a little outside 0..1 (resampling overshoot) are clamped, with a warning; far outside
  (below -0.5 or above 1.5) they are refused: that is another convention (-1..1, 0..255) and encoding
  it would give a wrong latent without a sign.
- Tiles under 64 px (the nodes' widget minimum) are refused when they would cut the image into more
  than 64 tiles: there a tile's fixed cost and its overlap dominate (SD-shape VAE at 256x256 px, CPU:
  32 px tiles 3.2x, 16 px 15x the untiled time). Fewer small tiles (small images, tests) run, with a
  note in the log. Negative and fractional sizes are refused; 0 / None mean untiled. Negative sizes are
  refused; 0 / None mean untiled."""
from __future__ import annotations

import logging
import math
import numbers
from typing import Sequence

import torch

from .errors import InputError

log = logging.getLogger("VAEKit")
MIN_TILE_PX = 64                  # core's and our nodes' widget minimum
MAX_SMALL_TILES = 64              # tiles under MIN_TILE_PX beyond this many are refused
RANGE_SLACK = 0.5                 # refuse images beyond [-0.5, 1.5]; clamp what lies between
_noted: set[int] = set()
LATENT_AXES = {4: ("batch", "channels", "height", "width"), 5: ("batch", "channels", "frames", "height", "width")}


def _kind(t, what: str, input: str) -> None:
    """A dense tensor with data, real-valued."""
    if not torch.is_tensor(t):
        raise InputError(f"expected {what} tensor, got a {type(t).__name__}.", input=input,
                         fix="connect the output of a node that makes one.")
    if t.is_meta:
        raise InputError(f"the {what} is a meta tensor: it has a shape {tuple(t.shape)} but no data.", input=input,
                         fix="pass a tensor that holds its values (not one created on the 'meta' device).")
    if t.layout != torch.strided:
        raise InputError(f"the {what} is a {str(t.layout).replace('torch.', '')} tensor.", input=input,
                         fix="pass a dense tensor (.to_dense()).")
    if t.is_complex():
        raise InputError(f"the {what} has complex values ({t.dtype}).", input=input,
                         fix="pass real values (the node before this one produced a complex tensor).")


def _empty_axes(t: torch.Tensor, names: Sequence[str]) -> list[str]:
    return [n for n, s in zip(names, t.shape) if s == 0]


def latent(z, input: str = "samples") -> None:
    """Kind, dtype and non-empty axes of a latent (rank and channels are the handle's checks)."""
    _kind(z, "latent", input)
    if not z.is_floating_point():
        raise InputError(f"the latent is {str(z.dtype).replace('torch.', '')}; latents are floating point.",
                         input=input, fix="connect a LATENT from a sampler, VAE Encode or Load Latent.")
    names = LATENT_AXES.get(z.dim())
    if names is None:
        return     # the handle names the rank it takes
    empty = _empty_axes(z, names)
    if "batch" in empty:
        raise InputError(f"the latent holds no samples (batch 0, shape {tuple(z.shape)}).", input=input,
                         fix="check the node that made it: an empty batch, e.g. a batch slice past its end.")
    if empty:
        raise InputError(f"the latent is empty: {' and '.join(f'0 {n}' for n in empty)} (shape {tuple(z.shape)}).",
                         input=input, fix="check the node that made it (an empty latent size, or a crop or trim "
                                          "outside the latent).")


def image(x, image_channels: int, ratio: int, video: bool, input: str = "pixels") -> torch.Tensor:
    """Kind, dtype, value range and non-empty size of images [B, C, H, W] / clips [B, C, T, H, W];
    returns them as float in 0..1 (uint8 converted, slight overshoot clamped)."""
    _kind(x, "image", input)
    if x.dtype == torch.uint8:
        log.info("VAEKit: %s: uint8 pixels converted to 0..1 (divided by 255).", input)
        x = x.float() / 255
    elif not x.is_floating_point():
        what = "a mask (bool)" if x.dtype == torch.bool else f"{str(x.dtype).replace('torch.', '')} integers"
        raise InputError(f"the image is {what}, whose pixel range is not known; images are floating point in 0..1.",
                         input=input, fix="convert it to float in 0..1 (divide by the format's maximum, e.g. 255 or "
                                          "65535)" + (", or use core 'Convert Mask to Image'." if x.dtype == torch.bool
                                                      else "."))
    if x.dim() != (5 if video else 4) or x.shape[1] < image_channels:
        return x       # the handle names the layout it takes
    names = ("batch", "channels", "frames", "height", "width") if video else ("batch", "channels", "height", "width")
    empty = _empty_axes(x, names)
    if "batch" in empty:
        raise InputError(f"no images to encode (batch 0, shape {tuple(x.shape)}).", input=input,
                         fix="check the node that made the IMAGE batch (e.g. a batch slice past its end).")
    if "frames" in empty:
        raise InputError("the clip has 0 frames.", input=input,
                         fix="check the node that made the frames (e.g. a trim past the end of the video).")
    h, w = x.shape[-2:]
    if h < ratio or w < ratio:
        up = (max(ratio, -(-w // ratio) * ratio), max(ratio, -(-h // ratio) * ratio))
        raise InputError(f"the image is {w}x{h} pixels, smaller than one latent pixel ({ratio}x{ratio}).",
                         input=input, fix=f"resize it to at least {up[0]}x{up[1]} (e.g. core 'Upscale Image') or "
                                          "check the node that made it (a crop outside the image?).")
    return _range(x, input)


def _range(x: torch.Tensor, input: str) -> torch.Tensor:
    lo, hi = (float(v) for v in torch.aminmax(x.detach().float()))
    if 0.0 <= lo and hi <= 1.0 or not all(map(math.isfinite, (lo, hi))):
        return x       # in range, or NaN/Inf: the handle's finite check names those
    if lo < -RANGE_SLACK or hi > 1 + RANGE_SLACK:
        if lo >= 0 and hi <= 255:
            guess, fix = "0..255 values", "divide by 255"
        elif lo >= -1 - 1e-3 and hi <= 1 + 1e-3:
            guess, fix = "-1..1 values", "map them to 0..1 with (x + 1) / 2"
        else:
            guess, fix = "values of another scale", "normalise them to 0..1"
        raise InputError(f"the image's values span {lo:.3g}..{hi:.3g}; images are 0..1 (these look like {guess}).",
                         input=input, fix=f"{fix} before encoding.")
    n = int(((x < 0) | (x > 1)).sum())
    log.warning("VAEKit: %s: %d pixel values outside 0..1 (%.3g..%.3g) clamped to 0..1.", input, n, lo, hi)
    return x.clamp(0, 1)


def _size(v, input: str, unit: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or float(v) != int(v):
        raise InputError(f"{v!r} is not a whole number of {unit}.", input=input, fix=f"give an integer ({unit}).")
    if v < 0:
        raise InputError(f"{int(v)} {unit} is negative.", input=input,
                         fix="use 0 for no tiling (one pass)." if "overlap" not in input else "use 0 or more.")
    return int(v)


def tiles(tile, overlap, ratio: int, latent_shape: Sequence[int] = ()) -> tuple[object, int]:
    """Spatial tile size(s) and overlap in pixels, checked; returns them as ints (tile: one int or a
    tuple per axis, as given). ``latent_shape``: the grid to tile, to count the tiles."""
    overlap = _size(overlap, "overlap", "pixels")
    sizes = tuple(_size(t, "tile", "pixels") for t in (tile if isinstance(tile, (tuple, list)) else (tile,)))
    per_axis = sizes * len(latent_shape) if len(sizes) == 1 else sizes
    small = [t for t in per_axis if 0 < t < MIN_TILE_PX]
    if small:
        count = math.prod(-(-n // max(1, t // ratio)) if t else 1 for n, t in zip(latent_shape, per_axis))
        px = "x".join(str(n * ratio) for n in latent_shape)
        if count > MAX_SMALL_TILES:
            raise InputError(f"tiles of {min(small)} pixels cut this {px}-pixel image into {count} tiles; below "
                             f"{MIN_TILE_PX} px a tile's fixed cost and its overlap dominate (16 px tiles: about 15x "
                             "the untiled time).", input="tile",
                             fix=f"use tiles of {MIN_TILE_PX} pixels or more, or 0 for one untiled pass.")
        if min(small) not in _noted:
            _noted.add(min(small))    # once per size: tests and scripts tile tiny tensors on purpose
            log.info("VAEKit: tiles of %d px run many times slower than tiles of %d px or more.", min(small),
                     MIN_TILE_PX)
    return (sizes if isinstance(tile, (tuple, list)) else sizes[0]), overlap


def frames(tile_frames, overlap_frames) -> tuple[int, int]:
    """Temporal tile size and overlap in pixel frames, checked (small sizes are raised to the
    planner's minimum of 2 latent frames by design)."""
    return _size(tile_frames, "tile_frames", "frames"), _size(overlap_frames, "overlap_frames", "frames")


DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


def dtype(d, input: str = "dtype"):
    """A weights/compute dtype: None (the default), a floating torch dtype, or its name ('bf16')."""
    if d is None:
        return None
    if isinstance(d, str) and d.lower() in DTYPES:
        return DTYPES[d.lower()]
    if isinstance(d, torch.dtype) and d.is_floating_point:
        return d
    raise InputError(f"{d!r} is not a floating-point dtype.", input=input,
                     fix="use torch.float32, torch.bfloat16 or torch.float16 (or 'fp32', 'bf16', 'fp16').")


def device(d, input: str = "device"):
    """A device this machine has: None (the default), or a torch device / name ('cuda:1'). An unknown
    name, a CUDA or MPS device the machine lacks, or 'meta' (no data) is refused, not met as a raw torch
    error at the first tensor moved there."""
    if d is None:
        return None
    try:
        dev = torch.device(d)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"{d!r} is not a device torch knows.", input=input,
                         fix="use 'cpu', 'cuda' (or 'cuda:N'), or 'mps'.") from None
    if dev.type == "cuda":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= have:
            raise InputError(f"{dev} is not on this machine: it has {have} CUDA device(s).", input=input,
                             fix="use 'cpu'" + (f" or cuda:0 .. cuda:{have - 1}." if have else " (this PyTorch sees "
                                                "no CUDA device; a CPU-only build, or no driver)."))
    elif dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise InputError("MPS (Apple GPU) is not available on this machine.", input=input, fix="use 'cpu'.")
    elif dev.type == "meta":
        raise InputError("the meta device holds no data; a VAE cannot run there.", input=input, fix="use 'cpu' or a GPU.")
    return dev
