"""One item's latent: the posterior's mean (and log-variance) of a clip, exact within the budget.

Both come from ``VAE.encode`` in the asked mode and budget (the planner picks tile and chunk): with
``posterior=True`` the same engines carry the mean and the log-variance together, so the log-variance is
exact and budgeted like the mean (docs/memory.md, "Encoding within a budget"). A family without a Gaussian
posterior (``caps.posterior`` False: TAESD) stores the mean alone."""
from __future__ import annotations

from typing import Optional

import torch


def encode(vae, x: torch.Tensor, want_logvar: bool, progress=None, **kw) -> tuple[torch.Tensor, Optional[torch.Tensor], str]:
    """(mean, logvar or None, a note on the log-variance) of clips ``x`` [B, 3, F, H, W] in 0..1."""
    if not want_logvar:
        return vae.encode(x, progress=progress, **kw), None, ""
    if not vae.caps.posterior:              # the family's encoder gives one latent
        return vae.encode(x, progress=progress, **kw), None, "no log-variance: the family has no posterior"
    mean, logvar = vae.encode(x, progress=progress, posterior=True, **kw)
    return mean, logvar, "exact"
