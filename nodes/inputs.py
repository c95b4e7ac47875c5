"""Every node input checked against the node's own declaration (its ``INPUT_TYPES``) where it enters.

ComfyUI's server validates a prompt against the declarations before it runs it; an API client that
skips the server (a script calling the node classes, a V3 ``execute``, the headless runner) does not
get that. ``names_node`` (nodes/base.py) runs ``check_call`` on every call of every node function, and
the headless runner runs ``problem`` on every literal of a prompt, so one reading of the declaration
serves the V1 classes, the V3 classes built from them (nodes/v3.py) and the runner, and an input added
to a declaration (a new widget, a new family's option) is checked from the start:

- combo values must be one of the choices (a folder listing the node resolves itself, named in
  ``FILE_INPUTS``, takes any file name: the node says where it looked);
- INT / FLOAT must be numbers (integral for INT; finite), within the declared min/max; BOOLEAN a bool;
  STRING a string;
- data inputs (IMAGE, LATENT, MASK, VAE...) must be connected (not None); IMAGE and MASK are tensors,
  a LATENT is a dict holding a 'samples' tensor;
- an input the node does not declare, or a required one left out, is named with the node's inputs.

Values are returned converted where the conversion is exact (64.0 for an INT is 64; True for a
BOOLEAN given 1), as ComfyUI's own validation converts them."""
from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Callable, Optional

import torch

from ..vae.errors import InputError

Problem = tuple[str, str]     # (what is wrong, the fix)


def declarations(node: type) -> dict[str, tuple]:
    """Input name -> its declaration (type, options), required inputs first."""
    spec = node.INPUT_TYPES()
    return {**spec.get("required", {}), **spec.get("optional", {})}


def _options(decl) -> dict:
    return decl[1] if isinstance(decl, (tuple, list)) and len(decl) > 1 and isinstance(decl[1], dict) else {}


def _kind(decl):
    return decl[0] if isinstance(decl, (tuple, list)) and decl else decl


def _shown(choices: list) -> str:
    names = ", ".join(repr(c) for c in choices[:12])
    return names + (f" and {len(choices) - 12} more" if len(choices) > 12 else "")


def _range(opts: dict) -> str:
    lo, hi = opts.get("min"), opts.get("max")
    if lo is not None and hi is not None:
        return f"from {lo} to {hi}"
    return f"of at least {lo}" if lo is not None else f"of at most {hi}" if hi is not None else "in range"


def _number(value, kind: str, opts: dict) -> tuple[Any, Optional[Problem]]:
    """The value as the declared number (INT: an int; FLOAT: a float), or the problem."""
    what = "a whole number" if kind == "INT" else "a number"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value, (f"{value!r} is not {what}.", f"give {what} {_range(opts)}.")
    if not math.isfinite(float(value)):
        return value, (f"{value!r} is not a finite number.", f"give {what} {_range(opts)}.")
    if kind == "INT":
        if float(value) != int(value):
            return value, (f"{value!r} is not a whole number.", f"give a whole number {_range(opts)}.")
        value = int(value)
    else:
        value = float(value)
    lo, hi = opts.get("min"), opts.get("max")
    if lo is not None and value < lo:
        return value, (f"{value} is below its minimum, {lo}.", f"use a value {_range(opts)}.")
    if hi is not None and value > hi:
        return value, (f"{value} is above its maximum, {hi}.", f"use a value {_range(opts)}.")
    return value, None


def _data(value, kind: str) -> Optional[Problem]:
    if value is None:
        return (f"nothing is connected (None where a {kind} is expected).",
                f"connect a {kind} output to it.")
    if kind in ("IMAGE", "MASK") and not torch.is_tensor(value):
        return (f"expected an {kind} tensor, got a {type(value).__name__}.", f"connect a node's {kind} output.")
    if kind == "LATENT" and not (isinstance(value, dict) and torch.is_tensor(value.get("samples"))):
        return (f"expected a LATENT (a dict with a 'samples' tensor), got a {type(value).__name__}.",
                "connect a LATENT output (KSampler, VAE Encode, Load Latent).")
    return None


def check(value, decl, file_list: bool = False) -> tuple[Any, Optional[Problem]]:
    """A value against its declaration: (the value, converted where exact; the problem or None)."""
    kind, opts = _kind(decl), _options(decl)
    if isinstance(kind, (list, tuple)):                     # a combo: its choices
        if file_list or not kind:                          # a folder listing: any file name, resolved later
            ok = isinstance(value, str) and value.strip() != ""
            return value, None if ok else (f"{value!r} is not a file name.", "choose a file from the list.")
        if isinstance(value, str) and value in kind:
            return value, None
        return value, (f"{value!r} is not one of its choices.", f"choose one of {_shown(list(kind))}.")
    if kind in ("INT", "FLOAT"):
        return _number(value, kind, opts)
    if kind == "BOOLEAN":
        if isinstance(value, bool):
            return value, None
        if isinstance(value, int) and value in (0, 1):
            return bool(value), None
        return value, (f"{value!r} is not a boolean.", "give true or false.")
    if kind == "STRING":
        return value, None if isinstance(value, str) else (f"{value!r} is not a string.", "give a text value.")
    return value, _data(value, str(kind))


def problem(value, decl, file_list: bool = False) -> Optional[Problem]:
    return check(value, decl, file_list)[1]


def _error(node: type, name: Optional[str], what: str, fix: str) -> InputError:
    return InputError(what, input=name, fix=fix).for_node(getattr(node, "DISPLAY_NAME", node.__name__), name)


def check_call(node: type, fn: Callable, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of a call of ``node``'s function ``fn`` (``args`` after self), each declared input
    checked against its declaration (defaults of the function included): the arguments to call with, or
    an InputError that names the node, the input and a fix."""
    decls = declarations(node)
    sig = inspect.signature(fn)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        unknown = [k for k in kwargs if k not in sig.parameters]
        if unknown:
            raise _error(node, unknown[0], f"{node.__name__} has no input '{unknown[0]}'.",
                         f"its inputs are {_shown(list(decls))}.") from None
        params = list(sig.parameters)[1:]      # after self
        given = set(params[:len(args) - 1]) | set(kwargs)
        absent = [p for p in params if p not in given and sig.parameters[p].default is inspect.Parameter.empty]
        name = absent[0] if absent else None
        raise _error(node, name, f"a required input is missing ({e}).", "connect or set it.") from None
    bound.apply_defaults()
    files = set(getattr(node, "FILE_INPUTS", ()))
    for name, value in list(bound.arguments.items()):
        if name in decls:
            converted, trouble = check(value, decls[name], name in files)
            if trouble:
                raise _error(node, name, *trouble)
            bound.arguments[name] = converted
    return bound.args, bound.kwargs
