"""The nodes as ComfyUI V3 schemas (``comfy_api.latest.io.ComfyNode``), built from the one declaration
each node already has (its V1 ``INPUT_TYPES`` / ``RETURN_TYPES``), so the V1 classes (old ComfyUI,
the headless runner) and the V3 ones can never disagree. ComfyUI ignores a pack's
``comfy_entrypoint`` while ``NODE_CLASS_MAPPINGS`` exists, but V3 classes may sit in that mapping:
execution detects them by subclass."""
from __future__ import annotations

import inspect
from typing import Any, Optional

# V1 socket types -> the io class that declares them
_SOCKETS = {"LATENT": "Latent", "VAE": "Vae", "IMAGE": "Image", "MASK": "Mask", "INT": "Int", "FLOAT": "Float",
            "BOOLEAN": "Boolean", "STRING": "String"}


def comfy_io():
    """ComfyUI's ``comfy_api.latest.io``, or None outside a ComfyUI that has it."""
    try:
        from comfy_api.latest import io
    except ImportError:
        return None
    return io


def _input(io, name: str, decl: tuple, optional: bool):
    kind, opts = decl[0], dict(decl[1]) if len(decl) > 1 and isinstance(decl[1], dict) else {}
    if isinstance(kind, list):
        cls, opts["options"] = io.Combo.Input, kind
    else:
        cls = getattr(io, _SOCKETS[kind]).Input
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: opts.pop(k) for k in list(opts) if k in accepted}
    inp = cls(name, optional=optional, **kwargs)
    # what this ComfyUI's class has no parameter for (e.g. 'advanced' before it had one) still
    # reaches the frontend, as the V1 dictionary would send it
    inp.extra_dict.update(opts)
    return inp


def _output(io, kind: str, name: Optional[str], tooltip: Optional[str]):
    return getattr(io, _SOCKETS[kind]).Output(display_name=name, tooltip=tooltip)


def as_v3(node: type, io) -> type:
    """A V3 ComfyNode class with ``node``'s id, inputs, outputs and texts, running ``node``'s function."""
    def define_schema(cls):
        spec = node.INPUT_TYPES()
        inputs = [_input(io, n, d, False) for n, d in spec.get("required", {}).items()]
        inputs += [_input(io, n, d, True) for n, d in spec.get("optional", {}).items()]
        names = getattr(node, "RETURN_NAMES", (None,) * len(node.RETURN_TYPES))
        tips = getattr(node, "OUTPUT_TOOLTIPS", (None,) * len(node.RETURN_TYPES))
        return io.Schema(node_id=node.__name__, display_name=node.DISPLAY_NAME, category=node.CATEGORY,
                         description=getattr(node, "DESCRIPTION", ""), inputs=inputs,
                         outputs=[_output(io, *o) for o in zip(node.RETURN_TYPES, names, tips)],
                         is_output_node=getattr(node, "OUTPUT_NODE", False))

    def execute(cls, **kwargs: Any):
        out = getattr(node(), node.FUNCTION)(**kwargs)
        # V1 returns a tuple, or {"ui": ..., "result": tuple} where the node also shows text
        if isinstance(out, dict):
            return io.NodeOutput(*out.get("result", ()), ui=out.get("ui"))
        return io.NodeOutput(*out)

    return type(node.__name__, (io.ComfyNode,), {
        "__doc__": node.__doc__, "__module__": node.__module__, "V1": node,
        "define_schema": classmethod(define_schema), "execute": classmethod(execute)})


def mappings(nodes: dict[str, type]) -> dict[str, type]:
    """V3 classes where ComfyUI offers them, the V1 classes otherwise."""
    io = comfy_io()
    return {k: as_v3(v, io) for k, v in nodes.items()} if io is not None else dict(nodes)
