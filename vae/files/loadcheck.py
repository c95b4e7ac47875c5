"""Checks between reading a file and building a model, so every malformed file ends in a LoadError
that names the file, what is wrong, and what to do.

- ``tensor_entries``: any mapping (a file's content, a user's dict) -> {name: tensor}; wrappers
  such as {"state_dict": ...} are opened, other entries (step counters, configs) are ignored.
- ``family_step``: a family's detect / key conversion / config reading / build may meet a missing key
  or an odd shape anywhere; whatever it raises becomes one LoadError naming the family and the file
  (a missing key by name, other errors with the last tensor the family read).
- ``check_weights``: the tensors the model takes must be dense floating point with data; non-finite
  values warn, or refuse when they are too many for the VAE to be of use (see ``NONFINITE_REFUSE``).
- ``damaged``: a file that does not fit the model its keys describe, said per part (encoder, decoder,
  statistics...): a part with none of its tensors is absent (an encoder-only or decoder-only file, which
  loads); a part with some of them is damaged, and the message names what is missing. A key the family
  reads to decide that a part exists (``decoder.conv_in.weight``) is named through its module's other
  tensors (a ``.bias`` without its ``.weight``: ``missing_siblings``).
- ``check_shapes``: the built model's halves, run on the meta device (shapes only), map sizes by the
  ratios the file's configuration declares: a resampler missing from one half (whose keys alone would
  read as a smaller valid model) is refused instead of encoding or decoding at the wrong size."""
from __future__ import annotations

import contextlib
import logging
from typing import Iterable, Iterator, Mapping, Optional

import torch

from ..errors import LoadError, VAEKitError

log = logging.getLogger("VAEKit")
WRAPPERS = ("state_dict", "model", "module")
# Refuse a file when at least this share of its weight values is NaN/Inf, or when a whole tensor is:
# that is a broken conversion or a corrupt file, and every decode would be NaN. Fewer scattered values
# only warn: they may sit in the half that is not used (an encoder when only decoding), and the decode
# itself reports a non-finite result.
NONFINITE_REFUSE = 0.01
DAMAGED_FIX = ("the file is damaged or a variant this pack does not know: download it again; if it is intact, "
               "please report it with the family and where the file comes from.")


def tensor_entries(obj, source: str) -> dict[str, torch.Tensor]:
    for _ in range(3):  # nested wrappers such as {"state_dict": {...}}
        if isinstance(obj, Mapping):
            inner = next((obj[w] for w in WRAPPERS if isinstance(obj.get(w), Mapping)), None)
            if inner is not None and not any(torch.is_tensor(v) for v in obj.values()):
                obj = inner
                continue
        break
    if not isinstance(obj, Mapping):
        raise LoadError(f"{source} holds a {type(obj).__name__}, not a state dict.",
                        fix="load a file of tensors (a state dict), e.g. a .safetensors VAE.")
    return {k: v for k, v in obj.items() if isinstance(k, str) and torch.is_tensor(v)}


class Tracked(dict):
    """A state dict that remembers the last tensor read, so an error deep in a family's config code
    can say which tensor had the unexpected shape, and the keys the family looked for and did not find
    (``absent``): where a part turns out damaged, those name what the family needed to build it."""
    last: Optional[str] = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.absent: set[str] = set()

    def __getitem__(self, key):
        self.last = key
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        found = super().__contains__(key)
        if not found and isinstance(key, str):
            self.absent.add(key)
        return found

    def get(self, key, default=None):
        return self[key] if key in self else default


@contextlib.contextmanager
def family_step(family: str, source: str, sd: Optional[Tracked] = None) -> Iterator[None]:
    try:
        yield
    except VAEKitError as e:    # a family's own message: make sure it names the file
        if source not in e.problem:
            e.problem = f"{source}: {e.problem}"
            e.args = (e._text(),)
        raise
    except KeyError as e:
        key = e.args[0] if e.args else "?"
        held = sum(part_of(k) == part_of(str(key)) for k in dict.keys(sd)) if sd is not None else 0
        where = f" (its {_part_name(part_of(str(key)))} is incomplete: {held} of its tensors are here)" if held else ""
        raise LoadError(f"{source} looks like {family} but has no tensor '{key}'{where}.", fix=DAMAGED_FIX) from None
    except Exception as e:   # noqa: BLE001 (any failure inside a family's reading code is a file problem)
        where = ""
        if sd is not None and sd.last is not None and sd.last in sd:
            v = dict.__getitem__(sd, sd.last)
            where = f" at tensor '{sd.last}' (shape {list(v.shape)}, {str(v.dtype).replace('torch.', '')})"
        raise LoadError(f"{source} looks like {family} but cannot be read{where}: "
                        f"{type(e).__name__}: {e}.", fix=DAMAGED_FIX) from None


def _listing(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _names(keys: list[str]) -> str:
    return _listing([f"'{k}'" for k in keys])


def mismatch(missing: list[str], unexpected: list[str], reshaped: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"{len(missing)} tensor(s) missing ({_names(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({_names(unexpected)})")
    if reshaped:
        parts.append(f"{len(reshaped)} with another shape ({_listing(reshaped)})")
    return "; ".join(parts)


def _kind_problem(v: torch.Tensor) -> Optional[str]:
    if v.layout != torch.strided:
        return f"a {str(v.layout).replace('torch.', '')} tensor (VAE weights are dense)"
    if v.is_meta:
        return "a meta tensor, with a shape but no data"
    if v.is_quantized:
        return f"quantized ({v.dtype})"
    if v.is_complex():
        return f"complex ({v.dtype})"
    if not v.is_floating_point():
        return f"{str(v.dtype).replace('torch.', '')} (not floating point)"
    return None


def _nonfinite(v: torch.Tensor) -> int:
    try:
        ok = torch.isfinite(v)
    except (RuntimeError, NotImplementedError):    # dtypes without the kernel (some fp8 builds)
        ok = torch.isfinite(v.float())
    return 0 if bool(ok.all()) else int((~ok).sum())


def check_weights(sd: Mapping[str, torch.Tensor], source: str, model_name: str,
                  expected: Optional[Mapping[str, torch.Tensor]] = None) -> None:
    """Refuse weights of the wrong kind; warn about, or refuse, NaN/Inf values. ``expected``: the
    built model's own tensors (on meta), whose integer buffers (BatchNorm's ``num_batches_tracked``)
    may be integers in the file too."""
    wrong: dict[str, list[str]] = {}
    for k, v in sd.items():
        own = expected.get(k) if expected is not None else None
        if own is not None and not own.is_floating_point() and not v.is_floating_point() and not v.is_complex():
            continue
        if problem := _kind_problem(v):
            wrong.setdefault(problem, []).append(k)
    if wrong:
        problem, keys = next(iter(wrong.items()))
        raise LoadError(f"{source} holds {len(keys)} weight(s) that are {problem}: {_names(keys)}.",
                        fix="use the original fp32/fp16/bf16 file: this one is damaged, or was converted by a tool "
                            "that changed the tensor types." if "meta" not in problem else
                            "pass tensors that hold their data (not created under a meta device or "
                            "init_empty_weights).")
    bad = {k: n for k, v in sd.items() if (n := _nonfinite(v))}
    if not bad:
        return
    total = sum(v.numel() for v in sd.values())
    share = sum(bad.values()) / max(1, total)
    whole = [k for k, n in bad.items() if n == sd[k].numel()]
    detail = _listing([f"'{k}' ({n} of {sd[k].numel()})" for k, n in bad.items()])
    if share >= NONFINITE_REFUSE or whole:
        why = f"{len(whole)} tensor(s) entirely NaN/Inf ({_names(whole)})" if whole else f"{share:.1%} of its values"
        raise LoadError(f"{source} ({model_name}) has NaN/Inf weights: {why}; its outputs would be NaN.",
                        fix="download the file again; if it came from a conversion (e.g. to fp16), convert the "
                            "original again in fp32 or bf16.")
    log.warning("VAEKit: %s (%s) has %d NaN/Inf weight value(s) in %s; outputs that depend on them will be NaN. "
                "Fix: download the file again or use another copy.", source, model_name, sum(bad.values()),
                detail)


# a module's tensors that come in sets: with the first present, the others must be too
SIBLINGS = {"bias": ("weight",), "running_mean": ("running_var",), "running_var": ("running_mean",)}


def missing_siblings(keys: Iterable[str]) -> list[str]:
    """Keys that a module's other tensors say are missing: a '.bias' without its '.weight' (no torch layer
    has one), a BatchNorm's running mean without its variance or the reverse. This names the key a family
    reads to decide that a part exists (``decoder.conv_in.weight``), whose absence otherwise reads as the
    whole part being absent, with the part's other tensors left over as "unexpected"."""
    keys = set(keys)
    return sorted({f"{stem}.{need}" for k in keys for stem, _, leaf in [k.rpartition(".")]
                   for need in SIBLINGS.get(leaf, ()) if stem and f"{stem}.{need}" not in keys})


def part_of(key: str) -> str:
    """The sub-model a canonical key belongs to: its first name (encoder, decoder, quant_conv, bn, ...)."""
    return key.split(".", 1)[0]


def _part_name(part: str) -> str:
    return part.replace("_", " ")


def _looked_for(absent: Iterable[str], unexpected: list[str]) -> list[str]:
    """Of the keys a family looked for and did not find, those in the module whose other tensors are
    left over: the family built the model without that module because the key was not there (e.g. an
    attention whose ``qkv.weight`` is missing, so its ``out`` projection is left over)."""
    near = []
    for k in absent:
        parent = k.rsplit(".", 2)[0] if k.count(".") >= 2 else ""
        if parent and any(u.startswith(parent + ".") for u in unexpected):
            near.append(k)
    return near


def damaged(source: str, family: str, keys: Iterable[str], missing: list[str],
            unexpected: list[str] = (), reshaped: list[str] = (), absent: Iterable[str] = ()) -> Optional[LoadError]:
    """The LoadError for a file whose parts are incomplete, or None when nothing is missing. ``keys``:
    the file's canonical keys; ``missing``: what the model built from them lacks; ``absent``: keys the
    family looked for in vain (``Tracked.absent``). Missing keys are named per part with how many of the
    part's tensors the file does hold: that distinguishes a damaged part from an absent one (which is no
    error: an encoder-only or decoder-only file). The keys whose absence made the family build the model
    without a module (found through their module's other tensors) are named first."""
    keys = set(keys)
    causes = sorted(set(missing_siblings(keys)) | set(_looked_for(set(absent) - keys, list(unexpected))))
    missing = causes + sorted(set(missing) - set(causes))
    if not missing:
        return None
    by_part: dict[str, list[str]] = {}
    for k in missing:
        by_part.setdefault(part_of(k), []).append(k)
    held = {p: sum(part_of(k) == p for k in keys) for p in by_part}
    told = []
    for p, ks in by_part.items():
        what = f"{len(ks)} tensor(s) missing ({_names(ks)})"
        told.append(f"its {_part_name(p)} is incomplete: {what} while {held[p]} of its tensors are here"
                    if held[p] else what)
    extra = [f"{len(unexpected)} left over ({_names(unexpected)})"] if unexpected else []
    extra += [f"{len(reshaped)} with another shape ({_listing(reshaped)})"] if reshaped else []
    return LoadError(f"{source} looks like {family} but {'; '.join(told)}"
                     f"{' (and ' + '; '.join(extra) + ')' if extra else ''}.", fix=DAMAGED_FIX)


def _meta_run(fn, x: torch.Tensor) -> Optional[torch.Tensor]:
    """``fn(x)`` on the meta device, or None where the model cannot run there (data-dependent steps)."""
    from .. import run
    try:
        with torch.inference_mode(), run.using(run.Run()):
            y = fn(x)
    except Exception:      # noqa: BLE001 - a model that cannot run on meta is simply not checked
        return None
    return y if torch.is_tensor(y) else None


_SHAPES_OK: dict[str, bool] = {}      # configurations (by repr) whose halves were checked and agree


def check_shapes(model, caps, source: str, described: str, config=None) -> None:
    """Encode a small meta image and decode a small meta latent through the built model (shapes
    only, no weights read): each half must keep to the ratios and channels the configuration declares.
    Checked where a file has both halves (the configuration reads the ratios from one of them), once
    per configuration (the model's structure is a function of it; about 0.1 s per check)."""
    if not (caps.can_encode and caps.can_decode):
        return
    key = f"{type(model).__module__}.{type(model).__qualname__}:{config!r}" if config is not None else None
    if key is not None and key in _SHAPES_OK:
        return
    _check_shapes(model, caps, source, described)
    if key is not None:
        if len(_SHAPES_OK) > 256:
            _SHAPES_OK.clear()
        _SHAPES_OK[key] = True


def _check_shapes(model, caps, source: str, described: str) -> None:
    r, t = caps.spatial_ratio, caps.temporal_ratio
    if not all(isinstance(n, int) and n > 0 for n in (r, t or 1, caps.latent_channels, caps.image_channels)):
        raise LoadError(f"{source} looks like {described} but its tensors give it a compression of {r!r} in space"
                        + (f" and {t!r} in time" if t else "") + ": blocks of it are missing.", fix=DAMAGED_FIX)
    grid = ((2,) if t else ()) + (3, 4)
    # two latent frames: 1 + r pixel frames, or 2r where the first frame stands alone in odd counts only
    frames = 2 * t if t and getattr(caps, "first_frame_odd_only", False) else 1 + (t or 0)
    pixels = ((frames,) if t else ()) + (grid[-2] * r, grid[-1] * r)
    latent = (caps.latent_channels, *grid)
    image = (caps.image_channels, *pixels)
    problems = []
    # a family whose clips and chunks are its own definition (MiniMax H3) has its own frame rules: its
    # model's frame counts are not 1 + r(t - 1), so only channels and space are checked there
    own = getattr(caps, "own_tiling", None) is not None

    def differs(got, want) -> bool:
        got = tuple(got)
        if own and t:
            return got[:1] + got[2:] != want[:1] + want[2:]
        return got != want

    if hasattr(model, "encode"):
        z = _meta_run(model.encode, torch.empty(1, *image, device="meta"))
        if z is not None and differs(z.shape[1:], latent):
            problems.append(f"its encoder turns {_shape(image)} pixels into a {_shape(z.shape[1:])} latent")
    if hasattr(model, "decode"):
        y = _meta_run(model.decode, torch.empty(1, *latent, device="meta"))
        if y is not None and differs(y.shape[1:], image):
            problems.append(f"its decoder turns a {_shape(latent)} latent into {_shape(y.shape[1:])} pixels")
    if problems:
        ratios = f"{r}x" + (f" in space and {t}x in time" if t else "")
        raise LoadError(f"{source} looks like {described}, which compresses {ratios} ({_shape(image)} pixels <-> a "
                        f"{_shape(latent)} latent), but {' and '.join(problems)}: tensors of a resampler (or another "
                        "block) are missing, or its halves come from different VAEs.", fix=DAMAGED_FIX)


def _shape(s) -> str:
    return "x".join(map(str, s))
