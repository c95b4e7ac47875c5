"""Core's ``patcher`` contract with our VAE, run by core's own code: its memory manager, SUPIR Apply's encode
with a patched encoder, Select VAE Device, and a multi-GPU clone made from the VAE's file.

    COMFYUI_DIR=PATH/TO/ComfyUI PATH/TO/ComfyUI/venv/bin/python bench/comfyui_checks/check_patcher.py

What it runs, each against the result it must give (docs/comfyui.md, "Core's patcher contract", has the table;
nodes/patcher.py lists what core reads): core's memory manager on ``vae.patcher``, SUPIR Apply's patched encode
(then the plain encode again, and the refusal on a VAE whose weights the patches do not name), Select VAE
Device and a multi-GPU clone from the VAE's file, each followed by core's VAE Decode.
A tiny AutoencoderKL (random weights, seeded; SD's layout, whose encoder keys SUPIR patches) is written to a
temporary file. Prints one line per check and exits 1 on any failure (tests/nodes/test_patcher.py runs it when
COMFYUI_DIR and COMFYUI_PYTHON are set)."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core
from check_core_nodes import _pack      # the repository imported as ComfyUI imports a custom node folder

TOL = 1e-5                               # the same maths on the same weights, CPU float32


def _tiny_kl(folder: Path) -> Path:
    import torch
    from harness import save
    from vaekit.vae.archs import kl
    torch.manual_seed(0)
    model = kl.SPEC.build(kl.KLConfig(ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=4, embed_dim=4))
    path = folder / "tiny_kl.safetensors"
    save(model.state_dict(), path)
    return path


def main() -> int:
    comfy_core.start(os.environ["COMFYUI_DIR"])
    pack = _pack()
    import copy

    import torch
    import comfy.model_management as mm
    import comfy.model_patcher
    import nodes as core_nodes
    from comfy_extras.nodes_model_patch import SUPIRApply
    from comfy_extras.nodes_multigpu import SelectVAEDeviceNode
    from vaekit.nodes import _comfy
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae.errors import VAEKitError
    results = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")

    def socket(path) -> VAEKitVAE:
        handle = pack.vae.load(path)
        _comfy.place(handle, torch.device("cpu"), torch.float32)
        return VAEKitVAE(handle)

    with tempfile.TemporaryDirectory() as tmp:
        path = _tiny_kl(Path(tmp))
        vae = socket(path)
        image = torch.rand(1, 32, 32, 3, generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            z0 = vae.encode(image)
            x0 = core_nodes.VAEDecode().decode(vae, {"samples": z0})[0]

        p = vae.patcher
        mm.load_models_gpu([p], force_full_load=True)
        check("patcher is core's ModelPatcher around first_stage_model",
              isinstance(p, comfy.model_patcher.ModelPatcher) and p.model is vae.first_stage_model)
        check("memory manager's reads", p.model_size() == mm.module_size(vae.first_stage_model)
              and p.current_loaded_device() == torch.device("cpu") and vae.model_size() == p.model_size()
              and any(m.model is p for m in mm.current_loaded_models), f"model_size {p.model_size()}")

        # SUPIR Apply: a denoise encoder of other weights, patched onto a clone of the patcher for one encode
        enc = {k[len("encoder."):]: torch.randn_like(v) * 0.05 + v for k, v in vae.first_stage_model.state_dict().items()
               if k.startswith("encoder.")}
        model_patch = SimpleNamespace(model=SimpleNamespace(denoise_encoder_sd=enc))
        expect_sd = {**{k: v.clone() for k, v in vae.first_stage_model.state_dict().items()},
                     **{f"encoder.{k}": v for k, v in enc.items()}}
        patched_vae = pack.vae.from_state_dict(expect_sd)
        original = vae.patcher
        with torch.inference_mode():
            z_supir = SUPIRApply._encode_with_denoise_encoder(vae, model_patch, image)
            z_expect = patched_vae.encode(image.movedim(-1, 1))
            z_after = vae.encode(image)
        d, moved = (z_supir - z_expect).abs().max().item(), (z_supir - z0).abs().max().item()
        check("SUPIR Apply encodes with its denoise encoder", d <= TOL and moved > 100 * TOL,
              f"max abs vs a VAE with those weights {d:.2e} (vs the unpatched VAE {moved:.2e})")
        d = (z_after - z0).abs().max().item()
        check("the next encode is the unpatched VAE's again", d <= TOL and vae.patcher is original, f"{d:.2e}")

        demo = socket(Path(pack.__file__).parent / "vae" / "demo" / "vaekit_demo.safetensors")
        try:
            SUPIRApply._encode_with_denoise_encoder(demo, model_patch, torch.rand(1, 32, 32, 3))
            check("weight patches a VAE has no weight for are refused", False, "encoded without them")
        except VAEKitError as e:
            check("weight patches a VAE has no weight for are refused", "vae.patcher" in str(e), str(e)[:160])

        # Select VAE Device, and the fresh copy it makes for another GPU (here: the same CPU)
        selected = SelectVAEDeviceNode.execute(vae, "default").result[0]
        with torch.inference_mode():
            x1 = core_nodes.VAEDecode().decode(selected, {"samples": z0})[0]
        check("Select VAE Device (default) then VAE Decode", isinstance(selected, VAEKitVAE)
              and selected.patcher is not vae.patcher and (x1 - x0).abs().max().item() <= TOL)
        moved = copy.copy(vae)
        moved.patcher = moved.patcher.deepclone_multigpu(new_load_device=torch.device("cpu"))
        moved.first_stage_model = moved.patcher.model
        with torch.inference_mode():
            x2 = core_nodes.VAEDecode().decode(moved, {"samples": z0})[0]
        check("a multi-GPU clone from the VAE's file decodes the same",
              moved.first_stage_model is not vae.first_stage_model and moved.handle is not vae.handle
              and (x2 - x0).abs().max().item() <= TOL, f"{(x2 - x0).abs().max().item():.2e}")
    bad = results.count(False)
    print(f"{len(results) - bad} of {len(results)} checks passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
