"""What every node's call on a VAE needs, in one place: the weights loaded through ComfyUI's memory
manager with what the call needs besides (``load_weights``), the memory budget from the node's
``max_memory``, the model's own options, and the call itself with progress and ComfyUI's
intermediate device, through a worker pool when ``devices`` names one. A node file makes its call
through ``run`` (or ``prepare``, for a call it repeats) once; the widgets of the inputs read here
(``BUDGET``, ``DECODE_OPTIONS``) are declared here too."""
from __future__ import annotations

from typing import Optional

import torch

from ..vae import checks
from . import _comfy
from .devices import pool_for

BUDGET = ("FLOAT", {"default": 0.0, "min": 0.0, "max": 4096.0, "step": 0.25, "advanced": True,
                    "tooltip": "Memory budget in GB (2^30 bytes) for this node's work on the VAE's device. The "
                               "planner measures the work on the meta device first and picks the largest tile "
                               "(at most tile_size) and chunk that fit, and logs its plan; if nothing fits, the "
                               "error names the smallest budget that works. 0: what ComfyUI's memory manager says "
                               "is free (the tiles as given when they fit)."})
# Inputs of timestep-conditioned or sampling decoders (LTX-Video 0.9.1+, LTX-2 files with a
# timestep-conditioned decoder; seed: also the Consistency Decoder); other VAEs ignore them. Marked
# "advanced" (frontends that know the flag fold them away, as core folds its temporal_size), and the
# seed is fixed: a randomizing seed would re-run the decode and all after it on every queue.
DECODE_OPTIONS = {
    "decode_timestep": ("FLOAT", {"default": 0.05, "min": 0.0, "max": 1.0, "step": 0.001, "advanced": True,
                                  "tooltip": "Timestep-conditioned LTX decoders only (LTX-Video 0.9.1+, some LTX-2 "
                                             "files): the timestep the decoder is conditioned on (ComfyUI's "
                                             "default 0.05). Ignored by other VAEs."}),
    "decode_noise_scale": ("FLOAT", {"default": 0.025, "min": 0.0, "max": 1.0, "step": 0.001, "advanced": True,
                                     "tooltip": "Timestep-conditioned LTX decoders only (LTX-Video 0.9.1+, some "
                                                "LTX-2 files): share of noise mixed into the latent before decoding "
                                                "(ComfyUI's default 0.025). Ignored by other VAEs."}),
    "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "advanced": True,
                     "control_after_generate": False,
                     "tooltip": "Seed of the noise a decoder draws, so a decode repeats exactly: LTX-Video 0.9.1+ "
                                "(the noise above), LTX-2.5's diffusion decoder (its pixel noise; 0 is what ComfyUI "
                                "draws on the CPU) and the Consistency Decoder (its sampler). Tiles take their part "
                                "of one noise field. Ignored by other VAEs."}),
}


def decode_options(decode_timestep=None, decode_noise_scale=None, seed=None) -> dict:
    """The ``DECODE_OPTIONS`` widgets by the library's names for them."""
    return dict(timestep=decode_timestep, noise_scale=decode_noise_scale, seed=seed)


class NodeCall:
    """A node's call on ``engine`` (our handle, or a core VAE tiled through its own calls), its keywords
    fixed by ``prepare``; calling it runs ``engine.<op>`` on an input."""

    def __init__(self, engine, op: str, keywords: dict):
        self.engine, self.op, self.keywords = engine, op, keywords

    def __call__(self, x: torch.Tensor, devices: str = "", progress: bool = True) -> torch.Tensor:
        """The call on ``x``, with ComfyUI's progress bar (``progress``) and its intermediate device as
        the output's; the tiles shared by a worker pool when ``devices`` names one."""
        common = dict(progress=_comfy.progress_callback() if progress else None,
                      out_device=_comfy.intermediate_device())
        pool = pool_for(devices, self.engine)
        if pool is None:
            return getattr(self.engine, self.op)(x, **common, **self.keywords)
        return pool.run(self.engine, self.op, x, **common, **self.keywords)


def prepare(engine, op: str, shape, max_memory: float = 0.0, options: Optional[dict] = None, **plan) -> NodeCall:
    """A node's call of ``op`` on an input of ``shape`` with the tiling keywords ``plan`` (tile, overlap,
    tile_frames, overlap_frames, mode), made ready: our VAE's weights loaded for it, its budget from
    ``max_memory`` (GB; 0: what ComfyUI says is free), of ``options`` (the model's own inputs) those the
    model takes."""
    ours = hasattr(engine, "model")       # else a core VAE we tile through its own calls: it loads itself
    need = load_weights(engine, op, shape, **plan) if ours else None
    return NodeCall(engine, op, {**plan, **_budget(engine, max_memory, need, ours),
                                 **_model_options(engine, options or {})})


def run(engine, op: str, x: torch.Tensor, devices: str = "", max_memory: float = 0.0,
        options: Optional[dict] = None, **plan) -> torch.Tensor:
    """A node's one call of ``op`` on ``x`` (see ``prepare`` and ``NodeCall``)."""
    return prepare(engine, op, x.shape, max_memory, options, **plan)(x, devices)


def temporal_ratio(engine) -> Optional[int]:
    """Pixel frames per latent frame of a video VAE (ours or a core one), None for an image VAE."""
    caps = getattr(engine, "caps", None)
    return caps.temporal_ratio if caps is not None else getattr(engine, "frames", None)


def load_weights(handle, op: Optional[str] = None, shape: Optional[tuple] = None, **plan) -> Optional[int]:
    """Before a call: inside ComfyUI, load the weights onto their device through its memory manager, and
    tell it what the call needs besides (one tile of one chunk, measured from the architecture on the
    meta device for the load device: ``VAE.memory_needed``), so it frees that much first; that need is
    returned (None outside ComfyUI or when it cannot be measured). Outside ComfyUI, the weights go where
    the VAE's patcher loads them (a node may have set its ``load_device``)."""
    mm = _comfy.model_management()
    p = _comfy.registered(handle)
    if p is None:
        return None
    if mm is None:
        load = torch.device(p.load_device)
        if handle.device != load:
            handle.to(load)
        return None
    # asked before the load, while the weights may still wait on the offload device: for the load device
    need = (handle.memory_needed(tuple(shape), op, device=torch.device(p.load_device), **plan)
            if op and shape is not None else None)
    # plain torch layers cannot be partially loaded, so the whole VAE is loaded
    mm.load_models_gpu([p], memory_required=need or 0, force_full_load=True)
    return need


def _budget(engine, gb: float, need: Optional[int], ours: bool) -> dict:
    """The ``budget`` keyword of the call (vae/engine/budget.py), from the node's ``max_memory`` (GB, read
    by the library's one parser, vae/checks.py): that size when given; with 0, inside ComfyUI, what its
    memory manager says is free on the VAE's device once the VAE is loaded, when the call as asked
    (``need``) would not fit in it; else none (the call runs as asked)."""
    size = checks.budget(gb, "max_memory", numbers_in_gb=True, zero=True)
    if not ours:        # a core VAE we tile through its own calls: no planner
        if gb:
            _comfy.log.warning("VAEKit: max_memory applies to VAEs VAEKit implements; %s runs as asked",
                               getattr(engine, "name", "this VAE"))
        return {}
    if size:
        return {"budget": size}
    mm = _comfy.model_management()
    if mm is None or need is None or not hasattr(mm, "get_free_memory"):
        return {}
    free = int(mm.get_free_memory(_comfy.placed_device(engine)))
    return {"budget": free} if need > free else {}


def _model_options(engine, given: dict) -> dict:
    """Of the node's model inputs (LTX's decode timestep and noise, a seed), those the VAE's model takes:
    the library refuses keywords a model does not take; a core VAE tiled through its own calls takes none."""
    return engine.decode_options(given) if hasattr(engine, "decode_options") else {}
