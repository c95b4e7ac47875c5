"""Our Wan VAE inside ComfyUI core's own Wan and Qwen-Image nodes, beside core's VAE on the same file.

    python bench/check_core_nodes.py --comfyui PATH/TO/ComfyUI --python PATH/TO/venv/bin/python

Core's nodes call ``vae.encode`` (and read ``latent_channels``, ``spacial_compression_encode``) on
whatever arrives on their VAE socket. This runs those nodes from core's own code, once with core's
``comfy.sd.VAE`` and once with our ``VAEKitVAE``, both from the same Wan-layout file (random weights at
the published configs, a fixed seed), and prints the max abs difference of every tensor they return:
  WanImageToVideo             a start image in a 9-frame 0.5-grey clip -> concat_latent_image (Wan 2.1)
  WanFirstLastFrameToVideo    first and last images -> concat_latent_image (Wan 2.1)
  TextEncodeQwenImageEdit     one image scaled to ~1 MP -> reference_latents (Qwen-Image = Wan 2.1 VAE;
                              a stand-in CLIP, since only the VAE part is compared)
  Wan22ImageToVideoLatent     a start image -> the normalised LATENT and its noise mask (Wan 2.2)
The weights are written by this python (it needs diffusers); the nodes run under ComfyUI's python (this
file in --worker mode). Nothing is asserted; "agree" means max abs < 1e-4.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
WAN22 = dict(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, patch_size=2, in_channels=12,
             out_channels=12, scale_factor_spatial=16)


def _pack():
    """The repository as the package 'vaekit', as ComfyUI imports a custom node folder."""
    spec = importlib.util.spec_from_file_location("vaekit", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vaekit"] = mod
    spec.loader.exec_module(mod)
    return mod


class _Clip:
    """Stands in for the Qwen-Image text encoder: the node's conditioning without a language model."""

    def tokenize(self, prompt, images=()):
        return {"images": images}

    def encode_from_tokens_scheduled(self, tokens):
        return [[torch.zeros(1, 1, 1), {}]]


def worker(a) -> None:
    sys.path.insert(0, a.comfyui)
    from comfy.cli_args import args as comfy_args
    comfy_args.cpu = True                       # before comfy.model_management is imported
    import comfy.sd
    from comfy_extras.nodes_qwen import TextEncodeQwenImageEdit
    from comfy_extras.nodes_wan import Wan22ImageToVideoLatent, WanFirstLastFrameToVideo, WanImageToVideo
    from safetensors.torch import load_file, save_file
    _pack()
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import load
    torch.set_num_threads(a.threads)
    d = Path(a.worker)
    g = torch.Generator().manual_seed(1)
    first, last = torch.rand(1, 48, 80, 3, generator=g), torch.rand(1, 48, 80, 3, generator=g)
    cond = [[torch.zeros(1, 1, 1), {}]]
    out = {}
    for version, cases in (("2.1", ("i2v", "flf", "qwen")), ("2.2", ("i2v22",))):
        path = d / f"wan{version}.safetensors"
        vaes = {"core": comfy.sd.VAE(sd=load_file(str(path))), "ours": VAEKitVAE(load(path))}
        for who, vae in vaes.items():
            with torch.inference_mode():
                if "i2v" in cases:
                    pos, _, _ = WanImageToVideo.execute(cond, cond, vae, 64, 48, 9, 1, start_image=first).result
                    out[f"i2v.{who}"] = pos[0][1]["concat_latent_image"]
                if "flf" in cases:
                    pos, _, _ = WanFirstLastFrameToVideo.execute(cond, cond, vae, 64, 48, 9, 1, start_image=first,
                                                                 end_image=last).result
                    out[f"flf.{who}"] = pos[0][1]["concat_latent_image"]
                if "qwen" in cases:
                    (c,) = TextEncodeQwenImageEdit.execute(_Clip(), "", vae=vae, image=first).result
                    out[f"qwen.{who}"] = c[0][1]["reference_latents"][0]
                if "i2v22" in cases:
                    (lat,) = Wan22ImageToVideoLatent.execute(vae, 64, 64, 9, 1, start_image=first).result
                    out[f"i2v22.{who}"], out[f"i2v22_mask.{who}"] = lat["samples"], lat["noise_mask"]
    save_file({k: v.contiguous().float() for k, v in out.items()}, str(d / "out.safetensors"))


def write_weights(d: Path) -> None:
    import diffusers
    from safetensors.torch import save_file
    sys.path.insert(0, str(ROOT))
    import vae
    from vae.archs.wan_layout import to_original
    for version, kw in (("2.1", {}), ("2.2", WAN22)):
        torch.manual_seed(0)
        sd = diffusers.AutoencoderKLWan(**kw).state_dict()
        canonical = vae.from_state_dict(sd).state_dict()
        save_file({k: v.contiguous() for k, v in to_original(canonical, nested=version == "2.2").items()},
                  str(d / f"wan{version}.safetensors"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True)
    p.add_argument("--python", help="ComfyUI's python (default: this one)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    from safetensors.torch import load_file
    with tempfile.TemporaryDirectory(prefix="core_nodes_") as tmp:
        write_weights(Path(tmp))
        cmd = [a.python or sys.executable, str(Path(__file__).resolve()), "--worker", tmp,
               "--comfyui", str(Path(a.comfyui).resolve()), "--threads", str(a.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"ComfyUI side failed:\n{proc.stderr[-3000:]}")
        out = load_file(str(Path(tmp) / "out.safetensors"))
    print(f"{'core node -> output':<42} {'shape':<22} {'max abs':>9}  verdict")
    for key in sorted(k[:-5] for k in out if k.endswith(".core")):
        core, ours = out[f"{key}.core"], out[f"{key}.ours"]
        same = core.shape == ours.shape
        err = (core - ours).abs().max().item() if same else float("nan")
        print(f"{key:<42} {str(tuple(core.shape)):<22} {err:>9.2e}  "
              + ("agree" if same and err < 1e-4 else f"DIFFER (ours {tuple(ours.shape)})"))
    print(json.dumps({"compared": len(out) // 2}))


if __name__ == "__main__":
    main()
