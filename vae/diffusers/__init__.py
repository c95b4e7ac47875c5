"""VAEKit's VAEs as diffusers' VAE classes to their callers (pipelines, trainers): ``load(file_or_folder)``
gives a ``torch.nn.Module`` whose encode/decode/config/dtype/device answer as the diffusers class for that
file does, every call exact within a budget. diffusers itself is never imported. See docs/diffusers.md.

    import vae
    pipe.vae = vae.diffusers.load("sdxl_vae.safetensors", budget="2GB")
"""
from .face import Face, FrozenConfig
from .families import FAMILIES, Family
from .posterior import DiagonalGaussianDistribution, IdentityDistribution, Output
from .source import load

__all__ = ["load", "Face", "FrozenConfig", "Family", "FAMILIES", "DiagonalGaussianDistribution",
           "IdentityDistribution", "Output"]
