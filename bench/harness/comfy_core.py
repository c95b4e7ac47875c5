"""ComfyUI core inside a bench worker, as the reference the scripts compare against (run under ComfyUI's python).

ComfyUI picks its device and attention function from its command-line flags when ``comfy.model_management``
is first imported; a worker never passes ComfyUI its own argv, so ``start`` sets the flags on core's parsed
defaults before anything imports that module."""
from __future__ import annotations

import sys


def start(comfyui: str, pytorch_attention: bool | None = None) -> None:
    """Make ComfyUI's source at ``comfyui`` importable and set it up for the CPU (``--cpu``); with
    ``pytorch_attention`` also ``--use-pytorch-cross-attention`` on or off. Call it before importing
    anything else from comfy or ComfyUI's ``nodes``."""
    if sys.path[0] != comfyui:
        sys.path.insert(0, comfyui)
    _audio_stand_in()
    from comfy.cli_args import args
    args.cpu = True
    if pytorch_attention is not None:
        args.use_pytorch_cross_attention = pytorch_attention


def _audio_stand_in() -> None:
    """Core 783545f6 imports ``torchaudio.functional`` at start-up (its Gemma 4 text encoder). Where
    torchaudio is an import-only stand-in without it (a CPU setup without the audio wheel), an empty
    module lets core start; no bench runs audio."""
    import importlib.util
    import types
    if importlib.util.find_spec("torchaudio") is not None and "torchaudio.functional" not in sys.modules:
        try:
            importlib.import_module("torchaudio.functional")
        except ImportError:
            sys.modules["torchaudio.functional"] = types.ModuleType("torchaudio.functional")


def vae(comfyui: str, sd: dict, **kw):
    """Core's VAE of a state dict, as its Load VAE builds it: ``comfy.sd.VAE(sd=sd, **kw)`` on the CPU."""
    start(comfyui)
    import comfy.sd
    return comfy.sd.VAE(sd=sd, **kw)
