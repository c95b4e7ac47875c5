"""Input checks where tensors and tiling arguments enter the library, with fixes that fit the numbers
given. The handle's ``check_latent`` / ``check_image`` (``model_latent`` / ``model_image`` here) and the
tile planners call these first, so nothing degenerate reaches a model (where it would end in a raw
torch error or a nonsense fix).

Decisions (README, Reliability):
- uint8 images are converted (/255): the type fixes the range, so the conversion is exact. Other
  integer and bool images are refused: their range is not known (0..255? 0..65535? a mask?).
- Float images a little outside 0..1 (resampling overshoot) are clamped, with a warning; far outside
  (below -0.5 or above 1.5) they are refused: that is another convention (-1..1, 0..255) and encoding
  it would give a wrong latent without a sign.
- Tiles under 64 px (the nodes' widget minimum) are refused when they would cut the image into more
  than 64 tiles: there a tile's fixed cost and its overlap dominate (SD-shape VAE at 256x256 px, CPU:
  32 px tiles 3.2x, 16 px 15x the untiled time). Fewer small tiles (small images, tests) run, with a
  note in the log. Negative and fractional sizes are refused; 0 / None mean untiled.
- A memory budget is one parser (``budget``) wherever it enters: the library's ``budget``, the CLI's
  ``--max-memory``, the nodes' ``max_memory``. A GB is 2^30 bytes throughout (ComfyUI's and the
  nodes' unit; "GiB" is read as the same, "MB" as 2^20): bytes as an int, GB as a float (every number,
  for the nodes' GB widget), or a string with an optional unit ("4", "4GB", "4 GB", "512MB", "1.5GiB").
  Negative, NaN, infinite and unreadable values are refused, and so are sizes under 1 KiB, which no
  VAE call fits (``budget=4``, 4 bytes, is most likely meant as 4 GB: the error says so). 0 means
  "no budget of my own" only where the caller gives it that meaning (the nodes: what ComfyUI says is
  free); the library and the CLI refuse it (a budget that fits nothing), None means no budget.
- ``call``: the one check of VAE.decode / VAE.encode's keywords where they enter: an unknown keyword is
  a TypeError that names it and lists the valid ones (the model's own options included), and tile,
  overlap, tile_frames, overlap_frames, mode, budget, offload and out_device are checked here, before
  any work, each with an InputError naming it."""
from __future__ import annotations

import difflib
import logging
import math
import numbers
import re
from typing import Callable, Mapping, Optional, Sequence

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


def image(x, image_channels: int, ratio: int, video: bool, input: str = "pixels",
          pixel_range: tuple[float, float] = (0.0, 1.0)) -> torch.Tensor:
    """Kind, dtype, value range and non-empty size of images [B, C, H, W] / clips [B, C, T, H, W];
    returns them as float in ``pixel_range`` (0..1: uint8 converted; slight overshoot clamped)."""
    _kind(x, "image", input)
    if x.dtype == torch.uint8:
        log.info("VAEKit: %s: uint8 pixels converted to 0..1 (divided by 255).", input)
        x = x.float() / 255 * (pixel_range[1] - pixel_range[0]) + pixel_range[0]
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
    return _range(x, input, *pixel_range)


def _range(x: torch.Tensor, input: str, a: float = 0.0, b: float = 1.0) -> torch.Tensor:
    lo, hi = (float(v) for v in torch.aminmax(x.detach().float()))
    if a <= lo and hi <= b or not all(map(math.isfinite, (lo, hi))):
        return x       # in range, or NaN/Inf: the handle's finite check names those
    if (a, b) != (0.0, 1.0):        # a caller that names its range (diffusers' face: -1..1) keeps to it
        raise InputError(f"the image's values span {lo:.3g}..{hi:.3g}, outside the {a:g}..{b:g} given.",
                         input=input, fix=f"clamp or rescale the pixels to {a:g}..{b:g} first.")
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


def _tile_sizes(tile) -> tuple[int, ...]:
    given = tile if isinstance(tile, (tuple, list)) else (tile,)
    if not 1 <= len(given) <= 2:
        raise InputError(f"{tuple(given)!r} has {len(given)} sizes; a tile is one size or (height, width) in pixels.",
                         input="tile", fix="give one size (e.g. 512) or two (e.g. (512, 768)).")
    return tuple(_size(t, "tile", "pixels") for t in given)


def tiles(tile, overlap, ratio: int, latent_shape: Sequence[int] = ()) -> tuple[object, int]:
    """Spatial tile size(s) and overlap in pixels, checked; returns them as ints (tile: one int or a
    tuple per axis, as given). ``latent_shape``: the grid to tile, to count the tiles."""
    overlap = _size(overlap, "overlap", "pixels")
    sizes = _tile_sizes(tile)
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


# ---- a tensor for one VAE: what its family declares (the handle's ``caps``) ------------------------

def as_clip(caps, t) -> tuple[torch.Tensor, bool]:
    """For a ``frames_in_batch`` model, a 4-D [T, C, h, w] tensor as the one clip [1, C, T, h, w] it
    holds; and whether it was one (the result then goes back to [T, C, H, W])."""
    if caps.frames_in_batch and torch.is_tensor(t) and t.dim() == 4:
        return t.movedim(0, 1).unsqueeze(0), True
    return t, False


def divisible(h: int, w: int, r: int, what: str, input: str = "pixels") -> None:
    """Images must tile the latent grid exactly: one rule and one message for every engine."""
    if h % r or w % r:
        raise InputError(f"the image is {w}x{h} pixels; {what} needs width and height divisible by {r}.", input=input,
                         fix=f"crop or resize to {w // r * r}x{h // r * r} (e.g. core 'ImageCrop' or 'Upscale Image') first.")


def model_latent(vae, z, input: str, hint: Callable[[int, int], str]) -> torch.Tensor:
    """A LATENT for ``vae`` (a handle: its ``caps`` and ``name``), checked: kind and size (``latent``),
    a decoder, the rank and channels its family takes, finite values. Returned as the model's layout (one
    clip for a ``frames_in_batch`` model, no frame axis for an image model), still packed as given.
    ``hint(channels, rank)`` names the models whose latents look like the one given."""
    latent(z, input)
    caps = vae.caps
    rank = z.dim()
    if not caps.can_decode:
        raise InputError("this VAE has no decoder (only an encoder file was loaded).", input="vae",
                         fix="load the matching *_decoder file too, or the pair by its stem name.")
    z, _ = as_clip(caps, z)
    if caps.temporal_ratio is not None:
        if z.dim() != 5:
            seen = f" (as {hint(z.shape[1], z.dim())} latents have)" if z.dim() == 4 else ""
            takes = "[B, C, frames, h, w] or one clip's frames [frames, C, h, w]" if caps.frames_in_batch \
                else "[B, C, frames, h, w] (one frame: [B, C, 1, h, w], as Qwen-Image's sampler gives them)"
            raise InputError(f"{vae.name} is a video VAE and takes video latents {takes}; got shape "
                             f"{tuple(z.shape)}{seen}.", input=input,
                             fix="connect the LATENT of a video model (e.g. its sampler's output); "
                                 "an image latent belongs to an image VAE.")
    else:
        if z.dim() == 5 and z.shape[2] == 1:
            z = z[:, :, 0]
        if z.dim() != 4:
            raise InputError(f"expected an image latent [B, C, h, w] for {vae.name}, got shape {tuple(z.shape)}.",
                             input=input, fix="decode video latents with a video VAE.")
    c = z.shape[1]
    if c not in {caps.latent_channels_packed, caps.latent_channels}:
        src = hint(c, rank)      # the rank as given (a 5-D latent is a video model's)
        raise InputError(
            f"this latent has {c} channels (as {src} latents do) but the loaded VAE, {vae.name}, "
            f"takes {caps.latent_channels_packed}.", input=input,
            fix="load the VAE that belongs to the model that made this latent.")
    if not torch.isfinite(z).all():
        bad = int((~torch.isfinite(z)).sum())
        raise InputError(f"the latent contains {bad} NaN/Inf values; decoding it would give a black or broken image.",
                         input=input, fix="the sampler diverged: re-run it in fp32/bf16 (not fp16), "
                                          "or with fewer steps/lower CFG; check the model and LoRA weights.")
    return z


def model_image(vae, x, input: str, pixel_range: tuple[float, float] = (0.0, 1.0)) -> torch.Tensor:
    """Images [B, C, H, W] (or clips [B, C, T, H, W] for a video VAE; a ``frames_in_batch`` model's one
    clip [T, C, H, W] becomes [1, C, T, H, W]) in ``pixel_range`` for ``vae`` (a handle), checked (``image``, an
    encoder, channels, sides that tile the latent grid, finite values); a clip cut to the frames an
    encode takes (``fit_frames``)."""
    caps = vae.caps
    video = caps.temporal_ratio is not None
    x, _ = as_clip(caps, x)
    x = image(x, caps.image_channels, caps.spatial_ratio_packed, video, input, pixel_range)
    if not caps.can_encode:
        raise InputError("this VAE has no encoder (only a decoder file was loaded).", input="vae",
                         fix="load the matching *_encoder file too, or the pair by its stem name.")
    dims = 5 if video else 4
    if x.dim() == dims and x.shape[1] == 3 and caps.image_channels == 4:
        x = torch.cat([x, x.new_full(x[:, :1].shape, pixel_range[1])], dim=1)   # RGB into RGBA: opaque, as ComfyUI pads
    if x.dim() != dims or x.shape[1] < caps.image_channels:
        what = "clips [B, C, frames, H, W]" if video else "images [B, C, H, W]"
        raise InputError(f"expected {what} with {caps.image_channels} channels, got shape {tuple(x.shape)}.",
                         input=input)
    x = x[:, : caps.image_channels]
    divisible(*x.shape[-2:], caps.spatial_ratio_packed, vae.name, input)
    if video:
        x = x[:, :, : fit_frames(vae, x.shape[2], input)]
    if not all(math.isfinite(float(v)) for v in torch.aminmax(x)):     # a reduction: no copy of the clip
        raise InputError("the image contains NaN/Inf values.", input=input,
                         fix="check the node that produced the image.")
    return x


def fit_frames(vae, t: int, input: str) -> int:
    """Of a clip of ``t`` frames, how many an encode takes (``vae.clip_frames``: 1 + r*k by the temporal
    compression the family declares; a model with its own clips pads them and takes all). The rest
    is dropped from the end, as ComfyUI core's VAE Encode does, with a warning naming the counts
    that fit."""
    keep = vae.clip_frames(t)
    if keep != t:
        r = vae.caps.temporal_ratio
        log.warning("VAEKit: %s: the clip has %d frames; %s encodes 1 + %d*k frames (a first frame, then groups "
                    "of %d): the first %d are encoded and the last %d dropped, as ComfyUI core does. %d or %d "
                    "frames fit.", input, t, vae.name, r, r, keep, t - keep, keep, keep + r)
    return keep


# ---- dtypes and devices ------------------------------------------------------------------------

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
        if not have:
            raise InputError(f"{d!r}: CUDA is not available here (this PyTorch sees no CUDA device: a CPU-only build, "
                             "or no driver).", input=input, fix="pass 'cpu', or leave it out for the default.")
        if (dev.index or 0) >= have:
            raise InputError(f"{dev} is not on this machine: it has {have} CUDA device(s).", input=input,
                             fix=f"use cuda:0 .. cuda:{have - 1}, or 'cpu'.")
    elif dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise InputError("MPS (Apple GPU) is not available on this machine.", input=input, fix="use 'cpu'.")
    elif dev.type == "meta":
        raise InputError("the meta device holds no data; a VAE cannot run there.", input=input, fix="use 'cpu' or a GPU.")
    return dev


# ---- memory budgets ----------------------------------------------------------------------------

GB = 1 << 30                      # a GB of memory here: 2^30 bytes, as ComfyUI's and the nodes' max_memory
MIN_BUDGET = 1 << 10              # no VAE call fits in less (and an int under it is most likely meant as GB)
UNITS = {"": GB, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": GB, "GB": GB,
         "T": 1 << 40, "TB": 1 << 40}
_SIZE = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|[-+]?(?:nan|inf|infinity))\s*([a-z]*)\s*$",
                   re.IGNORECASE)
_FORMS = ("bytes as an int (e.g. 4 << 30), GB as a float (4.0), or a string: '4GB', '4 GB', '512MB', '1.5GiB' "
          "(a GB is 2^30 bytes)")
_TEXT_FORMS = "a size: '4' (GB), '4GB', '4 GB', '1.5GiB' or '512MB' (a GB is 2^30 bytes)"


def budget(value, input: str = "budget", *, numbers_in_gb: bool = False, zero: bool = False) -> Optional[int]:
    """A memory budget in bytes, from what a user gives (see the module's notes); None for None, and 0 for
    0 where ``zero`` allows it (the caller's "none of my own"). ``numbers_in_gb``: every number is GB (the
    nodes' widget), else an int is bytes and a float GB (the library)."""
    if value is None:
        return None
    forms = "GB, e.g. 4 or 0.5" if numbers_in_gb else _TEXT_FORMS if isinstance(value, str) else _FORMS
    if isinstance(value, str):
        m = _SIZE.match(value)
        unit = m and m[2].upper().replace("IB", "B")
        if not m or unit not in UNITS:
            raise InputError(f"{value!r} is not a memory size.", input=input, fix=f"give {forms}.")
        size = float(m[1]) * UNITS[unit]
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        in_bytes = isinstance(value, numbers.Integral) and not numbers_in_gb
        size = float(value) * (1 if in_bytes else GB)
    else:
        raise InputError(f"{value!r} (a {type(value).__name__}) is not a memory size.", input=input,
                         fix=f"give {forms}.")
    if not math.isfinite(size):
        raise InputError(f"a memory budget of {value!r} is not a size.", input=input, fix=f"give {forms}.")
    if size < 0:
        raise InputError(f"a memory budget of {value!r} is negative.", input=input, fix=f"give {forms}.")
    if size == 0:
        if zero:
            return 0
        raise InputError(f"a memory budget of {value!r} fits nothing.", input=input,
                         fix="give a size, e.g. 4 GB, or no budget at all (None in the library; on the command "
                             "line, leave the option out).")
    if size < MIN_BUDGET:
        meant = (f" An int is bytes: for {value} GB pass {float(value)} or '{value}GB'."
                 if isinstance(value, numbers.Integral) and not numbers_in_gb else "")
        raise InputError(f"a memory budget of {value!r} is {int(size)} bytes, under 1 KiB: no VAE call fits in that."
                         + meant, input=input, fix=f"give {forms}.")
    return int(size)


# ---- the keywords of VAE.decode / VAE.encode ---------------------------------------------------

MODES = ("fast", "exact")
CALL_KEYWORDS = ("tile", "overlap", "progress", "out_device", "tile_frames", "overlap_frames", "mode", "budget",
                 "offload")


def mode(m, input: str = "mode") -> str:
    if not isinstance(m, str) or m not in MODES:
        raise InputError(f"unknown tiling mode {m!r}.", input=input, fix=f"use one of {', '.join(MODES)}.")
    return m


_mode, _budget = mode, budget          # by other names: call's keywords are named as VAE.decode's


def keywords(op: str, given: Mapping, options: Sequence[str]) -> None:
    """A keyword that neither the call nor the model takes is a TypeError (as Python's own for a wrong
    keyword) naming it, the nearest valid one and all valid ones (the model's options apart)."""
    unknown = [k for k in given if k not in options]
    if not unknown:
        return
    valid = list(CALL_KEYWORDS) + list(options)
    near = difflib.get_close_matches(unknown[0], valid, n=1)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    own = (f"; this model's own {op} options: {', '.join(options)}" if options else
           f"; this model takes no {op} options of its own")
    raise TypeError(f"VAE.{op}() got an unexpected keyword argument '{unknown[0]}'{hint}. It takes: "
                    f"{', '.join(CALL_KEYWORDS)}{own}.")


def call(op: str, given: Mapping, options: Sequence[str], *, tile=None, overlap=None, tile_frames=None,
         overlap_frames=None, mode: str = "fast", budget=None, offload=None, out_device=None) -> dict:
    """The keywords of one VAE.decode / VAE.encode, checked where they enter (see the module's notes);
    returns the call's own ones normalised (tile sizes as ints, the budget in bytes, devices as
    ``torch.device``)."""
    keywords(op, given, options)
    checked_mode = _mode(mode)
    sizes = _tile_sizes(tile) if tile is not None else None
    return dict(tile=(sizes if isinstance(tile, (tuple, list)) else sizes[0]) if sizes is not None else None,
                overlap=_size(overlap, "overlap", "pixels") if overlap is not None else None,
                tile_frames=_size(tile_frames, "tile_frames", "frames") if tile_frames is not None else None,
                overlap_frames=_size(overlap_frames, "overlap_frames", "frames") if overlap_frames is not None
                else None,
                mode=checked_mode, budget=_budget(budget), offload=device(offload, "offload"),
                out_device=device(out_device, "out_device"))
