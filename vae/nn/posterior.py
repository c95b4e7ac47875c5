"""The Gaussian posterior an encoder gives: its mean and log-variance, carried as ONE tensor, the two
halves stacked in channels ``[mean; log-variance]``.

One tensor because every engine (fast tiles, streamed chunks, exact tiles and their stages) runs an
encode by what its function returns: a posterior is then just an output of twice the channels, and
both halves come from the same encoder output under every plan, so exact tiles and streamed chunks
give the one-pass posterior. The handle splits it at the end (``VAE.encode(x, posterior=True)``).

The log-variance is clamped to [-30, 20], as diffusers' ``DiagonalGaussianDistribution`` and the LDM
code clamp it. A family whose LATENT is normalised inside the VAE, ``z' = (z - shift) * scale`` per
channel, has the posterior N((mean - shift) * scale, var * scale^2): the mean takes the family's own
normalisation (the same operations as its ``encode``), the log-variance gains ``2 log|scale|``
(``normalised``).
"""
from __future__ import annotations

import torch

LOGVAR_RANGE = (-30.0, 20.0)


def gaussian(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """``[mean; log-variance]`` in channels, the log-variance clamped."""
    return torch.cat([mean, logvar.clamp(*LOGVAR_RANGE)], dim=1)


def from_moments(moments: torch.Tensor) -> torch.Tensor:
    """An encoder's moments (its mean, then as many log-variance channels) as a posterior."""
    mean, logvar = split(moments)
    return gaussian(mean, logvar)


def split(posterior: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, log-variance): the two halves of the channels."""
    return posterior.chunk(2, dim=1)


def normalised(posterior: torch.Tensor, normalise, scale) -> torch.Tensor:
    """The posterior of the latent a VAE normalises inside: ``normalise(mean)`` (the family's own step,
    ``(z - shift) * scale``) and the log-variance plus ``2 log|scale|`` (``scale`` a number or a tensor
    that broadcasts over the log-variance)."""
    mean, logvar = split(posterior)
    scale = torch.as_tensor(scale, dtype=torch.float32, device=logvar.device)
    return torch.cat([normalise(mean), (logvar.float() + 2 * scale.abs().log()).to(logvar.dtype)], dim=1)
