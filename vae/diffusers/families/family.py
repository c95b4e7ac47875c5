"""What a diffusers class's declaration holds: which of our files it serves, the class's config
keys (its defaults, the values our loader read from the weights, the published latent statistics a file
name tells), how its latents relate to ours, and the instance attributes its pipelines read. The face
(face.py) and the loader (source.py) read only these fields; no code outside this package names a family.

A family's ``normalise(handle)`` gives ``(shift, scale)`` with ``diffusers' latent = (ours - shift) *
scale`` (numbers or per-channel tuples, in our layout), or None where our handle already gives the class's
raw latent. Where the class lays its tensors out unlike our handle (Flux.2's latent unpacked, Qwen-Image
2.1's images as one-frame clips, SVD's frames in the batch), ``into(handle, what, t, given)`` gives ours of
the class's ``t`` before a call and ``out_of(handle, what, t, given)`` the class's of ours after it;
``what`` is "pixels" or "latent" (each half of a posterior alike), ``given`` the call's own inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from ...errors import InputError



Number = Union[float, tuple[float, ...]]
MISSING = object()          # a config value only a diffusers folder's config.json (or ``config=``) can give


@dataclass(frozen=True)
class Family:
    class_name: str                         # diffusers' class, as a folder's config.json names it
    arch: str                               # our ArchSpec id whose files it serves
    defaults: Mapping[str, Any]             # the class's config keys and their defaults
    weights: Callable[[Any, Any], dict]     # (our config, capabilities) -> config keys the weights decide
    serves: Callable[[Any], bool] = lambda cfg: True      # which of the arch's files (by our config)
    names: tuple[str, ...] = ()             # file-name words that choose this class among several for one arch
    named: Callable[[Any, str], dict] = lambda cfg, name: {}     # config values a file name tells
    # config values the loaded file holds beside its shapes (Cosmos' latent statistics): (handle) -> dict;
    # a folder's config.json or ``config=`` may replace them, as the file name's
    held: Callable[[Any], dict] = lambda handle: {}
    posterior: bool = True                  # encode gives ``latent_dist`` (a Gaussian), else ``latents``
    # without a Gaussian: encode gives ``latent_dist``, an ``IdentityDistribution`` of the latent (Cosmos)
    identity: bool = False
    clamps: bool = False                    # decode clamps to [-1, 1], as the class does
    normalise: Callable[[Any], Optional[tuple[Number, Number]]] = lambda handle: None
    attributes: Callable[[Mapping[str, Any]], dict] = lambda config: {}
    derived: Callable[[Mapping[str, Any]], dict] = lambda config: {}    # config keys the class sets from others
    # the class's decode parameters after ``z``, in order (pipelines pass some by position); besides
    # ``return_dict`` and ``generator`` (accepted, unused) each is the class's own input, which
    # ``decode_options(handle, given)`` turns into our handle's decode options, or refuses
    decode_args: tuple[str, ...] = ("return_dict", "generator")
    decode_options: Callable[[Any, Mapping[str, Any]], dict] = lambda handle, given: {}
    # the class's encode parameters after ``x``, in order; besides ``return_dict`` each is the class's own
    # input, which ``encode_options(handle, given)`` turns into our handle's encode options, or refuses
    encode_args: tuple[str, ...] = ("return_dict",)
    encode_options: Callable[[Any, Mapping[str, Any]], dict] = lambda handle, given: {}
    forward_args: tuple[str, ...] = ("sample_posterior", "return_dict", "generator")    # forward's, after sample
    forward_defaults: Mapping[str, Any] = field(default_factory=dict)  # forward's own defaults (SVD's num_frames)
    # forward's own inputs that go to its encode or decode under another name: {name: ("encode"|"decode", as)}
    forward_routes: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    tensors: Callable[[Any], dict] = lambda handle: {}      # buffers the class holds that pipelines read
    modules: tuple[str, ...] = ()           # submodules of our model pipelines read as the class's (Flux.2's bn)
    into: Callable[[Any, str, Any, Mapping[str, Any]], Any] = lambda handle, what, t, given: t
    out_of: Callable[[Any, str, Any, Mapping[str, Any]], Any] = lambda handle, what, t, given: t
    prepare: Callable[[Any], None] = lambda handle: None    # set our model to compute as the class does


def one_frame(class_name: str, pipeline: str, what: str, t):
    """``t`` if it is a one-frame clip [B, C, 1, H, W], the only input on which the face answers as the class."""
    if t.dim() != 5 or t.shape[2] != 1:
        raise InputError(f"{class_name}'s face takes one-frame clips [B, C, 1, H, W], not {tuple(t.shape)}.",
                         input="x" if what == "pixels" else "z",
                         fix=f"pass images as one-frame clips (x.unsqueeze(2)), as {pipeline} does.")
    return t
