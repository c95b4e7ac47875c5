"""LTX-2.5's diffusion VAE beside ComfyUI core (``CausalDiffusionVAE``): parity at the published config, and
memory and time of a clip decode, same weights from the same file, one run.

    python bench/comfyui_checks/compare_core_ltx_diffusion.py --comfyui PATH/TO/ComfyUI --comfy-python PATH/TO/venv/bin/python
    python bench/comfyui_checks/compare_core_ltx_diffusion.py ... --memory --frames 3 --height 256 --width 256 --tile 128

Weights: diffusers' ``LTX2VideoDiffusionDecoderModel()`` (its defaults are the published decoder) and
LTX-2.3's published encoder (``AutoencoderKLLTX2Video``), random under a fixed seed, written once in the
shipped file's layout with the shipped file's ``config`` metadata (the published windows, one step);
ComfyUI reads it with ``comfy.sd.VAE(sd, metadata)``, ours with ``vae.load``. CPU, fp32.

Parity (default): decode one latent frame and a clip, encode one frame and a clip; max / mean abs
difference on 0..1 pixels (decode) and latents (encode). Both draw the decode's noise from a CPU
generator seeded 0 (ComfyUI's VAE Decode; ours ``seed=0``); a row shows how far seed 7 moves our clip
decode. Also neighbourhood attention alone: ours
(vae/nn/neighborhood.py) and the tests' brute-force stand-in for diffusers' attention
(tests/ltx_diffusion_common.py) against ComfyUI's ``comfy_kitchen.na3d`` on the same q/k/v.

``--memory``: one subprocess per run (core's under ComfyUI's python); the peak-RSS mark is reset after
loading (bench/harness/measure.py), so ``working MiB`` is peak RSS during the call minus RSS after load;
``cpu s`` the process CPU time of the call. ``max err`` against ours untiled. Runs: ``ours`` (VAE.decode),
``ours_exact`` (exact tiles of ``--tile`` px), ``ours_fast`` (fast tiles, overlap a quarter),
``core`` (VAE Decode), ``core_tiled`` (VAE Decode (Tiled) at the templates' 512/64 px, 64/16 frames).
Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core
from harness.workers import core_flags, measure_saved, ours_call, results, run, worker_flags

ROOT = Path(__file__).resolve().parents[2]
SEED = 0
ENCODER = dict(latent_channels=128, block_out_channels=(256, 512, 1024, 1024), layers_per_block=(4, 6, 4, 2, 2),
               encoder_causal=True, spatial_compression_ratio=32, temporal_compression_ratio=8,
               encoder_spatial_padding_mode="zeros")
# the shipped file's config (what ComfyUI reads; keys it does not find take its built-in values)
CONFIG = {"vae": {"_class_name": "CausalDiffusionVAE", "model_output_type": "x0",
                  "encoder": {"spatial_padding_mode": "zeros", "latent_log_var": "constant"},
                  "decoder": {"stage_kernels": [[3, 7, 7], [3, 7, 7], [3, 5, 5], [3, 5, 5], [11, 11, 11]],
                              "stage5_kernel": [11, 11, 11], "timestep_scale_multiplier": 1000.0,
                              "default_num_inference_steps": 1}}}
FILE = "ltx-2.5-video-vae.safetensors"
# (op, shape): decode latents [t, h, w], encode clips [T, H, W]
CASES = [("decode", (1, 4, 4)), ("decode", (3, 4, 4)), ("encode", (1, 128, 128)), ("encode", (9, 128, 128))]
NA_CASES = [((1, 3, 7, 9, 4, 64), (3, 7, 7)), ((1, 17, 24, 20, 4, 64), (11, 11, 11)), ((2, 1, 5, 6, 2, 32), (3, 7, 7))]
RUNS = ("ours", "ours_exact", "ours_fast", "core", "core_tiled")


def write_weights(d: Path) -> None:
    import torch
    from safetensors.torch import save_file
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import vae
    from ltx_diffusion_common import reference
    from vae.archs.ltx_diffusion_layout import to_original
    ref = reference(seed=SEED, encoder=ENCODER, decoder={})
    canonical = vae.from_state_dict({k: v.contiguous() for k, v in ref.state_dict().items()}).state_dict()
    del ref
    save_file({k: v.contiguous() for k, v in to_original(canonical).items()}, str(d / FILE),
              metadata={"config": json.dumps(CONFIG)})
    del canonical
    torch.manual_seed(SEED)


def _core(comfyui: str, d: Path):
    comfy_core.start(comfyui)
    import comfy.utils
    sd, meta = comfy.utils.load_torch_file(str(d / FILE), return_metadata=True)
    v = comfy_core.vae(comfyui, sd, metadata=meta)
    v.throw_exception_if_invalid()
    return v


def parity_worker(a) -> None:
    """ComfyUI's side: every case, and comfy_kitchen.na3d on the saved q/k/v."""
    import torch
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(a.threads)
    d = Path(a.tmp)
    v = _core(a.comfyui, d)
    inputs = load_file(d / "inputs.safetensors")
    out = {}
    with torch.inference_mode():
        for k, x in inputs.items():
            if k.startswith("decode"):
                out[k] = v.decode(x).movedim(-1, 1).contiguous()             # [B, T, H, W, 3] -> [B, 3, T, H, W]
            elif k.startswith("encode"):
                out[k] = v.encode(x[0].movedim(0, -1)).contiguous()          # one clip as an IMAGE batch
        import comfy_kitchen
        for i, (_, kernel) in enumerate(NA_CASES):
            q, k_, vv = (inputs[f"na{i}.{n}"] for n in "qkv")
            out[f"na{i}"] = comfy_kitchen.na3d(q, k_, vv, list(kernel), None, 1.0)
    save_file(out, d / "core.safetensors")
    keys = set(v.first_stage_model.state_dict())
    sd = load_file(d / FILE)
    (d / "core.json").write_text(json.dumps({"model": type(v.first_stage_model).__name__,
                                             "missing": sorted(keys - set(sd)),
                                             "unexpected": sorted(set(sd) - keys)}))


def parity(a, d: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file
    import vae
    from ltx_diffusion_common import brute_na
    from vae.nn.neighborhood import neighborhood_attention
    g = torch.Generator().manual_seed(SEED)
    inputs = {}
    for i, (op, shape) in enumerate(CASES):
        inputs[f"{op}{i}"] = torch.randn((1, 128, *shape), generator=g) if op == "decode" \
            else torch.rand((1, 3, *shape), generator=g)
    for i, (shape, _) in enumerate(NA_CASES):
        for n in "qkv":
            inputs[f"na{i}.{n}"] = torch.randn(shape, generator=g)
    save_file(inputs, d / "inputs.safetensors")
    cmd = [a.comfy_python, str(Path(__file__).resolve()), "--worker", "parity", "--tmp", str(d),
           "--comfyui", a.comfyui, "--threads", str(a.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"ComfyUI FAILED: {(proc.stderr or proc.stdout).strip().splitlines()[-3:]}")
    core, info = load_file(d / "core.safetensors"), json.loads((d / "core.json").read_text())
    ours = vae.load(d / FILE)
    unused = [k for k in info["unexpected"] if k.startswith("per_channel_statistics.")]
    print(f"LTX-2.5 diffusion VAE, published config, random weights; core model {info['model']}, "
          f"missing keys {info['missing'] or 'none'}, unexpected {len(info['unexpected']) - len(unused)} "
          f"(+{len(unused)} statistics core never reads); CPU, fp32, {a.threads} threads")
    print(f"{'case':<38} {'shape ours / core':<44} {'max abs':>9} {'mean abs':>9}")
    with torch.inference_mode():
        for i, (op, shape) in enumerate(CASES):
            k = f"{op}{i}"
            y = ours.decode(inputs[k]) if op == "decode" else ours.encode(inputs[k])
            c = core[k]
            err = (y - c).abs() if y.shape == c.shape else None
            what = f"{op} {'latent' if op == 'decode' else 'clip'} {'x'.join(map(str, shape))}"
            print(f"{what:<38} {str(tuple(y.shape)) + ' / ' + str(tuple(c.shape)):<44} "
                  f"{err.max().item() if err is not None else float('nan'):>9.2e} "
                  f"{err.mean().item() if err is not None else float('nan'):>9.2e}", flush=True)
        z = inputs["decode1"]                        # the noise matters: our clip decode at seed 7 vs 0
        err = (ours.decode(z, seed=7) - ours.decode(z)).abs()
        print(f"{'ours seed 7 vs seed 0 (clip)':<38} {str(tuple(z.shape)):<44} {err.max().item():>9.2e} "
              f"{err.mean().item():>9.2e}")
        for i, (shape, kernel) in enumerate(NA_CASES):
            q, k_, v = (inputs[f"na{i}.{n}"] for n in "qkv")
            for name, fn in (("ours", neighborhood_attention), ("tests' brute force", brute_na)):
                err = (fn(q, k_, v, kernel) - core[f"na{i}"]).abs()
                what = f"na3d {name} {kernel}"
                print(f"{what:<38} {str(shape):<44} {err.max().item():>9.2e} {err.mean().item():>9.2e}")


# ---- memory and time ------------------------------------------------------------------------------

def _decoder(a, d: Path):
    """The run's decode: latent -> pixels [B, 3, T, H, W] in 0..1."""
    if a.worker.startswith("core"):
        v = _core(a.comfyui, d)
        if a.worker == "core":
            return v.first_stage_model, lambda z: v.decode(z).movedim(-1, 1)
        import nodes
        node = nodes.VAEDecodeTiled()

        def tiled(z):                 # the templates' settings; IMAGE [B*T, H, W, 3] -> [B, 3, T, H, W]
            (images,) = node.decode(v, {"samples": z}, 512, 64, 64, 16)
            return images.reshape(z.shape[0], -1, *images.shape[-3:]).movedim(-1, 1)
        return v.first_stage_model, tiled
    sys.path.insert(0, str(ROOT))
    import vae
    v = vae.load(d / FILE)
    return v.model, ours_call(v, a.worker, a.tile)


def memory_worker(a) -> None:
    d = Path(a.tmp)
    measure_saved(a.threads, d / "latent.npy", lambda: _decoder(a, d), d / a.worker)


def memory(a, d: Path) -> None:
    import numpy as np
    t, h, w = a.frames, a.height // 32, a.width // 32
    np.save(d / "latent.npy", np.random.default_rng(SEED).standard_normal((1, 128, t, h, w), dtype=np.float32))
    print(f"LTX-2.5 diffusion VAE decode (published config, random weights), latent 1x128x{t}x{h}x{w} -> "
          f"{8 * t - 7} frames {a.height}x{a.width}, CPU, fp32, {a.threads} threads, our tile {a.tile} px")
    print(f"{'run':<12} {'time s':>8} {'cpu s':>8} {'working MiB':>12} {'w/o output':>11} {'max err':>9}")
    ref = None
    flags = ["--tmp", str(d), "--threads", str(a.threads), "--tile", str(a.tile), "--comfyui", a.comfyui or ""]
    start = lambda name: run(__file__, name, flags, d / name, a.comfy_python, tail=2)
    for name, r, out in results(a.runs.split(","), start, lambda name: f"{name:<12} "):
        ref = out if name == "ours" else ref
        err = float(np.abs(out - ref).max()) if ref is not None and out.shape == ref.shape else float("nan")
        print(f"{name:<12} {r['best_s']:>8.1f} {r['cpu_s']:>8.1f} {r['working_set_mib']:>12.0f} "
              f"{r['working_set_mib'] - out.size * 4 / 2 ** 20:>11.0f} {err:>9.2e}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    core_flags(p, "ComfyUI source directory (the one with comfy/)")
    p.add_argument("--memory", action="store_true", help="memory and time of one clip decode instead of parity")
    p.add_argument("--frames", type=int, default=3, help="latent frames (pixel frames 8t - 7)")
    p.add_argument("--height", type=int, default=256)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--tile", type=int, default=128, help="our spatial tile, pixels")
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--threads", type=int, default=2)
    worker_flags(p, tmp=str)
    a = p.parse_args()
    if a.worker == "parity":
        return parity_worker(a)
    if a.worker:
        return memory_worker(a)
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    if not a.comfyui:
        a.runs = ",".join(r for r in a.runs.split(",") if not r.startswith("core"))
    a.comfyui = str(Path(a.comfyui).resolve()) if a.comfyui else None
    a.comfy_python = a.comfy_python or sys.executable
    import torch
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory(prefix="cmp_ltxd_") as tmp:
        d = Path(tmp)
        write_weights(d)
        if a.memory:
            memory(a, d)
        elif a.comfyui:
            parity(a, d)
        else:
            sys.exit("parity needs --comfyui")


if __name__ == "__main__":
    main()
