"""The loader: a full checkpoint's VAE is read without reading the other models' tensors, and a
.safetensors file's metadata reaches the families that ask for it (and only those)."""
from __future__ import annotations

import torch
from safetensors.torch import save_file

import vae
from helpers import diffusers_kl, spy_tensor_reads
from vae import loading


def test_full_checkpoint_reads_only_the_vae_tensors(tmp_path, monkeypatch):
    canonical = vae.from_state_dict(diffusers_kl().state_dict()).state_dict()
    unet = {f"model.diffusion_model.input_blocks.{i}.0.weight": torch.randn(64, 64) for i in range(4)}
    clip = {"cond_stage_model.transformer.text_model.embeddings.token_embedding.weight": torch.randn(99, 8)}
    path = tmp_path / "sd_checkpoint.safetensors"
    save_file({**unet, **clip, **{f"first_stage_model.{k}": v for k, v in canonical.items()}}, str(path),
              metadata={"modelspec.title": "a checkpoint"})
    alone = tmp_path / "vae.safetensors"
    save_file(canonical, str(alone))
    read = spy_tensor_reads(monkeypatch)
    v = vae.load(path)
    assert sorted(read) == sorted(f"first_stage_model.{k}" for k in canonical)
    z = torch.randn(1, 4, 4, 4)
    assert torch.equal(v.decode(z), vae.load(alone).decode(z))
    # the explicit read of a whole file still gives every tensor
    assert len(loading.read_state_dict(path)) == len(canonical) + len(unet) + len(clip)


def test_metadata_is_read_and_reaches_only_families_that_read_it(tmp_path):
    sd = vae.from_state_dict(diffusers_kl().state_dict()).state_dict()
    path = tmp_path / "kl.safetensors"
    save_file(sd, str(path), metadata={"config": "{}", "format": "pt"})
    assert loading.read_metadata(path) == {"config": "{}", "format": "pt"}
    pt = tmp_path / "kl.pt"
    torch.save(sd, pt)
    assert loading.read_metadata(pt) == {}
    # KL reads everything from its weights: its config_from_state_dict(sd, hint) is called as before
    assert not vae.registry.detect(sd).reads_metadata
    assert vae.load(path).spec.id == "kl"
