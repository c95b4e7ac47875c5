"""MiniMax H3 video VAE: VAEKit beside ComfyUI core on the same weights from the same file, same
inputs; prints max / mean abs difference per case (pixels 0..1 for decode, latents for encode).

    python bench/comfyui_checks/compare_core_minimax.py --comfyui /path/to/ComfyUI --python /path/to/venv/bin/python
    python bench/comfyui_checks/compare_core_minimax.py ... --sizes tiny --newer-tiled-decode FILE
    python bench/comfyui_checks/compare_core_minimax.py ... --sizes tiny_int8 [--core-attention pytorch]
    python bench/comfyui_checks/compare_core_minimax.py ... --sizes published,int8     # ~10 GB per process

Core is run in a subprocess under its own python (CPU, fp32; this file in --worker mode), ours in
another; nothing is asserted. Sizes:

- ``tiny``: the published structure, narrow (encoder 6 levels of 32, ViT 2 blocks of 2 heads),
  random weights under a fixed seed, built from core's own classes (``MiniMaxH3VideoVAE`` with a small
  ``ViT3DDecoder``; core's loader only builds the published size). Every frame-count edge case and the
  tiles: rows ``stitch`` against the core given (783545f6: each tile blended with its raw neighbours),
  rows ``blend`` against core with the tiled decode of PR #16436 (core 0.38.1: each tile blended into
  what is already there), grafted onto the same class from ``--newer-tiled-decode`` (a file with that
  version's ``_decode_tile_row`` and ``tiled_decode``, read from Comfy-Org/ComfyUI; not shipped here);
- ``published``: the published config (2.60 G parameters) with random weights stored fp16 as
  ComfyUI's ``minimax_h3_video_vae_fp16.safetensors`` is (its layout, latent statistics included),
  loaded by core's ``comfy.sd.VAE`` (its detection, dtype choice: fp32 on CPU, VAE Decode / Encode's
  calls) and by ``vae.load``; each side holds ~9.7 GiB (on a shared machine, run it alone);
- ``int8``: that file quantized by core's own code (comfy_kitchen's int8 + Hadamard rotation, the
  format of ``minimax_h3_video_vae_int8_convrot.safetensors``), both sides running it
  as core does (activations quantized per row, int8 matmuls);
- ``tiny_int8``: the tiny model stored fp16 and quantized the same way (rotation group 64: its
  widths are 128), core's classes built with core's ``mixed_precision_ops`` as its loader does.

Core's attention: on a CPU core picks its sub-quadratic attention (``attention_sub_quad``), on NVIDIA
GPUs PyTorch's ``scaled_dot_product_attention`` (``attention_pytorch``, what ours runs everywhere).
``--core-attention pytorch`` runs core with ``--use-pytorch-cross-attention`` (the GPU choice) on
the CPU; the header names the function core's decoder called. The two attentions differ by fp32
rounding (~1e-7), which int8 files' per-row activation rounding turns into larger differences.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core

ROOT = Path(__file__).resolve().parents[2]
SEED = 0
FP16, INT8 = "minimax_h3_video_vae_fp16.safetensors", "minimax_h3_video_vae_int8_convrot.safetensors"   # as ComfyUI names them
TINY_FP16, TINY_INT8 = "tiny_fp16.safetensors", "tiny_int8.safetensors"
TINY = dict(enc_widths=(32,) * 6, enc_blocks=1, enc_down=(True,) * 4 + (False,) * 2, dec_dim=128, dec_depth=2,
            dec_ff=512, registers=4, patch=16)
PUBLISHED = dict(enc_widths=(128, 256, 256, 512, 512, 1024), enc_blocks=2, enc_down=(True,) * 4 + (False,) * 2,
                 dec_dim=2048, dec_depth=36, dec_ff=8192, registers=4, patch=16)
# (op, shape, variant): decode shapes are latents [t, h, w] (24 channels), encode shapes clips [T, H, W]
CASES = {
    "tiny": [("decode", (t, 5, 6), "stitch") for t in (1, 2, 3, 6, 7, 12)]
    + [("decode", (7, 29, 20), "stitch"), ("decode", (7, 29, 20), "blend"),
       ("decode", (12, 18, 17), "stitch"), ("decode", (12, 18, 17), "blend")]
    + [("encode", (n, 48, 64), "") for n in (1, 2, 5, 17, 18, 22, 40)]
    + [("encode", (1, 464, 320), ""), ("encode", (5, 288, 272), "")],
    # one tile per frame: both compositions are the same (the tiles are compared in the tiny rows)
    "published": [("decode", (1, 8, 8), "stitch"), ("decode", (7, 4, 4), "stitch"), ("decode", (12, 3, 3), "stitch"),
                  ("encode", (1, 64, 64), ""), ("encode", (22, 48, 48), "")],
    "int8": [("decode", (7, 4, 4), "stitch"), ("decode", (1, 8, 8), "stitch")],
    "tiny_int8": [("decode", (t, h, w), "stitch") for t, h, w in ((7, 4, 4), (1, 5, 6), (7, 18, 17), (12, 5, 6))],
}



def newer_tiled_decode(mm, path: str) -> None:
    """Put core 0.38.1's tiled decode (PR #16436: ``_decode_tile_row`` and ``tiled_decode``, a file the
    user gives, imported as a module) on 783545f6's MiniMax H3 class, the reference for our default."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("minimax_newer_tiled_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mm.MiniMaxH3VideoVAE._decode_tile_row = module._decode_tile_row
    mm.MiniMaxH3VideoVAE.tiled_decode = module.tiled_decode

def random_weights(fields: dict, dtype=torch.float32) -> dict:
    """Canonical (ComfyUI-layout) weights of the config ``fields``: per tensor a generator seeded by
    its name; scales chosen so activations stay O(1) and decoded pixels mostly inside 0..1. Plus
    ``decoder.mask_token`` (zeros), as MiniMax's and ComfyUI's files have it."""
    sys.path.insert(0, str(ROOT))
    from vae.archs import minimax, minimax_layout
    cfg = minimax.MiniMaxConfig(**fields)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in minimax.MiniMaxH3VAE(cfg).state_dict().items()}
    out = {}
    for name, shape in shapes.items():
        g = torch.Generator().manual_seed(SEED + zlib.crc32(name.encode()))
        r = torch.randn(shape, generator=g)
        if name == "latents_mean":
            r = torch.tensor(minimax_layout.LATENTS_MEAN)
        elif name == "latents_std":
            r = torch.tensor(minimax_layout.LATENTS_STD)
        elif name.endswith(("scale1", "scale2")):
            r *= 0.1
        elif name.endswith("register_tokens"):
            pass
        elif "norm" in name:
            r = 1 + 0.1 * r if name.endswith("weight") else 0.1 * r
        elif name.endswith("bias"):
            r *= 0.02
        else:
            r /= (r[0].numel() ** 0.5) * (2 if "proj_out" in name else 1)
        out[name] = r.to(dtype).contiguous()
        del r
    out["decoder.mask_token"] = torch.zeros(1, 1, fields["dec_dim"], dtype=dtype)
    return out


# ---- workers ---------------------------------------------------------------------------------------

def _core_model(a, weights: dict):
    """Core's model: the published one through comfy.sd.VAE, the tiny one from core's classes."""
    comfy_core.start(a.comfyui, pytorch_attention=a.core_attention == "pytorch")
    import comfy.ldm.minimax.vae as mm
    import comfy.ops
    import comfy.utils
    if a.newer_tiled_decode:                    # PR #16436's tiled decode on the same class
        newer_tiled_decode(mm, a.newer_tiled_decode)
    attention = mm.optimized_attention.__name__
    if not a.size.startswith("tiny"):
        v = comfy_core.vae(a.comfyui, weights)
        v.throw_exception_if_invalid()
        decode = lambda z: v.decode(z).movedim(-1, 1)
        encode = lambda x: v.encode(x[0].movedim(0, -1))            # an IMAGE batch [T, H, W, 3] is one clip
        return decode, encode, f"{type(v.first_stage_model).__name__}, {attention}"
    ops = {}
    quant = comfy.utils.detect_layer_quantization(weights, "")
    if quant is not None:                       # as core's loader builds an int8 file's model
        ops = dict(operations=comfy.ops.mixed_precision_ops(quant, torch.float16))
    m = mm.MiniMaxH3VideoVAE(ch=32, ch_mult=(1,) * 6, num_res_blocks=1, **ops)
    m.decoder = mm.ViT3DDecoder(num_layers=2, heads=2, dim_head=64, **ops)
    missing, unexpected = m.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"core tiny model: missing {missing}, unexpected {unexpected}")
    m.eval()
    return (lambda z: m.decode(z)), (lambda x: m.encode(x * 2 - 1)), f"MiniMaxH3VideoVAE ({a.size}), {attention}"


def worker(a) -> None:
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(a.threads)
    d = Path(a.worker)
    inputs = load_file(d / "inputs.safetensors")
    out, info = {}, {}
    if a.side == "core":
        decode, encode, info["model"] = _core_model(a, load_file(d / a.weights))
        run = lambda k, x: decode(x) if k.startswith("decode") else encode(x)
    else:
        sys.path.insert(0, str(ROOT))
        import vae
        # loaded in the file's dtype, then cast (one copy of the weights at a time; the same handle)
        v = vae.load(d / a.weights, dtype=torch.float16 if a.size != "tiny" else None).to(dtype=torch.float32)
        info["model"] = v.name
        run = lambda k, x: (v.decode(x, tiling=k.split(":")[1]) if k.startswith("decode") else v.encode(x))
    # core under no_grad: under inference_mode (as ComfyUI runs nodes) core 783545f6's model patcher fails
    # on the int8 file on CPU ("Cannot set version_counter for inference tensor", ops._quantized_apply)
    with torch.no_grad() if a.side == "core" else torch.inference_mode():
        for k, x in inputs.items():
            if a.side == "core" and k.endswith(":blend") != bool(a.newer_tiled_decode) and k.startswith("decode"):
                continue                         # each core run computes its own composition's rows
            out[k] = run(k, x).float().contiguous()
    save_file(out, d / f"{a.side}{'_newer' if a.newer_tiled_decode else ''}.safetensors")
    (d / f"{a.side}.json").write_text(json.dumps(info))


def _quantize(a) -> None:
    """The int8 file, by core's own quantizer (comfy_kitchen: rotate each 256-column group by the
    normalised Hadamard matrix, then per-row int8), for the blocks' Linears as ComfyUI's file has them;
    the tiny model's (``--size tiny_int8``: 128 wide) in groups of 64."""
    comfy_core.start(a.comfyui)
    import comfy.quant_ops
    from safetensors.torch import load_file, save_file
    d = Path(a.worker)
    tiny = a.size.startswith("tiny")
    group = 64 if tiny else 256
    sd = load_file(d / (TINY_FP16 if tiny else FP16))
    conf = torch.tensor(list(json.dumps({"format": "int8_tensorwise", "convrot": True,
                                         "convrot_groupsize": group}).encode()), dtype=torch.uint8)
    for k in [k for k in sd if k.startswith("decoder.transformer_blocks.") and k.endswith(".weight")
              and any(p in k for p in (".to_qkv.", ".to_out.", ".ff.w1.", ".ff.w2."))]:
        q, params = comfy.quant_ops.TensorWiseINT8Layout.quantize(sd[k].float(), is_weight=True, per_channel=True,
                                                                  convrot=True, convrot_groupsize=group)
        sd[k], sd[k[:-len("weight")] + "weight_scale"] = q.contiguous(), params.scale.contiguous()
        sd[k[:-len("weight")] + "comfy_quant"] = conf.clone()
    save_file(sd, d / (TINY_INT8 if tiny else INT8))


# ---- driver ----------------------------------------------------------------------------------------

def _inputs(size: str) -> dict:
    g = torch.Generator().manual_seed(SEED)
    inputs = {}
    for i, (op, shape, variant) in enumerate(CASES[size]):
        key = f"{op}{i}:{variant}"
        inputs[key] = (torch.randn((1, 24) + shape, generator=g) if op == "decode"
                       else torch.rand((1, 3) + shape, generator=g))
    return inputs


def _run(a, d: Path, side: str, weights: str, newer: bool = False) -> None:
    py = a.python if side == "core" else sys.executable
    cmd = [py, str(Path(__file__).resolve()), "--worker", str(d), "--side", side, "--weights", weights,
           "--size", a.size, "--comfyui", a.comfyui, "--threads", str(a.threads), "--core-attention", a.core_attention]
    if newer:
        cmd += ["--newer-tiled-decode", str(Path(a.newer_tiled_decode).resolve())]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{side} worker failed:\n{proc.stderr[-3000:]}")


def compare(a, size: str) -> None:
    from safetensors.torch import load_file, save_file
    a.size = size
    with tempfile.TemporaryDirectory(prefix=f"cmp_minimax_{size}_", dir=a.tmp) as tmp:
        d = Path(tmp)
        fields = TINY if size.startswith("tiny") else PUBLISHED
        weights = {"tiny": "tiny.safetensors", "tiny_int8": TINY_FP16}.get(size, FP16)
        save_file(random_weights(fields, torch.float32 if size == "tiny" else torch.float16), d / weights)
        if size.endswith("int8"):
            proc = subprocess.run([a.python, str(Path(__file__).resolve()), "--worker", str(d), "--quantize",
                                   "--size", size, "--comfyui", a.comfyui], capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"quantizing failed:\n{proc.stderr[-3000:]}")
            weights = TINY_INT8 if size == "tiny_int8" else INT8
        inputs = _inputs(size)
        save_file(inputs, d / "inputs.safetensors")
        _run(a, d, "ours", weights)
        ours = load_file(d / "ours.safetensors")
        cores = {}
        if any(k.endswith(":stitch") for k in inputs) or any(k.startswith("encode") for k in inputs):
            _run(a, d, "core", weights)
            cores.update(load_file(d / "core.safetensors"))
        if any(k.endswith(":blend") for k in inputs):
            if a.newer_tiled_decode:
                _run(a, d, "core", weights, newer=True)
                cores.update({k: v for k, v in load_file(d / "core_newer.safetensors").items() if k.endswith(":blend")})
            elif size == "tiny":
                print("# blend rows need --newer-tiled-decode (core 0.38.1's tiled decode)")
        info = {s: json.loads((d / f"{s}.json").read_text())["model"] for s in ("ours", "core") if (d / f"{s}.json").exists()}
        print(f"\n## {size}: ours {info.get('ours')} / core {info.get('core')} (fp32 compute, {a.threads} threads)")
        print(f"{'case':<28} {'shape (ours / core)':<40} {'max abs':>10} {'mean abs':>10} {'range (ours)':>16} "
              f"{'clamped':>8}")
        for k in inputs:
            op, variant = k.split(":")
            kind, i = op.rstrip("0123456789"), int(op[len(op.rstrip("0123456789")):])
            name = f"{kind} {'x'.join(map(str, CASES[size][i][1]))} {variant}"
            if k not in cores:
                continue
            o, c = ours[k], cores[k]
            if o.shape != c.shape:
                print(f"{name:<28} {str(tuple(o.shape)) + ' / ' + str(tuple(c.shape)):<40} SHAPE DIFFERS")
                continue
            diff = (o - c).abs()
            # decoded pixels at exactly 0 or 1: a saturated random decoder would hide differences
            clamped = f"{100 * ((o <= 0) | (o >= 1)).float().mean().item():.1f}%" if kind == "decode" else "-"
            print(f"{name:<28} {str(tuple(o.shape)):<40} {diff.max().item():>10.2e} {diff.mean().item():>10.2e} "
                  f"{o.min().item():>7.3f}..{o.max().item():<7.3f} {clamped:>8}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True, help="ComfyUI source directory (the one with comfy/)")
    p.add_argument("--python", help="ComfyUI's python (its venv); required but in worker mode")
    p.add_argument("--sizes", default="tiny", help="comma list of tiny, published, int8, tiny_int8")
    p.add_argument("--core-attention", choices=("cpu", "pytorch"), default="cpu",
                   help="core's attention: its CPU choice (sub-quadratic) or --use-pytorch-cross-attention "
                        "(PyTorch SDPA, its choice on NVIDIA GPUs and ours)")
    p.add_argument("--newer-tiled-decode", help="a file with core 0.38.1's _decode_tile_row and tiled_decode "
                                                "(for the blend rows)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tmp", help="folder for the weight files (the published one is 4.9 GB)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    p.add_argument("--size", default="tiny", help=argparse.SUPPRESS)
    p.add_argument("--quantize", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return _quantize(a) if a.quantize else worker(a)
    if not a.python:
        p.error("--python (ComfyUI's python) is required")
    a.comfyui = str(Path(a.comfyui).resolve())
    for size in a.sizes.split(","):
        compare(a, size)


if __name__ == "__main__":
    main()
