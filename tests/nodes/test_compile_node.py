"""Compile VAE as ComfyUI calls it: its definition, a new VAE on the socket (the input still works,
untouched), the QKV message shown not raised, errors naming the node, and its workflow run headless."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from helpers import ROOT, diffusers_tiny

NAME = "Compile VAE (VAEKit)"


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def node(pack):
    return pack.NODE_CLASS_MAPPINGS["VAEKitCompile"]()


def _taesd():
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    return VAEKitVAE(from_state_dict(diffusers_tiny().state_dict(), name_hint="taesd"))


def _kl_without_attention():
    """A tiny 2-level KL without mid-block attention: quick to trace, and nothing to fuse."""
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae.archs import kl
    from vaekit.vae.handle import VAE
    cfg = kl.KLConfig(ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=4, embed_dim=4, mid_attention=False)
    return VAEKitVAE(VAE(kl.SPEC, cfg, kl.AutoencoderKL(cfg).eval()))


def test_definition(pack, node):
    cls = type(node)
    assert pack.NODE_DISPLAY_NAME_MAPPINGS["VAEKitCompile"] == NAME
    req = cls.INPUT_TYPES()["required"]
    assert list(req) == ["vae", "compile_encoder", "compile_decoder", "backend", "mode", "dynamic", "fuse_qkv"]
    assert req["compile_encoder"][0] == req["compile_decoder"][0] == req["fuse_qkv"][0] == "BOOLEAN"
    assert {"inductor", "aot_eager", "eager"} <= set(req["backend"][0])
    assert ("cudagraphs" in req["backend"][0]) == torch.cuda.is_available()
    assert req["mode"][0] == ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
    assert req["dynamic"][0] == ["auto", "true", "false"]
    assert "first encode/decode" in req["backend"][1]["tooltip"]          # compilation is lazy, and says so
    assert cls.RETURN_TYPES == ("VAE",)


def test_node_says_there_is_no_attention_and_goes_on(node):
    out = node.compile(_taesd(), fuse_qkv=True)
    assert "has no attention blocks: nothing to fuse" in out["ui"]["text"][0]
    assert out["result"][0].handle.report.qkv


def test_node_returns_a_new_vae_and_the_input_still_works(pack, node, caplog):
    vae = _kl_without_attention()
    z = torch.randn(1, 4, 6, 5)
    want = vae.decode(z)
    model, params = vae.handle.model, [id(p) for p in vae.handle.model.parameters()]
    with caplog.at_level("INFO", logger="VAEKit"):
        out = node.compile(vae, compile_encoder=False, compile_decoder=True, backend="eager", fuse_qkv=True)
    (new,) = out["result"]
    (text,) = out["ui"]["text"]
    assert "no attention" in text and "no attention" in caplog.text and NAME in caplog.text
    assert type(new) is type(vae) and new.handle is not vae.handle
    images = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]().decode({"samples": z}, new, tile_size=512)[0]
    assert torch.allclose(images, want, atol=1e-5)                       # core layout, same pixels
    assert new.handle.graph_count("decode") >= 1 and new.handle.graph_count("encode") == 0
    assert vae.handle.model is model and [id(p) for p in model.parameters()] == params
    assert "decode" not in vars(model) and torch.equal(vae.decode(z), want)


def test_errors_name_the_node(pack, node):
    with pytest.raises(Exception, match=re.escape(f"{NAME}: input 'mode'")):
        node.compile(_taesd(), mode="fastest")
    with pytest.raises(Exception, match=re.escape(f"{NAME}: input 'vae'")):
        node.compile("not a vae")


def test_workflow_runs_headless(pack, tmp_path, monkeypatch):
    """workflows/image_compile_roundtrip_api.json run with backend "eager" (inductor on these 2 CPU
    cores takes minutes to build; the graph is the same): the round trip equals the library's own
    encode/decode with the compiled handle's fixed-size tiles."""
    from vaekit.nodes.headless import run_prompt
    from vaekit.vae import load
    from vaekit.vae.compile import compile_vae
    from vaekit.vae.files.imageio import read_image
    (tmp_path / "models" / "vae").mkdir(parents=True)
    (tmp_path / "input").mkdir()
    shutil.copy(ROOT / "vae" / "demo" / "vaekit_demo.safetensors", tmp_path / "models" / "vae")
    shutil.copy(ROOT / "vae" / "demo" / "vaekit_sample.png", tmp_path / "input")
    monkeypatch.setenv("VAEKIT_MODEL_DIRS", str(tmp_path / "models"))
    api = json.loads((ROOT / "workflows" / "image_compile_roundtrip_api.json").read_text())
    assert api["3"]["class_type"] == "VAEKitCompile" and api["3"]["inputs"]["backend"] == "inductor"
    api["3"]["inputs"]["backend"] = "eager"
    ui = run_prompt(api, input_dir=tmp_path / "input", output_dir=tmp_path / "output")
    assert "compiled encoder and decoder with eager" in ui["3"]["text"][0]
    (png,) = ui["6"]["images"]
    same_tiles, _ = compile_vae(load(tmp_path / "models" / "vae" / "vaekit_demo.safetensors"),
                                encoder=False, decoder=False)              # eager, same fixed-size plan
    x = read_image(tmp_path / "input" / "vaekit_sample.png").movedim(-1, 0)[None]
    want = same_tiles.decode(same_tiles.encode(x, tile=256, overlap=32), tile=256, overlap=32)
    assert (read_image(png) - want[0].movedim(0, -1)).abs().max() <= 1 / 255 + 1e-6
