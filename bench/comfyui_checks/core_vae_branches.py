"""Which class ComfyUI core's ``VAE.__init__`` builds for each VAE file in a folder (run under ComfyUI's python).

    COMFYUI_PYTHON bench/comfyui_checks/core_vae_branches.py --comfyui COMFYUI_DIR [--json OUT] FOLDER

tests/vae/test_core_branches.py writes one tiny file per branch of core's ``VAE.__init__`` and runs this on
them: it checks the test's restatement of core's key tests against core itself. The files are narrow, core's
classes are built at their published sizes, so the weights cannot load: ``load_state_dict`` is a no-op here,
and what is reported is only the branch core took (the class of its model and of the model's decoder).
Prints ``file: classes``; with --json writes {file stem: {"classes": [...]}}."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
from harness import comfy_core  # noqa: E402


def classes(model) -> list[str]:
    """The model's and its decoder's module-qualified class names (the decoder says which branch of a shared
    wrapper such as AutoencodingEngine was taken)."""
    out = [f"{type(model).__module__}.{type(model).__name__}"]
    dec = getattr(model, "decoder", None)
    if dec is not None:
        out.append(f"{type(dec).__module__}.{type(dec).__name__}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--comfyui", required=True, help="ComfyUI's source folder")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    comfy_core.start(args.comfyui)
    import torch
    from safetensors.torch import load_file

    torch.nn.Module.load_state_dict = lambda self, sd, strict=True, assign=False: ([], [])  # branch only
    report = {}
    for path in sorted(args.folder.glob("*.safetensors")):
        row: dict = {}
        try:
            v = comfy_core.vae(args.comfyui, load_file(path))
            row["classes"] = classes(v.first_stage_model) if v.first_stage_model is not None else ["(no VAE detected)"]
            row["latent_channels"] = v.latent_channels
            if isinstance(v.downscale_ratio, int):      # video branches hold a (time rule, h, w) tuple
                row["downscale_ratio"] = v.downscale_ratio
        except Exception as e:   # noqa: BLE001 (a branch that fails on a narrow file is reported, not fatal)
            row["classes"] = [f"error: {type(e).__name__}: {str(e)[:200]}"]
        report[path.stem] = row
        print(f"{path.stem}: {', '.join(row['classes'])}; latent channels {row.get('latent_channels')}"
              f"{'; downscale ' + str(row['downscale_ratio']) if 'downscale_ratio' in row else ''}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
