"""Cosmos-1 video tokenizer key layouts: detection, conversion to the canonical keys (and back to the
original's), and the hyperparameters read back from them.

Layouts users have:
- NVIDIA's original (the state dict of Cosmos-Tokenizer's ``autoencoder.jit``) = ComfyUI's file
  (``cosmos_cv8x8x8_1.0.safetensors``): every conv wrapped (``.conv3d``), most of them factorized into a
  1x3x3 conv in space then a 3x1x1 conv in time (``conv_in.{0,1}``, resnets' ``conv1.{0,1}`` / ``conv2.{0,1}``,
  ``conv_out.{0,1}``), every norm wrapped (``norm1.norm``), LDM names otherwise: ``encoder.down.<i>.block.<j>``
  (``nin_shortcut``), ``encoder.down.<i>.downsample.conv{1,2,3}``, ``decoder.up.<i>`` indexed like the encoder
  (``upsample.conv{1,2,3}``), ``mid.{block_1, attn_1.0 (attention over a frame's pixels), attn_1.1 (causal
  attention over time), block_2}`` with attention ``norm, q, k, v, proj_out`` (1x1x1 convs), ``norm_out``,
  ``quant_conv``, ``post_quant_conv``. The JIT's state dict also holds the wavelet transforms' constants
  (``encoder.patcher3d.{wavelets, _arange, patch_size_buffer}``, ``decoder.unpatcher3d.{wavelets, _arange}``;
  ComfyUI detects the family by ``decoder.unpatcher3d.wavelets``), dropped here. ComfyUI's file adds the
  latent statistics ``latent_mean`` / ``latent_std`` (16 channels x 16 latent frames: NVIDIA's ``mean_std.pt``).
- diffusers ``AutoencoderKLCosmos``: ``down_blocks`` / ``up_blocks`` (counted coarse to fine) ``.resnets``,
  ``conv_s`` / ``conv_t``, ``conv_shortcut``, ``downsamplers.0`` / ``upsamplers.0``, ``mid_block.{resnets,
  attentions, temp_attentions}``, ``to_q / to_k / to_v / to_out.0``; no wrappers, no wavelet constants, and the
  latent statistics in its config, not in the weights.
Canonical: the original's names without the ``.conv3d`` / ``.norm`` wrappers; the frame attention's 1x1 convs
2-D (it runs frame by frame), the time attention's q, k, v fused into one Linear ``attn.qkv`` and its
``proj_out`` a Linear ``attn.out`` (vae/nn/temporal_attention.py), the latent statistics kept.

A file without latent statistics (diffusers', the original's state dict without ``mean_std.pt``) gets the
published CV8x8x8-1.0 ones, diffusers' default config (NVIDIA's ``mean_std.pt``): every Cosmos tokenizer in
the diffusers layout is that one, and it is the one ComfyUI's Cosmos-1 models work with."""
from __future__ import annotations

import re
from typing import Mapping

import torch

from ..errors import LoadError
from ..files.keymap import count_indices, rename

STATISTICS = ("latent_mean", "latent_std")
HAAR = 2 ** -0.5          # the wavelet filter taps the original's JIT carries as a constant

# NVIDIA's CV8x8x8-1.0 latent statistics (mean_std.pt; diffusers' AutoencoderKLCosmos default config):
# one row per latent channel, one column per latent frame (frame 16 on repeats them, as ComfyUI does)
PUBLISHED_MEAN = (
    (0.11362758, -0.0171717, 0.03071163, 0.02046862, 0.01931456, 0.02138567, 0.01999342, 0.02189187,
     0.02011935, 0.01872694, 0.02168613, 0.02207148, 0.01986941, 0.01770413, 0.02067643, 0.02028245),
    (0.19125476, 0.04556972, 0.0595558, 0.05315534, 0.05496629, 0.05356264, 0.04856596, 0.05327453,
     0.05410472, 0.05597149, 0.05524866, 0.05181874, 0.05071663, 0.05204537, 0.0564108, 0.05518042),
    (0.01306714, 0.03341161, 0.03847246, 0.02810185, 0.02790166, 0.02920026, 0.02823597, 0.02631033,
     0.0278531, 0.02880507, 0.02977769, 0.03145441, 0.02888389, 0.03280773, 0.03484927, 0.03049198),
    (-0.00197727, 0.07534957, 0.04963879, 0.05530893, 0.05410828, 0.05252541, 0.05029899, 0.05321025,
     0.05149245, 0.0511921, 0.04643495, 0.04604527, 0.04631618, 0.04404101, 0.04403536, 0.04499495),
    (-0.02994183, -0.04787003, -0.01064558, -0.01779824, -0.01490502, -0.02157517, -0.0204778, -0.02180816,
     -0.01945375, -0.02062863, -0.02192209, -0.02520639, -0.02246656, -0.02427533, -0.02683363, -0.02762006),
    (0.08019473, -0.13005368, -0.07568636, -0.06082374, -0.06036175, -0.05875364, -0.05921887, -0.05869788,
     -0.05273941, -0.052565, -0.05346428, -0.05456541, -0.053657, -0.05656897, -0.05728589, -0.05321847),
    (0.16718403, -0.00390146, 0.0379406, 0.0356561, 0.03554131, 0.03924074, 0.03873615, 0.04187329,
     0.04226924, 0.04378717, 0.04684274, 0.05117614, 0.04547792, 0.05251586, 0.05048339, 0.04950784),
    (0.09564418, 0.0547128, 0.08183969, 0.07978633, 0.08076023, 0.08108605, 0.08011818, 0.07965573,
     0.08187773, 0.08350263, 0.08101469, 0.0786941, 0.0774442, 0.07724521, 0.07830418, 0.07599796),
    (-0.04987567, 0.05923908, -0.01058746, -0.01177603, -0.01116162, -0.01364149, -0.01546014, -0.0117213,
     -0.01780043, -0.01648314, -0.02100247, -0.02104417, -0.02482123, -0.02611689, -0.02561143, -0.02597336),
    (-0.05364667, 0.08211684, 0.04686937, 0.04605641, 0.04304186, 0.0397355, 0.03686767, 0.04087112,
     0.03704741, 0.03706401, 0.03120073, 0.03349091, 0.03319963, 0.03205781, 0.03195127, 0.03180481),
    (0.16427967, -0.11048453, -0.04595276, -0.04982893, -0.05213465, -0.04809378, -0.05080318, -0.04992863,
     -0.04493337, -0.0467619, -0.04884703, -0.04627892, -0.04913311, -0.04955709, -0.04533982, -0.04570218),
    (-0.10612928, -0.05121198, -0.06761009, -0.07251801, -0.07265285, -0.07417855, -0.07202412, -0.07499027,
     -0.07625481, -0.07535747, -0.07638787, -0.07920305, -0.07596069, -0.07959418, -0.08265036, -0.07955471),
    (-0.16888915, 0.0753242, 0.04062594, 0.03375093, 0.03337452, 0.03699376, 0.03651138, 0.03611023,
     0.03555622, 0.03378554, 0.0300498, 0.03395559, 0.02941847, 0.03156432, 0.03431173, 0.03016853),
    (-0.03415358, -0.01699573, -0.04029295, -0.04912157, -0.0498858, -0.04917918, -0.04918056, -0.0525189,
     -0.05325506, -0.05341973, -0.04983329, -0.04883146, -0.04985548, -0.04736718, -0.0462027, -0.04836091),
    (0.02055675, 0.03419799, -0.02907669, -0.04350509, -0.04156144, -0.04234421, -0.04446109, -0.04461774,
     -0.04882839, -0.04822346, -0.04502493, -0.0506244, -0.05146913, -0.04655267, -0.04862994, -0.04841615),
    (0.20312774, -0.07208502, -0.03635615, -0.03556088, -0.04246174, -0.04195838, -0.04293778, -0.04071276,
     -0.04240569, -0.04125213, -0.04395144, -0.03959096, -0.04044993, -0.04015875, -0.04088107, -0.03885176),
)
PUBLISHED_STD = (
    (0.56700271, 0.65488982, 0.65589428, 0.66524369, 0.66619784, 0.6666382, 0.6720838, 0.66955978,
     0.66928875, 0.67108786, 0.67092526, 0.67397463, 0.67894882, 0.67668313, 0.67769569, 0.67479557),
    (0.85245121, 0.8688373, 0.87348086, 0.88459337, 0.89135885, 0.8910504, 0.89714909, 0.89947474,
     0.90201765, 0.90411824, 0.90692616, 0.90847772, 0.90648711, 0.91006982, 0.91033435, 0.90541548),
    (0.84960359, 0.85863352, 0.86895317, 0.88460612, 0.89245003, 0.89451706, 0.89931005, 0.90647358,
     0.90338236, 0.90510076, 0.91008312, 0.90961218, 0.9123717, 0.91313171, 0.91435546, 0.91565102),
    (0.91877103, 0.85155135, 0.857804, 0.86998034, 0.87365264, 0.88161767, 0.88151032, 0.88758916,
     0.89015514, 0.89245576, 0.89276224, 0.89450496, 0.90054202, 0.89994133, 0.90136105, 0.90114892),
    (0.77755755, 0.81456852, 0.81911844, 0.83137071, 0.83820474, 0.83890373, 0.84401101, 0.84425181,
     0.84739357, 0.84798753, 0.85249585, 0.85114998, 0.85160935, 0.85626358, 0.85677862, 0.85641026),
    (0.69903517, 0.71697885, 0.71696913, 0.72583169, 0.72931731, 0.73254126, 0.73586977, 0.73734969,
     0.73664582, 0.74084908, 0.74399322, 0.74471819, 0.74493188, 0.74824578, 0.75024873, 0.75274801),
    (0.8187142, 0.82251883, 0.82616025, 0.83164483, 0.84072375, 0.8396467, 0.84143305, 0.84880769,
     0.8503468, 0.85196948, 0.85211051, 0.85386664, 0.85410017, 0.85439342, 0.85847849, 0.85385275),
    (0.67583984, 0.68259847, 0.69198853, 0.69928843, 0.70194328, 0.70467001, 0.70755547, 0.70917857,
     0.71007699, 0.70963502, 0.71064079, 0.71027333, 0.71291167, 0.71537536, 0.71902508, 0.71604162),
    (0.72450989, 0.71979928, 0.72057378, 0.73035461, 0.73329622, 0.73660028, 0.73891461, 0.74279994,
     0.74105692, 0.74002433, 0.74257588, 0.74416119, 0.74543899, 0.74694443, 0.74747062, 0.74586403),
    (0.90176988, 0.90990674, 0.91106802, 0.92163783, 0.92390233, 0.93056196, 0.93482202, 0.93642414,
     0.93858379, 0.94064975, 0.94078934, 0.94325715, 0.94955301, 0.94814706, 0.95144123, 0.94923073),
    (0.49853548, 0.64968109, 0.6427654, 0.64966393, 0.6487664, 0.65203559, 0.6584242, 0.65351611,
     0.65464371, 0.6574859, 0.65626335, 0.66123748, 0.66121179, 0.66077942, 0.66040152, 0.66474909),
    (0.61986589, 0.69138134, 0.6884557, 0.6955843, 0.69765401, 0.70015347, 0.70529598, 0.70468754,
     0.70399523, 0.70479989, 0.70887572, 0.71126866, 0.7097227, 0.71249932, 0.71231949, 0.71175605),
    (0.35586974, 0.68723857, 0.68973219, 0.69958478, 0.6943453, 0.6995818, 0.70980215, 0.69899458,
     0.70271689, 0.70095056, 0.69912851, 0.70522696, 0.70392174, 0.70916915, 0.70585734, 0.70373541),
    (0.98101336, 0.89024764, 0.89607251, 0.90678179, 0.91308665, 0.91812348, 0.91980827, 0.92480654,
     0.92635667, 0.92887944, 0.93338072, 0.93468094, 0.93619436, 0.93906063, 0.94191772, 0.94471723),
    (0.83202779, 0.84106231, 0.84463632, 0.85829508, 0.86319661, 0.86751342, 0.86914337, 0.87085921,
     0.87286359, 0.87537396, 0.87931138, 0.88054478, 0.8811838, 0.88872558, 0.88942474, 0.88934827),
    (0.44025335, 0.63061613, 0.63110614, 0.63601959, 0.6395812, 0.64104342, 0.65019929, 0.6502797,
     0.64355946, 0.64657205, 0.64847094, 0.64728117, 0.64972943, 0.65162975, 0.65328044, 0.64914775),
)

_CONSTANTS = re.compile(r"^(encoder\.patcher3d|decoder\.unpatcher3d)\.")
_LEVEL_ATTENTION = re.compile(r"^(encoder\.down|decoder\.up)\.\d+\.attn\.")


def _diffusers_rules(keys) -> list:
    n_up = count_indices(keys, "decoder.up_blocks")
    flip = lambda m: f"decoder.up.{n_up - 1 - int(m.group(1))}."               # noqa: E731
    return [
        (r"^encoder\.down_blocks\.(\d+)\.", r"encoder.down.\1."),
        (r"^decoder\.up_blocks\.(\d+)\.", flip),
        (r"\.mid_block\.resnets\.0\.", ".mid.block_1."),
        (r"\.mid_block\.resnets\.1\.", ".mid.block_2."),
        (r"\.mid_block\.attentions\.0\.", ".mid.attn_1.0."),
        (r"\.mid_block\.temp_attentions\.0\.", ".mid.attn_1.1."),
        (r"\.resnets\.(\d+)\.", r".block.\1."),
        (r"\.attentions\.(\d+)\.", r".attn.\1.0."),
        (r"\.temp_attentions\.(\d+)\.", r".attn.\1.1."),
        (r"\.downsamplers\.0\.", ".downsample."),
        (r"\.upsamplers\.0\.", ".upsample."),
        (r"\.to_q\.", ".q."), (r"\.to_k\.", ".k."), (r"\.to_v\.", ".v."), (r"\.to_out\.0\.", ".proj_out."),
        (r"\.conv_s\.", ".0."), (r"\.conv_t\.", ".1."),
        (r"\.conv_shortcut\.", ".nin_shortcut."),
    ]


_UNWRAP = [(r"\.conv3d\.(weight|bias)$", r".\1"),
           (r"\.(norm1|norm2|norm_out|norm)\.norm\.(weight|bias)$", r".\1.\2")]


def _attention_to_canonical(sd: dict) -> dict:
    """The frame attention's 1x1x1 convs as 2-D ones; the time attention's q, k, v as one Linear."""
    for prefix in [k[: -len("q.weight")] for k in sd if k.endswith(".attn_1.0.q.weight")]:
        for part in ("q", "k", "v", "proj_out"):
            w = sd[f"{prefix}{part}.weight"]
            sd[f"{prefix}{part}.weight"] = w.reshape(w.shape[:4]) if w.dim() == 5 else w
    for prefix in [k[: -len("q.weight")] for k in sd if k.endswith(".attn_1.1.q.weight")]:
        w = [sd.pop(f"{prefix}{p}.weight") for p in ("q", "k", "v")]
        sd[f"{prefix}attn.qkv.weight"] = torch.cat([t.reshape(t.shape[:2]) for t in w])
        if f"{prefix}q.bias" in sd:
            sd[f"{prefix}attn.qkv.bias"] = torch.cat([sd.pop(f"{prefix}{p}.bias") for p in ("q", "k", "v")])
        out = sd.pop(f"{prefix}proj_out.weight")
        sd[f"{prefix}attn.out.weight"] = out.reshape(out.shape[:2])
        if f"{prefix}proj_out.bias" in sd:
            sd[f"{prefix}attn.out.bias"] = sd.pop(f"{prefix}proj_out.bias")
    return sd


def to_canonical(sd: Mapping[str, torch.Tensor]) -> dict:
    sd = {k: v for k, v in sd.items() if not _CONSTANTS.match(k)}
    if any(".down_blocks." in k or ".up_blocks." in k or ".mid_block." in k for k in sd):
        sd = rename(sd, _diffusers_rules(list(sd)))
    return _attention_to_canonical(rename(sd, _UNWRAP))


def to_original(sd: Mapping[str, torch.Tensor], patch: int = 4) -> dict:
    """Canonical -> the original's names (ComfyUI's file), with the JIT's wavelet constants."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k in STATISTICS:
            out[k] = v
        elif m := re.match(r"^(.*)\.attn\.(qkv|out)\.(weight|bias)$", k):
            parts = v.chunk(3) if m[2] == "qkv" else (v,)
            for name, t in zip(("q", "k", "v") if m[2] == "qkv" else ("proj_out",), parts):
                out[f"{m[1]}.{name}.conv3d.{m[3]}"] = t.reshape(*t.shape, 1, 1, 1) if t.dim() == 2 else t
        elif m := re.match(r"^(.*\.(?:norm1|norm2|norm_out|norm))\.(weight|bias)$", k):
            out[f"{m[1]}.norm.{m[2]}"] = v
        else:
            out[re.sub(r"\.(weight|bias)$", r".conv3d.\1", k)] = v[..., None] if v.dim() == 4 else v
    wavelets = torch.tensor([HAAR, HAAR])
    if any(k.startswith("encoder.") for k in sd):
        out.update({"encoder.patcher3d.wavelets": wavelets, "encoder.patcher3d._arange": torch.arange(2),
                    "encoder.patcher3d.patch_size_buffer": torch.tensor([patch], dtype=torch.int32)})
    if any(k.startswith("decoder.") for k in sd):
        out.update({"decoder.unpatcher3d.wavelets": wavelets.clone(), "decoder.unpatcher3d._arange": torch.arange(2)})
    return out


def _factorized(a, b) -> bool:
    """A 1x3x3 conv in space followed by a 3x1x1 conv in time (the tokenizer's first layer)."""
    return (a is not None and b is not None and a.dim() == 5 and b.dim() == 5
            and tuple(a.shape[2:]) == (1, 3, 3) and tuple(b.shape[2:]) == (3, 1, 1))


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    """ComfyUI's test (the unpatcher's wavelet constant), or either half's factorized ``conv_in`` in any layout."""
    if "decoder.unpatcher3d.wavelets" in sd or "encoder.patcher3d.wavelets" in sd:
        return True
    return any(_factorized(sd.get(f"{half}.conv_in.{s}.weight"), sd.get(f"{half}.conv_in.{t}.weight"))
               for half in ("encoder", "decoder") for s, t in (("0.conv3d", "1.conv3d"), ("0", "1"), ("conv_s", "conv_t")))


def _patch(channels: int, image_channels: int, where: str) -> int:
    p = round((channels / image_channels) ** (1 / 3))
    if p < 1 or p & (p - 1) or image_channels * p ** 3 != channels:
        raise LoadError(f"the {where} has {channels} channels, not 3 image channels times a power-of-two patch "
                        "cubed (the published tokenizers: 192, a 4x4x4 wavelet patch).",
                        fix="this is not a Cosmos tokenizer file as published; please report it with the key list.")
    return p


def config_fields(sd: Mapping[str, torch.Tensor]) -> dict:
    """Widths, resnets per level, patch, latent channels, resampling levels and the latent statistics from the
    canonical keys. Resampling levels halve (double) space and time together, the first levels of the encoder
    and the decoder's mirror of them (the published 8x8x8 rule: 8 = the 4x wavelet patch x 2)."""
    keys = list(sd.keys())
    if any(_LEVEL_ATTENTION.match(k) for k in keys):
        raise LoadError("this Cosmos tokenizer has attention inside its levels; the published ones have it in the "
                        "mid blocks only, which is what this pack implements.",
                        fix="please report the file (with its key list) so its structure can be added.")
    f: dict = {"has_encoder": "encoder.conv_in.0.weight" in sd, "has_decoder": "decoder.conv_in.0.weight" in sd}
    if not (f["has_encoder"] or f["has_decoder"]):
        raise LoadError("the file has the Cosmos tokenizer's wavelet constants but neither its encoder nor its "
                        "decoder convolutions.", fix="download the VAE file again.")
    resample = []
    if f["has_encoder"]:
        levels = count_indices(keys, "encoder.down")
        f["base"] = sd["encoder.conv_in.0.weight"].shape[0]
        f["widths"] = tuple(sd[f"encoder.down.{i}.block.0.conv1.0.weight"].shape[0] for i in range(levels))
        f["layers_per_block"] = count_indices(keys, "encoder.down.0.block")
        f["latent_channels"] = sd["encoder.conv_out.1.weight"].shape[0]
        f["patch"] = _patch(sd["encoder.conv_in.0.weight"].shape[1], 3, "encoder's first conv")
        down = [i for i in range(levels) if f"encoder.down.{i}.downsample.conv1.weight" in sd]
        resample.append(("encoder", down, list(range(len(down)))))
    if f["has_decoder"]:
        levels = count_indices(keys, "decoder.up")
        f["decoder_widths"] = tuple(sd[f"decoder.up.{i}.block.0.conv2.0.weight"].shape[0] for i in range(levels))
        f["layers_per_block"] = count_indices(keys, "decoder.up.0.block") - 1
        f["latent_channels"] = sd["decoder.conv_in.0.weight"].shape[1]
        f["patch"] = _patch(sd["decoder.conv_out.1.weight"].shape[0], 3, "decoder's last conv")
        up = [i for i in range(levels) if f"decoder.up.{i}.upsample.conv1.weight" in sd]
        resample.append(("decoder", up, list(range(levels - 1 - len(up), levels - 1))))
    for half, found, published in resample:
        if found != published:
            raise LoadError(f"the {half} resamples at levels {found}; a published Cosmos tokenizer resamples its "
                            f"first encoder levels and the decoder's mirror of them ({published}).",
                            fix="this is not a Cosmos tokenizer file as published; please report it with the key list.")
    counts = {len(found) for _, found, _ in resample}
    if len(counts) > 1:
        raise LoadError("the encoder and the decoder resample a different number of times: the halves come from "
                        "different tokenizers.", fix="load the encoder and decoder of one tokenizer.")
    f["resample_levels"] = counts.pop()
    present = [k for k in STATISTICS if k in sd]
    if len(present) == 1:
        missing = next(k for k in STATISTICS if k not in sd)
        raise LoadError(f"the file has {present[0]} but not {missing}: the latent statistics come in pairs.",
                        fix="download the VAE file again.")
    if present:
        n = sd["latent_mean"].numel()
        if n % f["latent_channels"] or sd["latent_std"].numel() != n:
            raise LoadError(f"the latent statistics have {n} values, not a multiple of the {f['latent_channels']} "
                            "latent channels.", fix="download the VAE file again.")
        f["statistics"], f["stat_frames"] = "file", n // f["latent_channels"]
    return f
