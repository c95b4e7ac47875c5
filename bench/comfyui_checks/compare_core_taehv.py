"""The TAEHV family through VAEKit beside ComfyUI core's own (`comfy.sd.VAE` -> `comfy/taesd/taehv.py`) on
the same files, and beside the original taehv.py (madebyollin/taehv) when a copy is given: decode and
encode of one frame and of a clip per published variant, our streamed and exact-tiled decodes, and
where the references differ from each other (core's dtype rule, core's lighttaehy1_5 scale, core's
taeltx_2 ratios).

    python bench/comfyui_checks/compare_core_taehv.py --comfyui PATH/TO/ComfyUI --python PATH/TO/venv/bin/python
    python bench/comfyui_checks/compare_core_taehv.py ... --reference PATH/TO/taehv.py --json rows.json

Weights: no published file is available offline, so each variant's weights are random (randn /
sqrt(fan-in); the decoder's head x 0.4 and centred in the pixel range, so frames are mostly not
clamped; fixed seed) at its published config (encoder 64 wide, decoder 256/128/64/64, the published
time strides and patch), rounded to fp16 as madebyollin publishes them, and written under the
published file names: ``taehv.safetensors`` in fp16 (core calls an fp16 16-channel file taehv), the
others in fp32 (core's other 16-channel choice, lighttaew2_1, is "not fp16"). Core loads each file
with ``comfy.sd.VAE(sd=...)`` as its VAE Loader does (its branch picked by core's own rules), in a
subprocess under ``--python`` (CPU, fp32 compute); ours with ``vae.load`` (the latent space from the
file name). The original loads the same weights as ``NAME.pth`` through its own
``TAEHV(checkpoint_path)`` (taew2_1 and taehv1_5 under the weights of lighttaew2_1 and lighttaehy1_5).
Nothing is asserted here (tests/vae/test_taehv.py asserts the parity rows with ``--json``).

Rows (max / mean abs difference; pixels 0..1 for decode, LATENTs for encode). ``parity`` rows compare
the same computation; the others show where the references differ:
- decode: core's IMAGE is the network's output unclamped for every branch but lighttaehy1_5 and taeh3
  (identity ``process_output``); the original clamps to 0..1, and so do we. Compared clamped; the note
  says how much of core's output lies outside 0..1 (random weights saturate often).
- ``lighttaehy1_5``: core multiplies the LATENT by 1.03682 (its HunyuanVideo 1.5 latent format) before the
  network and divides after; LightX2V, which made the file, feeds the raw latent (``LightTaeHy15.decode``:
  ``latents / 1.03682`` of the sampler's scaled latent). We follow LightX2V; the parity row gives ours
  ``z * 1.03682`` so both networks see the same input, the ``as given`` row the same LATENT.
- ``taehv dtype``: the taehv weights stored in fp32: core takes them for lighttaew2_1 (no 0.476986 scale).
- ``taeltx_2 core tiled``: core's VAE Decode (Tiled) with its ratios for 128-channel TAEHVs (16x / 4x;
  the network is 32x / 8x).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core

ROOT = Path(__file__).resolve().parents[2]
SEED = 0
HY15 = 1.03682
# file name -> (latent channels, patch, encoder TPool strides, decoder TGrow strides, latent frames, frames)
VARIANTS = {
    "taehv": (16, 1, (2, 2, 1), (1, 2, 2), 5, 9),
    "lighttaew2_1": (16, 1, (2, 2, 1), (1, 2, 2), 5, 9),
    "lighttaew2_2": (48, 2, (2, 2, 1), (1, 2, 2), 5, 9),
    "lighttaehy1_5": (32, 2, (2, 2, 1), (1, 2, 2), 5, 9),
    "taeltx_2": (128, 4, (2, 2, 2), (2, 2, 2), 3, 17),
    "taeh3": (24, 2, (2, 2, 1), (1, 2, 2), 12, 18),
}
# the original's file name -> the weights it is given (the same tensors under its own name)
ORIGINAL = {"taehv": "taehv", "taew2_1": "lighttaew2_1", "taehv1_5": "lighttaehy1_5", "taew2_2": "lighttaew2_2",
            "taeltx_2": "taeltx_2", "taeh3": "taeh3"}
PIXELS = 64                          # output side of every case (latent side = 64 / spatial ratio)


def published_weights(name: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from vae.archs import taehv
    latent, patch, enc_t, dec_t, _, _ = VARIANTS[name]
    space = taehv.LATENT_SPACES[name]
    cfg = taehv.TAEHVConfig(latent, patch=patch, encoder_time=enc_t, decoder_time=dec_t, act=space.act)
    model = taehv.TAEHV(cfg)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p[0].numel() if p.dim() > 1 else 10) ** 0.5)
        model.decoder[-1].weight.mul_(0.4)            # frames mostly inside the pixel range, not clamped
        model.decoder[-1].bias.add_(sum(model.config.value_range) / 2)
    return {k: v.half().contiguous() for k, v in model.state_dict().items()}


def worker(a) -> None:
    """Core's side: each file (its tensors under ``STEM/`` in the weights) through comfy.sd.VAE: decode,
    encode, and taeltx_2's tiled decode."""
    torch.set_num_threads(a.threads)
    weights, inputs = comfy_core.worker_files(a.worker)
    comfy_core.start(a.comfyui)
    import comfy.sd
    out, info = {}, {}
    with torch.inference_mode():
        for stem in sorted({k.split("/", 1)[0] for k in weights}):
            v = comfy.sd.VAE(sd={k.split("/", 1)[1]: t for k, t in weights.items() if k.startswith(stem + "/")})
            m = v.first_stage_model
            info[stem] = dict(model=type(m).__name__, latent_format=type(m.latent_format).__name__
                              if m.latent_format else None, act=type(m.decoder[2]).__name__,
                              upscale=[v.upscale_ratio[1], v.upscale_ratio[0](5)])
            name = stem.removesuffix("_fp32")
            out[f"{stem}/decode_t1"] = v.decode(inputs[f"{name}/z1"]).movedim(-1, 1)
            out[f"{stem}/decode"] = v.decode(inputs[f"{name}/z"]).movedim(-1, 1)
            if stem != name:
                continue
            for k in ("x1", "x"):
                out[f"{stem}/encode_{k}"] = v.encode(inputs[f"{name}/{k}"][0].movedim(0, -1))
            if name == "taeltx_2":
                try:
                    y = v.decode_tiled(inputs[f"{name}/z"], tile_x=1, tile_y=1, overlap=0, tile_t=2, overlap_t=1)
                    out[f"{stem}/decode_tiled"] = y.movedim(-1, 1)
                except Exception as e:        # noqa: BLE001 - reported as a row
                    info[stem]["tiled_error"] = f"{type(e).__name__}: {e}"[:200]
    comfy_core.save_worker(a.worker, {k: x.float() for k, x in out.items()}, info)


def _reference(path: str):
    spec = importlib.util.spec_from_file_location("_taehv_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    comfy_core.comparison_flags(p)
    p.add_argument("--reference", help="a copy of madebyollin/taehv taehv.py: its rows too")
    p.add_argument("--json", help="write the rows here")
    a = comfy_core.parse_comparison(p, worker)
    if a is None:
        return
    from safetensors.torch import save_file
    sys.path.insert(0, str(ROOT))
    import vae
    table = comfy_core.ParityTable()
    with tempfile.TemporaryDirectory(prefix="cmp_taehv_") as tmp:
        d = Path(tmp)
        g = torch.Generator().manual_seed(SEED)
        inputs, weights = {}, {}
        for name, (latent, patch, _, _, t, frames) in VARIANTS.items():
            sd = published_weights(name)
            files = {name: sd if name == "taehv" else {k: v.float() for k, v in sd.items()}}
            if name == "taehv":          # the same weights in fp32: core's other 16-channel model
                files["taehv_fp32"] = {k: v.float() for k, v in sd.items()}
            for stem, tensors in files.items():
                save_file(tensors, d / f"{stem}.safetensors")
                weights.update({f"{stem}/{k}": v for k, v in tensors.items()})
            h = PIXELS // (8 * patch)
            inputs[f"{name}/z1"] = torch.randn(1, latent, 1, h, h, generator=g)
            inputs[f"{name}/z"] = torch.randn(1, latent, t, h, h, generator=g)
            inputs[f"{name}/x1"] = torch.rand(1, 3, 1, PIXELS, PIXELS, generator=g)
            inputs[f"{name}/x"] = torch.rand(1, 3, frames, PIXELS, PIXELS, generator=g)
        core, info = comfy_core.run_worker(str(Path(__file__).resolve()), a.comfyui, a.python, a.threads, weights,
                                           inputs, prefix="cmp_taehv_")
        print(f"TAEHV family, published configs, random weights (seed {SEED}, fp16 values), fp32 compute, CPU, "
              f"{a.threads} threads, {PIXELS}x{PIXELS} px")
        for stem, i in info.items():
            print(f"  core {stem}: {i['model']}, latent format {i['latent_format']}, activation {i['act']}, "
                  f"ratios {i['upscale'][0]}x, 5 latent frames -> {i['upscale'][1]} frames")
        print(f"{'case':<40} {'out (T, H, W)':<16} {'max':>9} {'mean':>9}")
        with torch.inference_mode():
            for name, (latent, patch, _, _, t, frames) in VARIANTS.items():
                v = vae.load(d / f"{name}.safetensors", dtype=torch.float32)
                k = HY15 if name == "lighttaehy1_5" else 1.0      # core's scale that LightX2V does not apply
                for case, z in (("decode_t1", inputs[f"{name}/z1"]), ("decode", inputs[f"{name}/z"])):
                    raw = core[f"{name}/{case}"]
                    ref = raw.clamp(0, 1)           # core leaves most branches' IMAGE unclamped
                    outside = f"{100 * ((raw < 0) | (raw > 1)).float().mean():.0f}% of core's values outside 0..1"
                    label = f"{name} {case.replace('decode', 'decode t=' + str(z.shape[2]))}".replace("_t1", "")
                    given = " (ours given z * 1.03682)" if k != 1 else ""
                    table.add(label, v.decode(z * k), ref, f"vs core VAE Decode clamped{given}; {outside}", True)
                    if k != 1:
                        table.add(f"{label} as given", v.decode(z), ref, "the same LATENT: core's extra scale", False)
                    if case == "decode" and not v.caps.own_tiling:
                        r = v.caps.temporal_ratio
                        table.add(f"{label} streamed", v.decode(z * k, tile_frames=r), ref,
                                  "ours one latent frame at a time vs core", True)
                        table.add(f"{label} exact tiles", v.decode(z * k, tile=PIXELS // 2, mode="exact"), ref,
                                  f"ours exact {PIXELS // 2} px tiles vs core untiled", True)
                for case in ("x1", "x"):
                    x = inputs[f"{name}/{case}"]
                    ref = core[f"{name}/encode_{case}"]
                    table.add(f"{name} encode T={x.shape[2]}", v.encode(x) / k, ref, "vs core VAE Encode", True)
            z = inputs["taehv/z"]
            fp16 = core["taehv/decode"].clamp(0, 1)
            table.add("taehv dtype: core, fp32 copy", core["taehv_fp32/decode"].clamp(0, 1), fp16,
                      "core: the same weights stored fp32 decode as lighttaew2_1", False)
            ours32 = vae.load(d / "taehv_fp32.safetensors").decode(z)
            table.add("taehv dtype: ours, fp32 copy", ours32, fp16, "ours: the name decides, not the dtype", True)
            if "taeltx_2/decode_tiled" in core:
                table.add("taeltx_2 core tiled", core["taeltx_2/decode_tiled"].clamp(0, 1),
                          core["taeltx_2/decode"].clamp(0, 1), "core VAE Decode (Tiled) vs core untiled", False)
            else:
                print(f"{'taeltx_2 core tiled':<40} core VAE Decode (Tiled): {info['taeltx_2'].get('tiled_error')}")
            if a.reference:
                original(a.reference, d, inputs, table)
    if a.json:
        Path(a.json).write_text(json.dumps(table.rows, indent=1))


def original(path: str, d: Path, inputs: dict, table: comfy_core.ParityTable) -> None:
    """The original's own loader on the same weights (as NAME.pth), under its own file names."""
    from safetensors.torch import load_file
    import vae
    ref = _reference(path)
    for orig, ours_name in ORIGINAL.items():
        sd = {k: v.float() for k, v in load_file(str(d / f"{ours_name}.safetensors")).items()}
        torch.save(sd, d / f"{orig}.pth")
        tae = ref.TAEHV(checkpoint_path=str(d / f"{orig}.pth")).eval()
        v = vae.load(d / f"{orig}.pth")
        cfg = v.config
        scale = torch.as_tensor(cfg.scale).reshape(1, -1, 1, 1, 1)
        shift = torch.as_tensor(cfg.shift).reshape(1, -1, 1, 1, 1)
        for key in (f"{ours_name}/z1", f"{ours_name}/z"):
            net = inputs[key]
            if orig == "taeh3" and net.shape[2] == 1:
                continue                   # one latent frame: the original gives 5 frames, core and we 1
            want = tae.decode_video(net.transpose(1, 2), parallel=True, show_progress_bar=False).transpose(1, 2)
            table.add(f"original {orig} decode t={net.shape[2]}", v.decode(net / scale + shift), want,
                      "vs the original decode_video", True)
        x = inputs[f"{ours_name}/x"]
        want = tae.encode_video(x.transpose(1, 2), parallel=True, show_progress_bar=False).transpose(1, 2)
        table.add(f"original {orig} encode T={x.shape[2]}", v.encode(x), want / scale + shift,
                  "vs the original encode_video", True)


if __name__ == "__main__":
    main()
