"""Run an API-format workflow (what ComfyUI's POST /prompt takes) in-process, without ComfyUI.

The graph may use this pack's nodes and the few core nodes our workflows need, replaced here by
stand-ins with the same inputs and outputs (LoadImage, SaveImage, PreviewImage, LoadLatent,
SaveLatent). ``validate_prompt`` is the same check ComfyUI makes before it runs a prompt: known
classes, required inputs, link types, INT/FLOAT ranges and combo values."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from ..vae.files import filekind, outputs
from ..vae.errors import InputError, VAEKitError
from ..vae.files.imageio import read_image, write_animated_webp, write_image
from ..vae.files.latents import read_latent_file, write_latent_file
from . import NODE_CLASS_MAPPINGS
from .inputs import problem as input_problem


def _files(folder: Optional[Path], suffixes: tuple[str, ...]) -> list[str]:
    """The files (not folders, whatever their names end in) of ``folder`` with these suffixes."""
    if folder is None or not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.suffix.lower() in suffixes and p.is_file())


def _input_file(name: str, what: str) -> Path:
    """A file of the input folder by name (``run_prompt`` checks before anything runs that there is one)."""
    if _Dirs.input is None:
        raise InputError(f"no input folder to read the {what} '{name}' from.", input=what,
                         fix="pass the folder that holds it (`vaekit run --input FOLDER` / `python -m vae run "
                             "--input FOLDER`, or run_prompt(input_dir=...)).")
    return _Dirs.input / name


class _Dirs:
    input: Optional[Path] = None
    output: Optional[Path] = None


class WorkflowError(InputError):
    """A workflow that cannot run, with every problem found (one per line)."""

    def __init__(self, problem: str, problems: Sequence[str] = (), fix: Optional[str] = None):
        super().__init__(problem, fix=fix)
        self.problems = list(problems)


def _save_all(prefix: str, ext: str, items: Sequence, write, width: int = 0, height: int = 0) -> list[str]:
    """Save Image's naming (ComfyUI's counters, never overwriting, prefix confined to the output
    folder) and all-or-nothing writes (vae/files/outputs.py)."""
    folder, name, counter = outputs.save_path(prefix, _Dirs.output, width, height)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [outputs.numbered(folder, name, counter + i, ext) for i in range(len(items))]
    with outputs.AtomicFiles() as files:
        for path, item in zip(paths, items):
            write(files.temp(path), item)
    return [str(p) for p in paths]


class LoadImage:
    RETURN_TYPES, FUNCTION = ("IMAGE", "MASK"), "load"
    READS_INPUT = True            # needs the runner's input folder (--input)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": (_files(_Dirs.input, (".png", ".jpg", ".jpeg", ".webp", ".npy")),)}}

    def load(self, image):
        img = read_image(_input_file(image, "image"))[None]
        return img, torch.zeros(img.shape[:3])


class SaveImage:
    RETURN_TYPES, FUNCTION, OUTPUT_NODE = (), "save", True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",), "filename_prefix": ("STRING", {"default": "ComfyUI"})}}

    def save(self, images, filename_prefix="ComfyUI"):
        return {"ui": {"images": _save_all(filename_prefix, ".png", images, write_image,
                                           images.shape[2], images.shape[1])}}


class PreviewImage(SaveImage):
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",)}}

    def save(self, images, filename_prefix="preview"):
        return super().save(images, "preview")


class SaveAnimatedWEBP:
    """Core's Save Animated WEBP (what video graphs end in where PyAV is not at hand): one animated
    file per batch at the given frame rate, named and counted as Save Image."""
    RETURN_TYPES, FUNCTION, OUTPUT_NODE = (), "save", True
    METHODS = {"default": 4, "fastest": 0, "slowest": 6}

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",), "filename_prefix": ("STRING", {"default": "ComfyUI"}),
                             "fps": ("FLOAT", {"default": 6.0, "min": 0.01, "max": 1000.0, "step": 0.01}),
                             "lossless": ("BOOLEAN", {"default": True}),
                             "quality": ("INT", {"default": 80, "min": 0, "max": 100}),
                             "method": (list(cls.METHODS),)}}

    def save(self, images, filename_prefix="ComfyUI", fps=6.0, lossless=True, quality=80, method="default"):
        def write(path, frames):
            write_animated_webp(path, frames, fps, lossless, quality, self.METHODS[method])
        return {"ui": {"images": _save_all(filename_prefix, ".webp", [images], write,
                                           images.shape[2], images.shape[1]), "animated": (True,)}}


class LoadLatent:
    RETURN_TYPES, FUNCTION = ("LATENT",), "load"
    READS_INPUT = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"latent": (_files(_Dirs.input, (".latent",)),)}}

    def load(self, latent):
        return ({"samples": read_latent_file(_input_file(latent, "latent"))},)


class SaveLatent:
    RETURN_TYPES, FUNCTION, OUTPUT_NODE = (), "save", True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "filename_prefix": ("STRING", {"default": "latents/ComfyUI"})}}

    def save(self, samples, filename_prefix="latents/ComfyUI"):
        return {"ui": {"latents": _save_all(filename_prefix, ".latent", [samples["samples"]], write_latent_file)}}


# Core's VAE nodes, making exactly the calls core makes on whatever is on the VAE socket: running
# them in-process checks that our VAE honours core's duck-typed contract.
class VAEDecode:
    RETURN_TYPES, FUNCTION = ("IMAGE",), "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "vae": ("VAE",)}}

    def decode(self, samples, vae):
        images = vae.decode(samples["samples"])
        return (images.reshape(-1, *images.shape[-3:]) if images.dim() == 5 else images,)


class VAEDecodeTiled(VAEDecode):
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "vae": ("VAE",),
                             "tile_size": ("INT", {"default": 512, "min": 64, "max": 4096, "step": 32}),
                             "overlap": ("INT", {"default": 64, "min": 0, "max": 4096, "step": 32}),
                             "temporal_size": ("INT", {"default": 64, "min": 8, "max": 4096, "step": 4}),
                             "temporal_overlap": ("INT", {"default": 8, "min": 4, "max": 4096, "step": 4})}}

    def decode(self, samples, vae, tile_size, overlap=64, temporal_size=64, temporal_overlap=8):
        overlap = tile_size // 4 if tile_size < overlap * 4 else overlap
        temporal_overlap = temporal_overlap // 2 if temporal_size < temporal_overlap * 2 else temporal_overlap
        ct = vae.temporal_compression_decode()
        if ct is not None:
            temporal_size = max(2, temporal_size // ct)
            temporal_overlap = max(1, min(temporal_size // 2, temporal_overlap // ct))
        else:
            temporal_size = temporal_overlap = None
        c = vae.spacial_compression_decode()
        images = vae.decode_tiled(samples["samples"], tile_x=tile_size // c, tile_y=tile_size // c,
                                  overlap=overlap // c, tile_t=temporal_size, overlap_t=temporal_overlap)
        return (images.reshape(-1, *images.shape[-3:]) if images.dim() == 5 else images,)


class VAEEncode:
    RETURN_TYPES, FUNCTION = ("LATENT",), "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"pixels": ("IMAGE",), "vae": ("VAE",)}}

    def encode(self, pixels, vae):
        return ({"samples": vae.encode(pixels[:, :, :, :3])},)


class VAELoader:
    """Signature only: core's loader builds a comfy.sd.VAE, which needs a real ComfyUI."""
    RETURN_TYPES, FUNCTION = ("VAE",), "load_vae"
    NEEDS_COMFYUI = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae_name": ([],)}}   # choices live on the user's disk

    def load_vae(self, vae_name):
        raise RuntimeError("core VAELoader needs ComfyUI; run this workflow in ComfyUI")


CORE_STANDINS = {c.__name__: c for c in (LoadImage, SaveImage, PreviewImage, SaveAnimatedWEBP, LoadLatent,
                                         SaveLatent, VAEDecode, VAEDecodeTiled, VAEEncode, VAELoader)}


def node_classes() -> dict[str, type]:
    return {**CORE_STANDINS, **NODE_CLASS_MAPPINGS}


def _is_link(v) -> bool:
    return isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], int)


def validate_prompt(prompt: dict, classes: Optional[dict] = None) -> list[str]:
    """Every problem ComfyUI's validation would report, as readable lines (empty: valid)."""
    classes = classes or node_classes()
    errors = []
    if not any(getattr(classes.get(n.get("class_type")), "OUTPUT_NODE", False) for n in prompt.values()
               if isinstance(n, dict)):
        errors.append("prompt has no output node (ComfyUI rejects it: 'Prompt has no outputs')")
    for nid, node in prompt.items():
        if not isinstance(node, dict) or not isinstance(node.get("inputs", {}), dict):
            errors.append(f"#{nid}: not a node (an API-format node is {{\"class_type\": ..., \"inputs\": {{...}}}})")
            continue
        cls = classes.get(node.get("class_type"))
        if cls is None:
            errors.append(f"#{nid}: unknown node class '{node.get('class_type')}'")
            continue
        inputs = node.get("inputs", {})
        spec = cls.INPUT_TYPES()
        files = set(getattr(cls, "FILE_INPUTS", ()))
        for name, decl in spec.get("required", {}).items():
            if name not in inputs:
                errors.append(f"#{nid} {node['class_type']}: required input '{name}' missing")
                continue
            errors += [f"#{nid} {node['class_type']}.{name}: {e}" for e in _input_kind(cls, name, inputs[name])
                       or _check_value(inputs[name], decl, prompt, classes, name in files)]
        for name, decl in spec.get("optional", {}).items():
            if name in inputs:
                errors += [f"#{nid} {node['class_type']}.{name}: {e}"
                           for e in _check_value(inputs[name], decl, prompt, classes, name in files)]
        declared = set(spec.get("required", {})) | set(spec.get("optional", {}))
        errors += [f"#{nid} {node['class_type']}: unknown input '{n}'" for n in inputs if n not in declared]
    return errors


def _input_kind(cls, name: str, value) -> list[str]:
    """A name of the input folder that is not a file there (a folder named like one, a broken link):
    said as such, where the choices (files only) would just not list it."""
    if not (getattr(cls, "READS_INPUT", False) and isinstance(value, str) and _Dirs.input is not None):
        return []
    wrong = filekind.wrong_path(_Dirs.input / value, f"{name} file")
    return [f"{wrong[0]} Fix: {wrong[1]}"] if wrong and "no " not in wrong[0][:3] else []


def _check_value(value, decl, prompt, classes, file_list: bool = False) -> list[str]:
    """A link's source and type, or a literal against its declaration (nodes/inputs.py, the check every
    node call makes too)."""
    kind = decl[0]
    if _is_link(value):
        src = prompt.get(value[0])
        if src is None:
            return [f"linked to missing node {value[0]}"]
        out_types = classes[src["class_type"]].RETURN_TYPES if src.get("class_type") in classes else ()
        if value[1] >= len(out_types):
            return [f"linked to output {value[1]} of {src.get('class_type')}, which has {len(out_types)}"]
        got = out_types[value[1]]
        want = kind if isinstance(kind, str) else "COMBO"
        return [] if got == want or "*" in (got, want) else [f"type mismatch: {got} into {want}"]
    if isinstance(kind, str) and kind not in ("INT", "FLOAT", "STRING", "BOOLEAN"):
        return [f"data input {kind} given a literal {value!r}"]
    trouble = input_problem(value, decl, file_list)
    return [f"{trouble[0]} Fix: {trouble[1]}"] if trouble else []


def check_api_format(prompt, name: str = "the workflow") -> dict:
    """An API-format prompt ({node id: {"class_type", "inputs"}}), or a WorkflowError saying what it is."""
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), dict):
        prompt = prompt["prompt"]            # the body of a POST /prompt
    if isinstance(prompt, dict) and "nodes" in prompt and "links" in prompt:
        raise WorkflowError(f"{name} is a UI-format workflow (what you drag into ComfyUI); this runs the API format.",
                            fix="use the *_api.json file beside it, or save the graph with ComfyUI's "
                                "'Export (API)'.")
    if not isinstance(prompt, dict) or not prompt:
        raise WorkflowError(f"{name} is not an API-format workflow (a JSON object of nodes); it holds "
                            f"{'an empty object' if prompt == {} else 'a ' + type(prompt).__name__}.",
                            fix="use an *_api.json workflow (workflows/ has some).")
    return prompt


def read_workflow(path) -> dict:
    """An API-format workflow from a JSON file, with one clear error for each way it can be wrong."""
    path = Path(path)
    wrong = filekind.wrong_path(path, "workflow file", (".json",))
    if wrong:
        raise WorkflowError(wrong[0], fix=wrong[1])
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise WorkflowError(f"'{path.name}' is not a text file.", fix="give a workflow .json file.") from None
    except ValueError as e:
        raise WorkflowError(f"'{path.name}' is not valid JSON ({e}).", fix="give a workflow .json file.") from None
    sibling = path.with_name(path.stem + "_api.json")
    try:
        return check_api_format(data, f"'{path.name}'")
    except WorkflowError as e:
        if sibling.is_file() and "UI-format" in e.problem:
            e.fix = f"run '{sibling.name}' (the same graph in API format)."
            e.args = (e._text(),)
        raise


def _check_outputs(prompt: dict) -> list[str]:
    """Literal filename prefixes checked before anything runs (ComfyUI would fail at the save)."""
    problems = []
    for nid, node in prompt.items():
        prefix = node.get("inputs", {}).get("filename_prefix")
        if isinstance(prefix, str):
            try:
                outputs.save_path(prefix, _Dirs.output)
            except InputError as e:
                problems.append(f"#{nid} {node['class_type']}.filename_prefix: {e.problem} Fix: {e.fix}")
    return problems


def _check_inputs(prompt: dict, classes: dict) -> list[str]:
    """Nodes that read the input folder need one (ComfyUI always has one; the runner only when given)."""
    if _Dirs.input is not None:
        wrong = filekind.wrong_folder(_Dirs.input, "input folder")
        return [f"{wrong[0]} Fix: {wrong[1]}"] if wrong else []
    return [f"#{nid} {node['class_type']} reads {next(iter(node.get('inputs', {}).values()), '?')!r} from the input "
            "folder, but no input folder was given. Fix: pass the folder that holds it (`vaekit run --input FOLDER` "
            "/ `python -m vae run --input FOLDER`, or run_prompt(input_dir=...))."
            for nid, node in prompt.items() if getattr(classes.get(node.get("class_type")), "READS_INPUT", False)]


def _check_written(prompt: dict, ui: dict, classes: dict) -> None:
    """Every output node reported the files it wrote, and they are there: no success is reported for an
    output that was not written."""
    problems = []
    for nid, node in prompt.items():
        cls = classes.get(node.get("class_type"))
        if not getattr(cls, "OUTPUT_NODE", False):
            continue
        files = [f for kind, items in ui.get(nid, {}).items() if kind != "animated" for f in items]
        if not files:
            problems.append(f"#{nid} {node['class_type']} wrote no file (an empty batch?).")
        problems += [f"#{nid} {node['class_type']} reported '{f}', which is not there." for f in files
                     if not Path(f).is_file()]
    if problems:
        raise WorkflowError(f"the workflow ran but {len(problems)} output(s) are missing: " + " ".join(problems),
                            problems, fix="check the output folder (another program may have moved the files) "
                                          "and the nodes before the save nodes.")


def run_prompt(prompt: dict, input_dir=None, output_dir=None, model_dirs=None) -> dict[str, Any]:
    """Validate, then execute the graph in dependency order; returns each output node's 'ui', after
    checking that every file it lists was written."""
    prompt = check_api_format(prompt)
    before = os.environ.get("VAEKIT_MODEL_DIRS")
    if model_dirs:            # for this run only: a later run without model_dirs does not see them
        os.environ["VAEKIT_MODEL_DIRS"] = os.pathsep.join(str(d) for d in model_dirs)
    try:
        return _run(prompt, input_dir, output_dir)
    finally:
        if before is None:
            os.environ.pop("VAEKIT_MODEL_DIRS", None)
        else:
            os.environ["VAEKIT_MODEL_DIRS"] = before


def _run(prompt: dict, input_dir, output_dir) -> dict[str, Any]:
    _Dirs.input = Path(input_dir) if input_dir else None
    _Dirs.output = Path(os.path.abspath(output_dir or "output"))
    classes = node_classes()
    errors = validate_prompt(prompt, classes)
    errors += (_check_outputs(prompt) + _check_inputs(prompt, classes)) if not errors else []
    if errors:
        raise WorkflowError(f"invalid workflow: {len(errors)} problem(s): " + "; ".join(errors), errors)
    results: dict[str, Any] = {}
    ui: dict[str, Any] = {}

    def run(nid: str, stack=()):
        if nid in results:
            return results[nid]
        if nid in stack:
            raise WorkflowError(f"the workflow has a cycle through node {nid}.", fix="remove the loop.")
        node = prompt[nid]
        args = {k: (run(v[0], stack + (nid,))[v[1]] if _is_link(v) else v) for k, v in node["inputs"].items()}
        cls = classes[node["class_type"]]
        try:
            with torch.inference_mode():
                out = getattr(cls(), cls.FUNCTION)(**args)
        except VAEKitError as e:      # core stand-ins do not name themselves; ComfyUI shows the node
            if e.node is None:
                e.for_node(f"{node['class_type']} (node {nid})")
            raise
        if isinstance(out, dict):
            ui[nid] = out.get("ui", {})
            out = out.get("result", ())
        results[nid] = out
        return out

    for nid in prompt:
        run(nid)
    _check_written(prompt, ui, classes)
    return ui
