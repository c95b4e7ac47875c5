"""Train the demo VAE: a small TAESD-architecture autoencoder, from scratch, on CPU.

    python -m vae.demo.train [--budget 600] [--threads 2]

Writes ``vae/demo/vaekit_demo.safetensors`` (the canonical TAESD layout: exactly the keys of
``TinyAutoencoder(make_config()).state_dict()``, including ``vae_scale``/``vae_shift``; a ``vaekit_demo``
entry in the safetensors metadata records the config and the training data) and
``vae/demo/vaekit_sample.png`` (written by ``vae.files.imageio.write_png``, so it reads without Pillow).

Data: images that scikit-image ships in ``skimage.data``, all public domain or CC0. (The
``skimage/data/README.txt`` of scikit-image 0.26 states no licences; each image's licence is in the
docstring of its ``skimage.data`` function, quoted here.)

Trained on:
    coffee   - coffee cup, "CC0 by the photographer (Rachel Michetti)"
    chelsea  - Chelsea the cat, "CC0 by the photographer (Stefan van der Walt)"
    rocket   - DSCOVR launch on Falcon 9, SpaceX photo "released in the public domain"
    hubble_deep_field - NASA Hubble eXtreme Deep Field, "may be freely used in the public domain"
    retina   - fundus photograph (Mikael Haggstrom, Wikimedia), "Creative Commons CC0 1.0"
    camera   - grey camera man, "CC0 by the photographer (Lav Varshney)"        (grey, as R=G=B)
    brick    - brick wall (CC0Textures), "Creative Commons CC0 License"         (grey, as R=G=B)
    grass    - grass (DeviantArt, linolafett), "Creative Commons CC0 License"   (grey, as R=G=B)
    gravel   - gravel (CC0Textures), "Creative Commons CC0 License"             (grey, as R=G=B)

Held out (never seen in training, so the demo's PSNR is measured on an unseen image):
    astronaut - Eileen Collins, NASA, "No known copyright restrictions, released into the public
                domain"; 512x512, it becomes ``vaekit_sample.png``.

Training: batches of 16 random 32x32 crops of the images at full and half size, random flips and
(colour images) random channel order; L1 + MSE loss; Adam at 1e-3 with a short warm-up and a
cosine decay over the time budget; fixed seed. On 2 CPU threads the budget, not the data, limits
quality, so the settings buy steps: small crops trained faster per second than 48-128 px ones, and
2e-3 stalled this ReLU stack. The schedule follows wall time, so runs on different (or busy)
machines take different numbers of steps; pass ``--steps`` to fix the count instead.

scikit-image is needed by this script only, never by the ``vae`` package at runtime."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..archs.tiny import TinyAutoencoder, TinyConfig

HERE = Path(__file__).resolve().parent
WEIGHTS = HERE / "vaekit_demo.safetensors"
SAMPLE = HERE / "vaekit_sample.png"

COLOUR = ("coffee", "chelsea", "rocket", "hubble_deep_field", "retina")
GREY = ("camera", "brick", "grass", "gravel")
HELD_OUT = "astronaut"
LICENCES = {
    "coffee": "CC0 (Rachel Michetti)", "chelsea": "CC0 (Stefan van der Walt)",
    "rocket": "public domain (SpaceX)", "hubble_deep_field": "public domain (NASA)",
    "retina": "CC0 1.0 (Mikael Haggstrom)", "camera": "CC0 (Lav Varshney)", "brick": "CC0 (CC0Textures)",
    "grass": "CC0 (linolafett)", "gravel": "CC0 (CC0Textures)", "astronaut": "public domain (NASA)",
}
MAX_SIDE = 768      # larger images (retina, hubble) are shrunk first: their detail is mostly background


def make_config(latent_channels: int = 8, width: int = 32, outer: int = 32) -> TinyConfig:
    """Real TAESD is 64 wide with 3 blocks per stage; this is narrower and shallower (``outer``:
    the width of the full-resolution stages, where most of the compute is). The spatial ratio stays
    8 (four stages)."""
    return TinyConfig(latent_channels=latent_channels,
                      encoder_stages=((outer, 1), (width, 2), (width, 2), (width, 2)),
                      decoder_stages=((width, 2), (width, 2), (width, 2), (outer, 1)),
                      midblock_gn=False, scale=1.0, shift=0.0)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = F.mse_loss(a.float().clamp(0, 1), b.float().clamp(0, 1)).item()
    return float("inf") if mse == 0 else 10 * math.log10(1.0 / mse)


def _shrink(x: torch.Tensor, factor: float) -> torch.Tensor:
    h, w = x.shape[-2:]
    size = (max(1, round(h * factor)), max(1, round(w * factor)))
    return F.interpolate(x[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0].clamp(0, 1)


def load_images(data) -> tuple[list[tuple[torch.Tensor, bool]], torch.Tensor]:
    """-> ([(image [3, H, W] in 0..1, is_colour)], held-out image [3, 512, 512])."""
    def tensor(a) -> torch.Tensor:
        t = torch.from_numpy(a.copy()).float() / 255.0
        t = t[None].expand(3, -1, -1) if t.dim() == 2 else t[..., :3].permute(2, 0, 1)
        return t.contiguous()

    pool = []
    for name in COLOUR + GREY:
        x = tensor(getattr(data, name)())
        longest = max(x.shape[-2:])
        if longest > MAX_SIDE:
            x = _shrink(x, MAX_SIDE / longest)
        for factor in (1.0, 0.5):
            pool.append((x if factor == 1.0 else _shrink(x, factor), name in COLOUR))
    held = tensor(getattr(data, HELD_OUT)())[:, :512, :512]
    return pool, held


def random_batch(pool, n: int, crop: int, gen: torch.Generator) -> torch.Tensor:
    out = torch.empty(n, 3, crop, crop)
    for i in range(n):
        x, colour = pool[int(torch.randint(len(pool), (1,), generator=gen))]
        h, w = x.shape[-2:]
        c = min(crop, h, w)
        top = int(torch.randint(h - c + 1, (1,), generator=gen))
        left = int(torch.randint(w - c + 1, (1,), generator=gen))
        x = x[:, top: top + c, left: left + c]
        if c < crop:
            x = F.interpolate(x[None], size=(crop, crop), mode="bilinear", align_corners=False)[0]
        r = torch.rand(3, generator=gen)
        if r[0] < 0.5:
            x = x.flip(-1)
        if r[1] < 0.5:
            x = x.flip(-2)
        if colour and r[2] < 0.5:
            x = x[torch.randperm(3, generator=gen)]
        out[i] = x
    return out


def train(cfg: TinyConfig, pool, budget: float, steps: int = 0, batch: int = 16, crop: int = 32,
          lr: float = 1e-3, seed: int = 0, log=print) -> tuple[TinyAutoencoder, int, float]:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TinyAutoencoder(cfg).train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    start, step, progress = time.perf_counter(), 0, 0.0
    while progress < 1.0:
        progress = step / steps if steps else (time.perf_counter() - start) / budget
        # warm-up over the first 3%, then cosine down to 5% of the base rate
        if progress < 0.03:
            scale = max(progress / 0.03, 0.01)
        else:
            scale = 0.05 + 0.475 * (1 + math.cos(math.pi * min(progress, 1.0)))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        x = random_batch(pool, batch, crop, gen)
        y = model.taesd_decoder(model.taesd_encoder(x))
        loss = F.l1_loss(y, x) + F.mse_loss(y, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 50 == 0:
            log(f"step {step:5d}  {time.perf_counter() - start:6.0f} s  loss {loss.item():.4f}  "
                f"lr {opt.param_groups[0]['lr']:.2e}")
        if steps and step >= steps:
            break
    return model.eval(), step, time.perf_counter() - start


@torch.inference_mode()
def reconstruct(model: TinyAutoencoder, x: torch.Tensor) -> torch.Tensor:
    return model.decode(model.encode(x[None]))[0].clamp(0, 1)


def save(model: TinyAutoencoder, path: Path, meta: dict) -> None:
    from safetensors.torch import save_file
    sd = {k: v.detach().float().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(sd, str(path), metadata={"vaekit_demo": json.dumps(meta, sort_keys=True)})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vae.demo.train", description=__doc__.split("\n")[0])
    p.add_argument("--budget", type=float, default=600.0, help="training wall time in seconds (default 600)")
    p.add_argument("--steps", type=int, default=0, help="fixed step count instead of the time budget")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    p.add_argument("--latent-channels", type=int, default=8)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--outer", type=int, default=32, help="width of the full-resolution stages")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--crop", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=WEIGHTS, help="weights file to write")
    p.add_argument("--sample", type=Path, default=SAMPLE, help="where to write the held-out sample image")
    args = p.parse_args(argv)
    try:
        from skimage import data
    except ImportError:
        print("this script needs scikit-image for its training images: pip install scikit-image", file=sys.stderr)
        return 1
    from ..files.imageio import write_png

    torch.set_num_threads(args.threads)
    cfg = make_config(args.latent_channels, args.width, args.outer)
    pool, held = load_images(data)
    if args.sample:
        write_png(args.sample, (held.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy())
    print(f"training {cfg} on {len(pool)} images ({args.budget:.0f} s budget, {args.threads} threads)")
    model, steps, seconds = train(cfg, pool, args.budget, args.steps, args.batch, args.crop, args.lr, args.seed)
    score = psnr(reconstruct(model, held), held)
    meta = {
        "description": "VAEKit demo VAE: TAESD architecture, narrow, trained from scratch by vae/demo/train.py",
        "config": {"latent_channels": cfg.latent_channels, "encoder_stages": cfg.encoder_stages,
                   "decoder_stages": cfg.decoder_stages, "midblock_gn": cfg.midblock_gn,
                   "scale": cfg.scale, "shift": cfg.shift, "spatial_ratio": 8, "pixel_range": [0, 1]},
        "training_images": {n: LICENCES[n] for n in COLOUR + GREY},
        "held_out": {HELD_OUT: LICENCES[HELD_OUT]},
        "training": {"steps": steps, "seconds": round(seconds, 1), "batch": args.batch, "crop": args.crop,
                     "lr": args.lr, "seed": args.seed, "threads": args.threads, "loss": "L1 + MSE"},
        "psnr_held_out_db": round(score, 2),
    }
    save(model, args.out, meta)
    size = args.out.stat().st_size
    print(f"{steps} steps in {seconds:.0f} s; held-out '{HELD_OUT}' PSNR {score:.2f} dB; "
          f"wrote {args.out.name} ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
