"""The encoder's Gaussian posterior: ``VAE.encode(x, posterior=True)`` -> (mean, logvar) in the LATENT's
layout and normalisation. The mean is what ``encode(x)`` gives; the log-variance is the reference's
(diffusers' ``latent_dist``, clamped as it clamps) moved through the family's own normalisation
(log-variance - 2 log std); exact tiles and time chunks give the one-pass posterior; a family
without a posterior refuses."""
from __future__ import annotations

import pytest
import torch

import diffusers_flux2 as F2
import mage_tiny
import vae
from vae.archs import minimax as mm
from vae.archs.minimax_layout import LATENTS_MEAN, LATENTS_STD
from vae.handle import VAE
from helpers import diffusers_kl, diffusers_tiny
from ltx_common import randomize, stats
from video_families import FAMILIES, RATIOS, ROWS, tiny_reference

pytestmark = pytest.mark.usefixtures("one_thread")

SAME = 1e-6          # the same computation, only sliced differently
EXACT = 1e-4         # exact tiles / time chunks against one pass (fp32 sums in another order)
PARITY = 1e-5        # against the reference on the same weights
DETERMINISTIC = ("taehv", "taeh3", "cosmos")   # one latent, no mean and log-variance: the tiny autoencoders;
# Cosmos-1's continuous tokenizer (an identity posterior in diffusers)


def _close(got, want, tol) -> None:
    """Within ``tol`` of values of order 1 (relative above: log-variances reach 30 where a statistic
    is small, and fp32 rounds them at 2e-6)."""
    for g, w in zip(got, want):
        assert g.shape == w.shape and (g - w).abs().max() <= tol * max(1.0, float(w.abs().max()))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_video_family_gives_its_posterior_exactly_under_tiles_and_chunks(loaded, family):
    v = loaded[family]
    s, r = RATIOS[family]
    x = torch.rand(1, 3, 1 + r, 4 * s, 3 * s)            # two latent frames: two chunks when streamed
    assert v.caps.posterior == (family not in DETERMINISTIC)
    if family in DETERMINISTIC:
        with pytest.raises(vae.InputError, match="no Gaussian posterior"):
            v.encode(x, posterior=True)
        return
    mean, logvar = v.encode(x, posterior=True)
    assert mean.shape == logvar.shape and (mean - v.encode(x)).abs().max() <= SAME
    if v.caps.own_tiling is None:        # a family whose tiles are its definition has no other plan
        kw = dict(tile=2 * s, mode="exact", tile_frames=r if v.caps.stream_encode else None)
        calls = []
        tiled = v.encode(x, posterior=True, progress=lambda d, n: calls.append(n), **kw)
        assert calls[-1] >= 4                          # 2 x 2 tiles (x chunks): the engine really tiled
        _close(tiled, (mean, logvar), EXACT)
    reference = ROWS[family].posterior
    if reference is not None:
        _close((mean, logvar), reference(tiny_reference(family), x), PARITY)


def test_ltx_log_variance_follows_the_per_channel_statistics():
    """LTX normalises inside the VAE ((z - mean) / std, random statistics here): the log-variance of that
    latent is the encoder's one shared log-variance channel minus 2 log std, per channel."""
    torch.manual_seed(0)
    ref = randomize(pytest.importorskip("diffusers").AutoencoderKLLTXVideo(
        latent_channels=8, block_out_channels=(8, 16, 32, 32), decoder_block_out_channels=(8, 16, 32, 32),
        layers_per_block=(1,) * 5, decoder_layers_per_block=(1,) * 5), 8)
    v = vae.from_state_dict(ref.state_dict())
    assert v.model.config.log_var == "uniform"
    x = torch.rand(1, 3, 17, 64, 32)
    m, s = stats(ref)
    with torch.no_grad():
        dist = ref.encode(x * 2 - 1).latent_dist
    mean, logvar = v.encode(x, posterior=True)
    _close((mean, logvar), ((dist.mean - m) / s, dist.logvar - 2 * s.log()), PARITY)
    _close(v.encode(x, posterior=True, tile=32, mode="exact", tile_frames=8), (mean, logvar), EXACT)


def test_ltx_per_channel_log_variance_is_read_from_the_weights(loaded):
    """An encoder with two outputs a latent channel carries one log-variance each ("per_channel"); no
    published file has one, so this one is made from the tiny LTX's weights."""
    v = loaded["ltx"]
    sd = v.state_dict()
    w, b = sd["encoder.conv_out.weight"], sd["encoder.conv_out.bias"]
    c = v.caps.latent_channels
    g = torch.Generator().manual_seed(5)
    sd["encoder.conv_out.weight"] = torch.cat([w[:c], 0.1 * torch.randn(w[:c].shape, generator=g)])
    sd["encoder.conv_out.bias"] = torch.cat([b[:c], 0.1 * torch.randn(c, generator=g)])
    per = vae.from_state_dict(sd)
    assert per.model.config.log_var == "per_channel"
    x = torch.rand(1, 3, 9, 64, 64)
    mean, logvar = per.encode(x, posterior=True)
    with torch.inference_mode():
        moments = per.model.encoder(x * 2 - 1)
    assert (mean - v.encode(x)).abs().max() <= SAME                  # the mean half is the same weights'
    assert (logvar - moments[:, c:]).abs().max() <= SAME              # identity statistics here
    assert logvar.std() > 0.01 and (logvar[:, :1] - logvar[:, 1:2]).abs().max() > 0    # one per channel


def test_image_families_give_the_references_posterior():
    """SD-shape KL (raw latent): diffusers' latent_dist; exact tiles equal one pass."""
    ref = diffusers_kl(widths=(32, 64, 64), layers=1)
    v = vae.from_state_dict(ref.state_dict())
    x = torch.rand(2, 3, 48, 40)
    with torch.no_grad():
        dist = ref.encode(x * 2 - 1).latent_dist
    got = v.encode(x, posterior=True)
    _close(got, (dist.mean, dist.logvar), PARITY)
    _close(v.encode(x, posterior=True, tile=16, mode="exact"), got, EXACT)


def test_flux2_posterior_is_packed_and_normalised_like_its_latent():
    """Flux.2 packs 2x2 and normalises by its BatchNorm statistics after tiling: the log-variance is
    packed alike, minus 2 log std of each packed channel."""
    ref, pipe = F2.model(), F2.Pipeline()
    v = vae.from_state_dict(ref.state_dict())
    x = torch.rand(1, 3, 24, 32)
    with torch.no_grad():
        dist = ref.encode(x * 2 - 1).latent_dist
    mean, std = ref.bn.running_mean.view(1, -1, 1, 1), (ref.bn.running_var.view(1, -1, 1, 1) + ref.bn.eps).sqrt()
    want = ((pipe._patchify(dist.mean) - mean) / std, pipe._patchify(dist.logvar) - 2 * std.log())
    got = v.encode(x, posterior=True)
    assert got[0].shape == (1, 32, 6, 8)         # ratio 2, packed 2x2
    _close(got, want, PARITY)
    assert (got[0] - v.encode(x)).abs().max() <= SAME
    _close(v.encode(x, posterior=True, tile=16, mode="exact"), got, EXACT)


def test_minimax_posterior_blends_like_its_own_tiles():
    """MiniMax's tiles are its definition; diffusers blends the encoder's moments, so the posterior's
    two halves blend alike (tiles narrowed to 64 px, as its own tests narrow them)."""
    ref = tiny_reference("minimax")
    ours = vae.from_state_dict(ref.state_dict())
    v = VAE(ours.spec, mm.with_tiles(ours.config, 64, 16), ours.model)
    x = torch.rand(1, 3, 5, 144, 112)
    pixels = [torch.tensor(t).view(1, 3, 1, 1, 1) for t in (mm.IMAGENET_MEAN, mm.IMAGENET_STD)]
    lm, ls = (torch.tensor(t).view(1, -1, 1, 1, 1) for t in (LATENTS_MEAN, LATENTS_STD))
    ref.enable_tiling(64, 64, 16, 16)
    with torch.no_grad():
        dist = ref.encode((x - pixels[0]) / pixels[1]).latent_dist
    calls = []
    got = v.encode(x, posterior=True, progress=lambda d, n: calls.append(n))
    assert calls[-1] == 3 * 2
    _close(got, ((dist.mean - lm) / ls, dist.logvar - 2 * ls.log()), PARITY)


def test_mage_posterior_is_its_encoders_second_half():
    v = vae.from_state_dict(mage_tiny.canonical())
    x = torch.rand(1, 3, 32, 32)
    mean, logvar = v.encode(x, posterior=True)
    with torch.inference_mode():
        moments = v.model.dconv_encoder(x * 2 - 1)
    c = v.caps.latent_channels
    assert (mean - v.encode(x)).abs().max() <= SAME and (logvar - moments[:, c:2 * c]).abs().max() <= SAME


def test_a_family_without_a_posterior_says_so():
    v = vae.from_state_dict(diffusers_tiny().state_dict())
    assert not v.caps.posterior
    with pytest.raises(vae.InputError, match="no Gaussian posterior") as e:
        v.encode(torch.rand(1, 3, 32, 32), posterior=True)
    assert e.value.input == "posterior" and "without posterior" in str(e.value)
