"""The face: a ``torch.nn.Module`` holding our model that answers what diffusers' pipelines and trainers
read and call on a VAE of the declared class (families.py), each call exact (the untiled result) within
the budget set at construction.

Conventions are diffusers': pixels in [-1, 1], the class's raw latents (converted with the family's
declared normalisation), results on the face's device in its dtype. What the face cannot honour
(gradients, a keyword it does not know, pixels beyond [-1, 1], which our handle would clamp) is an
InputError naming it.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Mapping, Optional

import torch

from .. import checks
from ..errors import InputError
from ..handle import VAE
from ..nn import posterior as gaussian
from .families import Family
from .posterior import DiagonalGaussianDistribution, IdentityDistribution, Output

# top-level modules pipelines read only the dtype of (SDXL: ``vae.post_quant_conv.parameters()``)
DTYPE_PROBES = ("post_quant_conv",)


class FrozenConfig(dict):
    """The class's config: dict and attribute access, read-only (as diffusers' ``FrozenDict``)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"this config has no key '{name}'.") from None

    def _frozen(self, *args, **kwargs):
        raise InputError("a VAE's config is read-only.", input="config",
                         fix="pass the values to vae.diffusers.load(..., config={...}).")

    __setitem__ = __delitem__ = __setattr__ = update = pop = setdefault = _frozen


def free_memory(device: torch.device) -> int:
    """Bytes free on ``device`` now: CUDA's own count, else the host's available physical memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class Face(torch.nn.Module):
    def __init__(self, handle: VAE, family: Family, config: Mapping[str, Any], budget=None):
        super().__init__()
        self.model = handle.model          # registered: parameters, ``pipe.to()`` and state_dict see it
        self._handle, self._family = handle, family
        self._budget = checks.budget(budget)
        self.config = FrozenConfig(config)
        # accepted switches of diffusers' classes: tiling and memory are the budget's business here
        self.use_slicing = self.use_tiling = False
        self.use_framewise_encoding = self.use_framewise_decoding = False
        for name, value in family.attributes(self.config).items():
            setattr(self, name, value)
        for name, value in family.tensors(handle).items():
            self.register_buffer(name, value.to(handle.device), persistent=False)
        family.prepare(handle)
        self.eval()

    # ---- what pipelines read ---------------------------------------------------------------------
    @property
    def handle(self) -> VAE:
        """Our VAE handle underneath (its own conventions: pixels 0..1, ComfyUI's LATENTs), its model set to
        compute as the class does (``Family.prepare``: LTX-Video's zero padding; Cosmos' raw latent as its LATENT)."""
        return self._handle

    @property
    def device(self) -> torch.device:
        return self._handle.device

    @property
    def dtype(self) -> torch.dtype:
        return self._handle.dtype

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        if name in DTYPE_PROBES:
            return self.model           # its parameters carry the face's dtype and device
        family = self.__dict__.get("_family")
        if family is not None and name in family.modules:
            return getattr(self.model, name)
        raise AttributeError(f"vae.diffusers' {getattr(family, 'class_name', 'face')} answers encode, decode, forward, config, dtype, "
                             f"device, to, eval, requires_grad_ and the tiling/slicing switches, not '{name}'.")

    def __repr__(self) -> str:
        return f"{self._family.class_name}(vae.diffusers face of {self._handle!r})"

    def requires_grad_(self, requires_grad: bool = True) -> "Face":
        if requires_grad:
            raise InputError("the face computes without gradients (its calls run in inference mode); it cannot be "
                             "trained or backpropagated through.", input="requires_grad_",
                             fix="keep the VAE frozen (requires_grad_(False)), as trainers of diffusion models do.")
        return super().requires_grad_(False)

    def enable_tiling(self, *args, **kwargs) -> None:
        """Accepted: every call runs in exact tiles when its budget asks for them (tile sizes are planned)."""
        self.use_tiling = True

    def disable_tiling(self) -> None:
        self.use_tiling = False

    def enable_slicing(self) -> None:
        """Accepted: batches run as the budget allows."""
        self.use_slicing = True

    def disable_slicing(self) -> None:
        self.use_slicing = False

    # ---- calls ------------------------------------------------------------------------------------
    def encode(self, x: torch.Tensor, *args, **kwargs):
        """The class's encode: ``encode(x, return_dict=True)``, or with the class's own inputs (LTX-2's ``causal``);
        ``latent_dist`` a Gaussian, or the latent as an ``IdentityDistribution`` (Cosmos), else ``latents``."""
        given = _bind(self._family.encode_args, args, kwargs, "encode")
        return_dict = given.pop("return_dict", True)
        _no_gradients(x, "encode")
        _in_range(x)
        handle, family = self._handle, self._family
        options = family.encode_options(handle, given)
        ours = family.into(handle, "pixels", x, given)
        out = handle.encode(ours, **self._call("encode", ours.shape), posterior=family.posterior,
                            pixel_range=(-1.0, 1.0), **options)
        if family.posterior:
            moments = gaussian.gaussian(*out)
            shift, scale = self._normalisation(moments.dim())
            if shift is not None:
                moments = gaussian.normalised(moments, lambda m: (m - shift) * scale, scale)
            moments = torch.cat([family.out_of(handle, "latent", h, {}) for h in gaussian.split(moments)], dim=1)
            result = Output(latent_dist=DiagonalGaussianDistribution(self._out(moments)))
        else:
            shift, scale = self._normalisation(out.dim())
            out = out if shift is None else (out - shift) * scale
            latents = self._out(family.out_of(handle, "latent", out, {}))
            result = Output(latent_dist=IdentityDistribution(latents)) if family.identity else Output(latents=latents)
        return result if return_dict else result.to_tuple()

    @property
    def _encode(self):
        """The classes' private ``_encode(x)``, which trainers call to cache the posterior's moments
        (finetrainers' latent precompute): ``[mean; log-variance]`` in channels, as ``encode`` would wrap them
        (the log-variance clamped, see ``DiagonalGaussianDistribution``); an ``IdentityDistribution``'s
        latent. Only where the class has it: not AutoencoderTiny."""
        if not (self._family.posterior or self._family.identity):
            raise AttributeError(f"{self._family.class_name} has no _encode; call encode(x).latents.")
        return lambda x: self.encode(x).latent_dist.parameters

    def decode(self, z: torch.Tensor, *args, **kwargs):
        """The class's decode: ``decode(z, return_dict=True, generator=None)`` (``generator`` accepted and
        unused, as by diffusers' deterministic decoders), or the class's own inputs (LTX-Video's ``temb``,
        SVD's ``num_frames``)."""
        handle, family = self._handle, self._family
        given = _bind(family.decode_args, args, kwargs, "decode")
        return_dict = given.pop("return_dict", True)
        given.pop("generator", None)
        _no_gradients(z, "decode")
        options = family.decode_options(handle, given)
        ours = family.into(handle, "latent", z, given)
        shift, scale = self._normalisation(ours.dim())
        ours = ours if shift is None else ours / scale + shift
        y = handle.decode(ours, **self._call("decode", ours.shape), clamp=family.clamps, **options)
        with torch.inference_mode(y.is_inference()):      # the call's own output: to -1..1 in place, not a
            y = y.mul_(2).sub_(1)                         # second and third clip (LTX-Video's 512x768x49: 220 MiB each)
        result = Output(sample=self._out(family.out_of(handle, "pixels", y, given)))
        return result if return_dict else result.to_tuple()

    def forward(self, sample: torch.Tensor, *args, **kwargs):
        """Encode then decode, as the classes' ``forward``: the posterior's sample (``sample_posterior``) or
        mode; the class's own inputs go to decode (their defaults the class's forward's)."""
        given = {**self._family.forward_defaults, **_bind(self._family.forward_args, args, kwargs, "forward")}
        if not (self._family.posterior or self._family.identity):
            raise InputError(f"{self._family.class_name}'s forward stores its latents as 8-bit values between encode "
                             "and decode; the face does not round latents.", input="forward",
                             fix="call encode(x).latents, then decode(...).")
        routed = {"encode": {}, "decode": given}
        for name, (call, as_name) in self._family.forward_routes.items():
            if name in given:
                routed[call][as_name] = given.pop(name)
        dist = self.encode(sample, **routed["encode"]).latent_dist
        generator = given.pop("generator", None)
        z = dist.sample(generator=generator) if given.pop("sample_posterior", False) else dist.mode()
        return self.decode(z, **given)

    # ---- helpers ----------------------------------------------------------------------------------
    def _normalisation(self, rank: int) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """The family's (shift, scale) as tensors that broadcast over a latent of ``rank`` dims, or Nones."""
        declared = self._family.normalise(self._handle)
        if declared is None:
            return None, None
        shape = (1, -1) + (1,) * (rank - 2)
        return tuple(torch.as_tensor(v, dtype=torch.float32, device=self.device).reshape(shape) for v in declared)

    def _call(self, op: str, shape: tuple[int, ...]) -> dict:
        """The engine's keywords for one call: exact, results on our device, exact maps in host memory, and
        the budget: the one set at construction, else (as ComfyUI does) what the device has free, only when
        the call as asked would not fit in it."""
        budget = self._budget
        if budget is None:
            need = self._handle.memory_needed(tuple(shape), op, mode="exact", offload="cpu")
            free = free_memory(self.device)
            budget = free if need is not None and need > free else None
        return dict(mode="exact", budget=budget, out_device=self.device, offload="cpu")

    def _out(self, t: torch.Tensor) -> torch.Tensor:
        """A result as diffusers gives it: the face's dtype, an ordinary tensor (not an inference tensor,
        which a trainer's autograd could not save)."""
        t = t.to(self.device, self.dtype)
        return t.clone() if t.is_inference() else t


# forward's parameters every class has, with the classes' defaults
_FORWARD_DEFAULTS = dict(sample_posterior=False, return_dict=True, generator=None)
_CLASSES: dict[str, type] = {}


def face_class(family: Family) -> type:
    """The face's class for ``family``: named as diffusers' class, its ``forward`` with that class's
    parameters, which pipelines read (StableVideoDiffusionPipeline passes ``num_frames`` only to a VAE whose
    ``forward`` takes it)."""
    if family.class_name not in _CLASSES:
        defaults = {**_FORWARD_DEFAULTS, **family.forward_defaults}
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [inspect.Parameter("self", kind), inspect.Parameter("sample", kind)]
        params += [inspect.Parameter(n, kind, default=defaults.get(n)) for n in family.forward_args]

        def forward(self, sample, *args, **kwargs):
            return Face.forward(self, sample, *args, **kwargs)
        forward.__signature__ = inspect.Signature(params)
        forward.__doc__ = Face.forward.__doc__
        _CLASSES[family.class_name] = type(family.class_name, (Face,), {"forward": forward, "__module__": __name__})
    return _CLASSES[family.class_name]


def _bind(names: tuple[str, ...], args: tuple, kwargs: dict, call: str) -> dict:
    """A call's arguments after its first by name, as the class's signature (``names``) takes them; one it
    does not take is refused."""
    if len(args) > len(names):
        raise InputError(f"{call}() takes at most {len(names) + 1} positional arguments here "
                         f"(the tensor, {', '.join(names)}), not {len(args) + 1}.", input=call,
                         fix=f"pass {', '.join(names)} by name.")
    given = dict(zip(names, args))
    twice = sorted(set(given) & set(kwargs))
    if twice:
        raise InputError(f"{call}() got {', '.join(twice)} both by position and by name.", input=twice[0],
                         fix="pass each once.")
    _refuse({k: v for k, v in kwargs.items() if k not in names}, call)
    return {**given, **kwargs}


def _refuse(unknown: dict, call: str) -> None:
    if unknown:
        raise InputError(f"{call}() takes no {', '.join(repr(k) for k in unknown)} here; the face does not "
                         "pass keywords on that it cannot honour.", input=next(iter(unknown)),
                         fix=f"call {call}() without it (see docs/diffusers.md for what the face does not do).")


def _no_gradients(t: torch.Tensor, call: str) -> None:
    if torch.is_tensor(t) and t.requires_grad and torch.is_grad_enabled():
        raise InputError(f"the input of {call}() requires gradients; the face computes without them, so none "
                         "would reach it.", input="x" if call == "encode" else "z",
                         fix="detach the input (x.detach()) or call inside torch.no_grad(); to train through "
                             "the VAE, use diffusers' own class.")


def _in_range(x: torch.Tensor) -> None:
    if torch.is_tensor(x) and x.is_floating_point() and x.numel():
        lo, hi = (float(v) for v in torch.aminmax(x.detach().float()))
        if lo < -1.0 or hi > 1.0:
            raise InputError(f"pixels span {lo:.4g}..{hi:.4g}; the face encodes pixels in [-1, 1] (diffusers' "
                             "convention) and would clamp the rest, which diffusers does not.", input="x",
                             fix="clamp or rescale the images to [-1, 1] first (an image processor's output is).")
