"""The checks every diffusers class's face takes (tests/vae/test_diffusers_face*.py): the face against
diffusers' own class on the same weights (decode, the posterior's attributes and draws, the config and the
attributes pipelines read), and the same call within a budget below one pass equal to one pass."""
from __future__ import annotations

import logging

import torch
from safetensors.torch import save_file

import vae
from ltx_common import randomize
from vae.engine import budget as planner

TOL = 1e-4
# what the classes set on themselves that pipelines read
ATTRIBUTES = ("z_dim", "temperal_downsample", "spatial_compression_ratio", "temporal_compression_ratio",
              "spatial_scale_factor", "latent_magnitude", "latent_shift")

LTX_LATENT = 8
_LTX_DEC_091 = dict(decoder_spatio_temporal_scaling=(True,) * 3, upsample_residual=(True,) * 3,
                    upsample_factor=(2, 2, 2), timestep_conditioning=True)
# each version's structure, narrow (tests/vae/test_ltx.py)
LTX = {
    "0.9.0": dict(block_out_channels=(8, 16, 32, 32), decoder_block_out_channels=(8, 16, 32, 32),
                  layers_per_block=(1,) * 5, decoder_layers_per_block=(1,) * 5),
    "0.9.1": dict(block_out_channels=(8, 16, 32, 32), layers_per_block=(1,) * 5,
                  decoder_block_out_channels=(16, 32, 64), decoder_layers_per_block=(1, 1, 1, 2),
                  decoder_inject_noise=(True, True, True, False), **_LTX_DEC_091),
    "0.9.5": dict(block_out_channels=(8, 16, 32, 64, 128), down_block_types=("LTXVideo095DownBlock3D",) * 4,
                  layers_per_block=(1,) * 5, spatio_temporal_scaling=(True,) * 4,
                  downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
                  decoder_block_out_channels=(16, 32, 64), decoder_layers_per_block=(1, 1, 1, 2),
                  decoder_inject_noise=(False,) * 4, spatial_compression_ratio=32, temporal_compression_ratio=8,
                  **_LTX_DEC_091),
}


def ltx_reference(version: str):
    """diffusers' LTX-Video VAE of ``version``'s structure, statistics and noise scales random."""
    torch.manual_seed(0)
    from diffusers import AutoencoderKLLTXVideo     # a test dependency: imported where a test needs it
    return randomize(AutoencoderKLLTXVideo(latent_channels=LTX_LATENT, **LTX[version]), LTX_LATENT)


def save(ref, how: str, tmp_path):
    """``ref``'s weights as a pipeline's folder (``how`` = "folder": its vae/ is read) or a single file named ``how``."""
    if how == "folder":
        ref.save_pretrained(tmp_path / "pipe" / "vae")
        return tmp_path / "pipe"
    path = tmp_path / how
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return path


def pixels(shape, seed=0):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def close(a, b, tol=TOL):
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    assert (a - b).abs().max() <= tol, (a - b).abs().max()
    return float((a - b).abs().max())


def assert_decode_equal(face, ref, z, *inputs) -> float:
    """decode(z, *inputs) of both, both return forms; the max abs difference."""
    with torch.no_grad():
        want = ref.decode(z, *inputs).sample
    close(face.decode(z, *inputs, return_dict=False)[0], want)
    return close(face.decode(z, *inputs).sample, want)


def assert_posterior_equal(face, ref, x) -> float:
    """The posterior's attributes, mode, kl both ways and draws from the same generator(s); the max abs difference."""
    with torch.no_grad():
        want = ref.encode(x).latent_dist
    got = face.encode(x).latent_dist
    worst = max(close(getattr(got, attr), getattr(want, attr)) for attr in ("mean", "logvar", "std", "var", "parameters"))
    close(got.mode(), want.mode())
    close(got.kl(), want.kl())
    close(got.kl(want), want.kl(got))      # both directions through the other's variance
    worst = max(worst, close(got.sample(torch.Generator().manual_seed(7)), want.sample(torch.Generator().manual_seed(7))))
    gens = lambda: [torch.Generator().manual_seed(s) for s in range(x.shape[0])]     # noqa: E731
    close(got.sample(gens()), want.sample(gens()))
    close(face.encode(x, return_dict=False)[0].mean, want.mean)
    return worst


def _plain(v):
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


def config_differences(face, ref) -> dict:
    """{key: (face's, diffusers')} for each key of diffusers' config of the same model that differs, after
    checking the attributes the class sets that pipelines read."""
    for attr in ATTRIBUTES:
        if attr in vars(ref):           # set by the class (hasattr would also find config keys)
            assert getattr(face, attr) == getattr(ref, attr), attr
    want = {k: _plain(v) for k, v in ref.config.items() if not k.startswith("_")}
    got = {k: _plain(face.config[k]) for k in want}
    assert face.config["_class_name"] == type(ref).__name__
    return {k: (got[k], want[k]) for k in want if got[k] != want[k]}


def budget_between(face, op: str, shape, tile_px: int) -> int:
    """A budget halfway between exact tiles of ``tile_px`` pixels (video: one latent frame a chunk) and one pass."""
    h, cpu = face.handle, torch.device("cpu")
    need = lambda **kw: planner.on_device(planner.predict(h, h.call_for(op, shape, mode="exact", **kw), cpu, cpu),  # noqa: E731
                                          cpu, cpu, cpu)
    tiles, whole = need(tile=tile_px, tile_frames=h.caps.temporal_ratio), need()
    assert tiles < whole
    return (tiles + whole) // 2


def assert_budget_gives_one_pass(path, op: str, x, tile_px: int, caplog, *inputs, tol=1e-5) -> None:
    """The call within a budget below one pass: planned in exact tiles or time chunks (the log says so), equal
    to the face without a budget."""
    one = vae.diffusers.load(path)
    small = vae.diffusers.load(path, budget=budget_between(one, op, tuple(x.shape), tile_px))
    with caplog.at_level(logging.INFO, logger="VAEKit"):
        got = small.encode(x) if op == "encode" else small.decode(x, *inputs)
    planned = [r.message for r in caplog.records if "exact" in r.message and "predicted" in r.message]
    assert any("px tiles" in m or "a chunk" in m for m in planned), planned      # tiles, or chunks in time
    want = one.encode(x) if op == "encode" else one.decode(x, *inputs)
    for key in want:
        a, b = (want[key].parameters, got[key].parameters) if key == "latent_dist" else (want[key], got[key])
        close(b, a, tol)


def run_both(make_pipe, ref, face, **call):
    """A diffusers pipeline's output with diffusers' VAE, then with the face, from the same seed
    (``make_pipe(vae)`` builds the pipeline around either)."""
    outs = []
    for v in (ref, face):
        pipe = make_pipe(v)
        pipe.set_progress_bar_config(disable=True)
        with torch.no_grad():
            outs.append(pipe(generator=torch.Generator().manual_seed(0), **call)[0])
    return outs


def conditioned_both(make_pipe, ref, face, image, *args):
    """An image-to-video pipeline's ``prepare_latents`` (the first frame's encode, as it enters every step)
    with diffusers' VAE, then with the face: ``args`` follow the preprocessed image (the generator last)."""
    fed = []
    for v in (ref, face):
        pipe = make_pipe(v)
        side = image.shape[-1]
        with torch.no_grad():
            fed.append(pipe.prepare_latents(pipe.video_processor.preprocess(image, side, side), *args,
                                            torch.Generator().manual_seed(0))[0])
    return fed


def same(a, b, tol=TOL) -> float:
    """Two pipeline outputs (tensors or arrays) equal within ``tol``, neither empty; the max abs difference."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    assert a.shape == b.shape and a.numel()
    assert (a - b).abs().max() <= tol, (a - b).abs().max()
    return float((a - b).abs().max())
