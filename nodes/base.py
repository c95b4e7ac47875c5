"""What every VAEKit node shares: category, and errors that name the node."""
from __future__ import annotations

import functools

from ..vae.errors import VAEKitError

CATEGORY = "VAEKit"


def names_node(method):
    """Re-raise library errors with this node's display name in front (shown verbatim by ComfyUI),
    and the library's argument names (``tile``...) turned into the node's inputs (``LIBRARY_INPUTS``)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except VAEKitError as e:
            if e.node is None:
                e.for_node(type(self).DISPLAY_NAME, getattr(self, "LIBRARY_INPUTS", {}).get(e.input))
            raise
    return wrapper
