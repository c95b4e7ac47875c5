"""One item's latent: the posterior's mean (and log-variance) of a clip, exact within the budget.

The mean comes from ``VAE.encode`` in the asked mode and budget (the planner picks tile and chunk).
The log-variance comes from ``VAE.encode(..., posterior=True)`` where the handle offers it (the same
engines, so it is exact and budgeted too).

FALLBACK, to be replaced by ``VAE.encode(x, posterior=True)`` when the handle has it: the log-variance
is read from one untiled pass of the model (the moments its encoder's last layer gives, as the model's
own ``encode`` computes them), so for the vaekit format the budget holds for the mean only. It is used
only where the untiled mean it sees equals the exact mean (else no log-variance is stored, and the
record says why)."""
from __future__ import annotations

import inspect
from typing import Optional

import torch


def has_posterior(vae) -> bool:
    return "posterior" in inspect.signature(vae.encode).parameters


def encode(vae, x: torch.Tensor, want_logvar: bool, progress=None, **kw) -> tuple[torch.Tensor, Optional[torch.Tensor], str]:
    """(mean, logvar or None, a note on the log-variance) of clips ``x`` [B, 3, F, H, W] in 0..1."""
    if want_logvar and has_posterior(vae):
        if not getattr(vae.caps, "posterior", True):          # the family's encoder gives one latent
            return vae.encode(x, progress=progress, **kw), None, "no log-variance: the family has no posterior"
        mean, logvar = vae.encode(x, progress=progress, posterior=True, **kw)
        return mean, logvar, "exact"
    layer = _moments_layer(vae.model) if want_logvar else None
    seen: list = []
    hook = layer.register_forward_hook(lambda m, i, o: seen.append(o.detach())) if layer is not None else None
    try:              # FALLBACK: an encode that ran untiled shows its moments on the way (no second pass)
        mean = vae.encode(x, progress=progress, **kw)
    finally:
        if hook is not None:
            hook.remove()
    if not want_logvar:
        return mean, None, ""
    logvar = _logvar(vae, [s for s in seen if s.device.type != "meta"], mean)
    if logvar is not None:
        return mean, logvar, "from the encode's own untiled pass (fallback until VAE.encode(posterior=True))"
    logvar, note = _untiled_logvar(vae, x, mean)
    return mean, logvar, note


def _moments_layer(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    """The layer whose output is the moments (mean channels, then log-variance channels)."""
    for name in ("quant_conv", "encoder"):
        m = getattr(model, name, None)
        if isinstance(m, torch.nn.Module):
            return m
    return None


def _untiled_logvar(vae, x: torch.Tensor, mean: torch.Tensor) -> tuple[Optional[torch.Tensor], str]:
    """FALLBACK (see the module's note): the log-variance from one untiled pass, in the space of ``mean``."""
    layer = _moments_layer(vae.model)
    if layer is None or vae.caps.latent_pack > 1:
        return None, "no log-variance: this family's posterior is not read by the fallback"
    seen = []
    hook = layer.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    try:
        with torch.inference_mode():
            lo, hi = vae.caps.value_range
            vae.model.encode(vae._model_input(x) * (hi - lo) + lo)
    finally:
        hook.remove()
    logvar = _logvar(vae, seen, mean)
    if logvar is None:
        return None, "no log-variance: the encoder's moments do not give this mean"
    return logvar, "untiled (fallback until VAE.encode(posterior=True))"


def _logvar(vae, seen: list, mean: torch.Tensor) -> Optional[torch.Tensor]:
    """The log-variance of the moments a pass showed (per time chunk, whole in space), in the space of
    ``mean``; None unless their mean half gives ``mean``."""
    c = vae.caps.latent_channels
    if not seen or vae.caps.latent_pack > 1 or any(s.shape[-2:] != mean.shape[-2:] or s.dim() != mean.dim() for s in seen):
        return None
    moments = torch.cat(seen, dim=2).float() if mean.dim() == 5 else seen[-1].float()
    if moments.shape[1] not in (c + 1, 2 * c) or moments.shape[2:] != mean.shape[2:]:
        return None
    m = moments[:, :c]
    logvar = moments[:, c:].expand(-1, c, *moments.shape[2:]) if moments.shape[1] == c + 1 else moments[:, c:]
    stats = getattr(vae.model, "per_channel_statistics", None)       # a normalising encode (LTX): z = (m - a) / s
    if stats is not None and hasattr(stats, "normalize"):
        scale = stats.normalize(torch.ones_like(m)) - stats.normalize(torch.zeros_like(m))
        m = stats.normalize(m)
        logvar = logvar + 2 * torch.log(scale.abs())      # scale = 1 / s
    tol = 1e-3 * max(1.0, float(mean.abs().max()))
    if float((m.to(mean.device) - mean.float()).abs().max()) > tol:
        return None
    return logvar.to(mean.device).clamp(-30.0, 20.0)
