"""The runs a benchmark table can hold, by name, each the same call for every family: ``build(a, folder)`` ->
(model, call) in the worker that measures it. ``a`` carries the family, ``op`` (decode or encode), the run's
parameter (``a.param``: a tile ``512/64``, a budget in GB) and the flags of bench/decode.py.

Ours: ``one_pass`` the model's own forward over the whole input (the definition), ``default`` the handle's
call with nothing asked, ``whole`` one time chunk of the whole clip, ``frame`` one latent frame a chunk through
the causal caches, ``overlap`` two latent frames a chunk sharing one (blended), ``fast`` blended spatial tiles,
``exact`` exact tiles (video: streamed one latent frame at a time), ``budget`` exact within a budget (the plan
in ``a.info``), ``posterior`` (encode) mean and log-variance, ``compiled`` Compile VAE (inductor) with exact
tiles after one warm-up call, ``stitch`` the model's own tiles stitched. References: ``diffusers`` (its
tiling and frame-wise switches off), ``diffusers_tiled`` (enable_tiling; ``--diffusers-tile``), ``face``
(``vae.diffusers.load`` on diffusers' own file, called as diffusers' class is; ``face@GB``: within that
budget), ``core`` (comfy.sd.VAE), ``core_tiled`` (VAE Decode / Encode (Tiled)), ``core_sdpa`` (core with PyTorch attention).
A family adds its own (``Family.runs``, ``Family.core_patches``)."""
from __future__ import annotations

import time
from pathlib import Path

from .families import FAMILIES, write_weights

GIB = 1 << 30


def tile_of(a):
    """The run's tile (one side, or HxW) and overlap in pixels: ``512/64``, ``256x192``, ``512`` (a quarter
    overlap), or the family's."""
    tile, _, overlap = (a.param or a.tile or str(FAMILIES[a.family].tile)).partition("/")
    sides = tuple(map(int, tile.split("x")))
    return (sides if len(sides) > 1 else sides[0]), int(overlap) if overlap else min(sides) // 4


def _ours_options(v, a, shape) -> dict:
    r = v.caps.temporal_ratio
    video = len(shape) == 5
    if a.run == "default":
        return {}
    if a.run == "whole":
        return dict(tile_frames=r * shape[2])
    if a.run == "frame":
        return dict(tile_frames=r)
    if a.run == "overlap":
        return dict(tile_frames=2 * r, overlap_frames=r)
    if a.run in ("budget", "posterior"):          # the parameter is a budget, not a tile; --tile: the largest tried
        return dict(mode="exact", budget=int(float(a.param or a.budget) * GIB),
                    **(dict(tile=int(a.tile.partition("/")[0])) if a.tile else {}))
    tile, overlap = tile_of(a)
    if a.run == "fast":
        return dict(tile=tile, overlap=overlap)
    if a.run in ("exact", "compiled"):
        return dict(tile=tile, mode="exact", **(dict(tile_frames=r) if video and r else {}))
    raise SystemExit(f"unknown run {a.run}")


def ours(a, folder: Path, shape):
    import torch
    import vae
    from vae.engine import budget
    family = FAMILIES[a.family]
    v = vae.load(write_weights(family, folder), dtype=torch.float32)
    if family.ours_setup:
        family.ours_setup(v)
    if a.run == "one_pass" and a.op == "decode":
        lo, hi = v.caps.value_range
        one = lambda z: ((v.model.decode(z) - lo) / (hi - lo)).clamp_(0, 1)           # noqa: E731
        if family.frames_on_batch:        # the LATENT's frames on its batch axis: the model takes the clip
            return v.model, lambda z: one(z.movedim(0, 1)[None])[0].movedim(1, 0)
        return v.model, one
    kw = {} if a.run == "one_pass" else _ours_options(v, a, shape)
    if a.run == "compiled":               # its tiles are of one shape (halos recomputed)
        from vae.compile import compile_vae
        v, _ = compile_vae(v, encoder=a.op == "encode", backend="inductor")
        t0 = time.perf_counter()
        with torch.inference_mode():
            getattr(v, a.op)(torch.zeros(shape), **kw)       # builds the graphs
        a.info.update(compile_s=time.perf_counter() - t0, graphs=v.graph_count(), fallbacks=v.fallbacks())
    cpu = torch.device("cpu")
    call = v.call_for(a.op, shape, **{k: w for k, w in kw.items() if k not in ("budget",)})
    if a.run in ("budget", "posterior"):
        import dataclasses
        p = budget.plan(v, dataclasses.replace(call, posterior=a.run == "posterior"), kw["budget"], cpu, cpu, cpu)
        a.info["plan"] = p.describe()
        p = p.prediction
    else:
        p = budget.predict(v, call, cpu, cpu)
    a.info["pred"] = dict(device=p.device, maps=p.maps, output=p.output, live=p.live)
    if a.run == "posterior":
        return v.model, lambda x: v.encode(x, posterior=True, **kw)[0]
    return v.model, lambda t: getattr(v, a.op)(t, **kw)


def diffusers(a, folder: Path, shape):
    import diffusers as d
    from .workers import diffusers_from_file
    family = FAMILIES[a.family]
    write_weights(family, folder)
    model = diffusers_from_file(getattr(d, family.diffusers), folder / "diffusers.safetensors", **family.kwargs)
    if a.run == "diffusers_tiled":
        model.enable_tiling()
        if a.param or a.diffusers_tile:   # pixels; decode splits on the latent grid, kept consistent
            model.tile_sample_min_size = int(a.param or a.diffusers_tile)
            model.tile_latent_min_size = model.tile_sample_min_size // family.spatial
        a.info["note"] = f"tile_sample_min_size={getattr(model, 'tile_sample_min_size', '?')}"
    return model, (family.diffusers_call or _diffusers_call)(model, a.op)


def _diffusers_call(model, op: str):
    """diffusers' common call of ``op``: 0..1 pixels out of decode, the posterior's mean out of encode."""
    if op == "decode":
        return lambda z: model.decode(z).sample.div_(2).add_(0.5).clamp_(0, 1)     # in place: the caller's own
    fn = lambda x: model.encode(x).latent_dist.mean      # noqa: E731
    fn.prepare = lambda x: x * 2 - 1    # pixels in -1..1 as a pipeline holds them: its data, not the call's
    return fn


def face(a, folder: Path):
    """vae.diffusers' face on the file diffusers' class loads, called as ``diffusers`` calls the class
    (same input, same output convention); ``a.param``: the budget set at construction, GB."""
    import torch
    import vae
    family = FAMILIES[a.family]
    write_weights(family, folder)
    f = vae.diffusers.load(folder / "diffusers.safetensors", budget=float(a.param) if a.param else None,
                           dtype=torch.float32)
    return f, _diffusers_call(f, a.op)


def core_call(a, folder: Path):
    """comfy.sd.VAE on our file (with its metadata, as Load VAE reads it): its IMAGE [.., H, W, 3] back to our
    layout, clamped as we clamp."""
    from . import comfy_core
    family = FAMILIES[a.family]
    comfy_core.start(a.comfyui, pytorch_attention=a.run == "core_sdpa")
    import comfy.utils
    sd, metadata = comfy.utils.load_torch_file(str(folder / family.file), return_metadata=True)
    v = comfy_core.vae(a.comfyui, sd, metadata=metadata)
    tiled = a.run == "core_tiled"
    tile = (int(a.core_tile), int(a.core_tile) // 8, *family.core_tiled[2:]) if a.core_tile else family.core_tiled
    if a.op == "encode":
        frames = lambda x: x[0].movedim(0, -1) if x.dim() == 5 else x.movedim(1, -1)     # noqa: E731
        if tiled:
            import nodes
            node = nodes.VAEEncodeTiled()
            return v.first_stage_model, lambda x: node.encode(v, frames(x), *tile)[0]["samples"]
        return v.first_stage_model, lambda x: v.encode(frames(x))
    if tiled:
        import nodes
        node = nodes.VAEDecodeTiled()

        def flat(z):     # the node returns a batch of frames [B*T, H, W, 3]
            images = node.decode(v, {"samples": z}, *tile)[0]
            return images.reshape(z.shape[0], -1, *images.shape[-3:]) if z.dim() == 5 else images
    else:
        flat = v.decode
    return v.first_stage_model, lambda z: flat(z).movedim(-1, 1).clamp(0, 1)


def build(a, folder: Path, shape):
    """The run's (model, call); ``a.run`` is its name without the parameter."""
    family = FAMILIES[a.family]
    if a.run in family.runs:
        return family.runs[a.run](a, folder)
    if a.run.startswith("diffusers"):
        return diffusers(a, folder, shape)
    if a.run == "face":
        return face(a, folder)
    if a.run.startswith("core"):
        if a.run in family.core_patches:
            family.core_patches[a.run](a)
        return core_call(a, folder)
    return ours(a, folder, shape)
