"""VAE Load: any supported VAE file, family and hyperparameters detected from its keys."""
from __future__ import annotations

import torch

from ..vae import load
from ..vae.errors import LoadError
from . import _comfy
from .base import CATEGORY, names_node
from .socket import VAEKitVAE


class VAEKitLoad:
    DISPLAY_NAME = "VAE Load (VAEKit)"
    CATEGORY = CATEGORY
    RETURN_TYPES = ("VAE",)
    RETURN_NAMES = ("vae",)
    OUTPUT_TOOLTIPS = ("The VAE; core VAE Decode/Encode nodes accept it too.",)
    FUNCTION = "load"
    FILE_INPUTS = ("vae_name",)     # a folder listing: this node resolves the name and says where it looked
    DESCRIPTION = ("Loads a VAE (image: AutoencoderKL for SD1.x/SD2.x/SDXL/SD3/Flux.1, the TAESD family (taeqi2_1 too), the "
                   "Consistency Decoder, Qwen-Image 2.1 (RGBA), Mage-VAE (Mage-Flow), HunyuanImage 2.1 and 3.0; video: Wan 2.1/2.2 and "
                   "Qwen-Image, Mochi, LTX-Video, LTX-2 and LTX-2.5, HunyuanVideo, EasyAnimate, SeedVR2, CogVideoX, "
                   "Stable Video Diffusion's temporal VAE (also from its full svd/svd_xt checkpoint), "
                   "and the TAEHV family of tiny video autoencoders: taehv, taew2_1/2_2, taehv1_5, taeltx_2, taeh3, "
                   "LightX2V's lighttae*, whose latent space is told by the file's name, as core tells them) from "
                   "the 'vae' or 'vae_approx' folder, in the original, ComfyUI or diffusers key layout. "
                   ".pth/.ckpt files are read without running pickled code.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "vae_name": (_comfy.vae_choices(), {
                "tooltip": "A file from models/vae, or a TAESD encoder/decoder pair from models/vae_approx "
                           "(listed once by its name, e.g. 'taef2', 'taeqi2_1')."}),
            "dtype": (["auto", "fp32", "bf16", "fp16"], {
                "default": "auto",
                "tooltip": "Weights and compute precision. auto: ComfyUI's VAE choice (fp32 on CPU, bf16 on "
                           "recent GPUs). fp16 can overflow on SD/SDXL VAEs."}),
            "device": (["auto", "cpu", "cuda"], {
                "default": "auto", "tooltip": "Where the VAE runs. auto: ComfyUI's VAE device."}),
        }}

    @names_node
    def load(self, vae_name: str, dtype: str = "auto", device: str = "auto"):
        dev = _comfy.compute_device(device)           # the cheap checks first: nothing is read in vain
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise LoadError("CUDA is not available on this machine.", input="device", fix="choose 'auto' or 'cpu'.")
        try:
            path, hint = _comfy.resolve_vae(vae_name)
        except FileNotFoundError as e:
            raise LoadError(str(e), input="vae_name", fix=_comfy.missing_model_fix()) from None
        try:
            handle = load(path, name_hint=hint)
        except LoadError as e:
            raise e.for_node(self.DISPLAY_NAME, "vae_name")
        _comfy.place(handle, dev, _comfy.pick_dtype(dtype, dev, handle.caps.working_dtypes))
        return (VAEKitVAE(handle),)
