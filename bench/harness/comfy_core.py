"""ComfyUI core inside a bench worker, as the reference the scripts compare against (run under ComfyUI's python).

ComfyUI picks its device and attention function from its command-line flags when ``comfy.model_management``
is first imported; a worker never passes ComfyUI its own argv, so ``start`` sets the flags on core's parsed
defaults before anything imports that module."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Optional


def start(comfyui: str, pytorch_attention: bool | None = None, cpu: bool = True) -> None:
    """Make ComfyUI's source at ``comfyui`` importable and set it up for the CPU (``--cpu``; ``cpu=False``:
    its device choice); with ``pytorch_attention`` also ``--use-pytorch-cross-attention`` on or off. Call
    it before importing anything else from comfy or ComfyUI's ``nodes``."""
    if sys.path[0] != comfyui:
        sys.path.insert(0, comfyui)
    _audio_stand_in()
    from comfy.cli_args import args
    args.cpu = cpu
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


def core_vae(w, meta=None):
    """Core's VAE of a comparison worker's file as its Load VAE builds it, refusing a file core cannot detect."""
    v = vae(w.a.comfyui, dict(w.sd), metadata=meta)
    v.throw_exception_if_invalid()
    return v


# ---- one core comparison: a family's declaration (bench/comfyui_checks/core_families.py) run by
# ---- bench/comfyui_checks/compare_core.py: weights here, core's side in a worker under ComfyUI's python

@dataclass(frozen=True)
class Case:
    """One input of a comparison: ``decode`` (randn) or ``encode`` (rand, 0..1) of ``shape``, on the
    family's file ``file`` ("": its only one)."""
    op: str
    shape: tuple
    file: str = ""


def cases(shapes: dict, file: str = "") -> dict:
    """name -> Case of name -> shape: a decode where the name says ``decode``, else an encode; on ``file``."""
    return {k: Case("decode" if "decode" in k else "encode", shape, file) for k, shape in shapes.items()}


@dataclass(frozen=True)
class IO:
    """Where a case meets each side, both outputs laid out alike for the table: core's VAE Decode /
    VAE Encode (``core_decode(v, x)``, ``core_encode(v, x)`` on core's VAE) and ours (``ours_decode(h, x)``,
    ``ours_encode(h, x)`` on our handle)."""
    core_decode: Callable
    core_encode: Callable
    ours_decode: Callable
    ours_encode: Callable


def socket(handle):
    """Our VAE as core's nodes see it (``VAEKitVAE``); the handle comes from the pack (``pack_load``)."""
    from vaekit.nodes.socket import VAEKitVAE
    return VAEKitVAE(handle)


# video in our layout: latents [B, C, t, h, w], clips [1, 3, T, H, W] (core's IMAGE batch is the clip's frames)
CLIP = IO(lambda v, z: v.decode(z).movedim(-1, 1), lambda v, x: v.encode(x[0].movedim(0, -1)),
          lambda h, z: h.decode(z), lambda h, x: h.encode(x))
# CLIP, core's IMAGE clamped to 0..1 as ours and the originals clamp (core leaves it unclamped)
CLIP_CLAMPED = IO(lambda v, z: v.decode(z).clamp(0, 1).movedim(-1, 1), CLIP.core_encode, CLIP.ours_decode,
                  CLIP.ours_encode)
# images in our layout [B, 3, H, W], core's IMAGE clamped (see CLIP_CLAMPED)
IMAGE_CLAMPED = IO(CLIP_CLAMPED.core_decode, lambda v, x: v.encode(x.movedim(1, -1)), CLIP.ours_decode,
                   CLIP.ours_encode)
# ComfyUI's layouts, a clip's frames in the batch: LATENT [T, C, h, w] in, IMAGE [T, H, W, 3] encoded
FRAMES = IO(CLIP.core_decode, lambda v, x: v.encode(x), lambda h, z: h.decode(z),
            lambda h, x: h.encode(x.movedim(-1, 1)))
# ComfyUI's layouts on both sides: core's VAE and our socket, what core's nodes call on either
SOCKET = IO(lambda v, z: v.decode(z), lambda v, x: v.encode(x), lambda h, z: socket(h).decode(z),
            lambda h, x: socket(h).encode(x))


@dataclass(frozen=True)
class Family:
    """A core comparison: ``files(run)`` -> {file name: tensors or (tensors, metadata), or None for a file
    it wrote itself} at the published config (``run.quick``: the narrow one where declared), or
    ``core_files(w)`` -> {file name: tensors} under core's python (core's own classes); ``cases``
    drawn in order from one generator seeded ``seed``, then ``extra_inputs(g)`` from it (``quick``: the
    cases of ``--quick``); ``variants(a)``: the sizes run one after the other; ``io`` where they meet each
    side. Core's side: ``core_build(w, metadata)`` (default ``comfy.sd.VAE``), every case through ``io``
    (under ``torch.no_grad`` where ``no_grad``, else inference mode as ComfyUI runs nodes), then
    ``core_extra(w)`` (a ``Worker``) for the outputs only one family has; ``workers``: its other steps
    under core's python. Ours: ``load(run, path)`` (default ``vae.load``), ``case_rows(run, name, case)``
    per case (default: ``run.core_row``), then ``rows(run)``. ``dry()`` -> (files, cases) at a tiny size,
    ours only. The published config, how core builds it and every documented difference: the family's
    section of docs/core_differences.md."""
    title: str
    cases: dict = field(default_factory=dict)
    quick: tuple = ()
    seed: int = 0
    io: IO = CLIP
    files: Optional[Callable] = None
    core_files: Optional[Callable] = None
    core_build: Optional[Callable] = None
    core_keys: Callable = set
    core_extra: Optional[Callable] = None
    load: Optional[Callable] = None
    case_rows: Optional[Callable] = None
    rows: Optional[Callable] = None
    options: Optional[Callable] = None
    no_grad: bool = False
    workers: dict = field(default_factory=dict)
    dry: Optional[Callable] = None
    relative_encode: bool = False
    variants: Optional[Callable] = None
    extra_inputs: Optional[Callable] = None


def draw(cases: dict, seed: int, extra: Optional[Callable] = None) -> dict:
    """The inputs of ``cases`` (name -> Case), in order, from one generator seeded with ``seed``; then
    ``extra(generator)``'s."""
    import torch
    g = torch.Generator().manual_seed(seed)
    out = {k: torch.randn(c.shape, generator=g) if c.op == "decode" else torch.rand(c.shape, generator=g)
           for k, c in cases.items()}
    return {**out, **(extra(g) if extra else {})}


class Table:
    """The rows of a comparison: max / mean abs difference of ours against a reference and the max over
    the larger side's largest magnitude, printed as they come and kept for ``--json``. ``parity`` rows
    compare the same computation (``--check TOL`` fails on one above TOL; the max, or with
    ``relative_encode`` an encode row's relative figure); the others show where references differ.
    ``kind`` (decode / encode) adds the share of decoded pixels at 0 or 1 (random weights: a saturated
    decoder would hide differences) or the reference latent's range."""

    def __init__(self, tol: Optional[float] = None, relative_encode: bool = False, width: int = 48):
        self.rows, self.tol, self.relative_encode, self.width = [], tol, relative_encode, width
        print(f"{'case':<{width}} {'shape':<22} {'max':>9} {'mean':>9} {'rel':>9}  {'':<6}  note")

    def add(self, name: str, ours, ref, note: str = "", parity: bool = True, kind: Optional[str] = None) -> dict:
        import math
        if ours.shape != ref.shape:
            row = dict(name=name, max=math.inf, mean=math.inf, rel=math.inf, parity=parity, note=note)
            print(f"{name:<{self.width}} SHAPE {tuple(ours.shape)} vs {tuple(ref.shape)}  {note}", flush=True)
        else:
            d = (ours.float() - ref.float()).abs()
            mx = d.max().item()
            rel = mx / max(ours.abs().max().item(), ref.abs().max().item(), 1e-12)
            extra = {"decode": lambda: f"{100 * ((ours <= 0) | (ours >= 1)).float().mean().item():.0f}% clamped",
                     "encode": lambda: f"latent range {ref.min().item():.2f}..{ref.max().item():.2f}"}.get(kind)
            note = "; ".join(n for n in (note, extra() if extra else "") if n)
            row = dict(name=name, max=mx, mean=d.mean().item(), rel=rel, parity=parity, note=note, kind=kind)
            print(f"{name:<{self.width}} {str(tuple(ours.shape)):<22} {mx:>9.2e} {row['mean']:>9.2e} {rel:>9.2e}  "
                  f"{self._mark(row):<6}  {note}", flush=True)
        self.rows.append(row)
        return row

    def _mark(self, row: dict) -> str:
        if not row["parity"]:
            return ""
        return "parity" if self.tol is None else ("FAIL" if failed([row], self.tol, self.relative_encode) else "ok")


def failed(rows: list, tol: float, relative_encode: bool = False) -> list:
    """The names of the parity rows above ``tol`` (see ``Table``)."""
    score = lambda r: r["rel"] if relative_encode and r.get("kind") == "encode" else r["max"]
    return [r["name"] for r in rows if r["parity"] and not score(r) <= tol]
