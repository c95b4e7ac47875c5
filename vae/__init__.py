"""VAEKit's VAE library: pure PyTorch, no ComfyUI import anywhere below this package.

    from vae import load
    v = load("taef2_decoder.safetensors")      # family and hyperparameters detected from the keys
    images = v.decode(latent, tile=512, overlap=64)
"""
from .errors import InputError, LoadError, NonFiniteError, VAEKitError
from .handle import VAE
from .loading import from_state_dict, load, read_state_dict

__all__ = ["VAE", "load", "from_state_dict", "read_state_dict", "VAEKitError", "LoadError", "InputError",
           "NonFiniteError"]
