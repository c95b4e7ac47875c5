"""Helpers shared by the tests: the pack imported as a package, tiny reference models."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# the real TAEF2 weights (MIT): $VAEKIT_TAEF2_DIR, else ../shared/data beside the checkout
SHARED_DATA = Path(os.environ.get("VAEKIT_TAEF2_DIR") or ROOT.parent / "shared" / "data")


# a real ComfyUI to run a bench/comfyui_checks script in (skipped without one)
IN_COMFYUI = pytest.mark.skipif(not (os.environ.get("COMFYUI_DIR") and os.environ.get("COMFYUI_PYTHON")),
                                reason="set COMFYUI_DIR and COMFYUI_PYTHON to run this against a real ComfyUI")


def run_in_comfyui(script: str) -> str:
    """``bench/comfyui_checks/<script>`` under ComfyUI's python; its output, asserting it exits 0."""
    import subprocess
    proc = subprocess.run([os.environ["COMFYUI_PYTHON"], str(ROOT / "bench" / "comfyui_checks" / script)],
                          capture_output=True, text=True, timeout=600, cwd=os.environ["COMFYUI_DIR"])
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout


def load_pack():
    """Import the repo root as the package 'vaekit', as ComfyUI imports a custom node folder; its
    library is this ``vae`` (one copy, one set of classes: vae/cli/pack.py)."""
    from vae.cli.pack import load_pack as load
    return load()


def module_attrs(model: torch.nn.Module) -> dict:
    """What is set on each module besides its weights: attribute names and hooks. A call that leaves
    run state (caches, hooks, patched forwards) on shared modules changes this."""
    return {name: (type(m), tuple(sorted(vars(m))), len(m._forward_hooks), len(m._forward_pre_hooks))
            for name, m in model.named_modules()}


def original_module(env: str, what: str):
    """An original repository's source file (e.g. madebyollin's taesd.py), imported from the local copy
    the environment variable ``env`` names: a test-time oracle only. CI has neither network nor a copy,
    so the test is skipped there (``what`` says which copy to give)."""
    import importlib.util
    path = os.environ.get(env)
    if not path or not os.path.isfile(path):
        pytest.skip(f"set {env} to a copy of {what}")
    spec = importlib.util.spec_from_file_location(f"_{env.lower()}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def jitter_norms(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Random GroupNorm affine parameters, so a parity test also checks the norms' weights."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def diffusers_kl(latent_channels: int = 4, quant: bool = True, widths=(32, 64), layers: int = 1):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    n = len(widths)
    m = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=tuple(widths), layers_per_block=layers,
        latent_channels=latent_channels, norm_num_groups=32, use_quant_conv=quant, use_post_quant_conv=quant)
    return jitter_norms(m).eval()


def diffusers_paella(published: bool = False):
    """Stable Cascade's stage A as diffusers has it (``PaellaVQModel``): the published config (2 levels, 12
    bottleneck blocks, 384 wide, 4 latent channels, 8192 codes) or a narrow one of the same structure.
    Random weights with the learned scalars and the latent BatchNorm's statistics off their defaults (so
    parity checks them) and a head that keeps most pixels inside 0..1 (so clamping hides little)."""
    pytest.importorskip("diffusers")
    from diffusers.pipelines.deprecated.wuerstchen.modeling_paella_vq_model import PaellaVQModel
    torch.manual_seed(0)
    m = PaellaVQModel(**({} if published else dict(bottleneck_blocks=2, embed_dim=32, num_vq_embeddings=64)))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("gammas"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
        bn = m.down_blocks[-1][1]
        bn.running_mean.copy_(0.1 * torch.randn(bn.num_features, generator=g))
        bn.running_var.copy_(0.5 + torch.rand(bn.num_features, generator=g))
        bn.weight.add_(0.1 * torch.randn(bn.num_features, generator=g))
        bn.bias.add_(0.1 * torch.randn(bn.num_features, generator=g))
        head = m.out_block[0]
        head.weight.mul_(0.2)
        head.bias.fill_(0.5)
    return m.eval()


def diffusers_qwen21(published: bool = False, **over):
    """Qwen-Image 2.1's VAE (diffusers' defaults are the published config: 5 levels, z 64, RGBA), narrow
    unless ``published``; RMS gammas off 1 so that parity checks them too."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    m = diffusers.AutoencoderKLQwenImage21(**({} if published else dict(base_dim=8, decoder_base_dim=12)), **over)
    return jitter_gammas(m)


def jitter_gammas(m: torch.nn.Module) -> torch.nn.Module:
    """RMS-norm gammas off 1 (a fixed draw), so that parity checks them too; ``m`` in eval mode."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("gamma"):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return m.eval()


# HunyuanImage: the published structures (2.1: 6 levels, 5 spatial resamplers, 64 channels, 32x; 3.0: 5 levels,
# 4 resamplers, the inner 2 also temporal, 32 channels, 16x), narrow (GroupNorm's 32 groups) unless published
HUNYUAN_IMAGE21 = dict(latent_channels=64, block_out_channels=(32, 32, 64, 64, 128, 128), layers_per_block=1)
HUNYUAN_IMAGE21_PUBLISHED = dict(latent_channels=64, block_out_channels=(128, 256, 512, 512, 1024, 1024),
                                 layers_per_block=2)
HUNYUAN_IMAGE3 = dict(latent_channels=32, block_out_channels=(32, 32, 64, 64, 64), layers_per_block=1)
HUNYUAN_IMAGE3_PUBLISHED = dict(latent_channels=32, block_out_channels=(128, 256, 512, 1024, 1024), layers_per_block=2)


def diffusers_hunyuan_image21(published: bool = False, **over):
    """HunyuanImage 2.1's VAE, diffusers' ``AutoencoderKLHunyuanImage`` (its converter's config when
    ``published``), seeded, norms jittered."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    cfg = {**(HUNYUAN_IMAGE21_PUBLISHED if published else HUNYUAN_IMAGE21), **over}
    m = diffusers.AutoencoderKLHunyuanImage(in_channels=3, out_channels=3, spatial_compression_ratio=32,
                                            sample_size=384, **cfg)
    return jitter_norms(m, scale=0.2).eval()


def hunyuan_image3(published: bool = False, **over):
    """HunyuanImage 3.0's VAE (diffusers has no class): our model, seeded, norms jittered. Its state dict
    (``hunyuan_image3_file``) is in Tencent's = ComfyUI's names; tests/vae/test_hunyuan_image.py checks the
    model against Tencent's ``AutoencoderKLConv3D`` when HUNYUAN_IMAGE3_REFERENCE names a copy."""
    from vae.archs import hunyuan_image
    from vae.archs.hunyuan_video15 import Resample
    cfg = {**(HUNYUAN_IMAGE3_PUBLISHED if published else HUNYUAN_IMAGE3), **over}
    w = cfg["block_out_channels"]
    down = tuple(Resample(w[i + 1], i >= 2) for i in range(len(w) - 1)) + (None,)
    up = (None,) + tuple(Resample(w[i - 1], i >= len(w) - 2) for i in range(1, len(w)))
    torch.manual_seed(0)
    m = hunyuan_image.HunyuanImageVAE(hunyuan_image.HunyuanImageConfig(
        widths=tuple(w), layers_per_block=cfg["layers_per_block"], latent_channels=cfg["latent_channels"],
        down=down, up=up, dims=3))
    return jitter_norms(m, scale=0.2).eval()


def hunyuan_image3_file(published: bool = False, **over) -> dict:
    from vae.archs import hunyuan_image_layout
    return hunyuan_image_layout.to_original({k: v.contiguous() for k, v in hunyuan_image3(published, **over)
                                             .state_dict().items()})


def diffusers_tiny(latent_channels: int = 4, width: int = 16):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    return diffusers.AutoencoderTiny(
        encoder_block_out_channels=(width,) * 4, decoder_block_out_channels=(width,) * 4,
        num_encoder_blocks=(1, 2, 2, 2), num_decoder_blocks=(2, 2, 2, 1),
        latent_channels=latent_channels).eval()


def reference_state_dicts() -> dict[str, dict]:
    """A small file of each family that has a reference class (KL for SD and Flux.1, TAESD, every row of
    tests/video_families.py, the Consistency Decoder where its tests are in), for detection across
    families: a family's own tests add the others they know of."""
    import importlib.util

    from video_families import FAMILIES, tiny_state_dict
    out = {"kl-sd": diffusers_kl().state_dict(), "kl-flux1": diffusers_kl(16, quant=False).state_dict(),
           "tiny": diffusers_tiny().state_dict(), "hunyuan_image21": diffusers_hunyuan_image21().state_dict(),
           "hunyuan_image3": hunyuan_image3_file(), "stage_a": diffusers_paella().state_dict()}
    out.update({f: tiny_state_dict(f) for f in FAMILIES})
    consistency = ROOT / "tests" / "vae" / "test_consistency.py"
    if consistency.is_file():
        spec = importlib.util.spec_from_file_location("_helpers_consistency", consistency)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out["consistency"] = mod.diffusers_consistency(**mod.TINY).state_dict()
    return out


class PointwiseVideo(torch.nn.Module):
    """A stand-in video VAE without spatial mixing and with ``memory`` latent frames of causal
    temporal mixing: latent 0 decodes to one frame, latent i to r frames. With memory 0 it is
    'identity-like'; with memory 1 every frame also sees the previous latent (a causal decoder)."""

    def __init__(self, channels: int = 4, r: int = 4, s: int = 8, memory: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.r, self.s, self.memory = r, s, memory
        self.dec = torch.nn.Parameter(torch.randn(r, 3, channels, generator=g))      # per sub-frame
        self.prev = torch.nn.Parameter(torch.randn(3, channels, generator=g) * 0.5)
        self.enc = torch.nn.Parameter(torch.randn(channels, 3, generator=g))

    def decode(self, z):
        b, c, t, h, w = z.shape
        out = torch.einsum("kdc,bcthw->btkdhw", self.dec, z)                      # (B, t, r, 3, h, w)
        if self.memory:
            prev = torch.cat([z[:, :, :1], z[:, :, :-1]], dim=2)
            out = out + torch.einsum("dc,bcthw->btdhw", self.prev, prev)[:, :, None]
        frames = torch.cat([out[:, 0, -1:], out[:, 1:].flatten(1, 2)], dim=1)      # 1 + r(t-1) frames
        frames = frames.movedim(2, 1)                                                # (B, 3, T, h, w)
        return frames.repeat_interleave(self.s, -1).repeat_interleave(self.s, -2)

    def encode(self, x):
        b, _, t, h, w = x.shape
        x = torch.nn.functional.avg_pool3d(x, (1, self.s, self.s))
        first, rest = x[:, :, :1], x[:, :, 1:]
        groups = rest.reshape(b, 3, (t - 1) // self.r, self.r, h // self.s, w // self.s).mean(3)
        return torch.einsum("cd,bdthw->bcthw", self.enc, torch.cat([first, groups], dim=2))


def pointwise_video_vae(channels: int = 4, r: int = 4, s: int = 8, memory: int = 0, tile_frames: int = 16,
                        package: str = "vae"):
    """``package``: "vae" for library tests, "vaekit.vae" for node tests (the pack's own classes)."""
    import importlib
    VAE = importlib.import_module(f"{package}.handle").VAE
    spec_mod = importlib.import_module(f"{package}.spec")
    ArchSpec, Capabilities = spec_mod.ArchSpec, spec_mod.Capabilities
    caps = Capabilities(latent_channels=channels, spatial_ratio=s, temporal_ratio=r, causal_decoder=True,
                        causal_encoder=True, default_tile_frames=tile_frames)
    spec = ArchSpec(id="pointwise-video", name="pointwise video stand-in", detect=lambda sd: False,
                    to_canonical=dict, config_from_state_dict=lambda sd, hint: None,
                    build=lambda cfg: PointwiseVideo(channels, r, s, memory), capabilities=lambda cfg: caps)
    return VAE(spec, None, PointwiseVideo(channels, r, s, memory).eval())


def halves(sd: dict) -> tuple[dict, dict]:
    """A state dict's encoder and decoder keys (an encoder-only and a decoder-only file)."""
    return ({k: v for k, v in sd.items() if k.startswith("encoder.")},
            {k: v for k, v in sd.items() if k.startswith("decoder.")})


def assert_budget_plans_exact_tiles(v, z: torch.Tensor, gpu_latent: tuple, encode_shape: tuple, caplog,
                                    tile: int = 64) -> None:
    """The memory planner (vae/engine/budget.py) on a video VAE whose exact tiles meet in rounds: below the
    untiled prediction for decoding ``z`` on the CPU it plans smaller exact tiles, with the untiled result;
    planned for a GPU (paused tiles wait in host memory), the tiles of a ``gpu_latent`` decode need at most
    half the untiled pass beyond the calibration's fixed bytes; memory managers get a number both ways."""
    import logging

    from vae.engine import budget, memory
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    side = z.shape[-1] * v.caps.spatial_ratio
    untiled = budget.plan(v, v.call_for("decode", z.shape, mode="exact"), 1 << 40, cpu, cpu, cpu)
    assert untiled.call.tile >= side
    with caplog.at_level(logging.INFO, logger="VAEKit"):
        out = v.decode(z, mode="exact", budget=untiled.on_device() - 1)
    line = next(r.message for r in caplog.records if "predicted on cpu" in r.message)
    assert "exact" in line and "px tiles" in line, line
    assert (out - v.decode(z)).abs().max() <= 1e-5
    call = v.call_for("decode", gpu_latent, mode="exact")
    fixed = memory.calibration(gpu)[1]          # the calibration's fixed bytes: no tile shrinks them
    whole = budget.plan(v, call, 1 << 40, gpu, cpu, cpu).on_device()
    half = fixed + (whole - fixed) // 2
    p = budget.plan(v, call, half, gpu, cpu, cpu)
    assert p.call.tile < gpu_latent[-1] * v.caps.spatial_ratio and p.on_device() <= half
    for op, shape in (("decode", z.shape), ("encode", encode_shape)):
        need = v.memory_needed(shape, op, tile=tile, mode="exact")
        assert isinstance(need, int) and need > 0, op


def assert_exact_tiles_both_ways(v, z: torch.Tensor, x: torch.Tensor, tile: int, overlap: int, parity: float,
                                 visible: float) -> None:
    """Tiles far narrower than the model's reach: exact tiles reproduce the untiled decode of ``z`` and
    encode of ``x`` within ``parity``; fast (blended) tiles change each by more than ``visible``, so the
    case is not trivially seamless."""
    for call, inp in ((v.decode, z), (v.encode, x)):
        untiled = call(inp)
        assert (call(inp, tile=tile, overlap=overlap) - untiled).abs().max() > visible
        assert (call(inp, tile=tile, mode="exact") - untiled).abs().max() <= parity


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``model`` by name."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def assert_same_weights(a, b, name: str = "") -> None:
    """Two handles hold the same weights the same way: equal values (copies of the same numbers), the
    same dtypes and strides, and each tensor at the start of memory of its own (storage offset 0,
    64-byte aligned: where the CPU allocator puts a fresh tensor; a memory-mapped file's tensors sit
    at any byte offset). Kernels choose their path from exactly these, so the two run bit for bit the
    same: what makes the layout tests' bit-identical outputs hold on any CPU, by construction."""
    ta, tb = model_tensors(a.model), model_tensors(b.model)
    assert ta.keys() == tb.keys(), name
    for k, t in ta.items():
        u = tb[k]
        assert (t.dtype, t.shape, t.stride()) == (u.dtype, u.shape, u.stride()), (name, k)
        # BatchNorm's training counter is never read in eval; files differ in it (some savers drop it)
        assert k.endswith("num_batches_tracked") or torch.equal(t, u), (name, k)
        for x in (t, u):
            assert x.storage_offset() == 0 and x.data_ptr() % 64 == 0, (name, k, x.storage_offset(), x.data_ptr() % 64)


def assert_layouts_agree(layouts: dict, tmp_path, spec_id: str, run) -> None:
    """Save each key layout as users have it on disk (a dict of tensors as .safetensors, a wrapped
    one such as {"state_dict": ...} as a pickle checkpoint), load it with ``vae.load``, check the
    family found, and require the same weights held the same way (``assert_same_weights``) and
    bit-identical results of ``run(vae)`` for every layout: the loader hands every layout's tensors to
    the model as fresh contiguous copies, so the same kernels run on the same numbers."""
    from safetensors.torch import save_file

    import vae
    first = None
    for name, sd in layouts.items():
        if all(torch.is_tensor(v) for v in sd.values()):
            path = tmp_path / f"{name}.safetensors"
            save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
        else:
            path = tmp_path / f"{name}.pt"
            torch.save(sd, path)
        v = vae.load(path)
        assert v.spec.id == spec_id, name
        out = run(v)
        if first is None:
            first = v, out
            continue
        assert_same_weights(first[0], v, name)
        assert torch.equal(out, first[1]), name


def spy_tensor_reads(monkeypatch) -> list:
    """Record every tensor the loader reads from a .safetensors file (through safetensors' safe_open)."""
    from vae import loading
    read, real = [], loading.safe_open

    class Spy:
        def __init__(self, *a, **kw):
            self.f = real(*a, **kw)

        def __enter__(self):
            self.inner = self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def keys(self):
            return self.inner.keys()

        def get_tensor(self, key):
            read.append(key)
            return self.inner.get_tensor(key)

    monkeypatch.setattr(loading, "safe_open", Spy)
    return read


def run_core_check(family: str) -> None:
    """``bench/comfyui_checks/compare_core.py --family FAMILY --quick --check`` against ComfyUI core
    (COMFYUI_DIR / COMFYUI_PYTHON: the caller skips without them); its table printed, asserting it exits 0
    (every parity row within 1e-4)."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "comfyui_checks" / "compare_core.py"), "--family",
                           family, "--comfyui", os.environ["COMFYUI_DIR"], "--python", os.environ["COMFYUI_PYTHON"],
                           "--quick", "--check"], capture_output=True, text=True, timeout=1800)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def core_parity_rows(family: str, tmp_path, *flags: str) -> list[dict]:
    """Run ``bench/comfyui_checks/compare_core.py --family FAMILY`` against ComfyUI core (COMFYUI_DIR /
    COMFYUI_PYTHON: the caller skips without them) with ``--json``; its ``parity`` rows, asserted non-empty."""
    import json
    import subprocess
    import sys
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "comfyui_checks" / "compare_core.py"), "--family",
                           family, *flags, "--comfyui",
                           os.environ["COMFYUI_DIR"], "--python", os.environ["COMFYUI_PYTHON"], "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parity = [r for r in json.loads(out.read_text()) if r["parity"]]
    assert parity
    return parity



def count_parked(mp: pytest.MonkeyPatch) -> list[int]:
    """With ``mp``, each park of vae/engine/park.py records the bytes it parked in the returned list."""
    from vae.engine import park
    moved, real = [], park.park

    def spy(*args, **kwargs):
        p = real(*args, **kwargs)
        moved.append(p.bytes)
        return p
    mp.setattr(park, "park", spy)
    return moved
