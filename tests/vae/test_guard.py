"""The fp16/bf16 NaN guard: tiles whose half-precision output overflows are recomputed upcast, the
log names them, the shared model is never changed, and fp32 handles never run the guard."""
from __future__ import annotations

import logging

import pytest
import torch

from vae import NonFiniteError, from_state_dict
from vae.engine import guard
from vae.archs import kl
from vae.handle import VAE
from helpers import module_attrs

CFG = kl.KLConfig(ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=4, embed_dim=4)
SCALE = 3000.0     # decoder.conv_in x3000: the residual stream carries ~3000x the latent (as SDXL's VAE overflows)


def _kl_pair(side: str = "decoder") -> tuple[VAE, VAE]:
    """The same overflow-prone weights as an fp32 and an fp16 handle. The scaled conv feeds the
    residual stream, whose later GroupNorms undo the scale: fp32 output stays sane, fp16 activations
    exceed 65504 wherever the input is large."""
    torch.manual_seed(0)
    model = kl.AutoencoderKL(CFG).eval().requires_grad_(False)
    with torch.no_grad():
        conv = getattr(model, side).conv_in
        conv.weight.mul_(SCALE if side == "decoder" else 30 * SCALE)       # pixels are at most 1
        conv.bias.mul_(SCALE) if side == "decoder" else conv.bias.zero_()
    sd = model.state_dict()
    return from_state_dict(sd), from_state_dict(sd, dtype=torch.float16)


def _latent() -> torch.Tensor:
    z = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    z[:, :, 2:6, 11:15] *= 30            # large values in the top-right quarter only
    return z


def test_raw_fp16_overflows_so_the_tests_mean_something():
    _, v16 = _kl_pair()
    with torch.inference_mode():
        y = v16.model.decode(v16._model_input(_latent()))
    assert not torch.isfinite(y).all()


@pytest.mark.parametrize("tile", [None, 16])
def test_decode_overflow_is_recomputed_and_logged(tile, caplog):
    v32, v16 = _kl_pair()
    z = _latent()
    ref = v32.decode(z, tile=tile)
    sd_before = {k: v.clone() for k, v in v16.model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        out = v16.decode(z, tile=tile)
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max() <= 1e-2
    rec = v16.last_upcast
    want = ((0, 0),) if tile is None else ((0, 1),)          # 2x2 tiles: only the top-right one overflows
    assert rec.tiles == want and rec.dtypes == (torch.float32,) and not rec.failed
    assert rec.total == (1 if tile is None else 4)
    lines = [r.getMessage() for r in caplog.records if r.name == "VAEKit"]
    assert len(lines) == 1
    assert f"{len(want)} of {rec.total} tiles overflowed in float16 and were recomputed in float32" in lines[0]
    assert "(0,1)" in lines[0] or tile is None
    # the shared model was only read
    after = v16.model.state_dict()
    assert v16.dtype == torch.float16 and all(torch.equal(sd_before[k], after[k]) for k in after)


def test_exact_mode_recomputes_the_whole_run():
    v32, v16 = _kl_pair()
    z = _latent()
    out = v16.decode(z, tile=16, mode="exact")
    assert torch.isfinite(out).all() and (out - v32.decode(z, tile=16, mode="exact")).abs().max() <= 1e-2
    assert v16.last_upcast.whole and "recomputed whole in float32" in v16.last_upcast.message


def test_encode_overflow_is_recomputed():
    v32, v16 = _kl_pair("encoder")
    x = torch.full((1, 3, 32, 32), 0.5)          # 0.5 is 0 at the model's input: no activation
    x[:, :, :8, :8] = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    ref = v32.encode(x, tile=16)
    out = v16.encode(x, tile=16)
    assert torch.isfinite(out).all() and (out - ref).abs().max() <= 1e-2 * ref.abs().max()
    assert v16.last_upcast.op == "encode" and v16.last_upcast.tiles == ((0, 0),)


def test_no_overflow_no_recompute():
    _, v16 = _kl_pair()
    z = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    assert torch.isfinite(v16.decode(z)).all()
    assert v16.last_upcast.tiles == () and v16.last_upcast.total == 1


def test_fp32_handles_never_run_the_guard(monkeypatch):
    v32, _ = _kl_pair()

    def boom(*_a, **_k):
        raise AssertionError("the guard ran on an fp32 handle")
    monkeypatch.setattr(guard, "finite", boom)
    monkeypatch.setattr(guard, "upcast_copy", boom)
    v32.decode(_latent(), tile=16)
    v32.encode(torch.rand(1, 3, 16, 16))
    assert v32.last_upcast is None


def test_failure_during_recompute_leaves_the_shared_model_intact(monkeypatch):
    _, v16 = _kl_pair()
    before = {k: v.clone() for k, v in v16.model.state_dict().items()}
    real = guard.upcast_copy

    def failing_copy(model, dtype):
        m = real(model, dtype)
        m.decode = lambda *_a, **_k: (_ for _ in ()).throw(MemoryError("out of memory (simulated)"))
        return m
    monkeypatch.setattr(guard, "upcast_copy", failing_copy)
    with pytest.raises(MemoryError):
        v16.decode(_latent(), tile=16)
    after = v16.model.state_dict()
    assert v16.dtype == torch.float16 and all(torch.equal(before[k], after[k]) for k in after)
    monkeypatch.setattr(guard, "upcast_copy", real)
    assert torch.isfinite(v16.decode(_latent(), tile=16)).all()


def test_upcast_copy_of_a_compiled_model_is_eager():
    _, v16 = _kl_pair()
    v16.model.decoder.compile()                   # never run: compiling costs nothing until called
    v16.model.encoder = torch.compile(v16.model.encoder)
    v16.model.decode = torch.compile(v16.model.decode)
    m = guard.upcast_copy(v16.model, torch.float32)
    assert m.decoder._compiled_call_impl is None and not hasattr(m.encoder, "_orig_mod")
    assert "decode" not in vars(m) and m.decode.__self__ is m
    assert next(m.parameters()).dtype == torch.float32 and v16.dtype == torch.float16
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(m.parameters(), v16.model.parameters()))


def test_cpu_upcasts_to_fp32():
    assert guard.ladder(torch.float16, torch.device("cpu")) == (torch.float32,)
    assert guard.ladder(torch.bfloat16, torch.device("cpu")) == (torch.float32,)


@pytest.fixture
def two_cards(monkeypatch):
    """A CUDA machine as PyTorch reports it, without a GPU: cuda:0 (also plain ``cuda``, the current
    device) an Ampere card (capability 8.6); cuda:1 a Turing card (7.5, a T4). ``is_bf16_supported()``
    says yes, as it does on any card by default (it counts emulation) when the current one is Ampere."""
    caps = {0: (8, 6), 1: (7, 5)}
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: caps[torch.device(device or "cuda").index or 0])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)


def test_bf16_is_chosen_by_the_devices_compute_capability(two_cards, pack, monkeypatch):
    """The guard's first retry for fp16 and the standalone default dtype both run bf16 only on a device of
    compute capability 8.0 or later: the VAE's device, not the current one, and not by emulation."""
    from vaekit.nodes import _comfy
    monkeypatch.setattr(_comfy, "model_management", lambda: None)       # standalone
    ampere, turing = torch.device("cuda:0"), torch.device("cuda:1")
    assert guard.ladder(torch.float16, ampere) == guard.LADDER_CUDA == (torch.bfloat16, torch.float32)
    assert guard.ladder(torch.float16, turing) == (torch.float32,)
    working = (torch.bfloat16, torch.float32)
    assert _comfy.pick_dtype("auto", ampere, working) == torch.bfloat16
    assert _comfy.pick_dtype("auto", turing, working) == torch.float32
    assert _comfy.pick_dtype("auto", ampere, (torch.float32,)) == torch.float32


def test_streamed_decode_replays_the_tile_stream_upcast(caplog):
    """Magvit streams a clip chunk by chunk through causal caches: the overflow is in the second
    latent frame of the right half only, so the right tile's stream is replayed upcast from its first
    chunk (a cold cache would give a first chunk's frame count, and the run would fail)."""
    from video_families import tiny_state_dict
    sd = {k: v * 20000 if k.startswith("decoder.conv_in") else v for k, v in tiny_state_dict("magvit").items()}
    v32, v16 = from_state_dict(sd), from_state_dict(sd, dtype=torch.float16)
    assert v16.caps.stream_decode
    attrs = module_attrs(v16.model)
    z = torch.randn(1, 16, 2, 2, 4, generator=torch.Generator().manual_seed(1))
    z[:, :, 1, :, 2:] *= 30
    kw = dict(tile_frames=4, tile=16, overlap=0)            # 2 chunks x 2 spatial tiles
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        out = v16.decode(z, **kw)
    assert torch.isfinite(out).all() and (out - v32.decode(z, **kw)).abs().max() <= 1e-2
    rec = v16.last_upcast
    assert rec.streamed and rec.tiles == ((0, 1),) and rec.total == 2
    assert "1 of 2 spatial tiles overflowed in float16 and were re-streamed" in caplog.text
    assert module_attrs(v16.model) == attrs


# ---- no silent NaN: what the guard cannot fix is an error with its likely cause ------------------

def test_fp32_nan_weights_are_named_not_returned():
    v32, _ = _kl_pair()
    sd = v32.state_dict()
    sd["decoder.mid.block_1.conv1.weight"][0, 0, 0, 0] = float("nan")
    v = from_state_dict(sd)
    with pytest.raises(NonFiniteError, match=r"input 'vae'.*decoder\.mid\.block_1\.conv1\.weight.*Fix: the VAE file is damaged"):
        v.decode(_latent())


def test_an_overflowing_latent_is_named():
    v32, _ = _kl_pair()
    z = _latent() * 1e36                 # finite, but the decoder's activations overflow float32
    assert torch.isfinite(z).all()
    with pytest.raises(NonFiniteError, match=r"input 'samples'.*values reach .*e\+3\d.*Fix: check the sampler"):
        v32.decode(z)


def test_a_nan_decode_option_is_named():
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("_ltx_tiny", Path(__file__).with_name("test_ltx.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    v = from_state_dict(mod._tiny("0.9.1").state_dict())
    with pytest.raises(NonFiniteError, match=r"input 'timestep'.*'timestep' is nan"):
        v.decode(torch.randn(1, v.caps.latent_channels, 2, 2, 2), timestep=float("nan"))


def test_half_precision_that_stays_broken_upcast_is_an_error(caplog):
    """NaN weights overflow in every precision: the guard recomputes in float32, then the call fails
    (never a log line and the NaNs returned)."""
    v32, _ = _kl_pair()
    sd = v32.state_dict()
    sd["decoder.conv_out.bias"][0] = float("inf")          # one value: the loader warns, loads
    v16 = from_state_dict(sd, dtype=torch.float16)
    with pytest.raises(NonFiniteError, match="input 'vae'.*conv_out.bias"):
        v16.decode(_latent())
