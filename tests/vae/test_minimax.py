"""MiniMax H3 video VAE: parity with diffusers (the tiny published structure, random weights), its own
tiles and chunks as the definition (both compositions), frame rules and ComfyUI's 1- and 2-latent rules,
every layout users have (MiniMax's original, ComfyUI's fp16 and int8 files, diffusers), detection both
ways, and the engine's schedule of the definition's units (progress, interrupt, memory, guard, compile).
The comparison against ComfyUI core is bench/comfyui_checks/compare_core.py --family minimax."""
from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch

import vae
from helpers import assert_layouts_agree, module_attrs
from vae.engine import defined
from vae import registry
from vae.archs import minimax as mm
from vae.archs.minimax_layout import LATENTS_MEAN, LATENTS_STD
from vae.handle import VAE
from video_families import FAMILIES, tiny_reference

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

STATS = (torch.tensor(LATENTS_MEAN).view(1, -1, 1, 1, 1), torch.tensor(LATENTS_STD).view(1, -1, 1, 1, 1))
IMAGENET = (torch.tensor(mm.IMAGENET_MEAN).view(1, 3, 1, 1, 1), torch.tensor(mm.IMAGENET_STD).view(1, 3, 1, 1, 1))
EXACT = 1e-5


@pytest.fixture(scope="module")
def ref():
    return tiny_reference("minimax")


@pytest.fixture(scope="module")
def ours(ref):
    return vae.from_state_dict(ref.state_dict())


def narrowed(v: VAE, tile: int, min_overlap: int) -> VAE:
    """The same model with smaller definition tiles (diffusers' enable_tiling sizes), for cheap tests."""
    return VAE(v.spec, mm.with_tiles(v.config, tile, min_overlap), v.model)


def ref_decode(ref, z):
    """diffusers' decode with MiniMax's latent statistics and ImageNet pixels, as its pipeline does."""
    with torch.no_grad():
        return (ref.decode(z * STATS[1] + STATS[0]).sample * IMAGENET[1] + IMAGENET[0]).clamp(0, 1)


def ref_encode(ref, x):
    with torch.no_grad():
        return (ref.encode((x - IMAGENET[0]) / IMAGENET[1]).latent_dist.mode() - STATS[0]) / STATS[1]


@contextlib.contextmanager
def ref_tiles(ref, tile: int = 256, overlap: int = 64, off: bool = False):
    """diffusers' tile geometry for the block (its enable_tiling sizes, or disable_tiling), then back."""
    ref.disable_tiling() if off else ref.enable_tiling(tile, tile, overlap, overlap)
    try:
        yield ref
    finally:
        ref.enable_tiling(256, 256, 64, 64)


def ref_tile(ref, z):
    """One unit through diffusers' modules: raw (ImageNet-normalised) pixels."""
    with torch.no_grad():
        return ref.decoder(ref.post_quant_conv(z * STATS[1] + STATS[0]))


# ---- parity with diffusers ------------------------------------------------------------------------

@pytest.mark.parametrize("t", [3, 7, 12])
def test_decode_matches_diffusers(ref, ours, t):
    """One and two chunks, the padding latents (3: one chunk of 7), one tile: either composition."""
    z = torch.randn(1, 24, t, 3, 4)
    want = ref_decode(ref, z)
    assert ours.frames_for(t) == want.shape[2]
    assert (ours.decode(z) - want).abs().max() <= EXACT


def test_tiled_decode_matches_diffusers_stitching(ref, ours):
    """diffusers (and MiniMax's code) blend each tile with its raw neighbours: ``tiling="stitch"``,
    here with the tiles narrowed to 64 px / 16 px overlaps on both sides (4 x 3 tiles, two chunks)."""
    z = torch.randn(1, 24, 8, 11, 9)
    with ref_tiles(ref, 64, 16):
        want = ref_decode(ref, z)
    calls = []
    out = narrowed(ours, 64, 16).decode(z, tiling="stitch", progress=lambda d, n: calls.append(n))
    assert calls[-1] == 2 * 4 * 3                        # chunks x tiles, one progress step each
    assert (out - want).abs().max() <= EXACT


def _blended(tiles: dict, starts: list[int], overlaps: list[int], size: int) -> torch.Tensor:
    """What ComfyUI core 0.38.1 does, written out as its steps: each tile, row by row, is blended
    (linear ramps p / overlap) against the already composed strip above it, then against the composed
    right edge of its left neighbour, and written where it is not overlapped by the next tiles."""
    n, canvas, strip = len(starts), None, None
    ramp = lambda k, dim, t: (torch.arange(k, dtype=t.dtype) / k).view([-1 if d == dim % t.dim() else 1 for d in range(t.dim())])
    for i in range(n):
        new_strip, left = None, None
        for j in range(n):
            t = tiles[i, j]
            if canvas is None:
                canvas = torch.zeros(*t.shape[:-2], size, size)
            if i:
                k = overlaps[i - 1]
                above = strip[..., starts[j]:starts[j] + t.shape[-1]]
                t = torch.cat([above * (1 - ramp(k, -2, t)) + t[..., :k, :] * ramp(k, -2, t), t[..., k:, :]], dim=-2)
            if j:
                k = overlaps[j - 1]
                t = torch.cat([left * (1 - ramp(k, -1, t)) + t[..., :k] * ramp(k, -1, t), t[..., k:]], dim=-1)
            left = t[..., -overlaps[j]:] if j < n - 1 else None
            y0, x0 = starts[i], starts[j]
            if i < n - 1:
                if new_strip is None:
                    new_strip = torch.zeros(*t.shape[:-2], overlaps[i], size)
                new_strip[..., x0:x0 + t.shape[-1]] = t[..., -overlaps[i]:, :]
            canvas[..., y0:y0 + t.shape[-2], x0:x0 + t.shape[-1]] = t
        strip = new_strip
    return canvas


def test_blend_is_each_tile_blended_into_what_is_there(ref, ours):
    """The default composition (ComfyUI core 0.38.1+), against its steps written out over diffusers'
    own tile decodes, where three tiles overlap one pixel (240 px with 128 px tiles: overlaps of 80 and
    64 px; the 256 px / 464 px case scaled down) and four tiles meet."""
    tile, lo, px = 128, 32, 240
    starts, sizes, overlaps = defined.cover(px, tile, lo, 16)
    assert overlaps == [80, 64] and overlaps[0] + overlaps[1] > tile
    z = torch.randn(1, 24, 7, px // 16, px // 16)
    tiles = {(i, j): ref_tile(ref, z[..., a // 16:(a + tile) // 16, b // 16:(b + tile) // 16])
             for i, a in enumerate(starts) for j, b in enumerate(starts)}
    raw = _blended(tiles, starts, overlaps, px)
    want = (torch.cat([raw[:, :, 3:20], raw[:, :, 23:]], dim=2) * IMAGENET[1] + IMAGENET[0]).clamp(0, 1)
    small = narrowed(ours, tile, lo)
    out = small.decode(z)
    assert (out - want).abs().max() <= EXACT
    stitched = small.decode(z, tiling="stitch")
    print(f"MiniMax H3 tiny, 3x3 tiles of 128 px over 240 px: blend vs stitch max abs "
          f"{(out - stitched).abs().max():.3g}")
    assert (out - stitched).abs().max() > 1e-3          # the compositions differ here: the case is not trivial


def test_untiled_decode_is_one_pass_per_chunk(ref, ours):
    """``tiling="off"``: diffusers' disable_tiling (each chunk in one pass; not the released output)."""
    z = torch.randn(1, 24, 7, 18, 17)
    with ref_tiles(ref, off=True):
        want = ref_decode(ref, z)
    assert (ours.decode(z, tiling="off") - want).abs().max() <= EXACT
    assert (ours.decode(z) - want).abs().max() > 1e-3
    with pytest.raises(vae.InputError, match="unknown tiling 'none'"):
        ours.decode(z, tiling="none")


@pytest.mark.parametrize("frames", [1, 5, 22])
def test_encode_matches_diffusers(ref, ours, frames):
    """One frame (a clip of its own), one clip padded from 5 frames, two clips (22 -> 7 latents)."""
    x = torch.rand(1, 3, frames, 32, 48)
    want = ref_encode(ref, x)
    assert ours.latent_frames_for(frames) == want.shape[2]
    assert (ours.encode(x) - want).abs().max() <= EXACT


def test_tiled_encode_matches_diffusers(ref, ours):
    """Encode tiles blend latents with their raw neighbours (every reference): tiles narrowed to 64 px."""
    x = torch.rand(1, 3, 5, 144, 112)
    with ref_tiles(ref, 64, 16):
        want = ref_encode(ref, x)
    calls = []
    out = narrowed(ours, 64, 16).encode(x, progress=lambda d, n: calls.append(n))
    assert calls[-1] == 3 * 2 and (out - want).abs().max() <= EXACT


# ---- frame rules --------------------------------------------------------------------------------

def test_frame_rules(ref, ours):
    """17k+5 frames <-> 5k+2 latent frames; other counts by the reference's padding (diffusers' frame
    counts for 3..12 latent frames and 1..40 frames, on 1x1 latents); 1 and 2 latent frames by
    ComfyUI's rules (diffusers cannot decode them)."""
    for k in range(4):
        assert ours.frames_for(5 * k + 2) == 17 * k + 5 and ours.latent_frames_for(17 * k + 5) == 5 * k + 2
    for t in range(3, 13):
        assert ref_decode(ref, torch.randn(1, 24, t, 1, 1)).shape[2] == ours.frames_for(t), t
    for frames in (1, 2, 16, 17, 18, 34, 35, 40):
        assert ref_encode(ref, torch.rand(1, 3, frames, 32, 32)).shape[2] == ours.latent_frames_for(frames), frames
    z = torch.randn(1, 24, 1, 3, 2)                       # one latent: 4 frames, the last kept
    assert (ours.decode(z) - (ref_tile(ref, z)[:, :, -1:] * IMAGENET[1] + IMAGENET[0]).clamp(0, 1)).abs().max() <= EXACT
    z = torch.randn(1, 24, 2, 3, 2)                       # two: padded to one chunk, its first 5 frames
    padded = torch.cat([z, z[:, :, -1:].expand(-1, -1, 5, -1, -1)], dim=2)
    assert (ours.decode(z) - ref_decode(ref, padded)[:, :, :5]).abs().max() <= EXACT
    with pytest.raises(Exception):
        ref.decode(z)                                      # diffusers: no chunk for two latent frames


# ---- layouts, files, detection ----------------------------------------------------------------------

def _original(ours: VAE) -> dict:
    """MiniMax's own file: our canonical names plus the training-only mask token, no latent statistics."""
    sd = {k: v for k, v in ours.state_dict().items() if not k.startswith("latents_")}
    sd["decoder.mask_token"] = torch.zeros(1, 1, ours.config.dec_dim)
    return sd


def _comfy(ours: VAE, dtype=torch.float32) -> dict:
    """ComfyUI's repackaged file: the original's names with the statistics (and the mask token)."""
    sd = {**_original(ours), "latents_mean": torch.tensor(LATENTS_MEAN), "latents_std": torch.tensor(LATENTS_STD)}
    return {k: v.to(dtype) for k, v in sd.items()}


def test_every_layout_gives_identical_output(ref, ours, tmp_path):
    z = torch.randn(1, 24, 3, 2, 3)
    layouts = {"diffusers": ref.state_dict(), "original": _original(ours), "comfyui": _comfy(ours),
               "comfyui-prefixed": {f"first_stage_model.{k}": v for k, v in _comfy(ours).items()},
               "wrapped-pickle": {"state_dict": _comfy(ours)}}
    assert_layouts_agree(layouts, tmp_path, "minimax", lambda v: v.decode(z))


def test_file_statistics_are_used(ref, ours):
    """A file's own latent statistics replace the published ones (ComfyUI's buffers)."""
    g = torch.Generator().manual_seed(3)
    sd = _comfy(ours)
    sd["latents_mean"], sd["latents_std"] = torch.randn(24, generator=g), torch.rand(24, generator=g) + 0.5
    v = vae.from_state_dict(sd)
    z = torch.randn(1, 24, 3, 2, 2)
    mean, std = sd["latents_mean"].view(1, -1, 1, 1, 1), sd["latents_std"].view(1, -1, 1, 1, 1)
    with torch.no_grad():
        want = (ref.decode(z * std + mean).sample * IMAGENET[1] + IMAGENET[0]).clamp(0, 1)
    assert (v.decode(z) - want).abs().max() <= EXACT


def test_decoder_only_and_encoder_only_files(ours):
    full = _comfy(ours)
    dec = vae.from_state_dict({k: v for k, v in full.items() if not k.startswith(("encoder.", "quant_conv."))})
    enc = vae.from_state_dict({k: v for k, v in full.items() if not k.startswith(("decoder.", "post_quant_conv."))})
    assert dec.caps.can_decode and not dec.caps.can_encode and "decoder only" in dec.name
    assert enc.caps.can_encode and not enc.caps.can_decode and "encoder only" in enc.name
    z, x = torch.randn(1, 24, 3, 2, 2), torch.rand(1, 3, 5, 32, 32)
    assert torch.equal(dec.decode(z), ours.decode(z)) and torch.equal(enc.encode(x), ours.encode(x))
    with pytest.raises(vae.InputError, match="no encoder"):
        dec.encode(x)


def _other_families() -> dict:
    from helpers import diffusers_kl, diffusers_tiny
    from video_families import tiny_state_dict
    out = {f: tiny_state_dict(f) for f in FAMILIES if f != "minimax"}
    out.update(kl=diffusers_kl().state_dict(), taesd=diffusers_tiny().state_dict())
    return out


def _halves(sd: dict) -> list[dict]:
    """The dict, its encoder-only and decoder-only parts (as the names split them)."""
    enc = {k: v for k, v in sd.items() if not k.startswith(("decoder.", "post_quant_conv."))}
    dec = {k: v for k, v in sd.items() if not k.startswith(("encoder.", "quant_conv."))}
    return [sd] + [h for h in (enc, dec) if h and len(h) < len(sd)]


def test_detection_both_ways(ref, ours):
    """Every MiniMax layout (and its halves) is found by MiniMax alone; no other family's state dict
    (nor its canonical layout, nor their halves) is claimed by it."""
    for name, sd in {"diffusers": ref.state_dict(), "original": _original(ours), "comfyui": _comfy(ours)}.items():
        for part in _halves(sd):
            assert [s.id for s in registry.REGISTRY if s.detect(part)] == ["minimax"], name
    for name, other in _other_families().items():
        spec = next(s for s in registry.REGISTRY if s.detect(other))
        for layout in (other, spec.to_canonical(other)):
            for part in _halves(layout):
                assert not mm.SPEC.detect(part), name


def test_latent_hint_names_minimax(ours):
    from video_families import tiny_state_dict
    wan = vae.from_state_dict(tiny_state_dict("wan"))
    with pytest.raises(vae.InputError, match=r"24 channels \(as MiniMax H3 latents do\)"):
        wan.decode(torch.randn(1, 24, 2, 2, 2))


# ---- ComfyUI's int8 file ---------------------------------------------------------------------------

def _hadamard(n: int) -> torch.Tensor:
    """The regular Hadamard matrix ComfyUI rotates with, built here by its definition (Kronecker
    powers of the 4x4 one with -1 on the anti-diagonal), normalised."""
    h4 = torch.tensor([[1., 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64)
    h = h4
    while h.shape[0] < n:
        h = torch.kron(h, h4)
    return h / math.sqrt(n)


def _int8(sd: dict, group: int) -> tuple[dict, dict]:
    """ComfyUI's int8 file from a float one (the blocks' Linears rotated per group and quantized per
    row, as comfy_kitchen does), and the float weights that file stands for (fp16, as ComfyUI runs it)."""
    q_sd, deq = dict(sd), dict(sd)
    conf = torch.tensor(list(json.dumps({"format": "int8_tensorwise", "convrot": True,
                                         "convrot_groupsize": group}).encode()), dtype=torch.uint8)
    h = _hadamard(group)
    for k, w in sd.items():
        if k.startswith("decoder.transformer_blocks.") and k.endswith((".to_qkv.weight", ".to_out.weight",
                                                                       ".w1.weight", ".w2.weight")):
            rot = (w.double().reshape(w.shape[0], -1, group) @ h).reshape(w.shape)
            scale = rot.abs().amax(1, keepdim=True) / 127
            q = (rot / scale).round().clamp(-127, 127).to(torch.int8)
            base = k[: -len("weight")]
            q_sd.update({k: q, base + "weight_scale": scale.float(), base + "comfy_quant": conf.clone()})
            back = (q.double() * scale.float().double()).reshape(w.shape[0], -1, group) @ h
            deq[k] = back.reshape(w.shape).float().half().float()
    return q_sd, deq


def test_int8_file_runs_as_comfyui(ours):
    """int8 weights + per-row scales + comfy_quant: kept int8 and run as ComfyUI runs them (core's
    int8 linear): activations rotated by the same Hadamard matrix in their dtype, quantized per row
    (row max / 127, rounded, clamped), an int8 matmul with exact integer sums, scaled back in float32.
    Checked against that arithmetic written out here (the sums in float64), and the decode within int8
    rounding of the float file the int8 one stands for. Core itself: bench/comfyui_checks/compare_core.py
    --family minimax."""
    sd = _comfy(ours)
    q_sd, deq = _int8(sd, 64)                            # the tiny width is 128: groups of 64 (ComfyUI's 256 divide 2048)
    v8, vf = vae.from_state_dict(q_sd), vae.from_state_dict(deq)
    assert "int8 decoder (8 layers" in v8.name
    lin = v8.model.decoder.transformer_blocks[0].attn.to_qkv
    assert lin.weight.dtype == torch.int8 and lin.weight_scale.dtype == torch.float32
    # the weight-only view: fp16 rounding of the same value (float64 here, float32 there: 1 fp16 ulp at most)
    assert (lin.dequantized(torch.float32) - deq["decoder.transformer_blocks.0.attn.to_qkv.weight"]).abs().max() <= 1e-4
    w = sd["decoder.transformer_blocks.0.attn.to_qkv.weight"]
    assert (lin.dequantized(torch.float32) - w).norm() <= 0.01 * w.norm()     # int8 rounding: under 1%
    x = torch.randn(2, 5, lin.in_features) * 3
    xr = (x.reshape(-1, lin.in_features // 64, 64) @ _hadamard(64).float()).reshape(-1, lin.in_features)
    s = (xr.abs().amax(1, keepdim=True) / 127).clamp(min=1e-30)
    qx = (xr / s).round().clamp(-128, 127)
    expect = (qx.double() @ lin.weight.double().t()) * (s.double() * lin.weight_scale.double().t()) + lin.bias.double()
    with torch.inference_mode():
        got = lin(x).reshape(-1, lin.out_features)
        weight_only = torch.nn.functional.linear(x, lin.dequantized(torch.float32), lin.bias).reshape_as(got)
    assert (got.double() - expect).abs().max() <= 1e-6 * expect.abs().max()
    assert (weight_only.double() - expect).abs().max() > 1e-4 * expect.abs().max()   # the activations are quantized
    z = torch.randn(1, 24, 3, 2, 2)
    assert (v8.decode(z) - vf.decode(z)).abs().max() <= 2e-2
    v8.to(dtype=torch.float16)                            # the scale stays float32 whatever the model's dtype
    assert lin.weight_scale.dtype == torch.float32 and lin.weight.dtype == torch.int8


def test_template_file_names_load(pack, ours, tmp_path, monkeypatch):
    """The VAE files ComfyUI's MiniMax H3 templates load (10 loads in comfyui-workflow-templates 0.1.123:
    the int8 file in 9, the fp16 file in the text-to-image one), in their layouts, through our loader and
    the VAE Load node's file listing."""
    from safetensors.torch import save_file
    models = tmp_path / "vae"
    models.mkdir()
    names = {"minimax_h3_video_vae_int8_convrot.safetensors": _int8(_comfy(ours, torch.float16), 64)[0],
             "minimax_h3_video_vae_fp16.safetensors": _comfy(ours, torch.float16)}
    for name, sd in names.items():
        save_file({k: v.contiguous() for k, v in sd.items()}, str(models / name))
    monkeypatch.setenv("VAEKIT_MODEL_DIRS", str(tmp_path))
    from vaekit.nodes._comfy import vae_choices
    assert sorted(names) == sorted(vae_choices())
    z = torch.randn(1, 24, 3, 2, 2)
    for name in names:
        v = vae.load(models / name)
        (node,) = pack.NODE_CLASS_MAPPINGS["VAEKitLoad"]().load(name, "fp32", "cpu")
        assert v.spec.id == node.handle.spec.id == "minimax"
        assert v.dtype == node.handle.dtype == torch.float32                  # fp16 on disk, run in fp32
        assert (node.handle.decode(z) - ours.decode(z)).abs().max() <= 0.02, name


# ---- the engine schedules the definition's units --------------------------------------------------

def test_progress_interrupt_and_no_state_left(ours):
    z = torch.randn(1, 24, 8, 20, 18)                     # 2 chunks x 2 x 2 tiles of 256 px
    calls = []
    full = ours.decode(z, progress=lambda d, n: calls.append((d, n)))
    assert calls == [(i, 8) for i in range(1, 9)]
    attrs = module_attrs(ours.model)

    def stop(done, total):
        if done == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        ours.decode(z, progress=stop)
    assert module_attrs(ours.model) == attrs and torch.equal(ours.decode(z), full)


def test_memory_needed_is_one_units(ours):
    """One unit's working set whatever the clip's length or size: a decode unit is 7 latent frames of
    at most 16 x 16 (256 px), an encode unit 17 frames of at most 256 x 256 px."""
    from vae.engine import memory
    small, large = ours.memory_needed((1, 24, 7, 4, 4)), ours.memory_needed((1, 24, 27, 40, 60))
    unit = memory.working_set(ours.model, "decode", (1, 24, 7, 16, 16), ours.dtype)
    assert 0 < small < large == unit
    assert ours.memory_needed((1, 24, 27, 40, 60), tile=512) == unit          # tile sizes given change nothing
    enc = ours.memory_needed((1, 3, 40, 640, 960), op="encode")
    assert enc == memory.working_set(ours.model, "encode", (1, 3, 17, 256, 256), ours.dtype)


def test_budget_is_checked_against_one_unit(ours):
    """The planner cannot shrink the definition's units: a budget below one unit (+ the output, which
    lives on the same device here) is refused naming the smallest that works; that one runs the same
    units, with the same result."""
    import re

    from vae.errors import InputError
    z = torch.randn(1, 24, 8, 20, 18)                     # 2 chunks x 2 x 2 tiles: 8 units; 29 frames of 320 x 288
    need = ours.memory_needed(tuple(z.shape)) + 3 * mm.pixel_frames(8) * 320 * 288 * 4
    with pytest.raises(InputError, match=r"budget.*8 units.*does not fit.*at least [0-9.]+ GB") as e:
        ours.decode(z, budget=need - 1)
    least = float(re.search(r"at least ([0-9.]+) GB", str(e.value)).group(1))
    assert need <= least * (1 << 30) < need + 0.1 * (1 << 30)
    assert torch.equal(ours.decode(z, budget=need), ours.decode(z))
    x = torch.rand(1, 3, 9, 64, 64)
    enc = ours.memory_needed(tuple(x.shape), op="encode")
    with pytest.raises(InputError, match="input 'budget'.*does not fit"):
        ours.encode(x, budget=enc - 1)
    assert torch.equal(ours.encode(x, budget=1 << 40), ours.encode(x))


def test_weights_sum_to_one_and_units_cover_the_output():
    for composition in defined.COMPOSITIONS:
        for size in ((464, 320), (272, 288), (240, 240), (96, 512)):
            tiles, grid = defined.spatial_tiles(size, 16, 256, 64, True, composition)
            total = torch.zeros(size)
            for t in tiles:
                (a, b), (c, d) = t.dst
                total[a:b, c:d] += t.weight()
            assert (total - 1).abs().max() <= 1e-6, (composition, size)
    for t in range(1, 30):                                # every output frame gets weight 1 in all
        got = torch.zeros(mm.pixel_frames(t))
        for chunk in mm.decode_chunks(t):
            for d, w in zip(chunk.dst, chunk.weight):
                if d >= 0:
                    got[d] += w
        assert (got - 1).abs().max() <= 1e-6, t


def test_half_precision_guard_compile_and_fused_qkv(ours):
    from vae.compile import compile_vae
    from vae.engine.guard import eager_copy
    from vae.nn.qkv import fuse_qkv
    report = fuse_qkv(eager_copy(ours.model, lambda t: t))
    assert report.fused == 0 and report.already == 2       # to_qkv is one projection already
    z = torch.randn(1, 24, 3, 2, 2)
    half = vae.from_state_dict(ours.state_dict(), dtype=torch.bfloat16)
    assert (half.decode(z) - ours.decode(z)).abs().max() <= 0.05 and half.last_upcast is not None
    compiled, _ = compile_vae(ours, backend="eager")
    assert torch.equal(compiled.decode(z), ours.decode(z))
    x = torch.rand(1, 3, 5, 32, 32)
    assert torch.equal(compiled.encode(x), ours.encode(x))


# ---- what core's nodes ask of the VAE ------------------------------------------------------------

def test_core_minimax_nodes_calls(pack, ref, ours):
    """Core's MiniMax H3 nodes call vae.encode(IMAGE) (a start image, keyframes, reference clips cut
    to 17k+5 frames); core's VAE answers 24 channels, 16x, frames (a-2)//5*17+5 and (a-5)//17*5+2 on
    the model's grid."""
    from vaekit.nodes.socket import VAEKitVAE
    v = VAEKitVAE(ours)
    assert v.latent_channels == 24 and v.latent_dim == 3 and v.spacial_compression_encode() == 16
    assert [v.upscale_ratio[0](a) for a in (1, 2, 7, 12)] == [1, 5, 22, 39]
    assert [v.downscale_ratio[0](a) for a in (1, 5, 22, 39)] == [1, 2, 7, 12]
    image = torch.rand(1, 48, 32, 3)
    assert v.encode(image).shape == (1, 24, 1, 3, 2)
    clip = torch.rand(22, 48, 32, 3)                      # every frame is used (the model pads its clips)
    out = v.encode(clip)
    assert out.shape == (1, 24, 7, 3, 2)
    assert (out - ref_encode(ref, clip.movedim(-1, 0)[None])).abs().max() <= EXACT
    assert v.decode(out).shape == (1, 22, 48, 32, 3)        # core's VAE.decode: [B, T, H, W, C]


# ---- published config (slow) --------------------------------------------------------------------

def _published_weights() -> dict:
    """The published config's canonical weights, random (seeded per tensor), scaled so activations stay
    O(1) and decoded pixels mostly inside 0..1."""
    g = torch.Generator().manual_seed(0)
    cfg = mm.MiniMaxConfig(enc_widths=(128, 256, 256, 512, 512, 1024), enc_blocks=2,
                           enc_down=(True,) * 4 + (False,) * 2, dec_dim=2048, dec_depth=36, dec_ff=8192)
    with torch.device("meta"):
        shapes = {k: t.shape for k, t in mm.MiniMaxH3VAE(cfg).state_dict().items()}
    sd = {}
    for k, shape in shapes.items():
        r = torch.randn(shape, generator=g)
        if k.endswith(("scale1", "scale2")):
            r *= 0.1
        elif "norm" in k:
            r = 1 + 0.1 * r if k.endswith("weight") else 0.1 * r
        elif k.endswith("bias"):
            r *= 0.02
        elif r.dim() > 1 and "register" not in k:
            r /= r[0].numel() ** 0.5 * (2 if "proj_out" in k else 1)
        sd[k] = r
    sd.update(latents_mean=torch.tensor(LATENTS_MEAN), latents_std=torch.tensor(LATENTS_STD))
    return sd


def _to_diffusers_in_place(sd: dict) -> dict:
    """Canonical -> diffusers' names, tensor by tensor (each fused tensor freed as it is split), so the
    process never holds two copies of the 9.7 GB of weights."""
    rules = [("encoder.down.", "encoder.down_blocks."), (".block.", ".resnets."), (".nin_shortcut.", ".conv_shortcut."),
             (".downsample.", ".downsamplers.0."), ("decoder.x_embedder.", "decoder.proj_in."),
             (".attn.to_out.", ".attn.to_out.0."), (".ff.w2.", ".ff.net.2.")]
    for k in list(sd):
        t = sd.pop(k)
        if k.startswith("latents_"):
            continue
        if ".attn.to_qkv." in k:
            parts = t.reshape(t.shape[0] // 192, 3, 64, *t.shape[1:])
            pre, what = k.split(".to_qkv.")
            for i, p in enumerate("qkv"):
                sd[f"{pre}.to_{p}.{what}"] = parts[:, i].reshape(-1, *t.shape[1:]).contiguous()
            continue
        if ".ff.w1." in k:
            gate, value = t.chunk(2)
            sd[k.replace(".ff.w1.", ".ff.net.0.proj.")] = torch.cat([value, gate])
            continue
        for a, b in rules:
            if a in k and (a != ".block." or k.startswith("encoder.")):
                k = k.replace(a, b)
        sd[k] = t
    return sd


@pytest.mark.slow
def test_published_config_parity():
    """The published config (2.60 G parameters; diffusers' default config is it), random weights, fp32,
    the same tensors on both sides: one frame and clips, both directions, against diffusers. Ours runs
    first, then its weights are renamed in place for diffusers: the process peaks near 10 GB (on a shared
    machine, run it alone)."""
    import gc
    sd = _published_weights()
    v = vae.from_state_dict(sd)
    params = sum(p.numel() for p in v.model.parameters())
    zs = {"decode 1 latent": torch.randn(1, 24, 1, 8, 8), "decode 7 latents": torch.randn(1, 24, 7, 4, 4),
          "decode 12 latents": torch.randn(1, 24, 12, 3, 3)}
    xs = {"encode 1 frame": torch.rand(1, 3, 1, 64, 64), "encode 22 frames": torch.rand(1, 3, 22, 48, 48)}
    outs = {k: v.decode(z) for k, z in zs.items()} | {k: v.encode(x) for k, x in xs.items()}
    del v
    gc.collect()
    with torch.device("meta"):
        ref = diffusers.AutoencoderKLMiniMaxH3()
    ref.load_state_dict(_to_diffusers_in_place(sd), assign=True)
    ref.eval()
    err = {}
    for k, z in zs.items():
        if k == "decode 1 latent":                         # diffusers cannot decode it: its one pass, last frame
            want = (ref_tile(ref, z)[:, :, -1:] * IMAGENET[1] + IMAGENET[0]).clamp(0, 1)
        else:
            want = ref_decode(ref, z)
        err[k] = (outs[k] - want).abs().max().item()
    for k, x in xs.items():
        err[k] = (outs[k] - ref_encode(ref, x)).abs().max().item()
    print(f"MiniMax H3 published config ({params / 1e9:.2f} G parameters), random weights, fp32:")
    for k, e in err.items():
        print(f"  {k} vs diffusers: max abs {e:.2e}")
    assert abs(params / 1e9 - 2.60) < 0.01
    assert max(err.values()) <= 1e-4
