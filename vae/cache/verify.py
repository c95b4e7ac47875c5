"""``--verify N``: a check a trainer can trust, on N items picked at random (seeded) from the cache.

- decoded back (exact) and compared with the source frames as they were fitted into the bucket: PSNR (dB);
- encoded again untiled (one pass, where it fits the budget) and compared with what is stored: the max
  |cached - untiled| in the family's latent space, and in the stored dtype (the format's rounding alone
  is then the difference)."""
from __future__ import annotations

import math
import random

import torch

from ..engine import budget as planner
from . import media


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = torch.mean((a.double() - b.double()) ** 2).item()
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def verify(r, works, n: int) -> list[str]:
    done = [(w, c) for w in works for c in w.clips
            if r.manifest_for(w.root).records.get(c.output, {}).get("status") == "done"]
    if not done:
        return ["verify: no cached item to check"]
    picked = random.Random(r.opts.seed).sample(done, min(n, len(done)))
    vae, fmt, lines = r.vae, r.format, []
    for w, c in picked:
        stored = fmt.read(w.root / c.output)
        z = stored.unsqueeze(0)
        if vae.is_video and z.dim() == 4:
            z = z.unsqueeze(2)
        clip = next(x for p, x in _read(w, c.plan) if p is c.plan)
        x = clip.unsqueeze(0) if vae.is_video else clip[:, 0].unsqueeze(0)
        (a, b), parts = fmt.pixel_range, [f"verify {c.output}:"]
        if vae.caps.can_decode:     # the decode gives 0..1 for what the encoder read as a..b
            y = vae.decode(z, mode="exact", tile=r.opts.tile or None)
            parts.append(f"PSNR {_psnr(y.reshape(x.shape), (x - a) / (b - a)):.2f} dB against the source frames")
        else:
            parts.append("no decoder in the file, no PSNR")
        shape = tuple(x.shape)
        need = vae.memory_needed(shape, "encode")
        if r.budget and need and need > r.budget:
            parts.append(f"untiled needs {planner.gib(need)}, more than the budget: not compared")
        else:
            one = vae.encode(x, mode="fast", pixel_range=fmt.pixel_range)[0].float().reshape(stored.shape)
            diff = (stored - one).abs().max().item()
            note = ""
            if fmt.dtype != torch.float32:
                rounding = (one.to(fmt.dtype).float() - one).abs().max().item()
                note = f" (stored as {str(fmt.dtype).removeprefix('torch.')}: its rounding alone is up to {rounding:.2e})"
            parts.append(f"max |cached - untiled| {diff:.2e}{note}")
        lines.append(" ".join(parts))
    return lines


def _read(w, plan):
    if media.kind(w.source) == "image":
        x, _ = media.read_image(w.source, w.bucket, w.crop)
        yield plan, x
        return
    yield from media.read_clips(w.source, [plan], w.crop)
