"""Share of the VAE loads in ComfyUI's official workflow templates that this pack's registry decodes.

    PYTHONPATH=DIR_WITH_THE_PACKAGE python3 bench/comfyui_checks/template_coverage.py [--templates DIR] [--assume minimax,seedvr2]

Reads every workflow JSON of the PyPI package ``comfyui-workflow-templates-json`` (imported by default;
``--templates`` names its ``templates/`` folder instead) and counts every VAE load (``scan``; what counts and
why: docs/coverage.md). Any other node with a VAE output and a file-name widget is reported as an unknown
loader, so a new loader type shows up instead of being missed. Each file name maps to a family (``PATTERNS``),
each family to the registry architecture (``SPEC.id`` in ``vae/archs``) that decodes it, or none
(``FAMILIES``). Figures are printed for all loads and for image/video VAEs only (audio and 3-D VAEs, and the
identity "VAE" of pixel-space models, are outside this pack's scope). No network.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "comfyui_workflow_templates_json"
DIST = "comfyui-workflow-templates-json"

# family id -> (what it is, kind, registry SPEC id that decodes it or None)
FAMILIES: dict[str, tuple[str, str, str | None]] = {
    "kl_sd": ("AutoencoderKL 4 ch: SD1.x/2.x, SDXL (VAE files, checkpoints)", "image", "kl"),
    "kl_16ch": ("AutoencoderKL 16 ch: Flux.1 / SD3 (`ae`, Flux.1 and SD3.5 checkpoints)", "image", "kl"),
    "flux2": ("Flux.2 VAE and its small decoders", "image", "flux2"),
    "qwen21": ("Qwen-Image 2.1 VAE (Wan 2.2 tree, RGBA, 16x)", "image", "wan"),
    "qwen_image": ("Qwen-Image VAE (Wan 2.1 architecture)", "image", "wan"),
    "qwen_image_rgba": ("Qwen-Image-Layered VAE (Wan 2.1 architecture, RGBA)", "image", "wan"),
    "qwen_image_like": ("Qwen-Image VAE as Marigold v2 and Ming-Image ship it (inferred, see PATTERNS)", "image", "wan"),
    "mage": ("Mage-VAE (Mage-Flow)", "image", "mage"),
    "svd": ("SVD temporal decoder (checkpoint)", "image", "svd"),
    "hunyuan_image": ("HunyuanImage 2.1 (32x, 64 ch) / 3.0 VAE", "image", "hunyuan_image"),
    "stage_a": ("Stable Cascade stage A (VQ-GAN 4x)", "image", "stage_a"),
    "wan21": ("Wan 2.1 VAE (incl. Wan-Alpha's RGB/alpha decoders)", "video", "wan"),
    "wan22": ("Wan 2.2 VAE (48 ch)", "video", "wan"),
    "hunyuan_video": ("HunyuanVideo 1.0 VAE", "video", "hunyuan_video"),
    "hunyuan_video15": ("HunyuanVideo 1.5 VAE", "video", "hunyuan_video15"),
    "ltx": ("LTX-Video 0.9 / LTX-2 / LTX-2.3 video VAE (checkpoints)", "video", "ltx"),
    "ltx_diffusion": ("LTX-2.5 diffusion video VAE", "video", "ltx_diffusion"),
    "minimax": ("MiniMax H3 video VAE", "video", "minimax"),
    "seedvr2": ("SeedVR2 VAE", "video", "seedvr2"),
    "cogvideox": ("CogVideoX VAE", "video", "cogvideox"),
    "taehv": ("TAEHV family: taehv, lighttaew2_1 / 2_2, lighttaehy1_5, taeltx_2, taeh3", "video", "taehv"),
    "cosmos": ("Cosmos-1 continuous video tokenizer (8x8x8)", "video", "cosmos"),
    "pixel_space": ("pixel-space identity (Chroma Radiance, PixelDiT, HiDream-O1)", "identity", None),
    "ltx_audio": ("LTX-2 / 2.5 audio VAE", "audio", None),
    "ace_step": ("ACE-Step 1.0 music DC-AE (checkpoint)", "audio", None),
    "ace_step15": ("ACE-Step 1.5 audio VAE", "audio", None),
    "stable_audio": ("Stable Audio Open / YuE2 audio VAE (checkpoint)", "audio", None),
    "stable_audio3": ("Stable Audio 3 VAE (checkpoint)", "audio", None),
    "minimax_audio": ("MiniMax H3 audio VAE / Music 3 DAV", "audio", None),
    "trellis2": ("Trellis 2 shape / texture VAEs", "3d", None),
    "triposplat": ("TripoSplat VAE decoder", "3d", None),
    "hunyuan3d": ("Hunyuan3D 2.x ShapeVAE (checkpoint)", "3d", None),
}

# (regex on the lower-case file name, family id); first match wins. Sources: the names and the `url`
# entries of the templates' `models` lists (HF repos in comments where the name alone is vague).
PATTERNS: list[tuple[str, str]] = [
    (r"^qwen_image_2\.1_vae", "qwen21"),
    (r"^qwen_image_layered_vae", "qwen_image_rgba"),          # Comfy-Org/Qwen-Image-Layered_ComfyUI
    (r"^qwen_image_vae", "qwen_image"),                       # Qwen-Image, Krea-2, Anima, FireRed
    # Marigold v2 (huawei-bayerlab) is Qwen-Image-Edit-2509 + its VAE; sglang's Ming-Image pipeline
    # uses QwenImageVAEConfig; both files are 242 MB like qwen_image_vae. Inferred, not read from weights.
    (r"^(marigold_v2_.*_vae|ming_image_vae)", "qwen_image_like"),
    (r"^(wan_2\.1_vae|wan2_1_vae|wan_alpha_2\.1_vae)", "wan21"),
    (r"^wan2\.2_vae", "wan22"),
    (r"^(flux2-vae|full_encoder_small_decoder)", "flux2"),
    (r"^mage_flow_vae", "mage"),
    (r"^(ae\.safetensors|flux1-(dev|schnell)|sd3(\.5)?_|netayume)", "kl_16ch"),  # NetaYume = Lumina 2 = Flux VAE
    (r"^(vae-ft-mse|sd_xl_|sdxl_vae|sdpose_)", "kl_sd"),
    # names no template of 0.1.123 loads, so that a later package's use of them is counted, not unmapped:
    # the TAEHV family (madebyollin/taehv), HunyuanImage (Comfy-Org/HunyuanImage_2.1_ComfyUI), Cosmos-1
    # (comfyanonymous/cosmos_1.0_text_encoder_and_VAE_ComfyUI), Stable Cascade stage A (stabilityai/stable-cascade)
    (r"^(taehv|taew2_|lighttaew2_|lighttaehy|taehv1_5|taeltx|taeh3)", "taehv"),
    (r"^(hunyuan_image_2\.1_vae|hunyuan_image_3|hunyuanimage)", "hunyuan_image"),
    (r"^cosmos_cv8x8x8", "cosmos"),
    (r"^stage_a", "stage_a"),
    (r"^hunyuanvideo15_vae", "hunyuan_video15"),
    (r"^hunyuan_video_vae", "hunyuan_video"),
    (r"^ltx-2\.5-video-vae", "ltx_diffusion"),
    (r"^ltx-2\.5-audio-vae", "ltx_audio"),
    (r"^(ltx-video-|ltx-2-|ltx-2\.3-)", "ltx"),
    (r"^minimax_h3_video_vae", "minimax"),
    (r"^(minimax_h3_audio_vae|minimax_music3_dav)", "minimax_audio"),
    (r"^seedvr2_.*vae", "seedvr2"),
    (r"^cogvideox_vae", "cogvideox"),
    (r"^svd", "svd"),
    (r"^(pixel_space$|hidream_o1_)", "pixel_space"),         # core swaps HiDream-O1's VAE for the identity
    (r"^ace_step_v1", "ace_step"),
    (r"^(ace_1\.5_vae|ace_step_1\.5)", "ace_step15"),
    (r"^(stable-audio-open|yue2_)", "stable_audio"),
    (r"^stable_audio_3", "stable_audio3"),
    (r"^trellis_2_.*vae", "trellis2"),
    (r"^triposplat_vae", "triposplat"),
    (r"^hunyuan(3d|_3d)", "hunyuan3d"),
]

VAE_LOADERS = {"VAELoader"}                                   # widget 0: the VAE file
CHECKPOINT_LOADERS = {"CheckpointLoaderSimple", "CheckpointLoader", "ImageOnlyCheckpointLoader",
                      "unCLIPCheckpointLoader"}               # widget 0: the checkpoint; its VAE output
# widget 0: the checkpoint holding the audio VAE; the loader type, not the name, says which VAE it is
AUDIO_VAE_LOADERS = {"LTXVAudioVAELoader": "ltx_audio"}
PASS_THROUGH = {"Reroute"}
OFF_MODES = {2, 4}                                            # muted ("never"), bypassed


def family_of(name: str) -> str | None:
    low = Path(name).name.lower()
    for pattern, fam in PATTERNS:
        if re.search(pattern, low):
            return fam
    return None


def default_templates() -> Path:
    try:
        pkg = importlib.import_module(PACKAGE)
    except ImportError:
        sys.exit(f"cannot import {PACKAGE}: install {DIST} (pip install {DIST}, or --target DIR and set "
                 f"PYTHONPATH=DIR), or name its templates folder with --templates")
    return Path(pkg.__file__).resolve().parent / "templates"


def package_version(templates: Path) -> str:
    for dist_dir in templates.parent.parent.glob(f"{PACKAGE}-*.dist-info"):  # a --target install beside it
        for line in (dist_dir / "METADATA").read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    try:
        return importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def subgraph_defs(wf: dict) -> dict[str, dict]:
    defs: dict[str, dict] = {}
    stack = [wf]
    while stack:
        for sg in ((stack.pop().get("definitions") or {}).get("subgraphs") or []):
            if sg.get("id") not in defs:
                defs[sg["id"]] = sg
                stack.append(sg)
    return defs


def walk(graph: dict, defs: dict[str, dict], off: bool, depth: int = 0):
    """(node, off) for every node this graph runs, subgraph instances expanded."""
    for node in graph.get("nodes") or []:
        node_off = off or node.get("mode") in OFF_MODES
        yield node, node_off
        sub = defs.get(node.get("type"))
        if sub is not None and depth < 16:
            yield from walk(sub, defs, node_off, depth + 1)


def vae_output_used(node: dict) -> bool:
    return any(o.get("type") == "VAE" and o.get("links") for o in node.get("outputs") or [])


def file_widget(node: dict) -> str | None:
    w = node.get("widgets_values")
    if isinstance(w, dict):
        w = list(w.values())
    if isinstance(w, list) and w and isinstance(w[0], str):
        return w[0]
    return None


def scan(templates: Path, include_off: bool):
    loads = []                      # (template, loader type, file name, family id or None)
    skipped = Counter()             # why a loader did not count
    unknown_loaders = Counter()
    n_templates = 0
    for path in sorted(templates.glob("*.json")):
        wf = json.loads(path.read_text(encoding="utf-8"))
        if not (isinstance(wf, dict) and isinstance(wf.get("nodes"), list)):
            continue                # index*.json, fuse_options.json, schemas, logos
        n_templates += 1
        defs = subgraph_defs(wf)
        for node, off in walk(wf, defs, False):
            kind = node.get("type")
            if kind in VAE_LOADERS | CHECKPOINT_LOADERS | AUDIO_VAE_LOADERS.keys():
                name = file_widget(node)
                if name is None:
                    skipped["loader without a file name"] += 1
                elif off and not include_off:
                    skipped[f"{kind} bypassed or muted"] += 1
                elif kind in CHECKPOINT_LOADERS and not vae_output_used(node):
                    skipped[f"{kind} with its VAE output unconnected ({name})"] += 1
                else:
                    loads.append((path.stem, kind, name, AUDIO_VAE_LOADERS.get(kind) or family_of(name)))
            elif (kind not in PASS_THROUGH and kind not in defs and file_widget(node)
                  and any(o.get("type") == "VAE" for o in node.get("outputs") or [])):
                unknown_loaders[kind] += 1
    return n_templates, loads, skipped, unknown_loaders


def registry_ids() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from vae import registry
    return [s.id for s in registry.REGISTRY]


def share(part: int, whole: int) -> str:
    return f"{part}/{whole} = {100.0 * part / whole:.1f}%" if whole else "n/a"


def coverage(loads, supported_ids: set[str], kinds: set[str]):
    """(loads covered, loads, templates covered, templates) over the loads whose family kind is in kinds."""
    per_template: dict[str, list[bool]] = defaultdict(list)
    n = ok = 0
    for template, _, _, fam in loads:
        if fam is not None and FAMILIES[fam][1] not in kinds:
            continue
        good = fam is not None and FAMILIES[fam][2] in supported_ids
        n += 1
        ok += good
        per_template[template].append(good)
    t_ok = sum(all(v) for v in per_template.values())
    return ok, n, t_ok, len(per_template)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--templates", type=Path, help="the package's templates/ folder (default: import the package)")
    ap.add_argument("--assume", default="", help="registry ids counted as supported although not (yet) in the "
                                                 "registry, comma-separated (e.g. minimax,seedvr2)")
    ap.add_argument("--include-bypassed", action="store_true", help="count bypassed/muted loaders too")
    args = ap.parse_args()

    templates = (args.templates or default_templates()).resolve()
    if not templates.is_dir():
        sys.exit(f"--templates {templates}: not a folder; name the package's templates/ folder")
    have = registry_ids()
    assume = [a.strip() for a in args.assume.split(",") if a.strip()]
    known = {spec for _, _, spec in FAMILIES.values() if spec}
    for a in assume:
        if a not in known:
            print(f"note: --assume {a}: no family in this script's table decodes with that id")
    n_templates, loads, skipped, unknown_loaders = scan(templates, args.include_bypassed)
    with_templates = {load[0] for load in loads}

    print(f"package: {DIST} {package_version(templates)}")
    print(f"registry ids: {', '.join(have)}")
    print(f"assumed about to land: {', '.join(assume) or '(none)'}")
    print(f"templates: {n_templates} workflows; {len(with_templates)} load a VAE; {len(loads)} VAE loads")
    for why, k in sorted(skipped.items()):
        print(f"  not counted: {k} x {why}")
    for kind, k in sorted(unknown_loaders.items()):
        print(f"  UNKNOWN loader with a VAE output (not counted): {kind} x {k}")

    fam_loads: Counter = Counter()
    fam_templates: dict[str, set] = defaultdict(set)
    unmapped: Counter = Counter()
    for template, _, name, fam in loads:
        fam = fam or "?"
        fam_loads[fam] += 1
        fam_templates[fam].add(template)
        if fam == "?":
            unmapped[name] += 1

    now, later = set(have), set(have) | set(assume)
    print("\n| family | kind | registry id | loads | templates | supported now | with --assume |")
    print("|---|---|---|---:|---:|---|---|")
    for fam, k in sorted(fam_loads.items(), key=lambda x: (-x[1], x[0])):
        label, kind, spec = FAMILIES.get(fam, ("file name not in the table", "?", None))
        yes = ["yes" if spec in ids else "no" for ids in (now, later)]
        print(f"| `{fam}` {label} | {kind} | {spec or '-'} | {k} | {len(fam_templates[fam])} | {yes[0]} | {yes[1]} |")

    print("\n| scope | loads covered, now | templates covered, now | loads, with --assume | templates, with --assume |")
    print("|---|---|---|---|---|")
    scopes = [("all VAE loads", {"image", "video", "audio", "3d", "identity"}), ("image + video VAEs", {"image", "video"})]
    for title, kinds in scopes:
        a, b, c, d = coverage(loads, now, kinds)
        e, f, g, h = coverage(loads, later, kinds)
        print(f"| {title} | {share(a, b)} | {share(c, d)} | {share(e, f)} | {share(g, h)} |")
    print("(a template is covered when every VAE it loads in that scope is supported; unmapped names count as "
          "unsupported in every scope)")

    print("\nunsupported file names (loads), with --assume:")
    rows = Counter()
    for _, loader, name, fam in loads:
        if fam is None or FAMILIES[fam][2] not in later:
            rows[(name, loader, fam or "?")] += 1
    for (name, loader, fam), k in sorted(rows.items(), key=lambda x: (-x[1], x[0])):
        kind = FAMILIES[fam][1] if fam in FAMILIES else "?"
        print(f"  {k:3d}  {name}  [{fam}, {kind}{'' if loader == 'VAELoader' else ', ' + loader}]")
    if assume:
        newly = Counter(name for _, _, name, fam in loads if fam and FAMILIES[fam][2] in set(assume) - now)
        print("supported only through --assume (loads):")
        for name, k in sorted(newly.items(), key=lambda x: (-x[1], x[0])):
            print(f"  {k:3d}  {name}")
    if unmapped:
        print(f"file names no pattern matches: {dict(unmapped)}  (add them to PATTERNS)")


if __name__ == "__main__":
    main()
