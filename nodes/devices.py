"""The ``devices`` input of Tiled Decode / Tiled Encode: one persistent worker pool per device list
(vae/workers.py), started on first use, reused across prompts, closed at exit or when the list
changes. Where the devices or the VAE's file are not there (a workflow from another machine), the node
runs on one device and says why; a list that cannot be right anywhere (an unknown device name, one
device, mixed types) is refused with a fix."""
from __future__ import annotations

import logging
from typing import Optional

from ..vae import workers

log = logging.getLogger("VAEKit")
_POOL: dict[str, workers.Pool] = {}

DEVICES = ("STRING", {"default": "", "advanced": True, "tooltip":
                      "Share the tiles among several devices, e.g. 'cuda:0,cuda:1' (this ComfyUI's device first): "
                      "one worker process per extra device, started once and kept; exact mode stays exact. Empty: "
                      "one device. Missing devices fall back to one device, said in the log."})


def pool_for(text: str, engine) -> Optional[workers.Pool]:
    """The pool for ``text``, or None (one device: empty text, or a reason logged)."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        devices = workers.parse_devices(text)        # a list no machine can run: the error goes to the user
        if getattr(engine, "path", None) is None:
            raise workers.DevicesAbsent("this VAE was not loaded from a file by VAE Load (VAEKit), so worker "
                                        "processes cannot load it.")
    except workers.DevicesAbsent as e:
        log.warning("VAEKit: devices %r: %s Running on one device.", text, e.problem)
        return None
    pool = _POOL.get(text)
    if pool is None or not pool.alive:
        for old in _POOL.values():            # one process group per process: the new list replaces the old
            old.close()
        _POOL.clear()
        pool = _POOL[text] = workers.Pool(devices)
    return pool
