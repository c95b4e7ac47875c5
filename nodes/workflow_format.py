"""UI-format workflows (what you drag into ComfyUI, version 0.4) <-> API-format prompts (what
POST /prompt runs). Widget values are positional in the UI format, in INPUT_TYPES order, so the
conversion needs the node definitions."""
from __future__ import annotations

from typing import Any

WIDGET_KINDS = {"INT", "FLOAT", "STRING", "BOOLEAN"}
UPLOAD_WIDGETS = {"LoadImage": ["image"]}   # the frontend stores an extra 'upload' widget value


def _inputs(cls) -> list[tuple[str, tuple]]:
    spec = cls.INPUT_TYPES()
    return list(spec.get("required", {}).items()) + list(spec.get("optional", {}).items())


def _is_widget(decl) -> bool:
    return isinstance(decl[0], list) or decl[0] in WIDGET_KINDS


def _has_control(name: str, decl) -> bool:
    """The frontend stores a 'control after generate' value (fixed/randomize...) after seed widgets."""
    opts = decl[1] if len(decl) > 1 and isinstance(decl[1], dict) else {}
    return decl[0] == "INT" and bool(opts.get("control_after_generate", name in ("seed", "noise_seed")))


def api_to_ui(prompt: dict, classes: dict, positions: dict | None = None) -> dict:
    ids = {nid: i + 1 for i, nid in enumerate(prompt)}
    links: list[list] = []
    out_links: dict[tuple[str, int], list[int]] = {}      # (source node, output slot) -> link ids
    nodes = []
    for order, (nid, node) in enumerate(prompt.items()):
        cls = classes[node["class_type"]]
        sockets, widgets = [], []
        for name, decl in _inputs(cls):
            v = node["inputs"].get(name)
            if _is_widget(decl):
                if v is not None:
                    widgets.append(v)
                    if _has_control(name, decl):
                        widgets.append("fixed")
                continue
            lid = None
            if isinstance(v, list):
                lid = len(links) + 1
                links.append([lid, ids[v[0]], v[1], ids[nid], len(sockets), decl[0]])
                out_links.setdefault((v[0], v[1]), []).append(lid)
            sockets.append({"name": name, "type": decl[0], "link": lid})
        widgets += UPLOAD_WIDGETS.get(node["class_type"], [])
        x, y = (positions or {}).get(nid, (50 + 350 * order, 100))
        nodes.append({"id": ids[nid], "type": node["class_type"], "pos": [x, y], "size": [315, 130], "flags": {},
                      "order": order, "mode": 0, "inputs": sockets, "outputs": [],
                      "properties": {"Node name for S&R": node["class_type"]}, "widgets_values": widgets,
                      **({"title": node["_meta"]["title"]} if node.get("_meta", {}).get("title") else {})})
    for nid, ui_node in zip(prompt, nodes):   # outputs last: links to later nodes are known now
        cls = classes[prompt[nid]["class_type"]]
        names = getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)
        ui_node["outputs"] = [{"name": names[i], "type": t, "links": out_links.get((nid, i), []), "slot_index": i}
                              for i, t in enumerate(cls.RETURN_TYPES)]
    return {"last_node_id": len(nodes), "last_link_id": len(links), "nodes": nodes, "links": links,
            "groups": [], "config": {}, "extra": {"ds": {"scale": 1, "offset": [0, 0]}}, "version": 0.4}


def ui_to_api(workflow: dict, classes: dict) -> dict[str, Any]:
    links = {link[0]: link for link in workflow["links"]}
    prompt = {}
    for node in workflow["nodes"]:
        if node.get("mode", 0) != 0:      # muted / bypassed nodes do not run
            continue
        cls = classes[node["type"]]
        values = list(node.get("widgets_values", []))
        by_name = {s["name"]: s for s in node.get("inputs", [])}
        inputs: dict[str, Any] = {}
        for name, decl in _inputs(cls):
            sock = by_name.get(name)
            if sock is not None and sock.get("link") is not None:
                link = links[sock["link"]]
                inputs[name] = [str(link[1]), link[2]]
            elif _is_widget(decl) and values:
                inputs[name] = values.pop(0)
                if _has_control(name, decl) and values:
                    values.pop(0)
        entry = {"class_type": node["type"], "inputs": inputs}
        if node.get("title"):
            entry["_meta"] = {"title": node["title"]}
        prompt[str(node["id"])] = entry
    return prompt
