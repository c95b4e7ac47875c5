"""The shipped demo VAE and sample image, run_demo, and the built-in PNG codec (without Pillow)."""
import json
import struct
import sys
import zlib

import numpy as np
import pytest
import torch

import vae
from vae.files import imageio
from vae.archs.tiny import TinyAutoencoder
from vae.demo import SAMPLE, WEIGHTS, run_demo
from vae.demo.train import make_config

# Measured with the shipped weights on the 256x256 centre of the sample, 128 px tiles, 32 px overlap:
# 21.4 dB untiled and tiled, seam 47.1 dB (the full 512x512 sample: 22.8 dB). Floors leave a margin.
PSNR_FLOOR_DB = 19.0
SEAM_PSNR_FLOOR_DB = 40.0


@pytest.fixture
def no_pillow(monkeypatch):
    """Make ``from PIL import Image`` fail, as on a machine without Pillow."""
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ImportError):
        from PIL import Image  # noqa: F401


def _header(path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def test_demo_weights_load_as_taesd_family():
    assert WEIGHTS.stat().st_size <= 5 * 2 ** 20
    v = vae.load(WEIGHTS)
    assert v.spec.id == "tiny"
    cfg, want = v.config, make_config()
    assert (cfg.latent_channels, cfg.encoder_stages, cfg.decoder_stages, cfg.midblock_gn) == \
           (want.latent_channels, want.encoder_stages, want.decoder_stages, False)
    assert (cfg.scale, cfg.shift, cfg.pack) == (1.0, 0.0, 1)
    assert v.caps.spatial_ratio == 8 and v.caps.can_encode and v.caps.can_decode
    # exactly the canonical layout, and the metadata describing it
    header = _header(WEIGHTS)
    meta = json.loads(header.pop("__metadata__")["vaekit_demo"])
    assert set(header) == set(TinyAutoencoder(want).state_dict())
    assert meta["config"]["latent_channels"] == want.latent_channels
    assert "astronaut" in meta["held_out"] and "astronaut" not in meta["training_images"]


def test_run_demo_reconstructs_the_held_out_sample(tmp_path, no_pillow):
    r = run_demo(out_dir=tmp_path, tile=128, overlap=32, size=256, verbose=False)
    assert r["image_size"] == (256, 256) and r["tiles"] == 4
    assert r["psnr_untiled_db"] >= PSNR_FLOOR_DB
    assert r["psnr_tiled_db"] >= PSNR_FLOOR_DB
    assert r["seam_psnr_db"] >= SEAM_PSNR_FLOOR_DB and r["seam_max_abs"] > 0   # tiling did run
    for key in ("time_untiled_s", "time_tiled_s"):
        assert r[key] > 0
    for path in r["files"].values():
        assert imageio.read_image(path).shape == (256, 256, 3)


def test_png_round_trip_without_pillow(tmp_path, no_pillow):
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (37, 53, 3), generator=g).float() / 255
    imageio.write_image(tmp_path / "x.png", img)
    back = imageio.read_image(tmp_path / "x.png")
    assert back.dtype == torch.float32 and torch.equal(back, img)
    imageio.write_image(tmp_path / "x.npy", img)
    assert torch.equal(imageio.read_image(tmp_path / "x.npy"), img)
    sample = imageio.read_image(SAMPLE)
    assert sample.shape == (512, 512, 3)
    (tmp_path / "x.jpg").write_bytes(b"\xff\xd8\xff" + bytes(16))
    with pytest.raises(ValueError, match="install Pillow"):
        imageio.read_image(tmp_path / "x.jpg")


def _png(rows: bytes, w: int, h: int, colour: int) -> bytes:
    return imageio.PNG_SIGNATURE + imageio._chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0)) \
        + imageio._chunk(b"IDAT", zlib.compress(rows)) + imageio._chunk(b"IEND", b"")


def test_png_reader_filters_sub_up_and_rgba(tmp_path, no_pillow):
    rng = np.random.default_rng(1)
    h, w, bpp = 9, 7, 4
    a = rng.integers(0, 256, (h, w, bpp), dtype=np.uint8)
    rows, prev = [], np.zeros(w * bpp, np.uint8)
    for y in range(h):
        row, f = a[y].reshape(-1), y % 3
        enc = row.copy()
        if f == 1:
            enc[bpp:] = row[bpp:] - row[:-bpp]
        elif f == 2:
            enc = row - prev
        rows.append(bytes([f]) + enc.tobytes())
        prev = row
    (tmp_path / "a.png").write_bytes(_png(b"".join(rows), w, h, 6))
    assert np.array_equal(imageio.read_png(tmp_path / "a.png"), a)
    assert torch.equal(imageio.read_image(tmp_path / "a.png"), torch.from_numpy(a[..., :3]).float() / 255)
    # Paeth (4) is not built in: the error names the file and the fix
    (tmp_path / "paeth.png").write_bytes(_png(bytes([4]) + bytes(w * 3), w, 1, 2))
    with pytest.raises(ValueError, match=r"paeth\.png.*install Pillow"):
        imageio.read_image(tmp_path / "paeth.png")
