"""Our VAE inside ComfyUI core's own family nodes, beside core's VAE on the same file, and what core's
memory manager is told about each (docs/comfyui.md: the nodes of each family and what they showed).

    python bench/comfyui_checks/check_core_nodes.py --comfyui PATH/TO/ComfyUI --python PATH/TO/venv/bin/python
    python bench/comfyui_checks/check_core_nodes.py ... --families wan,flux2

Core's nodes call ``vae.encode`` (and read ``latent_channels``, ``spacial_compression_encode``,
``downscale_index_formula``) on whatever arrives on their VAE socket. This runs each family's nodes
(``_cases``; a node this core does not have is reported as absent) from core's own code, once with core's
``comfy.sd.VAE`` and once with our ``VAEKitVAE``, both from the same file (random weights at the published
config, a fixed seed, in the layout core's files have), and prints the max abs difference of every tensor
they return; then core's ``VAEDecode`` of the node's latent (up to 32x32 latent pixels) and of its first
latent frame. Memory: every ``comfy.model_management.load_models_gpu`` call is recorded (the model and its
``memory_required``), ours registered with the memory manager as ``nodes/_comfy.place`` does for a GPU;
beside them, each VAE's answers to core's hooks for the shapes the node used.
The weights are written by this python (it needs diffusers); the nodes run under ComfyUI's python
(this file in --worker mode), one process per family. Nothing is asserted; "agree" means max abs < 1e-4.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared harness
import harness
from harness import comfy_core

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("wan", "wan2.2", "ltx", "hunyuan_video15", "flux2", "svd")
# differences with a known cause, checked elsewhere (the decode of the first latent frame alone agrees)
EXPECTED = {("hunyuan_video15", "decoded"): "expected: core's mid-block attention is not causal over frames, "
            "ours is as Tencent's (tests/vae/test_hunyuan_video15.py)"}


def _pack():
    """The repository as the package 'vaekit', as ComfyUI imports a custom node folder."""
    spec = importlib.util.spec_from_file_location("vaekit", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vaekit"] = mod
    spec.loader.exec_module(mod)
    return mod


class _Clip:
    """Stands in for the Qwen-Image text encoder: the node's conditioning without a language model."""

    def tokenize(self, prompt, images=()):
        return {"images": images}

    def encode_from_tokens_scheduled(self, tokens):
        return [[torch.zeros(1, 1, 1), {}]]


# ---- ComfyUI side ------------------------------------------------------------------------------

class _ClipVision:
    """A stand-in CLIP vision model for SVD's conditioning node (its image embedding is not the VAE's)."""

    def encode_image(self, image):
        return type("Output", (), {"image_embeds": torch.zeros(1, 1024)})()


def _cases(family: str, first: torch.Tensor, last: torch.Tensor):
    """(case name, core node name, fn(vae) -> {output: tensor}) for the family; fn is None when this
    core lacks the node."""
    import nodes
    extras = {}
    for mod, names in (("nodes_wan", ("WanImageToVideo", "WanFirstLastFrameToVideo", "Wan22ImageToVideoLatent")),
                       ("nodes_qwen", ("TextEncodeQwenImageEdit",)), ("nodes_lt", ("LTXVImgToVideo",)),
                       ("nodes_hunyuan", ("HunyuanVideo15ImageToVideo",)), ("nodes_edit_model", ("ReferenceLatent",)),
                       ("nodes_video_model", ("SVD_img2vid_Conditioning",))):
        try:
            m = importlib.import_module(f"comfy_extras.{mod}")
        except Exception:   # noqa: BLE001 - an older core without the module
            continue
        extras.update({n: getattr(m, n) for n in names if hasattr(m, n)})
    cond = [[torch.zeros(1, 1, 1), {}]]
    clip = torch.randn(4, 4, 6, 8, generator=torch.Generator().manual_seed(2))     # an SVD LATENT: 4 frames

    x = extras

    def pick(d, *keys):          # the named entries of a node's conditioning dict or LATENT
        return {k: d[k] for k in keys}

    def cond_of(out, *keys):     # the entries of a node's positive conditioning
        return pick(out[0][0][1], *keys)

    table = {
        "wan": [
            ("i2v", "WanImageToVideo", lambda v: cond_of(x["WanImageToVideo"].execute(
                cond, cond, v, 64, 48, 9, 1, start_image=first).result, "concat_latent_image")),
            ("flf", "WanFirstLastFrameToVideo", lambda v: cond_of(x["WanFirstLastFrameToVideo"].execute(
                cond, cond, v, 64, 48, 9, 1, start_image=first, end_image=last).result, "concat_latent_image")),
            ("qwen", "TextEncodeQwenImageEdit", lambda v: {"reference_latents": x["TextEncodeQwenImageEdit"].execute(
                _Clip(), "", vae=v, image=first).result[0][0][1]["reference_latents"][0]}),
        ],
        "wan2.2": [("i2v22", "Wan22ImageToVideoLatent", lambda v: pick(x["Wan22ImageToVideoLatent"].execute(
            v, 64, 64, 9, 1, start_image=first).result[0], "samples", "noise_mask"))],
        "ltx": [("ltxv_i2v", "LTXVImgToVideo", lambda v: pick(x["LTXVImgToVideo"].execute(
            cond, cond, first, v, 64, 64, 9, 1, 1.0).result[2], "samples", "noise_mask"))],
        "hunyuan_video15": [("hv15_i2v", "HunyuanVideo15ImageToVideo", lambda v: cond_of(
            x["HunyuanVideo15ImageToVideo"].execute(cond, cond, v, 64, 48, 5, 1, start_image=first).result,
            "concat_latent_image", "concat_mask"))],
        "svd": [("svd_i2v", "SVD_img2vid_Conditioning", lambda v: (lambda out: {
            "concat_latent_image": out[0][0][1]["concat_latent_image"], "latent": out[2]["samples"],
            "decoded_clip": nodes.VAEDecode().decode(v, {"samples": clip})[0]})(
            x["SVD_img2vid_Conditioning"]().encode(_ClipVision(), first, v, 64, 48, 4, 127, 6, 0.0)))],
        "flux2": [("flux2_ref", "VAEEncode + ReferenceLatent", lambda v: {
            "reference_latents": x["ReferenceLatent"].execute(cond, latent=nodes.VAEEncode().encode(
                v, first[:, :, :64])[0]).result[0][0][1]["reference_latents"][0]})],
    }
    # the core node is the shown name's last word; None when this core lacks it
    return [(case, shown, fn if shown.split()[-1] in extras else None) for case, shown, fn in table[family]]


def _hooks(vae, model, shapes: dict) -> dict:
    """A VAE's answers to core's memory hooks for the shapes it was given (model layout, as core calls them)."""
    out = {"handles_tiling": getattr(vae, "handles_tiling", "absent"),
           "comfy_has_chunked_io": getattr(model, "comfy_has_chunked_io", False)}
    for op, shape in shapes.items():
        hook = getattr(vae, f"memory_used_{op}", None)
        try:
            out[f"memory_used_{op}{list(shape)}"] = int(hook(shape, vae.vae_dtype)) if hook else "absent"
        except Exception as e:   # noqa: BLE001 - reported, not fatal
            out[f"memory_used_{op}{list(shape)}"] = f"raised {type(e).__name__}"
    return out


def worker(a) -> None:
    comfy_core.start(a.comfyui)
    import comfy.model_management as mm
    import comfy.sd
    import nodes
    from comfy.model_patcher import ModelPatcher
    from safetensors.torch import load_file
    _pack()
    from vaekit.nodes import _comfy
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import load
    torch.set_num_threads(a.threads)
    d = Path(a.worker)
    g = torch.Generator().manual_seed(1)
    first, last = torch.rand(1, 48, 80, 3, generator=g), torch.rand(1, 48, 80, 3, generator=g)
    told: list = []
    load_models_gpu = mm.load_models_gpu

    def recording(models, memory_required=0, *args, **kw):
        told.extend((type(getattr(m, "model", m)).__name__, int(memory_required or 0)) for m in models)
        return load_models_gpu(models, memory_required, *args, **kw)
    mm.load_models_gpu = recording

    path = d / f"{a.family}.safetensors"
    handle = load(path)
    # what nodes/_comfy.place registers for a GPU: the memory manager loads our weights before each call
    _comfy._patchers[handle.model] = ModelPatcher(handle.model, load_device=torch.device("cpu"),
                                                  offload_device=torch.device("cpu"))
    vaes = {"core": comfy.sd.VAE(sd=load_file(str(path))), "ours": VAEKitVAE(handle)}
    out, report = {}, {"cases": {}, "hooks": {}, "seconds": {}}
    for case, node_name, fn in _cases(a.family, first, last):
        report["cases"][case] = node_name if fn else f"{node_name}: not in this core"
        if fn is None:
            continue
        for who, v in vaes.items():
            shapes = {}
            for op in ("encode", "decode"):      # the shapes core's wrapper would hand its hooks
                setattr(v, op, _spy(v, op, shapes))
            told.clear()
            t0 = time.time()
            with torch.inference_mode():
                res = fn(v)
                main = next(iter(res.values()))
                # core's VAE Decode of it (not of Qwen's ~1 MP reference latent: minutes on a CPU)
                if main.dim() in (4, 5) and main.shape[1] == v.latent_channels and main.shape[-2:].numel() <= 1024:
                    res["decoded"] = nodes.VAEDecode().decode(v, {"samples": main})[0]
                    if main.dim() == 5 and main.shape[2] > 1:                     # and of its first frame
                        res["decoded_frame0"] = nodes.VAEDecode().decode(v, {"samples": main[:, :, :1]})[0]
            report["seconds"][f"{case}.{who}"] = round(time.time() - t0, 2)
            for op in ("encode", "decode"):
                delattr(v, op)
            report["hooks"][f"{case}.{who}"] = {**_hooks(v, v.first_stage_model, shapes), "told": list(told)}
            out.update({f"{case}.{k}.{who}": t.contiguous().float() for k, t in res.items()})
    harness.save(out, d / "out.safetensors")
    (d / "report.json").write_text(json.dumps(report))


def _spy(vae, op: str, shapes: dict):
    """``vae.<op>`` that notes the model-layout shape of its first input."""
    method = getattr(vae, op)

    def call(x, *args, **kw):
        shapes.setdefault(op, _model_layout(vae, x, op))
        return method(x, *args, **kw)
    return call


def _model_layout(vae, x: torch.Tensor, op: str) -> tuple:
    """The shape core's VAE wrapper hands its memory hooks: decode gets the latent as is; encode the
    pixels moved to channels-first (a video VAE: one clip [1, C, T, H, W])."""
    if op == "decode":
        return tuple(x.shape)
    if getattr(vae, "latent_dim", 2) == 3 and x.dim() == 4:
        return (1, x.shape[-1], x.shape[0], x.shape[1], x.shape[2])
    return (x.shape[0], x.shape[-1]) + tuple(x.shape[1:-1])


# ---- this python: weights in core's layout ------------------------------------------------------

def write_weights(family: str, path: Path) -> None:
    import diffusers
    for p in (ROOT, ROOT / "tests", ROOT / "tests" / "vae", ROOT / "bench", ROOT / "bench" / "comfyui_checks"):
        sys.path.insert(0, str(p))
    import vae
    torch.manual_seed(0)
    if family in ("wan", "wan2.2", "ltx"):            # the drop-in check's files
        from core_dropin import SOURCES, comfy_weights
        sd = comfy_weights(family, *SOURCES[family])
    elif family == "hunyuan_video15":
        from test_hunyuan_video15 import original_layout, reference
        sd = original_layout(reference().state_dict(), comfyui=True)
    elif family == "flux2":
        from diffusers_flux2 import model
        ref = diffusers.AutoencoderKLFlux2()            # the published config: its defaults
        cfg = ref.config
        sd = model(widths=tuple(cfg.block_out_channels), layers=cfg.layers_per_block,
                   latent=cfg.latent_channels).state_dict()
        sd = vae.from_state_dict(sd).state_dict()       # canonical = ComfyUI's keys
    elif family == "svd":
        from core_families import svd_model, svd_original_layout
        sd = svd_original_layout(svd_model().state_dict())        # svd_xt's first stage, core's names
    else:
        raise SystemExit(f"unknown family {family!r}: one of {', '.join(FAMILIES)}")
    harness.save(sd, path)


def run(comfyui: str, python: str, families, threads: int = 2) -> list[dict]:
    """Rows per (family, case, output) and the memory report; each family in its own processes."""
    from safetensors.torch import load_file
    rows, hooks = [], []
    for family in families:
        with tempfile.TemporaryDirectory(prefix="core_nodes_") as tmp:
            write_weights(family, Path(tmp) / f"{family}.safetensors")
            cmd = [python, str(Path(__file__).resolve()), "--worker", tmp, "--family", family,
                   "--comfyui", str(Path(comfyui).resolve()), "--threads", str(threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                rows.append({"family": family, "key": "-", "note": f"ComfyUI side FAILED: "
                             f"{(proc.stderr.strip().splitlines() or ['?'])[-1][:300]}"})
                print(proc.stderr[-3000:], file=sys.stderr)
                continue
            out = load_file(str(Path(tmp) / "out.safetensors"))
            report = json.loads((Path(tmp) / "report.json").read_text())
        for case, node in report["cases"].items():
            if "not in this core" in node:
                rows.append({"family": family, "key": f"{case} ({node})", "note": "absent"})
        for key in sorted(k[:-5] for k in out if k.endswith(".core")):
            core, ours = out[f"{key}.core"], out[f"{key}.ours"]
            same = core.shape == ours.shape
            err = (core - ours).abs().max().item() if same else float("nan")
            case, output = key.split(".")
            note = "agree" if same and err < 1e-4 else "DIFFER" + (f" (ours {tuple(ours.shape)})" if not same else "")
            if note != "agree" and (family, output) in EXPECTED:
                note += f" ({EXPECTED[family, output]})"
            rows.append({"family": family, "key": f"{key}  [{report['cases'][case]}]", "shape": tuple(core.shape),
                         "err": err, "note": note})
        for case_who, h in report["hooks"].items():
            hooks.append({"family": family, "who": case_who, "seconds": report["seconds"].get(case_who), **h})
        print(f"# {family} done", file=sys.stderr, flush=True)
    return rows, hooks


def print_tables(rows, hooks) -> None:
    print(f"{'family':<16} {'core node -> output':<68} {'shape':<24} {'max abs':>9}  verdict")
    for r in rows:
        err = f"{r['err']:>9.2e}" if "err" in r else f"{'':>9}"
        print(f"{r['family']:<16} {r['key']:<68} {str(r.get('shape', '')):<24} {err}  {r['note']}")
    print("\nwhat core's memory manager is told (load_models_gpu: model, memory_required bytes) and each VAE's hooks")
    for h in hooks:
        told = ", ".join(f"{m} {b / 2**20:.1f} MiB" for m, b in h["told"]) or "nothing"
        rest = "; ".join(f"{k} = {v / 2**20:.1f} MiB" if isinstance(v, int) and not isinstance(v, bool) else f"{k} = {v}"
                         for k, v in h.items() if k not in ("family", "who", "told", "seconds"))
        print(f"{h['family']:<16} {h['who']:<22} {h['seconds']:>6} s  told: {told}\n{'':<47}{rest}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True)
    p.add_argument("--python", help="ComfyUI's python (default: this one)")
    p.add_argument("--families", default=",".join(FAMILIES), help=f"comma list (default: {','.join(FAMILIES)})")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--family", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    rows, hooks = run(a.comfyui, a.python or sys.executable, a.families.split(","), a.threads)
    print_tables(rows, hooks)


if __name__ == "__main__":
    main()
