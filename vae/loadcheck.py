"""Checks between reading a file and building a model, so every malformed file ends in a LoadError
that names the file, what is wrong, and what to do.

- ``tensor_entries``: any mapping (a file's content, a user's dict) -> {name: tensor}; wrappers
  such as {"state_dict": ...} are opened, other entries (step counters, configs) are ignored.
- ``family_step``: a family's detect / key conversion / config reading / build may meet a missing key
  or an odd shape anywhere; whatever it raises becomes one LoadError naming the family and the file
  (a missing key by name, other errors with the last tensor the family read).
- ``check_weights``: the tensors the model takes must be dense floating point with data; non-finite
  values warn, or refuse when they are too many for the VAE to be of use (see ``NONFINITE_REFUSE``)."""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Mapping, Optional

import torch

from .errors import LoadError, VAEKitError

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
    can say which tensor had the unexpected shape."""
    last: Optional[str] = None

    def __getitem__(self, key):
        self.last = key
        return super().__getitem__(key)


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
        raise LoadError(f"{source} looks like {family} but has no tensor '{key}'.", fix=DAMAGED_FIX) from None
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
