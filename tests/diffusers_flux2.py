"""diffusers' Flux.2 VAE and its pipeline's latent steps, as the parity oracle (tests and bench).

``AutoencoderKLFlux2.decode`` takes the raw latent; the Flux.2 pipeline does the rest (BatchNorm
un-normalise + unpatchify before decode; patchify + normalise after encode). Importing the pipeline
modules needs transformers, which nothing else here needs, so the pipeline's own functions are read
from the installed diffusers source and run as they are: ``Flux2Pipeline._encode_vae_image`` (with
its ``retrieve_latents`` and ``_patchify_latents``) and the modular pipeline's ``Flux2DecodeStep``
(its ``__call__`` and ``_unpatchify_latents``), with its image processor's postprocess."""
from __future__ import annotations

import ast
import importlib.util
import math
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import jitter_norms

PIPELINE = "pipelines/flux2/pipeline_flux2.py"
DECODE_STEP = "modular_pipelines/flux2/decoders.py"

# the published FLUX.2 VAE config (= diffusers' defaults: quant convs, mid attention, batch_norm_eps 1e-4)
PUBLISHED = dict(widths=(128, 256, 512, 512), layers=2, latent=32)


def _functions(relpath: str, wanted: dict[str, tuple[str, ...]]) -> dict:
    """The named functions of one installed diffusers file, compiled from its source. ``wanted``: class name ("" for module
    level) -> function names. Annotations stay unevaluated (the file's own future import)."""
    spec = importlib.util.find_spec("diffusers")
    if spec is None:
        pytest.skip("diffusers is not installed")
    path = Path(spec.origin).parent / relpath
    tree = ast.parse(path.read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in wanted:
            found.update({f"{node.name}.{f.name}": f for f in node.body
                          if isinstance(f, ast.FunctionDef) and f.name in wanted[node.name]})
        elif isinstance(node, ast.FunctionDef) and node.name in wanted.get("", ()):
            found[node.name] = node
    missing = [f"{c}.{n}".lstrip(".") for c, names in wanted.items() for n in names
               if f"{c}.{n}".lstrip(".") not in found]
    if missing:
        pytest.fail(f"diffusers' {relpath} no longer has {missing}: update the oracle")
    out = {}
    for name, fn in found.items():
        # the function's code object compiled from its own source, bound to a namespace of ours; its
        # decorators (torch.no_grad, staticmethod) are left off: they do not change the values
        fn.decorator_list = []
        future = ast.ImportFrom(module="__future__", names=[ast.alias(name="annotations")], level=0)
        module = ast.fix_missing_locations(ast.Module(body=[future, fn], type_ignores=[]))
        (code,) = [c for c in compile(module, str(path), "exec").co_consts
                   if isinstance(c, types.CodeType) and c.co_name == fn.name]
        f = types.FunctionType(code, {"torch": torch, "__builtins__": __builtins__}, fn.name)
        f.__defaults__ = tuple(ast.literal_eval(d) for d in fn.args.defaults) or None
        f.__kwdefaults__ = {a.arg: ast.literal_eval(d) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults)
                            if d is not None} or None
        out[name] = f
    return out


class Pipeline:
    """The Flux.2 pipeline's VAE side: ``encode(vae, pixels 0..1) -> packed, normalised latent`` and
    ``decode(vae, packed latent) -> pixels 0..1``, each the pipeline's own code around ``vae``."""

    def __init__(self):
        enc = _functions(PIPELINE, {"": ("retrieve_latents",),
                                    "Flux2Pipeline": ("_patchify_latents", "_encode_vae_image")})
        dec = _functions(DECODE_STEP, {"Flux2DecodeStep": ("_unpatchify_latents", "__call__")})
        enc["Flux2Pipeline._encode_vae_image"].__globals__["retrieve_latents"] = enc["retrieve_latents"]
        self._encode, self._patchify = enc["Flux2Pipeline._encode_vae_image"], enc["Flux2Pipeline._patchify_latents"]
        self._decode_step, self._unpatchify = dec["Flux2DecodeStep.__call__"], dec["Flux2DecodeStep._unpatchify_latents"]
        from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor
        self.processor = Flux2ImageProcessor(vae_scale_factor=16, vae_latent_channels=32)

    def encode(self, vae, pixels: torch.Tensor) -> torch.Tensor:
        me = SimpleNamespace(vae=vae, _patchify_latents=self._patchify)
        with torch.no_grad():
            return self._encode(me, pixels * 2 - 1, None)

    def decode(self, vae, latent: torch.Tensor) -> torch.Tensor:
        state = SimpleNamespace(latents=latent, output_type="pt")
        me = SimpleNamespace(get_block_state=lambda s: s, set_block_state=lambda s, b: None,
                             _unpatchify_latents=self._unpatchify)
        self._decode_step(me, SimpleNamespace(vae=vae, image_processor=self.processor), state)
        return state.images

    def unpatchify(self, latent: torch.Tensor) -> torch.Tensor:
        return self._unpatchify(latent)


def model(widths=(32, 64), decoder_widths=None, layers: int = 1, latent: int = 8, var=(1e-3, 4.0), **kw):
    """A diffusers AutoencoderKLFlux2 with random weights, jittered GroupNorm affines and random
    BatchNorm statistics (the defaults, mean 0 / var 1, would make the latent step an identity):
    variances log-uniform over ``var``; down to 1e-3 by default, where the eps (1e-4) counts."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    n = len(widths)
    m = diffusers.AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=tuple(widths), decoder_block_out_channels=decoder_widths, layers_per_block=layers,
        latent_channels=latent, **kw)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        m.bn.running_mean.copy_(torch.randn(m.bn.running_mean.shape, generator=g))
        lo, hi = math.log(var[0]), math.log(var[1])
        m.bn.running_var.copy_(torch.exp(torch.empty(m.bn.running_var.shape).uniform_(lo, hi, generator=g)))
        m.bn.num_batches_tracked.fill_(1000)
    return jitter_norms(m).eval()
