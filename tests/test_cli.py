"""The headless main job: `python -m vae ...` from the repo root, as the README gives it."""
from __future__ import annotations

import subprocess
import sys

from helpers import ROOT

DEMO = ROOT / "vae" / "demo"


def vae_cli(*args, cwd=ROOT):
    r = subprocess.run([sys.executable, "-m", "vae", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                       timeout=300)
    return r.returncode, r.stdout + r.stderr


def test_info_encode_decode_run(tmp_path):
    code, out = vae_cli("info", DEMO / "vaekit_demo.safetensors")
    assert code == 0 and "TAESD family" in out
    latent = tmp_path / "sample.latent"
    code, out = vae_cli("encode", "--vae", DEMO / "vaekit_demo.safetensors", "--tile", 256, "--overlap", 32,
                        "-o", latent, DEMO / "vaekit_sample.png")
    assert code == 0 and latent.is_file(), out
    code, out = vae_cli("decode", "--vae", DEMO / "vaekit_demo.safetensors", "-o", tmp_path / "dec", latent)
    assert code == 0 and (tmp_path / "dec_00000.png").is_file(), out
    code, out = vae_cli("run", "workflows/image_tiled_roundtrip_api.json", "--models", DEMO, "--input", DEMO,
                        "--output", tmp_path / "out")
    assert code == 0 and "vaekit_roundtrip_00001_.png" in out, out


def test_bad_file_is_a_clear_error_not_a_traceback(tmp_path):
    bad = tmp_path / "vae.safetensors"
    bad.write_bytes(b"\x00" * 12)
    code, out = vae_cli("info", bad)
    assert code == 2 and out.startswith("error: ") and "Traceback" not in out
