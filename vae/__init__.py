"""VAEKit's VAE library: pure PyTorch, no ComfyUI import anywhere below this package.

    from vae import load
    v = load("taef2_decoder.safetensors")      # family and hyperparameters detected from the keys
    images = v.decode(latent, tile=512, overlap=64)
"""
try:
    import torch  # noqa: F401 (imported first: without it, one error that says what to install)
except ImportError as _missing:        # the command line (vae/cli/entry.py) says what to install
    _TORCH_MISSING: "ImportError | None" = _missing
else:
    _TORCH_MISSING = None
    from .errors import InputError, LoadError, NonFiniteError, VAEKitError
    from .handle import VAE
    from .loading import from_state_dict, load, read_state_dict
    from . import diffusers        # diffusers' VAE classes to their callers: vae.diffusers.load(...)

__all__ = ["VAE", "load", "from_state_dict", "read_state_dict", "VAEKitError", "LoadError", "InputError",
           "NonFiniteError", "diffusers"]

TORCH_HELP = ("VAEKit needs PyTorch, which this Python ({python}) cannot import ({error}). Fix: install it "
              "(https://pytorch.org/get-started/locally/ gives the command for your GPU, e.g. "
              "`python3 -m pip install torch`), then `python3 -m pip install -r requirements.txt`; or "
              "`python3 -m pip install -e .` in the repository for the `vaekit` command.")


def __getattr__(name: str):
    if _TORCH_MISSING is not None and name in __all__:
        import sys
        raise ImportError(TORCH_HELP.format(python=sys.executable, error=_TORCH_MISSING))
    if name == "cache":          # a front end above this package: loaded by its own import (tests/test_layout.py)
        raise AttributeError("vae.cache (the trainers' latent cache) is loaded by its own import: "
                             "`import vae.cache` or `from vae import cache`, then vae.cache(...).")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
