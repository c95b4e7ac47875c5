"""VAEKit: faster, leaner, more correct VAE encode/decode nodes for ComfyUI."""
from .nodes import NODE_CLASS_MAPPINGS as _V1_NODES
from .nodes import NODE_DISPLAY_NAME_MAPPINGS
from .nodes.v3 import mappings

# V3 schemas inside a ComfyUI that has comfy_api.latest, the same nodes as V1 classes elsewhere
NODE_CLASS_MAPPINGS = mappings(_V1_NODES)

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
