"""HunyuanVideo 1.5 VAE key layouts -> the canonical one, detection, and the config read from the weights.

Layouts users have:
- Tencent's original (``tencent/HunyuanVideo-1.5`` ``vae/diffusion_pytorch_model.safetensors``) = ComfyUI's
  single files (``hunyuanvideo15_vae_fp16.safetensors``): ``{encoder,decoder}.conv_in.conv.weight``,
  ``encoder.down.<i>.block.<j>.{norm1.gamma,conv1.conv.weight,norm2.gamma,conv2.conv.weight}``,
  ``encoder.down.<i>.downsample.conv.conv.weight``, ``{encoder,decoder}.mid.{block_1,attn_1,block_2}``
  (attention ``norm.gamma``, ``q k v proj_out`` as 1x1x1 convs), ``norm_out.gamma``, ``conv_out.conv.weight``;
  the decoder's ``up.<i>`` in the order they run (``up.0`` first, coarsest), ``up.<i>.upsample.conv.conv``.
  No quant convs. A resnet that changes width (none at the published config) has ``nin_shortcut``: a plain
  ``.weight`` in Tencent's code, wrapped ``.conv.weight`` in ComfyUI's.
- diffusers ``AutoencoderKLHunyuanVideo15``: ``down_blocks.<i>.resnets.<j>``, ``downsamplers.0``,
  ``mid_block.{resnets.0,attentions.0,resnets.1}`` (``to_q to_k to_v proj_out``), ``up_blocks.<i>``
  (running order) with ``upsamplers.0``, ``conv_shortcut``; causal convs wrapped (``.conv.``) as above.
- full checkpoints: the VAE under ``vae.`` (vae/loading.py strips it).
Canonical: the LDM names of vae/archs/ldm.py without the ``.conv.`` wrappers, the decoder's ``up.<i>``
indexed fine to coarse (``up.<n-1>`` runs first), as HunyuanVideo 1.0's.

The HunyuanImage 2.1 refiner VAE (``hunyuan_image_refiner_vae_fp16.safetensors``) has the same keys and
shapes, and is the same model: Tencent's ``hyimage/models/vae/refiner_vae.py`` is this network (causal convs,
first-frame rule, attention masked causally over frames), and ComfyUI builds both with one class. Its
"64-channel" latent is two 32-channel latent frames packed into channels by the sampler's latent format, not
a tensor in the file. diffusers' ``AutoencoderKLHunyuanImageRefiner`` (the same keys) agrees on one latent
frame, the refiner's use; on more it never resamples time (every frame takes the first-frame rule) and drops
the attention mask.
"""
from __future__ import annotations

import re
from typing import Callable, Mapping

import torch

from ..errors import LoadError
from ..files.keymap import count_indices, rename
from . import ldm
from .hunyuan_video import _UNWRAP, detect_video_ldm

# diffusers' mid attention names that ldm.from_diffusers does not know (HunyuanVideo 1.0's are GroupNorm / to_out)
_ATTENTION = [(r"\.mid_block\.attentions\.0\.(norm|proj_out)\.", r".mid.attn_1.\1.")]
_PARTS = re.compile(r"^(encoder|decoder)\.(conv_in|down|up|mid|norm_out|conv_out)\.")
_RESNET_GAMMA = re.compile(r"^(encoder|decoder)\.(down|up)\.\d+\.block\.\d+\.norm1\.gamma$")
_UP = re.compile(r"^decoder\.up\.(\d+)\.")


def to_canonical(sd: Mapping[str, torch.Tensor]) -> dict:
    if ldm.is_diffusers(sd.keys()):
        sd = ldm.from_diffusers(rename(sd, _ATTENTION), ndim=5)
    return rename(fine_to_coarse(sd), _UNWRAP)


def fine_to_coarse(sd: Mapping[str, torch.Tensor]) -> dict:
    """Tencent's / ComfyUI's decoder levels (``up.0`` runs first; the finest, last, has no upsampler)
    renumbered as ldm.Decoder stores them (``up.0`` finest). Canonical names pass unchanged."""
    if not any(k.startswith("decoder.up.0.upsample.") for k in sd):
        return dict(sd)
    n = count_indices(sd.keys(), "decoder.up")
    return rename(sd, [(_UP.pattern, lambda m: f"decoder.up.{n - 1 - int(m[1])}.")])


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    """5-D convs in the LDM parts only (no quant convs: HunyuanVideo 1.0 and Wan have them), channel L2
    norms in the resnets (``norm1.gamma``; HunyuanVideo 1.0's GroupNorm has ``norm1.weight``), 3-D
    resampler convs (Wan's are 2-D), in Tencent's, ComfyUI's, diffusers' or our canonical names."""
    return detect_video_ldm(sd, to_canonical, _PARTS, _RESNET_GAMMA, lambda v: v.dim() == 5)


def _resample(sd, key: str, out: int, down: bool, make: Callable, family: str):
    """A level's DC-AE resampler from its conv: out / 4 channels (down) or out * 4 (up) in space only,
    8 also in time."""
    if key not in sd:
        return None
    conv = sd[key].shape[0]
    big, small = (out, conv) if down else (conv, out)
    factor = big // small
    if big % small or factor not in (4, 8):
        raise LoadError(f"{key} has {conv} output channels for a {out}-channel level: not a {family} "
                        "resampler (out/4 or out/8 channels down, out*4 or out*8 up).",
                        fix="the file may be damaged or another model; please report it with the key list.")
    return make(out=out, temporal=factor == 8)


def config(sd: Mapping[str, torch.Tensor], make: Callable, resample: Callable, family: str = "HunyuanVideo 1.5"):
    """Widths, depth, channels and every resampler (which levels, their widths, which are temporal)
    from the canonical weights of a DC-AE style LDM (HunyuanVideo 1.5, HunyuanImage); ``make`` /
    ``resample`` build the config and a level's resampler."""
    keys = sd.keys()
    has_enc, has_dec = "encoder.conv_in.weight" in sd, "decoder.conv_in.weight" in sd
    down = up = ()
    if has_enc:
        n = count_indices(keys, "encoder.down")
        widths = tuple(sd[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] for i in range(n))
        layers = count_indices(keys, "encoder.down.0.block")
        latent = sd["encoder.conv_out.weight"].shape[0] // 2
        nxt = [sd[f"encoder.down.{i + 1}.block.0.conv1.weight"].shape[1] for i in range(n - 1)]
        down = tuple(_resample(sd, f"encoder.down.{i}.downsample.conv.weight", o, True, resample, family)
                     for i, o in enumerate(nxt)) + (None,)
    if has_dec:
        n = count_indices(keys, "decoder.up")
        if not has_enc:
            widths = tuple(sd[f"decoder.up.{i}.block.0.conv2.weight"].shape[0] for i in range(n))
            layers = count_indices(keys, "decoder.up.0.block") - 1
        latent = sd["decoder.conv_in.weight"].shape[1]
        nxt = [sd[f"decoder.up.{i - 1}.block.0.conv1.weight"].shape[1] for i in range(1, n)]
        up = (None,) + tuple(_resample(sd, f"decoder.up.{i}.upsample.conv.weight", o, False, resample, family)
                             for i, o in enumerate(nxt, start=1))
    return make(widths=widths, layers_per_block=layers, latent_channels=latent, down=down, up=up,
                in_channels=sd["encoder.conv_in.weight"].shape[1] if has_enc else 3,
                out_channels=sd["decoder.conv_out.weight"].shape[0] if has_dec else 3)
