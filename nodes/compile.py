"""Compile VAE: a new, compiled VAE on the socket; the input VAE stays as it was for other nodes."""
from __future__ import annotations

from ..vae.compile import DYNAMIC, MODES, available_backends, compile_vae
from ..vae.errors import InputError
from ..vae.handle import VAE
from . import _comfy
from .base import CATEGORY, names_node
from .socket import VAEKitVAE, as_engine

_LAZY = "Nothing is compiled when this node runs: each graph is built on the first encode/decode that uses it."


class VAEKitCompile:
    DISPLAY_NAME = "Compile VAE (VAEKit)"
    CATEGORY = CATEGORY
    RETURN_TYPES = ("VAE",)
    RETURN_NAMES = ("vae",)
    OUTPUT_TOOLTIPS = ("A new VAE whose encoder/decoder run compiled; use it in place of the input VAE.",)
    FUNCTION = "compile"
    DESCRIPTION = ("torch.compile for a VAE, as a NEW VAE: the input VAE is not modified and keeps working "
                   "in other nodes. Encoder and decoder are compiled as separate graphs. Tiled nodes feed "
                   "fixed-size tiles, so one graph serves every resolution; untiled decodes use dynamic "
                   "shapes. Images whose sides are not multiples of the compression are centre-cropped, "
                   "as core's VAE Encode does. Exact tiles (the tiled nodes' default mode) run the eager "
                   "model, since a tile pauses inside it where tiles meet: compiled graphs speed up fast "
                   "tiles, untiled and frame-wise calls. " + _LAZY)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "vae": ("VAE", {"tooltip": "The VAE to compile (VAE Load (VAEKit) or core's Load VAE); it is "
                                       "left as it is."}),
            "compile_encoder": ("BOOLEAN", {"default": True, "tooltip":
                                            "Compile the encoder (its own graph). Off: it runs as before."}),
            "compile_decoder": ("BOOLEAN", {"default": True, "tooltip":
                                            "Compile the decoder (its own graph). Off: it runs as before."}),
            "backend": (list(available_backends()), {"default": "inductor", "tooltip":
                        "inductor: generated kernels (the speed-up; needs a C compiler on CPU, Triton on "
                        "GPU). cudagraphs (CUDA only): replays recorded kernels. aot_eager / eager: trace "
                        "only, no speed-up; for checking that a model compiles. " + _LAZY}),
            "mode": (list(MODES), {"default": "default", "tooltip":
                     "inductor only. reduce-overhead: CUDA graphs (more memory); max-autotune: tries "
                     "kernel variants (much longer first run); max-autotune-no-cudagraphs: the same "
                     "without CUDA graphs."}),
            "dynamic": (list(DYNAMIC), {"default": "auto", "tooltip":
                        "auto: tiled axes use fixed-size tiles (static graphs), untiled axes are dynamic, so "
                        "a new resolution does not recompile. true: every shape dynamic. false: every shape "
                        "static (a new untiled resolution recompiles)."}),
            "fuse_qkv": ("BOOLEAN", {"default": False, "tooltip":
                         "Fuse the attention q/k/v projections into one (same outputs, one kernel instead "
                         "of three), in the new VAE only. VAEs without attention (TAESD, LTX-Video, Magvit "
                         "V5.1) say so and go on."}),
        }}

    @names_node
    def compile(self, vae, compile_encoder=True, compile_decoder=True, backend="inductor", mode="default",
                dynamic="auto", fuse_qkv=False):
        handle = as_engine(vae, self.DISPLAY_NAME)
        if not isinstance(handle, VAE):
            raise InputError(f"{handle.name} is run through ComfyUI's own code, which VAEKit does not compile.",
                             input="vae", fix="load a VAE VAEKit implements (see VAE Load (VAEKit)).")
        new, report = compile_vae(handle, encoder=compile_encoder, decoder=compile_decoder, backend=backend,
                                  mode=mode, dynamic=dynamic, fuse_qkv=fuse_qkv)
        _comfy.place(new, _comfy.placed_device(handle), handle.dtype)
        _comfy.log.info("%s: %s", self.DISPLAY_NAME, report.message)
        return {"ui": {"text": [report.message]}, "result": (VAEKitVAE(new),)}
