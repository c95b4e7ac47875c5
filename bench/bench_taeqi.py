"""taeqi2_1 (Qwen-Image 2.1's tiny autoencoder) benchmark: ours (untiled, exact tiles, fast tiles)
beside the original ``taesd.py`` (madebyollin/taesd, 401ce45e or later: ``F16Encoder``/``F16Decoder``),
same weights from the same files, same input, one run each.

    python bench/bench_taeqi.py --reference PATH/TO/taesd.py                 # 1024x1024, decode + encode
    python bench/bench_taeqi.py --reference PATH/TO/taesd.py --size 2048 --op decode

Weights: the original's ``F16Encoder(64, 4)`` / ``F16Decoder(64, 4)`` (the published config) with
random weights under a fixed seed (scaled by fan-in so activations stay O(1): no saturated image),
written as ``taeqi2_1_encoder.pth`` / ``taeqi2_1_decoder.pth`` in fp16 as madebyollin publishes them;
the original loads them with its own ``TAESD(encoder_path, decoder_path)`` (variant picked from the
name), ours with ``vae.load`` (from the weights). Both compute in fp32.

Conventions: decode takes a raw Qwen-Image 2.1 LATENT (randn * std + mean per channel, ComfyUI's
``latent_formats.QwenImage21`` statistics); the original's decoder is given (z - mean) / std (its
network works in the normalised latent; its output clamped to 0..1), ours the LATENT. Encode: RGB
0..1 with an opaque alpha appended for the original (ours pads it); the original's latent is mapped
back to the raw LATENT (* std + mean). ``max err``: max abs difference against the original (0..1
pixels; latents: relative to the latent's max abs). Memory as bench_decode.py: ``working MiB`` = peak
RSS during the call - RSS after load (the peak mark reset after loading); CPU, one subprocess per run.

ComfyUI core 783545f6 has no taeqi2_1 (its TAESD class has no f16 variant), so there is no core run.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from harness.workers import measure_saved, ours_call, results, run, worker_flags

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("reference", "ours", "ours_exact", "ours_fast")


def _reference(path: str):
    spec = importlib.util.spec_from_file_location("_taesd_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stats():
    import torch
    sys.path.insert(0, str(ROOT))
    from vae.archs.tiny import QWEN21_MEAN, QWEN21_STD
    return torch.tensor(QWEN21_MEAN).view(1, -1, 1, 1), torch.tensor(QWEN21_STD).view(1, -1, 1, 1)


def _runner(args, tmp: Path):
    import torch
    decode = args.op == "decode"
    mean, std = _stats()
    if args.worker == "reference":
        ref = _reference(args.reference)
        tae = ref.TAESD(tmp / "taeqi2_1_encoder.pth", tmp / "taeqi2_1_decoder.pth").float().eval()
        if decode:
            return tae, lambda z: tae.decoder((z - mean) / std).clamp_(0, 1)
        return tae, lambda x: tae.encoder(torch.cat([x, torch.ones_like(x[:, :1])], 1)) * std + mean
    import vae
    v = vae.load(tmp / "taeqi2_1", dtype=torch.float32)
    return v.model, ours_call(v, args.worker, args.tile, encode=not decode)


def worker(args) -> None:
    tmp = Path(args.tmp)
    measure_saved(args.threads, tmp / f"{args.op}_in.npy", lambda: _runner(args, tmp), tmp / f"{args.worker}_{args.op}")


def write_weights(args, tmp: Path) -> None:
    import torch
    ref = _reference(args.reference)
    g = torch.Generator().manual_seed(0)
    for name, net in (("encoder", ref.F16Encoder(64, 4)), ("decoder", ref.F16Decoder(64, 4))):
        with torch.no_grad():
            for p in net.parameters():
                fan_in = p[0].numel() if p.dim() > 1 else 10
                p.copy_(torch.randn(p.shape, generator=g) * (1.2 / fan_in ** 0.5))
        torch.save({k: v.half() for k, v in net.state_dict().items()}, tmp / f"taeqi2_1_{name}.pth")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", default=os.environ.get("TAESD_REFERENCE"),
                   help="a copy of madebyollin/taesd taesd.py with F16Encoder/F16Decoder (or TAESD_REFERENCE)")
    p.add_argument("--size", type=int, default=1024, help="image side, pixels (a multiple of 16)")
    p.add_argument("--op", default="decode,encode", help="decode, encode or both (comma list)")
    p.add_argument("--tile", type=int, default=512, help="our spatial tile, pixels")
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--threads", type=int, default=2)
    worker_flags(p, tmp=str)
    a = p.parse_args()
    if not a.reference or not Path(a.reference).is_file():
        p.error("give --reference PATH/TO/taesd.py (madebyollin/taesd at 401ce45e or later)")
    if a.worker:
        return worker(a)
    import numpy as np
    with tempfile.TemporaryDirectory(prefix="bench_taeqi_") as tmp:
        tmp = Path(tmp)
        write_weights(a, tmp)
        mean, std = (t.numpy() for t in _stats())
        rng = np.random.default_rng(0)
        s = a.size
        z = rng.standard_normal((1, 64, s // 16, s // 16), dtype=np.float32) * std + mean
        np.save(tmp / "decode_in.npy", z.astype(np.float32))
        np.save(tmp / "encode_in.npy", rng.random((1, 3, s, s), dtype=np.float32))
        print(f"taeqi2_1 (published config, random fp16 weights, fp32 compute), {s}x{s} px, {a.threads} threads, "
              f"our tile {a.tile} px")
        print(f"{'op':<7} {'run':<12} {'time s':>8} {'cpu s':>8} {'working MiB':>12} {'w/o output':>11} "
              f"{'max err':>9} {'mean err':>9}")
        for op in a.op.split(","):
            ref = None
            flags = ["--tmp", str(tmp), "--op", op, "--threads", str(a.threads), "--tile", str(a.tile),
                     "--reference", a.reference]
            start = lambda name: run(__file__, name, flags, tmp / f"{name}_{op}", tail=2,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
            for name, r, out in results(a.runs.split(","), start, lambda name: f"{op:<7} {name:<12}  "):
                ref = out if name == "reference" else ref
                scale = 1.0 if op == "decode" or ref is None else float(np.abs(ref).max())
                same = ref is not None and out.shape == ref.shape
                err = float(np.abs(out - ref).max()) / scale if same else float("nan")
                mean_err = float(np.abs(out - ref).mean()) / scale if same else float("nan")
                output_mib = out.size * 4 / 2 ** 20
                print(f"{op:<7} {name:<12} {r['best_s']:>8.2f} {r['cpu_s']:>8.2f} {r['working_set_mib']:>12.0f} "
                      f"{r['working_set_mib'] - output_mib:>11.0f} {err:>9.2e} {mean_err:>9.2e}", flush=True)


if __name__ == "__main__":
    main()
