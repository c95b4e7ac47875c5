"""Stable Video Diffusion's VAE through VAEKit beside ComfyUI core's (``comfy.sd.VAE``: ``AutoencodingEngine``
with ``comfy/ldm/modules/temporal_ae.VideoDecoder``), the original (Stability-AI generative-models,
``sgm/modules/autoencoding/temporal_ae.py`` at ``configs/inference/svd.yaml``'s config) and diffusers
(``AutoencoderKLTemporalDecoder``) on the same weights: parity of decode and encode, the clip rule
(which frames are decoded together) of each, and exact tiles.

    python bench/comfyui_checks/compare_core_svd.py --comfyui PATH/TO/ComfyUI --python PATH/TO/ComfyUI/venv/bin/python
    python bench/comfyui_checks/compare_core_svd.py ... --original PATH/TO/generative-models   # also the original
    python bench/comfyui_checks/compare_core_svd.py ... --quick                               # parity rows only

Weights: diffusers' class at the published config (svd_xt's ``vae/config.json``: block_out_channels
128/256/512/512, 2 layers a block, 4 latent channels), random under a fixed seed, GroupNorm affines
jittered and the mix factors drawn (they start at 0, an even merge under which the image and temporal
halves could be swapped unseen). diffusers' files carry a ``quant_conv`` (its conversion takes the
encoder from the checkpoint's conditioner embedder); the original's first stage has none, so it is set
to the identity here and the same function is in all four. The file core and the original load is that
state dict in the original's names (``svd_layout.to_canonical``, quant conv dropped), which is also
what ours loads; diffusers runs in this process, core and the original in a subprocess under
``--python`` (CPU, fp32; this file in --worker mode). Inputs: latents randn(T, 4, h, w), images
rand(T, H, W, 3) (ComfyUI's layouts: a LATENT [T, 4, h, w] is one clip). Nothing is asserted.

Rows (max / mean abs difference; pixels 0..1 for decode, raw latents for encode):
- ``decode T=..`` / ``encode T=..``: ours (VAE.decode / VAE.encode on ComfyUI's layout) against core's
  VAE Decode / VAE Encode, the original (``decode(z, timesteps=T)``, (x + 1) / 2 clamped; the
  regulariser's mode) and diffusers (``decode(z, num_frames=T)``; ``latent_dist.mode()``).
- clip rule: frame 0 decoded alone against the same latent as frame 0 of a 4-frame clip (core and ours:
  the decoder mixes frames); 25 frames as the original's sampling script decodes them (``decoding_t``
  14: clips of 14 and 11) against ours taking them 14 at a time (Frame-wise Decode: each chunk its own
  clip) and diffusers' ``decode_chunk_size=14``; one clip of 25 against those two clips; core's VAE
  Decode when its free-memory estimate lets 7 frames through at once (core decodes ``free //
  memory_used_decode`` frames a clip; 7 is what its formula gives at 576x1024 in bf16 with 18 GiB free)
  against core with all 25 in one clip; a 5-D latent [1, 4, 4, h, w]: core keeps its first frame,
  ours decodes the clip.
- tiles (4 frames of 192x192): ours exact 128 px tiles and fast 128/32 px tiles, and core's VAE Decode
  (Tiled) 128/32 px (its three-pass average), each against core's untiled decode.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core  # noqa: E402

SEED = 0
PUBLISHED = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4,
                 down_block_types=("DownEncoderBlock2D",) * 4)
# name -> (op, shape in ComfyUI's layout): decode LATENT [T, 4, h, w], encode IMAGE [T, H, W, 3]
CASES = {"decode_T1": ("decode", (1, 4, 8, 8)), "decode_T4": ("decode", (4, 4, 8, 8)),
         "decode_T14": ("decode", (14, 4, 8, 8)), "encode_T1": ("encode", (1, 64, 64, 3)),
         "encode_T5": ("encode", (5, 64, 64, 3))}
CLIPS = {"decode_T25": ("decode", (25, 4, 8, 8))}
TILES = {"tiles_decode": ("decode", (4, 4, 24, 24))}
DECODING_T = 14          # the original's sampling script (scripts/sampling/simple_video_sample.py)
CORE_FRAMES = 7          # frames core's free-memory estimate lets through in the emulated row
TILE, OVERLAP = 128, 32  # pixels (core's tiled node halves a side: 64 px tiles would leave none)


def published_model(seed: int = SEED):
    """diffusers' class at the published config, random weights (see the docstring), quant conv = identity."""
    import diffusers
    torch.manual_seed(seed)
    m = diffusers.AutoencoderKLTemporalDecoder(**PUBLISHED).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("mix_factor"):
                p.copy_(2 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
        m.quant_conv.weight.copy_(torch.eye(8)[:, :, None, None])
        m.quant_conv.bias.zero_()
    return m


def original_layout(diffusers_sd: dict) -> dict:
    """The same weights in the original's (= core's) names, without diffusers' quant conv."""
    sys.path.insert(0, str(ROOT))
    from vae.archs import svd_layout
    return {k: v.contiguous() for k, v in svd_layout.to_canonical(diffusers_sd).items() if not k.startswith("quant_conv.")}


# ---- reference side (ComfyUI's python) ------------------------------------------------------------

def _original_modules(path: str):
    """The original's encoder and video decoder at svd.yaml's first-stage config, imported from a
    generative-models checkout without its package ``__init__``s (they pull in training-only packages)."""
    import importlib
    for name, sub in (("sgm", "sgm"), ("sgm.modules", "sgm/modules")):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [str(Path(path) / sub)]
            sys.modules[name] = m
    model = importlib.import_module("sgm.modules.diffusionmodules.model")
    temporal = importlib.import_module("sgm.modules.autoencoding.temporal_ae")
    dd = dict(attn_type="vanilla", double_z=True, z_channels=4, resolution=256, in_channels=3, out_ch=3, ch=128,
              ch_mult=[1, 2, 4, 4], num_res_blocks=2, attn_resolutions=[], dropout=0.0)
    return model.Encoder(**dd).eval(), temporal.VideoDecoder(**dd, video_kernel_size=[3, 1, 1]).eval()


def worker(a) -> None:
    """Core's and the original's side: every case, results saved."""
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(a.threads)
    d = Path(a.worker)
    sd = load_file(d / "weights.safetensors")
    inputs = load_file(d / "inputs.safetensors")
    v = comfy_core.vae(a.comfyui, sd)
    keys = set(v.first_stage_model.state_dict())
    pixels = lambda images: images.movedim(-1, 1)             # IMAGE [T, H, W, 3] -> [T, 3, H, W]
    out = {}
    with torch.inference_mode():
        for k, x in inputs.items():
            if k.startswith("encode"):
                out[f"core_{k}"] = v.encode(x)
                continue
            out[f"core_{k}"] = pixels(v.decode(x))
            if k == "decode_T4":
                out["core_frame0_alone"] = pixels(v.decode(x[:1]))
                out["core_5d"] = pixels(v.decode(x.movedim(0, 1).unsqueeze(0)))       # [1, 4, 4, h, w]
            if k == "decode_T25":       # core's free-memory rule: CORE_FRAMES frames a clip
                need = v.memory_used_decode(x.shape, v.vae_dtype)
                free = v.patcher.get_free_memory
                v.patcher.get_free_memory = lambda device: CORE_FRAMES * need
                out["core_split"] = pixels(v.decode(x))
                v.patcher.get_free_memory = free
            if k == "tiles_decode":     # VAE Decode (Tiled): latent units, as the node passes them
                out["core_tiled"] = pixels(v.decode_tiled(x, tile_x=TILE // 8, tile_y=TILE // 8, overlap=OVERLAP // 8))
        if a.original:
            encoder, decoder = _original_modules(a.original)
            encoder.load_state_dict({k[8:]: t for k, t in sd.items() if k.startswith("encoder.")})
            decoder.load_state_dict({k[8:]: t for k, t in sd.items() if k.startswith("decoder.")})
            decode = lambda z: ((decoder(z, timesteps=len(z)) + 1) / 2).clamp(0, 1)
            for k, x in inputs.items():
                if k.startswith("encode"):
                    out[f"original_{k}"] = encoder(pixels(x) * 2 - 1)[:, :4]       # the regulariser's mode
                elif k != "tiles_decode":
                    out[f"original_{k}"] = decode(x)
            x = inputs.get("decode_T25")     # decode_first_stage with en_and_decode_n_samples_a_time = DECODING_T
            if x is not None:
                out["original_decoding_t"] = torch.cat([decode(x[i:i + DECODING_T])
                                                        for i in range(0, len(x), DECODING_T)])
    save_file({k: t.contiguous() for k, t in out.items()}, d / "core.safetensors")
    (d / "core.json").write_text(json.dumps({"model": type(v.first_stage_model.decoder).__name__,
                                             "missing": sorted(keys - set(sd)), "unexpected": sorted(set(sd) - keys)}))


# ---- our side -------------------------------------------------------------------------------------

def row(name: str, a: torch.Tensor, b: torch.Tensor, note: str = "") -> str:
    if a.shape != b.shape:
        return f"{name:<44} SHAPE {tuple(a.shape)} vs {tuple(b.shape)}  {note}"
    d = (a.float() - b.float()).abs()
    return f"{name:<44} {str(tuple(a.shape)):<18} {d.max().item():>9.2e} {d.mean().item():>9.2e}  {note}"


def run_references(comfyui: str, python: str, weights: dict, inputs: dict, original=None, threads: int = 2) -> dict:
    """Core's (and with ``original``, the original's) outputs for ``inputs``, from a worker under ``python``."""
    from safetensors.torch import load_file, save_file
    with tempfile.TemporaryDirectory(prefix="cmp_svd_") as tmp:
        d = Path(tmp)
        save_file(weights, d / "weights.safetensors")
        save_file(inputs, d / "inputs.safetensors")
        cmd = [python, str(Path(__file__).resolve()), "--worker", tmp, "--comfyui", str(Path(comfyui).resolve()),
               "--threads", str(threads)] + (["--original", str(Path(original).resolve())] if original else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"reference worker FAILED:\n{proc.stderr[-3000:]}")
        return {**load_file(d / "core.safetensors"), "info": json.loads((d / "core.json").read_text())}


def inputs_for(cases: dict, seed: int = SEED) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(shape, generator=g) if op == "decode" else torch.rand(shape, generator=g)
            for k, (op, shape) in cases.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True, help="ComfyUI source directory (the one with comfy/)")
    p.add_argument("--python", help="ComfyUI's python (its venv); default: this one")
    p.add_argument("--original", help="a Stability-AI/generative-models checkout (the original's code); "
                                      "imported under --python, which needs einops")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="the parity rows only")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    torch.set_num_threads(a.threads)
    sys.path.insert(0, str(ROOT))
    import vae

    ref = published_model()
    weights = original_layout(ref.state_dict())
    cases = {**CASES, **({} if a.quick else {**CLIPS, **TILES})}
    inputs = inputs_for(cases)
    got = run_references(a.comfyui, a.python or sys.executable, weights, inputs, a.original, a.threads)
    info = got.pop("info")
    v = vae.from_state_dict(weights, source="the original's layout")
    print(f"SVD VAE, published config, random weights (seed {SEED}), fp32, CPU, {a.threads} threads; core: "
          f"{info['model']}, {len(info['missing'])} missing, {len(info['unexpected'])} unexpected keys; ours: {v.name}")
    print(f"{'case':<44} {'shape':<18} {'max':>9} {'mean':>9}  note")
    diffusers_decode = lambda z, n: ((ref.decode(z, num_frames=n).sample + 1) / 2).clamp(0, 1)
    with torch.inference_mode():
        for k, (op, shape) in CASES.items():
            x = inputs[k]
            if op == "decode":
                ours = v.decode(x)
                refs = {"core": got[f"core_{k}"], "diffusers": diffusers_decode(x, len(x))}
            else:
                pixels = x.movedim(-1, 1)
                ours = v.encode(pixels)
                refs = {"core": got[f"core_{k}"], "diffusers": ref.encode(pixels * 2 - 1).latent_dist.mode()}
            if f"original_{k}" in got:
                refs["original"] = got[f"original_{k}"]
            for name, r in refs.items():
                print(row(f"{op} T={shape[0]}: ours vs {name}", ours, r))
        if a.quick:
            return
        x4 = inputs["decode_T4"]
        print(row("frame 0 alone vs in a 4-frame clip (core)", got["core_frame0_alone"], got["core_decode_T4"][:1],
                  "the decoder mixes frames"))
        print(row("frame 0 alone vs in a 4-frame clip (ours)", v.decode(x4[:1]), v.decode(x4)[:1]))
        x = inputs["decode_T25"]
        chunked = torch.cat([v.decode(x[i:i + DECODING_T]) for i in range(0, len(x), DECODING_T)])
        one = v.decode(x)
        if "original_decoding_t" in got:
            print(row(f"25 frames, clips of {DECODING_T}: ours vs original", chunked, got["original_decoding_t"],
                      "ours: Frame-wise Decode's chunks; original: decoding_t"))
        dchunks = torch.cat([diffusers_decode(x[i:i + DECODING_T], len(x[i:i + DECODING_T]))
                             for i in range(0, len(x), DECODING_T)])
        print(row(f"25 frames, clips of {DECODING_T}: ours vs diffusers", chunked, dchunks, "decode_chunk_size"))
        print(row("25 frames: one clip vs clips of 14 + 11 (ours)", one, chunked, "what the clip rule changes"))
        print(row("25 frames, one clip: ours vs core", one, got["core_decode_T25"]))
        print(row(f"core, {CORE_FRAMES} frames a clip vs one clip", got["core_split"], got["core_decode_T25"],
                  "core's free-memory rule"))
        print(row("5-D [1, 4, 4, h, w]: core vs ours", got["core_5d"], v.decode(x4.movedim(0, 1).unsqueeze(0))[0].movedim(1, 0),
                  "core keeps frame 0; ours decodes the clip"))
        x, untiled = inputs["tiles_decode"], got["core_tiles_decode"]
        print(row("tiles: ours untiled vs core untiled", v.decode(x), untiled))
        print(row(f"tiles: ours exact {TILE} px vs core untiled", v.decode(x, tile=TILE, mode="exact"), untiled))
        print(row(f"tiles: ours fast {TILE}/{OVERLAP} vs core untiled", v.decode(x, tile=TILE, overlap=OVERLAP), untiled))
        print(row(f"tiles: core tiled {TILE}/{OVERLAP} vs core untiled", got["core_tiled"], untiled,
                  "core VAE Decode (Tiled)"))


if __name__ == "__main__":
    main()
