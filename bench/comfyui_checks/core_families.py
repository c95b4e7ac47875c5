"""The families compare_core.py compares against ComfyUI core: for each, the published config and its random
weights, how core builds it and the inputs; every documented difference between core and ours is its section
of docs/core_differences.md (printed by ``compare_core.py --list``). The builders of the published weights
are also the bench scripts'.

Weights are random under fixed seeds (no published file is available offline), written once in the file
layout core loads; core loads it as its Load VAE does unless the family says otherwise."""
from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import torch

from comfyui_checks.core_dropin import DROP_IN       # a package import: harness/families.py imports this one
from harness import comfy_core, module_at, repo_on_path, save
from harness.comfy_core import CLIP_CLAMPED, FRAMES, IMAGE_CLAMPED, SOCKET, Case, Family, cases, core_vae

ROOT = Path(__file__).resolve().parents[2]
SEED = 0


def jittered(model, seed: int):
    """``model`` with every norm's parameters jittered (a generator seeded ``seed``): no affine is the identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def diffusers_jittered(cls: str, seed: int = SEED, **config):
    """diffusers' model of class ``cls`` (its name) at ``config`` (default: its defaults, the published one),
    random weights seeded with ``seed``, norms jittered (seed + 1)."""
    import diffusers
    torch.manual_seed(seed)
    return jittered(getattr(diffusers, cls)(**config).eval(), seed + 1)


def drawn(shapes: dict, seed: int = SEED) -> dict:
    """Every tensor of ``shapes`` (name -> shape) drawn (core's ops leave parameters uninitialised):
    matrices at unit output variance, biases around 0, norm scales around 1."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if len(shape) > 1:
            out[name] = torch.randn(shape, generator=g) / torch.Size(shape[1:]).numel() ** 0.5
        else:
            out[name] = (1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(shape, generator=g)
    return out


def pack_load(run, path: Path, dtype=torch.float32):
    """Ours as ComfyUI imports the pack (its socket wraps this handle)."""
    repo_on_path()
    from vae.cli.pack import load_pack
    return load_pack().vae.load(path, dtype=dtype)


def exact_row(run, k: str, c: Case, tile: int) -> None:
    """The row of ours with exact ``tile`` px tiles, in the socket's layouts (SOCKET io), against core's
    VAE Decode / VAE Encode."""
    from vaekit.nodes.convert import center_crop_to_multiple
    h, x = run.ours[c.file or next(iter(run.ours))], run.inputs[k]
    y = (comfy_core.socket(h)._out(h.decode(x, tile=tile, mode="exact"), x) if c.op == "decode" else
         h.encode(center_crop_to_multiple(x, h.caps.spatial_ratio).movedim(-1, 1), tile=tile, mode="exact"))
    run.table.add(f"{k} exact {tile} px tiles", y, run.core[k], "vs core", True, c.op)


def tile_rows(run, k: str, op: str, core_tiled, tile: int, overlap: int, core_note: str = "") -> None:
    """The rows of case ``k`` against core untiled (``run.core[k]``): core's VAE Decode / Encode (Tiled)
    ``core_tiled`` and ours fast, both ``tile``/``overlap`` px, and ours exact ``tile`` px tiles (parity)."""
    call, x, untiled, add = getattr(run.ours[next(iter(run.ours))], op), run.inputs[k], run.core[k], run.table.add
    add(f"{k}: core tiled {tile}/{overlap}", core_tiled, untiled,
        f"core VAE {op.capitalize()} (Tiled){core_note} vs core untiled", False)
    add(f"{k}: ours fast {tile}/{overlap}", call(x, tile=tile, overlap=overlap), untiled,
        "ours fast tiles vs core untiled", False)
    add(f"{k}: ours exact {tile}", call(x, tile=tile, mode="exact"), untiled, "ours exact tiles vs core untiled", True)


def _dry(files: dict, decode: tuple, encode: tuple) -> tuple[dict, dict]:
    """``Family.dry``'s answer: the files and one decode and one encode of these shapes."""
    return files, cases({"decode": decode, "encode": encode})


def _outside(raw: torch.Tensor) -> str:
    return f"{100 * ((raw < 0) | (raw > 1)).float().mean():.1f}% of core's values outside 0..1"


# ---- CogVideoX ------------------------------------------------------------------------------------

def _cogvideox_files(run) -> dict:
    run.state["ref"] = ref = diffusers_jittered("AutoencoderKLCogVideoX")
    return {"cogvideox.safetensors": ref.state_dict()}


def _cogvideox_core(w) -> None:
    m = w.v.first_stage_model                     # core's own model in the original's grouping
    for k, x in w.inputs.items():
        w.out[k + " original"] = (((m._decode_batched(x) + 1) / 2).clamp(0, 1) if k.startswith("decode")
                                  else m.encoder(x * 2 - 1)[0].chunk(2, dim=1)[0])


def _cogvideox_case(run, k: str, c: Case) -> None:
    ref, x, t, add = run.state["ref"], run.inputs[k], c.shape[2], run.table.add
    ours = run.core_row(k, c, parity=t == 1 or (c.op == "encode" and t <= 8), note="core's grouping")
    add(f"{k} vs core, original's grouping", ours, run.core[k + " original"], "core's model", True, c.op)
    if c.op == "decode":
        add(f"{k} vs diffusers", ours, ((ref.decode(x).sample + 1) / 2).clamp(0, 1), "", True, c.op)
        return
    old = ref.num_sample_frames_batch_size
    batched = ref.encode(x * 2 - 1).latent_dist.mean
    ref.num_sample_frames_batch_size = t
    one = ref.encode(x * 2 - 1).latent_dist.mean
    ref.num_sample_frames_batch_size = old
    add(f"{k} vs diffusers (8-frame batches)", ours, batched, "", t < 16, c.op)
    add(f"{k} vs diffusers one pass", ours, one, "the original's encode", True, c.op)


COGVIDEOX = Family(
    title="CogVideoX VAE (core: comfy/ldm/cogvideo/vae.py), published config, random weights (seed 0)",
    cases=cases({"decode_t1": (1, 16, 1, 8, 8), "decode_t3": (1, 16, 3, 4, 4), "decode_t4": (1, 16, 4, 4, 4),
                 "decode_t13": (1, 16, 13, 4, 4), "encode_T1": (1, 3, 1, 64, 64), "encode_T5": (1, 3, 5, 32, 32),
                 "encode_T9": (1, 3, 9, 32, 32), "encode_T17": (1, 3, 17, 32, 32), "encode_T49": (1, 3, 49, 32, 32)}),
    quick=("decode_t1", "decode_t3", "encode_T1", "encode_T5", "encode_T9"),
    files=_cogvideox_files, core_extra=_cogvideox_core, case_rows=_cogvideox_case,
    dry=lambda: _dry({"cogvideox.safetensors": diffusers_jittered(
        "AutoencoderKLCogVideoX", block_out_channels=(32,) * 4, layers_per_block=1).state_dict()},
        (1, 16, 3, 4, 4), (1, 3, 5, 32, 32)))


# ---- Cosmos-1 --------------------------------------------------------------------------------------

def cosmos_weights(**config) -> tuple[dict, object]:
    """diffusers' AutoencoderKLCosmos at ``config`` (default: the published CV8x8x8-1.0) in the original's
    layout (core's file: ``.conv3d`` / ``.norm`` wrappers, the wavelet constants, the latent statistics as
    ``latent_mean`` / ``latent_std``), and the diffusers model."""
    repo_on_path()
    from vae.archs import cosmos_layout
    ref = diffusers_jittered("AutoencoderKLCosmos", **config)
    weights = cosmos_layout.to_original(cosmos_layout.to_canonical(ref.state_dict()))
    if ref.config.latents_mean is not None:
        weights.update(latent_mean=torch.tensor(ref.config.latents_mean), latent_std=torch.tensor(ref.config.latents_std))
    return weights, ref


def _cosmos_files(run) -> dict:
    weights, run.state["ref"] = cosmos_weights()
    run.state["stats"] = [weights[k].view(1, 16, -1, 1, 1) for k in ("latent_mean", "latent_std")]
    return {"cosmos_cv8x8x8_1.0.safetensors": weights}


def _cosmos_core(w) -> None:
    m = w.v.first_stage_model                     # core's tokenizer without the statistics
    for k, x in w.inputs.items():
        w.out[k + " raw"] = (m.decoder(m.post_quant_conv(x)) if k.startswith("decode")
                             else m.quant_conv(m.encoder(x * 2 - 1)))


def _cosmos_case(run, k: str, c: Case) -> None:
    ref, x, (mean, std) = run.state["ref"], run.inputs[k], run.state["stats"]
    v = run.ours[c.file or next(iter(run.ours))]
    table = lambda s, n: s[:, :, torch.arange(n) % s.shape[2]]       # frame i takes column i % 16, as core does
    ours = run.core_row(k, c)
    if c.op == "decode":
        z = x * table(std, c.shape[2]) / 0.5 + table(mean, c.shape[2])
        run.table.add(f"{k} vs diffusers", ours, ((ref.decode(z).sample + 1) / 2).clamp(0, 1), "", True, c.op)
        run.table.add(f"{k} vs core model, raw", v.model.decode(x), run.core[k + " raw"], "[-1, 1]", True)
    else:
        z = ref.encode(x * 2 - 1).latent_dist.mode()
        n = z.shape[2]
        run.table.add(f"{k} vs diffusers", ours, (z - table(mean, n)) * 0.5 / table(std, n), "", True, c.op)
        run.table.add(f"{k} vs core model, raw", v.model.encode(x * 2 - 1), run.core[k + " raw"], "raw latents", True)


COSMOS = Family(
    title="Cosmos-1 tokenizer CV8x8x8 (core: comfy/ldm/cosmos/vae.py), published config, random weights (seed 0)",
    cases=cases({"decode_t1": (1, 16, 1, 8, 8), "decode_t3": (1, 16, 3, 4, 6), "decode_t18": (1, 16, 18, 2, 2),
                 "encode_T1": (1, 3, 1, 64, 64), "encode_T9": (1, 3, 9, 32, 48), "encode_T17": (1, 3, 17, 32, 32)}),
    quick=("decode_t1", "decode_t3", "encode_T1", "encode_T9"),
    files=_cosmos_files, core_extra=_cosmos_core, case_rows=_cosmos_case,
    dry=lambda: _dry({"cosmos.safetensors": cosmos_weights(encoder_block_out_channels=(8, 8, 16, 16), num_layers=1,
                                                            decode_block_out_channels=(8, 16, 16, 16))[0]},
                     (1, 16, 2, 2, 2), (1, 3, 9, 16, 16)))


# ---- SeedVR2 ---------------------------------------------------------------------------------------

SEEDVR2 = dict(widths=(128, 256, 512, 512), layers_per_block=2, temporal=(False, True, True))
SEEDVR2_TILES = dict(tile=512, overlap=128, temporal=64, temporal_overlap=8)   # the templates' tiled nodes


def seedvr2_weights(seed: int = SEED, **config) -> dict:
    """Random weights at ``config`` (default: the published one, which core hard-codes), GroupNorm affines
    jittered, in core's layout (the original's names)."""
    repo_on_path()
    from vae.archs import seedvr2, seedvr2_layout
    torch.manual_seed(seed)
    model = jittered(seedvr2.SeedVR2VAE(seedvr2.SeedVR2Config(**{**SEEDVR2, **config})).eval(), seed + 1)
    return {k: v.contiguous() for k, v in seedvr2_layout.to_original(model.state_dict()).items()}


def _seedvr2_core(w) -> None:
    v, t, x = w.v, SEEDVR2_TILES, w.inputs
    image = lambda c: c[0].movedim(0, -1)
    if "tiles_decode" in x:       # VAE Decode (Tiled) 512/128 px: latent units, as the node passes them
        w.out["tiles_decode tiled"] = v.decode_tiled(
            x["tiles_decode"], tile_x=t["tile"] // 8, tile_y=t["tile"] // 8, overlap=t["overlap"] // 8,
            tile_t=t["temporal"] // 4, overlap_t=t["temporal_overlap"] // 4).movedim(-1, 1)
        w.out["tiles_encode tiled"] = v.encode_tiled(image(x["tiles_encode"]), tile_x=t["tile"], tile_y=t["tile"],
                                                     overlap=t["overlap"], tile_t=t["temporal"],
                                                     overlap_t=t["temporal_overlap"])
    m = v.first_stage_model       # the definition (chunks, 0.5 GiB splits) against one pass of the same modules
    for k in ("decode_t5", "encode_T17"):
        call = (lambda: m.decode(x[k])) if k.startswith("decode") else (lambda: m.encode(x[k] * 2 - 1))
        w.out[k + " chunks"] = call()
        m.use_slicing = False
        m.set_memory_limit(None, None)
        w.out[k + " whole"] = call()
        m.use_slicing = True
        m.set_memory_limit(0.5, 0.5)


def _seedvr2_case(run, k: str, c: Case) -> None:
    v, x, t = run.ours[next(iter(run.ours))], run.inputs[k], SEEDVR2_TILES
    if k.startswith("tiles"):
        run.core_row(k, c, label=f"{k}: ours untiled")
        tile_rows(run, k, c.op, run.core[k + " tiled"], t["tile"], t["overlap"])
    elif c.op == "decode":
        run.core_row(k, c)
        run.table.add(f"{k} (ours one pass)", ((v.model.decode(x) + 1) / 2).clamp(0, 1), run.core[k],
                      "vs core VAE Decode", True, c.op)
    else:
        keep = 1 + 4 * ((c.shape[2] - 1) // 4)
        run.core_row(k, c, v.encode(x[:, :, :keep]), "" if keep == c.shape[2] else
                     f"ours: the first {keep} frames (core encodes all; its causal encoder ignores the rest)")


def _seedvr2_rows(run) -> None:
    for k in ("decode_t5", "encode_T17"):
        run.table.add(f"core chunks vs one pass ({k})", run.core[k + " chunks"], run.core[k + " whole"],
                      "core's model: its slicing + 0.5 GiB splits vs neither ([-1, 1] / raw mean)", False)


SEEDVR2_FAMILY = Family(
    title="SeedVR2 VAE (core: comfy/ldm/seedvr/vae.py), published config, random weights (seed 0)",
    cases=cases({"decode_t1": (1, 16, 1, 8, 8), "decode_t5": (1, 16, 5, 8, 8), "encode_T1": (1, 3, 1, 64, 64),
                 "encode_T17": (1, 3, 17, 64, 64), "encode_T11": (1, 3, 11, 64, 64),
                 "tiles_decode": (1, 16, 1, 80, 80), "tiles_encode": (1, 3, 1, 640, 640)}),
    quick=("decode_t1", "decode_t5", "encode_T1", "encode_T17", "encode_T11"),
    files=lambda run: {"seedvr2_ema_vae.safetensors": seedvr2_weights()}, core_extra=_seedvr2_core,
    case_rows=_seedvr2_case, rows=_seedvr2_rows,
    dry=lambda: _dry({"seedvr2.safetensors": seedvr2_weights(widths=(32,) * 4, layers_per_block=1)},
                     (1, 16, 2, 4, 4), (1, 3, 5, 32, 32)))


# ---- Stable Video Diffusion -----------------------------------------------------------------------

SVD = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4,
           down_block_types=("DownEncoderBlock2D",) * 4)
SVD_DECODING_T = 14      # the original's sampling script (scripts/sampling/simple_video_sample.py)
SVD_CORE_FRAMES = 7      # frames core's free-memory estimate lets through in the emulated row
SVD_TILE, SVD_OVERLAP = 128, 32  # pixels (core's tiled node halves a side: 64 px tiles would leave none)


def svd_model(seed: int = SEED, **config):
    """diffusers' AutoencoderKLTemporalDecoder at ``config`` (default: svd_xt's), random weights, GroupNorm
    affines jittered and the mix factors drawn (at 0 the image and temporal halves could be swapped unseen);
    its quant conv set to the identity (the original's first stage has none)."""
    import diffusers
    torch.manual_seed(seed)
    m = diffusers.AutoencoderKLTemporalDecoder(**{**SVD, **config}).eval()
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


def svd_original_layout(diffusers_sd: dict) -> dict:
    """The same weights in the original's (= core's) names, without diffusers' quant conv."""
    repo_on_path()
    from vae.archs import svd_layout
    return {k: v.contiguous() for k, v in svd_layout.to_canonical(diffusers_sd).items() if not k.startswith("quant_conv.")}


def _svd_files(run) -> dict:
    run.state["ref"] = ref = svd_model()
    return {"svd_xt_vae.safetensors": svd_original_layout(ref.state_dict())}


def _svd_original(path: str):
    """The original's encoder and video decoder at svd.yaml's first-stage config, imported from a
    generative-models checkout without its package ``__init__``s (they pull in training-only packages)."""
    import importlib
    import types
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


def _svd_core(w) -> None:
    v, x, out = w.v, w.inputs, w.out
    pixels = lambda images: images.movedim(-1, 1)
    if "decode_T4" in x:
        out["frame0 alone"] = pixels(v.decode(x["decode_T4"][:1]))
        out["5d"] = pixels(v.decode(x["decode_T4"].movedim(0, 1).unsqueeze(0)))       # [1, 4, 4, h, w]
    if "decode_T25" in x:        # core's free-memory rule: SVD_CORE_FRAMES frames a clip
        need = v.memory_used_decode(x["decode_T25"].shape, v.vae_dtype)
        free = v.patcher.get_free_memory
        v.patcher.get_free_memory = lambda device: SVD_CORE_FRAMES * need
        out["split"] = pixels(v.decode(x["decode_T25"]))
        v.patcher.get_free_memory = free
    if "tiles_decode" in x:      # VAE Decode (Tiled): latent units, as the node passes them
        out["tiled"] = pixels(v.decode_tiled(x["tiles_decode"], tile_x=SVD_TILE // 8, tile_y=SVD_TILE // 8,
                                             overlap=SVD_OVERLAP // 8))
    if w.a.original:
        encoder, decoder = _svd_original(w.a.original)
        encoder.load_state_dict({k[8:]: t for k, t in w.sd.items() if k.startswith("encoder.")})
        decoder.load_state_dict({k[8:]: t for k, t in w.sd.items() if k.startswith("decoder.")})
        decode = lambda z: ((decoder(z, timesteps=len(z)) + 1) / 2).clamp(0, 1)
        for k, t in x.items():
            if k.startswith("encode"):
                out[f"original {k}"] = encoder(pixels(t) * 2 - 1)[:, :4]       # the regulariser's mode
            elif k != "tiles_decode":
                out[f"original {k}"] = decode(t)
        if "decode_T25" in x:     # decode_first_stage with en_and_decode_n_samples_a_time = SVD_DECODING_T
            z = x["decode_T25"]
            out["original decoding_t"] = torch.cat([decode(z[i:i + SVD_DECODING_T])
                                                    for i in range(0, len(z), SVD_DECODING_T)])


def _svd_case(run, k: str, c: Case) -> None:
    ref, x = run.state["ref"], run.inputs[k]
    ours = run.core_row(k, c)
    if k in ("decode_T25", "tiles_decode"):
        return
    want = (((ref.decode(x, num_frames=len(x)).sample + 1) / 2).clamp(0, 1) if c.op == "decode"
            else ref.encode(x.movedim(-1, 1) * 2 - 1).latent_dist.mode())
    run.table.add(f"{k} vs diffusers", ours, want, "", True, c.op)
    if f"original {k}" in run.core:
        run.table.add(f"{k} vs original", ours, run.core[f"original {k}"], "", True, c.op)


def _svd_rows(run) -> None:
    if "decode_T25" not in run.inputs:
        return
    v, ref, got, add, n = run.ours[next(iter(run.ours))], run.state["ref"], run.core, run.table.add, SVD_DECODING_T
    x4 = run.inputs["decode_T4"]
    add("frame 0 alone vs in a 4-frame clip (core)", got["frame0 alone"], got["decode_T4"][:1],
        "the decoder mixes frames", False)
    add("frame 0 alone vs in a 4-frame clip (ours)", v.decode(x4[:1]), v.decode(x4)[:1], "", False)
    x = run.inputs["decode_T25"]
    chunked = torch.cat([v.decode(x[i:i + n]) for i in range(0, len(x), n)])
    if "original decoding_t" in got:
        add(f"25 frames, clips of {n}: ours vs original", chunked, got["original decoding_t"],
            "ours: Frame-wise Decode's chunks; original: decoding_t")
    dchunks = torch.cat([((ref.decode(x[i:i + n], num_frames=len(x[i:i + n])).sample + 1) / 2).clamp(0, 1)
                         for i in range(0, len(x), n)])
    add(f"25 frames, clips of {n}: ours vs diffusers", chunked, dchunks, "decode_chunk_size")
    add(f"25 frames: one clip vs clips of {n} (ours)", v.decode(x), chunked, "what the clip rule changes", False)
    add(f"core, {SVD_CORE_FRAMES} frames a clip vs one clip", got["split"], got["decode_T25"],
        "core's free-memory rule", False)
    add("5-D [1, 4, 4, h, w]: core vs ours", got["5d"], v.decode(x4.movedim(0, 1).unsqueeze(0))[0].movedim(1, 0),
        "core keeps frame 0; ours decodes the clip", False)
    tile_rows(run, "tiles_decode", "decode", got["tiled"], SVD_TILE, SVD_OVERLAP, ", its three-pass average")


SVD_FAMILY = Family(
    title="Stable Video Diffusion VAE (core: AutoencodingEngine + temporal_ae.VideoDecoder), published config, "
          "random weights (seed 0)",
    cases=cases({"decode_T1": (1, 4, 8, 8), "decode_T4": (4, 4, 8, 8), "decode_T14": (14, 4, 8, 8),
                 "encode_T1": (1, 64, 64, 3), "encode_T5": (5, 64, 64, 3), "decode_T25": (25, 4, 8, 8),
                 "tiles_decode": (4, 4, 24, 24)}),
    quick=("decode_T1", "decode_T4", "decode_T14", "encode_T1", "encode_T5"), io=FRAMES,
    files=_svd_files, core_extra=_svd_core, case_rows=_svd_case, rows=_svd_rows,
    options=lambda g: g.add_argument("--original", help="svd: a Stability-AI/generative-models checkout"),
    dry=lambda: _dry({"svd.safetensors": svd_original_layout(svd_model(block_out_channels=(32,) * 4,
                                                                       layers_per_block=2).state_dict())},
                     (2, 4, 4, 4), (2, 32, 32, 3)))


# ---- Stable Cascade stage A ------------------------------------------------------------------------

STAGE_A_TILE = 128             # px: our exact tiles and core's tiled decode


def stage_a_weights(widths=(192, 384), bottleneck_blocks: int = 12, codebook_size: int = 8192) -> dict:
    """Random weights (randn / sqrt(fan-in), the six learned scalars of each block and the latent
    BatchNorm's statistics off their defaults, the head scaled so that most pixels stay inside 0..1) at the
    published config by default, in the original's / ComfyUI's layout."""
    repo_on_path()
    from vae.archs import stage_a
    cfg = stage_a.StageAConfig(widths=widths, hidden=4, bottleneck_blocks=bottleneck_blocks, latent_channels=4,
                               codebook_size=codebook_size, patch=2, image_channels=3, has_encoder=True, has_decoder=True)
    model = stage_a.StageA(cfg)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.5 if name.endswith("gammas") else 1 / (p[0].numel() if p.dim() > 1 else 10) ** 0.5
            p.copy_(scale * torch.randn(p.shape, generator=g))
        bn = model.down_blocks[-1][1]
        bn.running_mean.copy_(0.1 * torch.randn(4, generator=g))
        bn.running_var.copy_(0.5 + torch.rand(4, generator=g))
        model.out_block[0].weight.mul_(0.2)
        model.out_block[0].bias.fill_(0.5)
    return {k.replace(".depthwise.", ".depthwise.1."): v.contiguous() for k, v in model.state_dict().items()}


def _stage_a_core(w) -> None:
    from comfy.ldm.cascade.stage_a import StageA
    v, z, r = w.v, w.inputs["decode"], w.v.upscale_ratio
    w.out["decode raw"] = v.decode(z).movedim(-1, 1)
    w.out["decode tiled"] = v.decode_tiled(z, tile_x=STAGE_A_TILE // r, tile_y=STAGE_A_TILE // r,
                                           overlap=STAGE_A_TILE // r // 4).movedim(-1, 1)
    strict = StageA()             # core's own class loads the file: exactly core's keys?
    missing, unexpected = strict.load_state_dict(dict(w.sd), strict=False)
    w.info["strict StageA"] = dict(missing=list(missing), unexpected=list(unexpected))
    w.out["encode quantized"] = strict.eval().encode(w.inputs["encode"], quantize=True)[0]


def _stage_a_case(run, k: str, c: Case) -> None:
    v, x, t = run.ours[next(iter(run.ours))], run.inputs[k], STAGE_A_TILE
    if c.op == "decode":
        raw = run.core["decode raw"]
        run.core_row(k, c, note=f"core clamped (its process_output is the identity); {_outside(raw)}")
        run.table.add("decode, network output", v.model.decode(x), raw, "ours unclamped vs core's IMAGE", True)
        tile_rows(run, k, c.op, run.core["decode tiled"].clamp(0, 1), t, t // 4)
    else:
        lat = run.core_row(k, c, note="not quantized")
        run.table.add(f"encode exact {t} px tiles", v.encode(x, tile=t, mode="exact"), run.core[k],
                      "ours exact tiles vs core untiled", True)
        run.table.add("encode quantized", v.model.quantize(lat), run.core["encode quantized"],
                      "ours quantize(encode) vs core StageA.encode(quantize=True)", True)


def _stage_a_rows(run) -> None:
    """diffusers' PaellaVQModel on the same tensors (its codebook key) beside ours and core."""
    print(f"  core's StageA on the file: {run.info['strict StageA']}")
    try:
        from diffusers.pipelines.deprecated.wuerstchen.modeling_paella_vq_model import PaellaVQModel
    except ImportError:
        print("diffusers not importable: no diffusers rows")
        return
    from safetensors.torch import load_file
    v, z, x, add = run.ours[next(iter(run.ours))], run.inputs["decode"], run.inputs["encode"], run.table.add
    m = PaellaVQModel().eval()
    weights = load_file(str(run.d / next(iter(run.ours))))
    m.load_state_dict({k.replace("vquantizer.codebook.", "vquantizer.embedding."): t for k, t in weights.items()})
    dec, enc = m.decode(z).sample, m.encode(x).latents
    add("decode vs diffusers", v.decode(z), dec.clamp(0, 1), "ours vs diffusers' decode clamped", True)
    add("encode vs diffusers", v.encode(x), enc, "ours vs diffusers' encode", True)
    add("diffusers decode vs core", dec, run.core["decode raw"], "both unclamped", True)
    add("diffusers encode vs core", enc, run.core["encode"], "", True)


STAGE_A = Family(
    title="Stable Cascade stage A (core: comfy/ldm/cascade/stage_a.py), published config, random weights "
          "(seed 0), latent 64x48 (256x192 px)",
    cases=cases({"decode": (1, 4, 64, 48), "encode": (1, 3, 256, 192)}), seed=SEED + 1,
    io=IMAGE_CLAMPED, files=lambda run: {"stage_a.safetensors": stage_a_weights()}, core_extra=_stage_a_core,
    case_rows=_stage_a_case, rows=_stage_a_rows,
    dry=lambda: _dry({"stage_a.safetensors": stage_a_weights((16, 32), 1, 64)}, (1, 4, 8, 8), (1, 3, 32, 32)))


# ---- the TAEHV family ------------------------------------------------------------------------------

HY15 = 1.03682
TAEHV_PIXELS = 64        # output side of every case
# file name -> (latent channels, patch, encoder TPool strides, decoder TGrow strides, latent frames, frames)
TAEHV = {
    "taehv": (16, 1, (2, 2, 1), (1, 2, 2), 5, 9),
    "lighttaew2_1": (16, 1, (2, 2, 1), (1, 2, 2), 5, 9),
    "lighttaew2_2": (48, 2, (2, 2, 1), (1, 2, 2), 5, 9),
    "lighttaehy1_5": (32, 2, (2, 2, 1), (1, 2, 2), 5, 9),
    "taeltx_2": (128, 4, (2, 2, 2), (2, 2, 2), 3, 17),
    "taeh3": (24, 2, (2, 2, 1), (1, 2, 2), 12, 18),
}
# the original's file name -> the weights it is given (the same tensors under its own name)
TAEHV_ORIGINAL = {"taehv": "taehv", "taew2_1": "lighttaew2_1", "taehv1_5": "lighttaehy1_5", "taew2_2": "lighttaew2_2",
                  "taeltx_2": "taeltx_2", "taeh3": "taeh3"}


def taehv_weights(name: str, **widths) -> dict:
    """Random weights (randn / sqrt(fan-in); the decoder's head x 0.4 and centred in the pixel range, so
    frames are mostly not clamped) at the published config of ``name``, rounded to fp16."""
    repo_on_path()
    from vae.archs import taehv
    latent, patch, enc_t, dec_t, _, _ = TAEHV[name]
    cfg = taehv.TAEHVConfig(latent, patch=patch, encoder_time=enc_t, decoder_time=dec_t,
                            act=taehv.LATENT_SPACES[name].act, **widths)
    model = taehv_random(taehv.TAEHV(cfg))
    return {k: v.half().contiguous() for k, v in model.state_dict().items()}


def taehv_random(model):
    """``model``'s weights randn / sqrt(fan-in) under the fixed seed, the head x 0.4 (+ the value range's
    middle): decoded frames mostly inside the range, as a trained TAEHV's are."""
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p[0].numel() if p.dim() > 1 else 10) ** 0.5)
        model.decoder[-1].weight.mul_(0.4)
        model.decoder[-1].bias.add_(sum(model.config.value_range) / 2)
    return model


def _taehv_files(run) -> dict:
    files = {}
    for name in TAEHV:        # taehv in fp16 (core calls an fp16 16-channel file taehv), the others fp32
        sd = taehv_weights(name)
        files[f"{name}.safetensors"] = sd if name == "taehv" else {k: v.float() for k, v in sd.items()}
    files["taehv_fp32.safetensors"] = {k: v.float() for k, v in files["taehv.safetensors"].items()}
    return files


def _taehv_cases() -> dict:
    out = {}
    for name, (latent, patch, _, _, t, frames) in TAEHV.items():
        h, f, p = TAEHV_PIXELS // (8 * patch), f"{name}.safetensors", TAEHV_PIXELS
        out.update(cases({f"{name} decode t=1": (1, latent, 1, h, h), f"{name} decode t={t}": (1, latent, t, h, h),
                          f"{name} encode T=1": (1, 3, 1, p, p), f"{name} encode T={frames}": (1, 3, frames, p, p)}, f))
    return out


def _taehv_core(w) -> None:
    v, m, stem = w.v, w.v.first_stage_model, w.stem.removesuffix(".safetensors")
    w.info[w.stem].update(latent_format=type(m.latent_format).__name__ if m.latent_format else None,
                          act=type(m.decoder[2]).__name__, upscale=[v.upscale_ratio[1], v.upscale_ratio[0](5)])
    for k, x in w.inputs.items():
        if k.startswith(stem + " decode"):
            w.out[k + " raw"] = v.decode(x).movedim(-1, 1)
    if stem == "taehv_fp32":      # the same weights in fp32: core's other 16-channel model
        w.out["taehv_fp32 decode"] = v.decode(w.inputs["taehv decode t=5"]).movedim(-1, 1)
    if stem == "taeltx_2":
        try:
            w.out["taeltx_2 tiled"] = v.decode_tiled(w.inputs["taeltx_2 decode t=3"], tile_x=1, tile_y=1, overlap=0,
                                                     tile_t=2, overlap_t=1).movedim(-1, 1)
        except Exception as e:        # noqa: BLE001 - reported as a row
            w.info[w.stem]["tiled_error"] = f"{type(e).__name__}: {e}"[:200]


def _taehv_case(run, k: str, c: Case) -> None:
    v, x, add = run.ours[c.file], run.inputs[k], run.table.add
    s = HY15 if c.file.startswith("lighttaehy1_5") else 1.0     # core's scale that LightX2V does not apply
    if c.op == "encode":
        run.core_row(k, c, v.encode(x) / s, "ours / 1.03682" if s != 1 else "")
        return
    given = "ours given z * 1.03682; " if s != 1 else ""
    run.core_row(k, c, v.decode(x * s), f"core clamped; {given}{_outside(run.core[k + ' raw'])}")
    if s != 1:
        add(f"{k} as given", v.decode(x), run.core[k], "the same LATENT: core's extra scale", False)
    if c.shape[2] > 1 and not v.caps.own_tiling:
        add(f"{k} streamed", v.decode(x * s, tile_frames=v.caps.temporal_ratio), run.core[k],
            "ours one latent frame at a time vs core", True)
        add(f"{k} exact tiles", v.decode(x * s, tile=TAEHV_PIXELS // 2, mode="exact"), run.core[k],
            f"ours exact {TAEHV_PIXELS // 2} px tiles vs core untiled", True)


def _taehv_rows(run) -> None:
    core, info, add = run.core, run.info, run.table.add
    for stem, i in info.items():
        print(f"  core {stem}: latent format {i['latent_format']}, activation {i['act']}, ratios "
              f"{i['upscale'][0]}x, 5 latent frames -> {i['upscale'][1]} frames")
    fp16 = core["taehv decode t=5"]
    add("taehv dtype: core, fp32 copy", core["taehv_fp32 decode"].clamp(0, 1), fp16,
        "core: the same weights stored fp32 decode as lighttaew2_1", False)
    add("taehv dtype: ours, fp32 copy", run.ours["taehv_fp32.safetensors"].decode(run.inputs["taehv decode t=5"]),
        fp16, "ours: the name decides, not the dtype", True)
    if "taeltx_2 tiled" in core:
        add("taeltx_2 core tiled", core["taeltx_2 tiled"].clamp(0, 1), core["taeltx_2 decode t=3"],
            "core VAE Decode (Tiled) vs core untiled", False)
    else:
        print(f"taeltx_2 core tiled: core VAE Decode (Tiled): {info['taeltx_2.safetensors'].get('tiled_error')}")
    if run.a.reference:
        _taehv_original(run)


def _taehv_original(run) -> None:
    """The original's own loader on the same weights (as NAME.pth), under its own file names."""
    import vae
    from safetensors.torch import load_file
    ref = module_at(run.a.reference, "_taehv_reference")
    for orig, ours_name in TAEHV_ORIGINAL.items():
        sd = {k: v.float() for k, v in load_file(str(run.d / f"{ours_name}.safetensors")).items()}
        torch.save(sd, run.d / f"{orig}.pth")
        tae = ref.TAEHV(checkpoint_path=str(run.d / f"{orig}.pth")).eval()
        v = vae.load(run.d / f"{orig}.pth")
        scale = torch.as_tensor(v.config.scale).reshape(1, -1, 1, 1, 1)
        shift = torch.as_tensor(v.config.shift).reshape(1, -1, 1, 1, 1)
        t, frames = TAEHV[ours_name][4:]
        for key in (f"{ours_name} decode t=1", f"{ours_name} decode t={t}"):
            net = run.inputs[key]
            if orig == "taeh3" and net.shape[2] == 1:
                continue                   # one latent frame: the original gives 5 frames, core and we 1
            want = tae.decode_video(net.transpose(1, 2), parallel=True, show_progress_bar=False).transpose(1, 2)
            run.table.add(f"original {orig} decode t={net.shape[2]}", v.decode(net / scale + shift), want,
                          "vs the original decode_video", True)
        x = run.inputs[f"{ours_name} encode T={frames}"]
        want = tae.encode_video(x.transpose(1, 2), parallel=True, show_progress_bar=False).transpose(1, 2)
        run.table.add(f"original {orig} encode T={x.shape[2]}", v.encode(x), want / scale + shift,
                      "vs the original encode_video", True)


TAEHV_FAMILY = Family(
    title="TAEHV family (core: comfy/taesd/taehv.py), published configs, random weights (seed 0, fp16 values), "
          "fp32 compute, 64x64 px",
    cases=_taehv_cases(), io=CLIP_CLAMPED, files=_taehv_files, core_extra=_taehv_core, case_rows=_taehv_case,
    rows=_taehv_rows, options=lambda g: g.add_argument("--reference", help="taehv: a copy of madebyollin's taehv.py"),
    dry=lambda: ({f"{n}.safetensors": taehv_weights(n, encoder_width=8, decoder_widths=(16, 8, 8, 8)) for n in TAEHV},
                 {k: c for k, c in _taehv_cases().items() if "=1" in k}))


# ---- HunyuanImage 2.1 and 3.0 ----------------------------------------------------------------------

# core's ddconfig per variant (comfy/sd.py), and the narrow one of --quick (the same structure)
HUNYUAN_IMAGE = {
    "2.1": dict(published=dict(block_out_channels=[128, 256, 512, 512, 1024, 1024], num_res_blocks=2),
                quick=dict(block_out_channels=[32, 32, 64, 64, 128, 128], num_res_blocks=1),
                common=dict(in_channels=3, out_channels=3, z_channels=64, ffactor_spatial=32,
                            downsample_match_channel=True, upsample_match_channel=True),
                module="comfy.ldm.hunyuan_video.vae"),
    "3.0": dict(published=dict(block_out_channels=[128, 256, 512, 1024, 1024], num_res_blocks=2),
                quick=dict(block_out_channels=[32, 32, 64, 64, 64], num_res_blocks=1),
                common=dict(in_channels=3, out_channels=3, z_channels=32, ffactor_spatial=16, ffactor_temporal=4,
                            downsample_match_channel=True, upsample_match_channel=True, refiner_vae=False),
                module="comfy.ldm.hunyuan_video.vae_refiner"),
}
HUNYUAN_IMAGE_EXACT = ("2.1 decode 3x4", "2.1 encode 96x128", "3.0 decode 1x32x1x4x3", "3.0 encode 64x48")


def _hy_file(variant: str) -> str:
    return f"hunyuan_image_{variant}_vae.safetensors"


def _hy_engine(a, variant: str):
    comfy_core.start(a.comfyui)
    from comfy.ldm.models.autoencoder import AutoencodingEngine
    c = HUNYUAN_IMAGE[variant]
    ddconfig = {**c["common"], **c["quick" if a.quick else "published"]}
    return AutoencodingEngine(regularizer_config={"target": "comfy.ldm.models.autoencoder.DiagonalGaussianRegularizer"},
                              encoder_config={"target": f"{c['module']}.Encoder", "params": ddconfig},
                              decoder_config={"target": f"{c['module']}.Decoder", "params": ddconfig})


def _hy_files(w) -> dict:
    """Core's model of each variant, every tensor drawn, in core's file layout (= Tencent's names); each file
    written as soon as it is drawn (one variant's tensors held at a time)."""
    for variant in HUNYUAN_IMAGE:
        shapes = {k: p.shape for k, p in _hy_engine(w.a, variant).state_dict().items()}
        save(drawn(shapes), w.d / _hy_file(variant))
    return {_hy_file(v): None for v in HUNYUAN_IMAGE}


def _hy_crop(image: torch.Tensor, r: int) -> torch.Tensor:
    """comfy.sd.VAE.vae_encode_crop_pixels: sides centre-cropped to multiples of the ratio."""
    h, w = image.shape[1] // r * r, image.shape[2] // r * r
    y, x = (image.shape[1] % r) // 2, (image.shape[2] % r) // 2
    return image[:, y:y + h, x:x + w]


class _CoreClasses:
    """Core's Encoder / Decoder classes in an AutoencodingEngine (--quick: comfy.sd.VAE builds only the
    published widths), with what comfy.sd.VAE's decode / encode do around the model: LATENT -> 0..1 IMAGE
    (3.0: a one-frame clip's frames), IMAGE centre-cropped -> [-1, 1] (3.0: as one-frame clips) -> LATENT."""

    def __init__(self, model, variant: str):
        self.first_stage_model, (self.r, self.clip) = model, (32, False) if variant == "2.1" else (16, True)

    def decode(self, z):
        return ((self.first_stage_model.decode(z) + 1) / 2).clamp(0, 1).movedim(1, -1)

    def encode(self, image):
        x = _hy_crop(image, self.r).movedim(-1, 1) * 2 - 1
        return self.first_stage_model.encode(x.unsqueeze(2) if self.clip else x)


def _hy_core_build(w, meta):
    variant = "2.1" if "2.1" in w.stem else "3.0"
    if w.a.quick:
        model = _hy_engine(w.a, variant)
        model.load_state_dict(w.sd, strict=True)
        return _CoreClasses(model.eval(), variant)
    return core_vae(w)


def _hy_references(handle, variant: str) -> dict:
    """name -> (decode: LATENT -> 0..1 IMAGE, encode: IMAGE -> LATENT) of the references that load the same
    weights: diffusers and Tencent's original (2.1), Tencent's original (3.0), the originals when
    HUNYUAN_IMAGE21_REFERENCE / HUNYUAN_IMAGE3_REFERENCE name copies of hyimage/models/vae/hunyuanimage_vae.py /
    hunyuan_image_3/autoencoder_kl_3d.py."""
    import importlib.util
    import os

    from vae.archs import hunyuan_image_layout

    def module(env: str):
        path = os.environ.get(env)
        if not path or not os.path.isfile(path) or importlib.util.find_spec("einops") is None:
            return None
        return module_at(path, f"_{env.lower()}")

    cfg, sd, r = handle.config, hunyuan_image_layout.to_original(handle.state_dict()), handle.caps.spatial_ratio
    pix = lambda y: ((y.clamp(-1, 1) + 1) / 2).movedim(1, -1)
    clip = (lambda x: x[:, :, None]) if variant == "3.0" else (lambda x: x)
    models = {}
    common = dict(in_channels=3, out_channels=3, latent_channels=cfg.latent_channels, block_out_channels=cfg.widths,
                  layers_per_block=cfg.layers_per_block)
    if variant == "2.1":
        import diffusers
        m = diffusers.AutoencoderKLHunyuanImage(**common, spatial_compression_ratio=cfg.ratios[0], sample_size=384)
        theirs = m.state_dict()             # our layout reads diffusers' keys in order: the names
        names = list(hunyuan_image_layout.to_canonical(theirs))
        m.load_state_dict({k: handle.state_dict()[n] for k, n in zip(theirs, names)}, strict=True)
        models["diffusers"] = m
        mod = module("HUNYUAN_IMAGE21_REFERENCE")
        if mod:
            models["Tencent"] = mod.HunyuanVAE2D(**common, ffactor_spatial=cfg.ratios[0], sample_size=384,
                                                 sample_tsize=1)
            models["Tencent"].load_state_dict(sd)
    else:
        mod = module("HUNYUAN_IMAGE3_REFERENCE")
        if mod:
            models["Tencent"] = mod.AutoencoderKLConv3D(**common, ffactor_spatial=cfg.ratios[0],
                                                        ffactor_temporal=cfg.frames, sample_size=256, sample_tsize=64)
            models["Tencent"].load_state_dict(sd)
    return {k: (lambda z, m=m.eval(): pix(m.decode(z).sample),
                lambda im, m=m: m.encode(clip(_hy_crop(im, r).movedim(-1, 1)) * 2 - 1).latent_dist.mode())
            for k, m in models.items()}


def _hy_case(run, k: str, c: Case) -> None:
    handle, x = run.ours[c.file], run.inputs[k]
    ours = run.core_row(k, c)
    refs = run.state.setdefault(c.file, _hy_references(handle, k[:3]))
    for name, (dec, enc) in refs.items():
        run.table.add(f"{k} vs {name}", ours, dec(x) if c.op == "decode" else enc(x), "", True, c.op)
    if k in HUNYUAN_IMAGE_EXACT:
        exact_row(run, k, c, 2 * handle.caps.spatial_ratio)


def _hy_dry():
    repo_on_path()
    import vae
    from vae.archs import hunyuan_image_layout
    m = diffusers_jittered("AutoencoderKLHunyuanImage", in_channels=3, out_channels=3, latent_channels=64,
                           block_out_channels=(32, 32, 64, 64, 128, 128), layers_per_block=1,
                           spatial_compression_ratio=32, sample_size=384)
    sd = hunyuan_image_layout.to_original(vae.from_state_dict(m.state_dict()).state_dict())
    return _dry({_hy_file("2.1"): sd}, (1, 64, 2, 2), (1, 64, 64, 3))


HUNYUAN_IMAGE_FAMILY = Family(
    title="HunyuanImage 2.1 and 3.0 VAEs (core: hunyuan_video/vae.py, vae_refiner.py refiner_vae=False)",
    cases={**cases({"2.1 decode 3x4": (1, 64, 3, 4), "2.1 decode 2x2, batch 2": (2, 64, 2, 2),
                    "2.1 encode 96x128": (1, 96, 128, 3), "2.1 encode 100x70 (centre-cropped)": (1, 100, 70, 3)},
                   _hy_file("2.1")),
           **cases({"3.0 decode 1x32x1x4x3": (1, 32, 1, 4, 3), "3.0 decode 2x32x1x2x2": (2, 32, 1, 2, 2),
                    "3.0 encode 64x48": (1, 64, 48, 3), "3.0 encode 2x40x50 (centre-cropped)": (2, 40, 50, 3)},
                   _hy_file("3.0"))},
    seed=SEED + 1, io=SOCKET, core_files=_hy_files, core_build=_hy_core_build,
    load=pack_load, case_rows=_hy_case, relative_encode=True, dry=_hy_dry)


# ---- Mage-VAE --------------------------------------------------------------------------------------

MAGE_FILE = "mage_flow_vae.safetensors"
MAGE_BF16 = ("decode 40x36 (2x2 windows)", "encode 64x80")                # also compared in bf16
MAGE_EXACT = ("decode 40x36 (2x2 windows)", "encode 650x590 (centre-cropped)")   # also with exact 512 px tiles


def _mage_files(w) -> dict:
    """Core's published MageVAE, every tensor drawn, in the file layout the templates load (plus two
    tensors of the Flux.2 anchor encoder, which both loaders must drop)."""
    comfy_core.start(w.a.comfyui)
    import comfy.ldm.mage_flow.vae as mage
    shapes = {k: p.shape for k, p in mage.MageVAE().state_dict().items()}
    sd = {("student." if k.startswith("dconv_encoder.") else "") + k.replace("decoder_model.", "pipeline.", 1): t
          for k, t in drawn(shapes).items()}
    g = torch.Generator().manual_seed(SEED)
    sd["pipeline.y_embedder.encoder.conv_in.weight"] = torch.randn(128, 3, 3, 3, generator=g)
    sd["pipeline.y_embedder.bottleneck.weight"] = torch.randn(128, 64, 1, 1, generator=g)
    return {MAGE_FILE: sd}


def _mage_core(w) -> None:
    """The bf16 cases again on core's VAE loaded in bf16 (its working dtypes are bf16 and fp32)."""
    v = comfy_core.vae(w.a.comfyui, dict(w.sd), dtype=torch.bfloat16)
    for k in (k for k in MAGE_BF16 if k in w.inputs):
        w.out[k + " bf16"] = (v.decode if k.startswith("decode") else v.encode)(w.inputs[k]).float()


def _mage_case(run, k: str, c: Case) -> None:
    run.core_row(k, c)
    if k in MAGE_BF16:
        h = run.state.setdefault("bf16", pack_load(run, run.d / MAGE_FILE, torch.bfloat16))
        core = run.core[k + " bf16"]
        run.table.add(f"{k} bf16", run.ours_out(k, c, h).float(), core, "both in bf16: rounding, not parity", False,
                      c.op)
        run.table.add(f"{k} core bf16 vs core fp32", core, run.core[k], "the scale of bf16 rounding", False, c.op)
    if k in MAGE_EXACT:
        exact_row(run, k, c, 512)


def _mage_dry():
    repo_on_path()
    import mage_tiny
    return _dry({MAGE_FILE: mage_tiny.file_layout(mage_tiny.canonical(), anchor=True)}, (1, 16, 2, 2), (1, 32, 32, 3))


MAGE = Family(
    title="Mage-VAE (core: comfy/ldm/mage_flow/vae.py through comfy.sd.VAE), published config, random weights "
          "(seed 0)",
    cases=cases({"decode 4x5 (one padded window)": (1, 128, 4, 5), "decode 6x4, batch 2": (2, 128, 6, 4),
                 "decode 40x36 (2x2 windows)": (1, 128, 40, 36), "encode 64x80": (1, 64, 80, 3),
                 "encode 650x590 (centre-cropped)": (1, 650, 590, 3)}),
    quick=("decode 4x5 (one padded window)", "decode 6x4, batch 2", "encode 64x80"),
    seed=SEED + 1, io=SOCKET, core_files=_mage_files, core_build=core_vae,
    core_keys=lambda sd: {k.replace("student.dconv_encoder.", "dconv_encoder.").replace("pipeline.", "decoder_model.", 1)
                          for k in sd},
    core_extra=_mage_core, load=pack_load, case_rows=_mage_case, relative_encode=True, dry=_mage_dry)


# ---- LTX-2.5 diffusion VAE -------------------------------------------------------------------------

LTXD_FILE = "ltx-2.5-video-vae.safetensors"
# LTX-2.3's published encoder (diffusers AutoencoderKLLTX2Video); the decoder: diffusers' defaults, the published one
LTXD_ENCODER = dict(latent_channels=128, block_out_channels=(256, 512, 1024, 1024), layers_per_block=(4, 6, 4, 2, 2),
                    encoder_causal=True, spatial_compression_ratio=32, temporal_compression_ratio=8,
                    encoder_spatial_padding_mode="zeros")
# the shipped file's config (what ComfyUI reads; keys it does not find take its built-in values)
LTXD_CONFIG = {"vae": {"_class_name": "CausalDiffusionVAE", "model_output_type": "x0",
                       "encoder": {"spatial_padding_mode": "zeros", "latent_log_var": "constant"},
                       "decoder": {"stage_kernels": [[3, 7, 7], [3, 7, 7], [3, 5, 5], [3, 5, 5], [11, 11, 11]],
                                   "stage5_kernel": [11, 11, 11], "timestep_scale_multiplier": 1000.0,
                                   "default_num_inference_steps": 1}}}
# neighbourhood attention alone: q/k/v [B, T, H, W, heads, dim] and the kernel
LTXD_NA = (((1, 3, 7, 9, 4, 64), (3, 7, 7)), ((1, 17, 24, 20, 4, 64), (11, 11, 11)), ((2, 1, 5, 6, 2, 32), (3, 7, 7)))


def ltx_diffusion_weights(encoder: dict = LTXD_ENCODER, decoder: dict = None) -> tuple[dict, dict]:
    """The shipped file (its layout, its ``config`` metadata) of random weights at the published config."""
    repo_on_path()
    import vae
    from ltx_diffusion_common import reference
    from vae.archs.ltx_diffusion_layout import to_original
    ref = reference(seed=SEED, encoder=encoder, decoder=decoder or {})
    canonical = vae.from_state_dict({k: v.contiguous() for k, v in ref.state_dict().items()}).state_dict()
    del ref
    return to_original(canonical), {"config": json.dumps(LTXD_CONFIG)}


def _ltxd_inputs(g) -> dict:
    return {f"na{i}.{n}": torch.randn(shape, generator=g) for i, (shape, _) in enumerate(LTXD_NA) for n in "qkv"}


def _ltxd_core(w) -> None:
    import comfy_kitchen
    for i, (_, kernel) in enumerate(LTXD_NA):
        w.out[f"na{i}"] = comfy_kitchen.na3d(*(w.inputs[f"na{i}.{n}"] for n in "qkv"), list(kernel), None, 1.0)


def _ltxd_rows(run) -> None:
    from ltx_diffusion_common import brute_na
    from vae.nn.neighborhood import neighborhood_attention
    unused = sum(k.startswith("per_channel_statistics.") for k in run.info[LTXD_FILE]["unexpected"])
    print(f"  of core's unexpected keys, {unused} are statistics core never reads")
    v, z = run.ours[LTXD_FILE], run.inputs["decode_t3"]
    run.table.add("ours seed 7 vs seed 0 (decode_t3)", v.decode(z, seed=7), v.decode(z), "the noise matters", False)
    for n, (shape, kernel) in enumerate(LTXD_NA):
        q, k, x = (run.inputs[f"na{n}.{c}"] for c in "qkv")
        for name, fn in (("ours", neighborhood_attention), ("tests' brute force", brute_na)):
            run.table.add(f"na3d {name} {kernel} {shape}", fn(q, k, x, kernel), run.core[f"na{n}"],
                          "vs comfy_kitchen.na3d", True)


def _ltxd_dry():
    repo_on_path()
    from ltx_diffusion_common import DECODER, ENCODER
    sd, _ = ltx_diffusion_weights(ENCODER, DECODER)
    return _dry({LTXD_FILE: sd}, (1, 16, 2, 2, 2), (1, 3, 9, 64, 64))


LTX_DIFFUSION = Family(
    title="LTX-2.5 diffusion VAE (core: CausalDiffusionVAE through comfy.sd.VAE), published config, random "
          "weights (seed 0)",
    cases=cases({"decode_t1": (1, 128, 1, 4, 4), "decode_t3": (1, 128, 3, 4, 4), "encode_T1": (1, 3, 1, 128, 128),
                 "encode_T9": (1, 3, 9, 128, 128)}),
    extra_inputs=_ltxd_inputs, files=lambda run: {LTXD_FILE: ltx_diffusion_weights()}, core_build=core_vae,
    core_extra=_ltxd_core, rows=_ltxd_rows, dry=_ltxd_dry)


# ---- MiniMax H3 ------------------------------------------------------------------------------------

MINIMAX_FP16, MINIMAX_INT8 = "minimax_h3_video_vae_fp16.safetensors", "minimax_h3_video_vae_int8_convrot.safetensors"
MINIMAX_TINY = dict(enc_widths=(32,) * 6, enc_blocks=1, enc_down=(True,) * 4 + (False,) * 2, dec_dim=128, dec_depth=2,
                    dec_ff=512, registers=4, patch=16)
MINIMAX = dict(enc_widths=(128, 256, 256, 512, 512, 1024), enc_blocks=2, enc_down=(True,) * 4 + (False,) * 2,
               dec_dim=2048, dec_depth=36, dec_ff=8192, registers=4, patch=16)
# size -> (op, shape, tiling): decode latents [t, h, w] (24 channels), encode clips [T, H, W]
MINIMAX_CASES = {
    "tiny": [("decode", (t, 5, 6), "stitch") for t in (1, 2, 3, 6, 7, 12)]
    + [("decode", s, tiling) for s in ((7, 29, 20), (12, 18, 17)) for tiling in ("stitch", "blend")]
    + [("encode", (n, 48, 64), "") for n in (1, 2, 5, 17, 18, 22, 40)]
    + [("encode", (1, 464, 320), ""), ("encode", (5, 288, 272), "")],
    # one tile per frame: both compositions are the same (the tiles are compared in the tiny rows)
    "published": [("decode", (1, 8, 8), "stitch"), ("decode", (7, 4, 4), "stitch"), ("decode", (12, 3, 3), "stitch"),
                  ("encode", (1, 64, 64), ""), ("encode", (22, 48, 48), "")],
    "int8": [("decode", (7, 4, 4), "stitch"), ("decode", (1, 8, 8), "stitch")],
    "tiny_int8": [("decode", (t, h, w), "stitch") for t, h, w in ((7, 4, 4), (1, 5, 6), (7, 18, 17), (12, 5, 6))],
}


def minimax_weights(fields: dict, dtype=torch.float32) -> dict:
    """Canonical (ComfyUI-layout) weights of the config ``fields``: per tensor a generator seeded by
    its name; scales chosen so activations stay O(1) and decoded pixels mostly inside 0..1. Plus
    ``decoder.mask_token`` (zeros), as MiniMax's and ComfyUI's files have it."""
    repo_on_path()
    from vae.archs import minimax, minimax_layout
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in minimax.MiniMaxH3VAE(minimax.MiniMaxConfig(**fields)).state_dict().items()}
    out = {}
    for name, shape in shapes.items():
        r = torch.randn(shape, generator=torch.Generator().manual_seed(SEED + zlib.crc32(name.encode())))
        if name in ("latents_mean", "latents_std"):
            r = torch.tensor(minimax_layout.LATENTS_MEAN if name == "latents_mean" else minimax_layout.LATENTS_STD)
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


def newer_tiled_decode(mm, path: str) -> None:
    """Put core 0.38.1's tiled decode (PR #16436: ``_decode_tile_row`` and ``tiled_decode``, a file the
    user gives, imported as a module) on 783545f6's MiniMax H3 class, the reference for our default."""
    module = module_at(path, "minimax_newer_tiled_decode")
    mm.MiniMaxH3VideoVAE._decode_tile_row = module._decode_tile_row
    mm.MiniMaxH3VideoVAE.tiled_decode = module.tiled_decode


def _minimax_cases(size: str) -> dict:
    return {f"{op} {'x'.join(map(str, s))} {tiling}".rstrip(): Case(op, (1, 24 if op == "decode" else 3, *s))
            for op, s, tiling in MINIMAX_CASES[size]}


def _minimax_files(run) -> dict:
    """The tiny file fp32; the published one fp16 as ComfyUI ships it; int8 ones quantized from those by
    core (the ``quantize`` worker)."""
    tiny, int8 = run.variant.startswith("tiny"), run.variant.endswith("int8")
    sd = minimax_weights(MINIMAX_TINY if tiny else MINIMAX, torch.float32 if run.variant == "tiny" else torch.float16)
    if not int8:
        return {"tiny.safetensors" if tiny else MINIMAX_FP16: sd}
    save(sd, run.d / "fp16.safetensors")
    del sd
    run.call("quantize")
    return {MINIMAX_INT8: None}


def _minimax_quantize(w) -> None:
    """The int8 file by core's own quantizer (comfy_kitchen: rotate each column group by the normalised
    Hadamard matrix, then per-row int8), for the blocks' Linears as ComfyUI's file has them; groups of 256
    (the tiny model's, 128 wide, of 64)."""
    comfy_core.start(w.a.comfyui)
    import comfy.quant_ops
    from safetensors.torch import load_file
    group = 64 if w.variant.startswith("tiny") else 256
    sd = load_file(str(w.d / "fp16.safetensors"))
    conf = torch.tensor(list(json.dumps({"format": "int8_tensorwise", "convrot": True,
                                         "convrot_groupsize": group}).encode()), dtype=torch.uint8)
    for k in [k for k in sd if k.startswith("decoder.transformer_blocks.") and k.endswith(".weight")
              and any(p in k for p in (".to_qkv.", ".to_out.", ".ff.w1.", ".ff.w2."))]:
        q, params = comfy.quant_ops.TensorWiseINT8Layout.quantize(sd[k].float(), is_weight=True, per_channel=True,
                                                                  convrot=True, convrot_groupsize=group)
        sd[k], sd[k[:-len("weight")] + "weight_scale"] = q.contiguous(), params.scale.contiguous()
        sd[k[:-len("weight")] + "comfy_quant"] = conf.clone()
    save(sd, w.d / MINIMAX_INT8)


class _MinimaxTiny:
    """Core's classes at the tiny size (core's loader builds only the published one): MiniMaxH3VideoVAE with
    a small ViT3DDecoder (an int8 file's with core's mixed_precision_ops, as its loader builds them), called
    with VAE Decode / VAE Encode's layouts (an IMAGE batch [T, H, W, 3] is one clip)."""

    def __init__(self, sd: dict):
        import comfy.ldm.minimax.vae as mm
        import comfy.ops
        import comfy.utils
        quant = comfy.utils.detect_layer_quantization(sd, "")
        ops = {} if quant is None else dict(operations=comfy.ops.mixed_precision_ops(quant, torch.float16))
        m = mm.MiniMaxH3VideoVAE(ch=32, ch_mult=(1,) * 6, num_res_blocks=1, **ops)
        m.decoder = mm.ViT3DDecoder(num_layers=2, heads=2, dim_head=64, **ops)
        missing, unexpected = m.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise RuntimeError(f"core tiny model: missing {missing}, unexpected {unexpected}")
        self.first_stage_model = m.eval()

    def decode(self, z):
        return self.first_stage_model.decode(z).movedim(1, -1)

    def encode(self, image):
        return self.first_stage_model.encode(image.movedim(-1, 0)[None] * 2 - 1)


def _minimax_core_build(w, meta):
    return _MinimaxTiny(w.sd) if w.variant.startswith("tiny") else core_vae(w)


def _minimax_core(w) -> None:
    """Names the attention core called; the ``blend`` rows again with core 0.38.1's tiled decode grafted
    (--newer-tiled-decode), or dropped without it (783545f6 stitches)."""
    import comfy.ldm.minimax.vae as mm
    w.info[w.stem]["model"] += f", {mm.optimized_attention.__name__}"
    blend = [k for k in w.out if k.endswith("blend")]
    for k in blend:
        del w.out[k]
    if blend and w.a.newer_tiled_decode:
        newer_tiled_decode(mm, w.a.newer_tiled_decode)
        for k in blend:
            w.out[k] = w.fam.io.core_decode(w.v, w.inputs[k])


def _minimax_load(run, path: Path):
    """In the file's dtype, then cast: one copy of the weights at a time."""
    import vae
    return vae.load(path, dtype=None if run.variant == "tiny" else torch.float16).to(dtype=torch.float32)


def _minimax_case(run, k: str, c: Case) -> None:
    if k not in run.core:
        print(f"{k}: needs --newer-tiled-decode (core 0.38.1's tiled decode)")
        return
    v, x, int8 = run.ours[next(iter(run.ours))], run.inputs[k], run.variant.endswith("int8")
    ours = v.decode(x, tiling=k.rsplit(" ", 1)[1]) if c.op == "decode" else v.encode(x)
    run.core_row(k, c, ours, "int8: per-row activation rounding" if int8 else "", parity=not int8)


MINIMAX_FAMILY = Family(
    title="MiniMax H3 video VAE (core: comfy/ldm/minimax/vae.py), random weights, fp32 compute",
    cases=_minimax_cases, variants=lambda a: a.sizes.split(","), no_grad=True, files=_minimax_files,
    workers={"quantize": _minimax_quantize}, core_build=_minimax_core_build, core_extra=_minimax_core,
    load=_minimax_load, case_rows=_minimax_case,
    options=lambda g: (g.add_argument("--sizes", default="tiny", help="minimax: tiny, published, int8, tiny_int8"),
                       g.add_argument("--newer-tiled-decode", help="minimax: a file with core 0.38.1's "
                                      "_decode_tile_row and tiled_decode (the blend rows)")),
    dry=lambda: _dry({"tiny.safetensors": minimax_weights(MINIMAX_TINY)}, (1, 24, 2, 5, 6), (1, 3, 5, 48, 64)))


# the families by the name of --family
FAMILIES = {"cogvideox": COGVIDEOX, "cosmos": COSMOS, "hunyuan_image": HUNYUAN_IMAGE_FAMILY,
            "ltx_diffusion": LTX_DIFFUSION, "mage": MAGE, "minimax": MINIMAX_FAMILY, "seedvr2": SEEDVR2_FAMILY,
            "stage_a": STAGE_A, "svd": SVD_FAMILY, "taehv": TAEHV_FAMILY, **DROP_IN}
