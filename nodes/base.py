"""What every VAEKit node shares: category, inputs checked against the node's declaration, and
errors that name the node."""
from __future__ import annotations

import functools

from ..vae.errors import VAEKitError
from .inputs import check_call

CATEGORY = "VAEKit"


def names_node(method):
    """The node function with every input checked against the node's ``INPUT_TYPES`` first
    (nodes/inputs.py: a client that skips ComfyUI's validation gets the same refusals, with fixes),
    and library errors re-raised with this node's display name in front (shown verbatim by ComfyUI),
    the library's argument names (``tile``...) turned into the node's inputs (``LIBRARY_INPUTS``)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        args, kwargs = check_call(type(self), method, (self, *args), kwargs)
        try:
            return method(*args, **kwargs)
        except VAEKitError as e:
            if e.node is None:
                e.for_node(type(self).DISPLAY_NAME, getattr(self, "LIBRARY_INPUTS", {}).get(e.input))
            raise
    return wrapper
