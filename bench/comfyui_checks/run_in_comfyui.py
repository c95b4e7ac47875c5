"""Run the shipped API workflows in a real ComfyUI server with this pack installed.

    python bench/comfyui_checks/run_in_comfyui.py --comfyui PATH/TO/ComfyUI --python PATH/TO/venv/bin/python
    python bench/comfyui_checks/run_in_comfyui.py ... --only video_tiled_decode_wan,image_qwen_roundtrip

A fresh base directory (models, input, output; this repository linked into custom_nodes) is made in a
temp folder, with the files every graph names: the demo VAE and sample image from vae/demo, and for the
video graphs tiny random-weight VAEs of each family (tests/video_families.py, written under the file
names the graphs use) with random latents. The server starts on loopback (CPU), each API graph is
POSTed to /prompt and /history is polled until it ends; the table gives the status, the seconds and
the images written. The server is stopped at the end; nothing is left running.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]


def _files(base: Path) -> None:
    """What the graphs load, under the names they use: the demo files; for the video (and Qwen-Image)
    graphs a tiny random-weight VAE of the family and a random latent; for core's Load VAE an SD-shape
    VAE with random weights (core's loader has a fixed size for it)."""
    import torch
    sys.path.insert(0, str(ROOT))
    import vae
    from harness import configs, save
    from vae.files.latents import write_latent_file
    from video_families import tiny_state_dict
    vae_dir, inp = base / "models" / "vae", base / "input"
    shutil.copy(ROOT / "vae" / "demo" / "vaekit_demo.safetensors", vae_dir)
    shutil.copy(ROOT / "vae" / "demo" / "vaekit_sample.png", inp)
    shutil.copy(ROOT / "vae" / "demo" / "vaekit_sample.latent", inp)       # what image_tiled_decode loads
    g = torch.Generator().manual_seed(0)
    for api in sorted((ROOT / "workflows").glob("*_api.json")):
        nodes = json.loads(api.read_text()).values()
        family = api.stem.split("_decode_")[1][: -len("_api")] if api.stem.startswith("video_") else "wan"
        for node in nodes:
            name = node["inputs"].get("vae_name")
            if not name or (vae_dir / name).exists():
                continue
            if node["class_type"] == "VAELoader":          # SD's VAE at its published config
                save(configs.build(configs.PUBLISHED["kl"]).state_dict(), vae_dir / name)
                continue
            save(tiny_state_dict(family), vae_dir / name)
            channels = vae.load(vae_dir / name).caps.latent_channels
            for other in nodes:
                if other["class_type"] == "LoadLatent":
                    write_latent_file(inp / other["inputs"]["latent"], torch.randn(1, channels, 4, 4, 4, generator=g))


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _post(url: str, payload: dict):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@contextlib.contextmanager
def comfyui_server(comfyui: str, python: str, port: int, extra: tuple[str, ...] = ()):
    """A ComfyUI server on loopback (CPU) over a fresh base directory holding this pack and the files
    the graphs name; yields (url, object_info, base). Stopped on the way out, nothing left running."""
    with tempfile.TemporaryDirectory(prefix="vaekit_comfy_") as tmp:
        base = Path(tmp)
        for d in ("custom_nodes", "models/vae", "input", "output"):
            (base / d).mkdir(parents=True)
        os.symlink(ROOT, base / "custom_nodes" / "VAEKit")
        _files(base)
        url = f"http://127.0.0.1:{port}"
        with open(base / "server.log", "w") as log:
            server = subprocess.Popen([python, str(Path(comfyui) / "main.py"), "--cpu", "--listen", "127.0.0.1",
                                       "--port", str(port), "--disable-auto-launch", "--base-directory", str(base),
                                       "--database-url", "sqlite:///:memory:", "--disable-api-nodes", *extra],
                                      cwd=comfyui, stdout=log, stderr=subprocess.STDOUT)
            try:
                for _ in range(180):
                    try:
                        info = _get(f"{url}/object_info")
                        break
                    except (urllib.error.URLError, ConnectionError):
                        time.sleep(1)
                else:
                    sys.exit("ComfyUI did not start: see its log")
                text = (base / "server.log").read_text()
                if any("IMPORT FAILED" in line and "VAEKit" in line for line in text.splitlines()):
                    sys.exit(f"ComfyUI could not import the pack:\n{text[-3000:]}")
                yield url, info, base
            finally:
                server.terminate()
                server.wait(timeout=30)


def wait_for(url: str, prompt_id: str, timeout: float) -> dict:
    """The prompt's /history entry once it has ended (an empty dict on timeout)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        hist = _get(f"{url}/history/{prompt_id}").get(prompt_id)
        if hist and hist.get("status", {}).get("completed") is not None:
            return hist
        time.sleep(0.5)
    return {}


def server_arguments(description: str, port: int) -> argparse.ArgumentParser:
    """The options of the scripts that start a ComfyUI server (this one, browser_check.py)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--comfyui", required=True, help="ComfyUI source directory (with main.py)")
    p.add_argument("--python", required=True, help="ComfyUI's python (its venv)")
    p.add_argument("--port", type=int, default=port)
    return p


def main() -> None:
    p = server_arguments(__doc__.split("\n\n")[0], 8189)
    p.add_argument("--only", help="comma list of workflow names (without _api.json)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per graph")
    a = p.parse_args()
    with comfyui_server(a.comfyui, a.python, a.port) as (url, info, base):
        ours = sorted(k for k in info if k.startswith("VAEKit"))
        print(f"ComfyUI up: {len(info)} nodes, ours: {', '.join(ours)}")
        names = a.only.split(",") if a.only else [p.name[: -len("_api.json")] for p in
                                                 sorted((ROOT / "workflows").glob("*_api.json"))]
        print(f"{'workflow':<40} {'status':<10} {'s':>7}  outputs")
        for name in names:
            prompt = json.loads((ROOT / "workflows" / f"{name}_api.json").read_text())
            t0 = time.time()
            code, reply = _post(f"{url}/prompt", {"prompt": prompt})
            if code != 200:
                print(f"{name:<40} {'HTTP ' + str(code):<10} {0:>7.1f}  {json.dumps(reply)[:300]}")
                continue
            hist = wait_for(url, reply["prompt_id"], a.timeout)
            status = hist.get("status", {}).get("status_str", "timeout")
            images = sum(len(o.get("images", [])) for o in hist.get("outputs", {}).values())
            msgs = [m for m in hist.get("status", {}).get("messages", []) if m[0] == "execution_error"]
            note = f"{images} images" + (f"; {msgs[0][1].get('exception_message', '')[:300]}" if msgs else "")
            print(f"{name:<40} {status:<10} {time.time() - t0:>7.1f}  {note}", flush=True)

if __name__ == "__main__":
    main()
