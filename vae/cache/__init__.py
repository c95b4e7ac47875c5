"""The latent cache for trainers: a dataset of videos and images -> one latent file per item, encoded
exactly (equal to one untiled pass) within a memory budget, in the layout a trainer reads (ours with the
posterior's mean and log-variance, musubi-tuner's, LTX-2's trainer's, SimpleTuner's), kept true by a
manifest.

    import vae.cache
    result = vae.cache("wan_2.1_vae.safetensors", ["clips/"], "cache/", format="musubi", arch="wan",
                       resolution="832x480", frames=(81,), max_memory="1.5GB")

``vae.cache`` is this package, and calling it runs ``runner.cache`` (``from vae import cache`` works too):
the package is the entry point, so importing its modules (``vae.cache.formats`` ...) never hides the
call. ``vae`` itself does not import it (the public face sits below its front ends, tests/test_layout.py).

Modules by role: ``datasets`` (what to cache), ``clips`` (buckets, crops, frames), ``media`` (reading,
streaming), ``posterior`` (the encode), ``formats`` (the files written; SimpleTuner's in ``simpletuner``),
``manifest`` (what is current), ``runner`` (a run), ``verify`` (--verify), ``worker`` (a process of a several-device run), ``options``.
The command line: ``vaekit cache`` (vae/cli/cache.py); docs/cache.md."""
from __future__ import annotations

import sys
import types

from .options import CacheOptions
from .runner import CacheResult, cache

__all__ = ["cache", "CacheOptions", "CacheResult"]


class _CallablePackage(types.ModuleType):
    """``vae.cache(...)`` calls the entry point; attributes and submodules are the package's."""

    def __call__(self, *args, **kwargs) -> CacheResult:
        return cache(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
