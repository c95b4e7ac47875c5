"""The loader: a full checkpoint's VAE is read without reading the other models' tensors, a
.safetensors file's metadata reaches the families that ask for it (and only those), and however a
source holds the weights, the model gets the same tensors held the same way."""
from __future__ import annotations

import torch
from safetensors.torch import save_file

import vae
from helpers import assert_same_weights, diffusers_kl, spy_tensor_reads
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


def _held_awkwardly(sd: dict) -> dict:
    """The same numbers held as sources may hold them: every tensor a view into one shared buffer at an
    odd float offset (4 bytes off the allocator's 64-byte alignment, as a memory-mapped file's tensors
    are), the 2-D ones transposed (column-major strides)."""
    buf = torch.empty(sum(t.numel() + 1 for t in sd.values()) + 1)
    out, at = {}, 1
    for k, t in sd.items():
        n = t.numel()
        flat = buf[at:at + n]
        view = flat.view(t.shape[1], t.shape[0]).t() if t.dim() == 2 else flat.view(t.shape)
        out[k] = view.copy_(t)
        at += n + 1
    return out


def test_every_source_hands_the_model_the_same_tensors(tmp_path):
    """A model's own state dict, awkward views of one buffer, a .safetensors file and a pickle of the
    same weights give handles with the same tensors held the same way (fresh, contiguous, aligned: the
    loader copies every tensor), so their outputs are bit-identical by construction; and a handle
    shares no memory with its source (changing the source afterwards changes nothing)."""
    sd = {k: t.contiguous() for k, t in diffusers_kl(widths=(32, 32)).state_dict().items()}
    awkward = _held_awkwardly(sd)
    assert any(t.dim() == 2 for t in awkward.values()) and all(t.storage_offset() for t in awkward.values())
    save_file(sd, str(tmp_path / "kl.safetensors"))
    torch.save(sd, tmp_path / "kl.pth")
    handles = {"state dict": vae.from_state_dict(sd), "awkward views": vae.from_state_dict(awkward),
               "safetensors": vae.load(tmp_path / "kl.safetensors"), "pickle": vae.load(tmp_path / "kl.pth")}
    z, x = torch.randn(1, 4, 5, 6), torch.rand(1, 3, 10, 12)
    first = handles["state dict"]
    want = first.decode(z), first.encode(x)
    for name, v in handles.items():
        assert_same_weights(first, v, name)
        assert torch.equal(v.decode(z), want[0]) and torch.equal(v.encode(x), want[1]), name
    for t in (*sd.values(), *awkward.values()):
        t.zero_()
    assert torch.equal(first.decode(z), want[0]) and torch.equal(handles["awkward views"].decode(z), want[0])
