"""What diffusers' VAE classes return, as their callers read it: the Gaussian posterior with diffusers'
``DiagonalGaussianDistribution`` semantics (its attributes, ``sample(generator)`` drawing the same numbers
from the same generator as diffusers' ``randn_tensor``, ``mode()``, ``kl()``, ``nll()``), the deterministic
``IdentityDistribution`` and the output records (``.latent_dist`` / ``.latents`` / ``.sample``, indexable like a tuple)."""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

from ..nn.posterior import LOGVAR_RANGE

Generator = Union[torch.Generator, Sequence[torch.Generator], None]


def randn(shape: Sequence[int], generator: Generator, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal noise as diffusers' ``randn_tensor`` draws it: one generator for the whole tensor,
    or one per batch item (a list, each drawing a [1, ...] slice); a CPU generator draws on the CPU and
    the noise moves to ``device``; a generator on another accelerator is refused."""
    gens = list(generator) if isinstance(generator, (list, tuple)) else generator
    if isinstance(gens, list) and len(gens) == 1:
        gens = gens[0]
    first = gens[0] if isinstance(gens, list) else gens
    where = device
    if first is not None and first.device.type != device.type:
        if first.device.type != "cpu":
            raise ValueError(f"cannot draw {device} noise from a generator on {first.device}.")
        where = torch.device("cpu")
    if isinstance(gens, list):
        if len(gens) != shape[0]:
            raise ValueError(f"{len(gens)} generators for a batch of {shape[0]}: give one per item, or one.")
        one = (1, *shape[1:])
        return torch.cat([torch.randn(one, generator=g, device=where, dtype=dtype) for g in gens]).to(device)
    return torch.randn(tuple(shape), generator=gens, device=where, dtype=dtype).to(device)


class DiagonalGaussianDistribution:
    """The posterior ``N(mean, exp(logvar))`` from ``parameters`` = [mean; log-variance] in channels; the
    log-variance clamped to [-30, 20]. ``deterministic``: variance 0 (``sample()`` gives the mean)."""

    def __init__(self, parameters: torch.Tensor, deterministic: bool = False):
        self.parameters = parameters
        self.deterministic = deterministic
        self.mean, logvar = parameters.chunk(2, dim=1)
        self.logvar = logvar.clamp(*LOGVAR_RANGE)
        self.std = (0.5 * self.logvar).exp()
        self.var = self.logvar.exp()
        if deterministic:
            self.std = self.var = torch.zeros_like(self.mean)

    def sample(self, generator: Generator = None) -> torch.Tensor:
        noise = randn(self.mean.shape, generator, self.parameters.device, self.parameters.dtype)
        return self.mean + self.std * noise

    def mode(self) -> torch.Tensor:
        return self.mean

    def kl(self, other: Optional["DiagonalGaussianDistribution"] = None) -> torch.Tensor:
        """KL divergence to ``other`` (default the standard normal), summed over dims 1-3 as diffusers sums
        it (for a video latent [B, C, T, H, W]: per batch item and width)."""
        if self.deterministic:
            return torch.Tensor([0.0])
        if other is None:
            terms = self.mean.pow(2) + self.var - 1.0 - self.logvar
        else:
            terms = ((self.mean - other.mean).pow(2) / other.var + self.var / other.var - 1.0 - self.logvar
                     + other.logvar)
        return 0.5 * terms.sum(dim=[1, 2, 3])

    def nll(self, sample: torch.Tensor, dims: Sequence[int] = (1, 2, 3)) -> torch.Tensor:
        if self.deterministic:
            return torch.Tensor([0.0])
        return 0.5 * (math.log(2.0 * math.pi) + self.logvar + (sample - self.mean).pow(2) / self.var).sum(dim=list(dims))


class IdentityDistribution:
    """A deterministic encoder's latent as diffusers' ``IdentityDistribution`` (AutoencoderKLCosmos' ``latent_dist``):
    ``parameters`` is the latent, and ``sample(generator)`` and ``mode()`` give it unchanged."""

    def __init__(self, parameters: torch.Tensor):
        self.parameters = parameters

    def sample(self, generator: Generator = None) -> torch.Tensor:
        return self.parameters

    def mode(self) -> torch.Tensor:
        return self.parameters


class Output(dict):
    """A call's result by name (``out.sample``, ``out["sample"]``) or position (``out[0]``), as diffusers'
    output records are read."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"this output has {', '.join(self)}, not '{name}'.") from None

    def __getitem__(self, key):
        if isinstance(key, (int, slice)):
            return self.to_tuple()[key]
        return super().__getitem__(key)

    def to_tuple(self) -> tuple:
        return tuple(self.values())
