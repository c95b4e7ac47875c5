"""Every UI workflow in ComfyUI's real frontend, in headless Chromium, with this pack installed.

    python bench/comfyui_checks/browser_check.py --comfyui PATH/TO/ComfyUI --python PATH/TO/venv/bin/python
    python bench/comfyui_checks/browser_check.py ... --only image_tiled_roundtrip --screenshots workflows/screenshots

Needs Chromium and its driver (Debian: `chromium`, `chromium-driver`) and `selenium` for this python;
ComfyUI's venv needs `comfyui-frontend-package`. The server is the one `run_in_comfyui.py` starts. What it
checks, in the order it checks it (our nodes' V3 schemas against their V1 declarations, then each workflow
loaded, run and re-queued from the page): docs/comfyui.md. A screenshot of each workflow is saved. Columns:
loaded, ran (seconds), cached (nodes cached / nodes, seconds). Exit status 1 on any failure.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from run_in_comfyui import ROOT, _get, _post, comfyui_server, server_arguments, wait_for

LOAD = """
const [graph, done] = [arguments[0], arguments[arguments.length - 1]];
(async () => {
  try {
    await window.app.loadGraphData(graph);
    const nodes = window.app.graph._nodes ?? window.app.graph.nodes;
    const rejected = [];
    for (const n of nodes) for (const w of (n.widgets ?? [])) {
      const choices = w.options?.values;
      if (w.type === "combo" && Array.isArray(choices) && !choices.includes(w.value))
        rejected.push(`${n.type}.${w.name} = ${JSON.stringify(w.value)}`);
    }
    // fit the graph in view (screen = (pos + offset) * scale)
    const c = window.app.canvas, el = c.canvas;
    const x0 = Math.min(...nodes.map(n => n.pos[0])), y0 = Math.min(...nodes.map(n => n.pos[1] - 40));
    const x1 = Math.max(...nodes.map(n => n.pos[0] + n.size[0])), y1 = Math.max(...nodes.map(n => n.pos[1] + n.size[1]));
    const s = Math.min(el.clientWidth / (x1 - x0 + 80), el.clientHeight / (y1 - y0 + 80), 1.5);
    c.ds.scale = s;
    c.ds.offset = [(el.clientWidth / s - (x1 - x0)) / 2 - x0, (el.clientHeight / s - (y1 - y0)) / 2 - y0];
    c.setDirty(true, true);
    done({types: nodes.map(n => n.type), errors: nodes.filter(n => n.has_errors).map(n => n.type), rejected,
          widgets: nodes.map(n => [n.type, (n.widgets ?? []).map(w => w.name)])});
  } catch (e) { done({failed: String(e)}); }
})();
"""
QUEUE = """
const done = arguments[arguments.length - 1];
window.app.queuePrompt(0, 1).then(() => done(true), e => done(String(e)));
"""


def _browser(url: str, vue_nodes: bool = False):
    from selenium import webdriver
    opts = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        opts.add_argument(flag)
    binary = shutil.which("chromium") or shutil.which("google-chrome")
    if binary:
        opts.binary_location = binary
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(shutil.which("chromedriver")))
    driver.set_script_timeout(120)
    # a first start would open the template browser over the canvas
    _post(f"{url}/settings/Comfy.TutorialCompleted", True)
    _post(f"{url}/settings/Comfy.VueNodes.Enabled", vue_nodes)
    _open(driver, url)
    return driver


def _open(driver, url: str) -> None:
    """A fresh page (no dialog or tab left from the graph before)."""
    driver.get(url)
    for _ in range(120):
        if driver.execute_script("return !!(window.app && window.app.graph)"):
            return
        time.sleep(0.5)
    driver.quit()
    sys.exit("the frontend did not start (window.app never appeared)")


def _queue(driver, url: str, timeout: float) -> dict:
    """Queue the loaded graph from the page; its /history entry once it has ended."""
    before = set(_get(f"{url}/history"))
    result = driver.execute_async_script(QUEUE)
    if result is not True:
        return {"status": {"status_str": f"queue failed: {result}"}}
    for _ in range(int(timeout * 2)):
        new = set(_get(f"{url}/history")) - before
        queue = _get(f"{url}/queue")
        if new or not (queue["queue_running"] or queue["queue_pending"]):
            break
        time.sleep(0.5)
    new = set(_get(f"{url}/history")) - before
    return wait_for(url, new.pop(), timeout) if new else {"status": {"status_str": "never ran"}}


def _cached(hist: dict) -> set:
    return {n for kind, m in hist.get("status", {}).get("messages", []) if kind == "execution_cached"
            for n in m.get("nodes", [])}


def _errors(hist: dict) -> str:
    msgs = [m[1].get("exception_message", "") for m in hist.get("status", {}).get("messages", [])
            if m[0] == "execution_error"]
    return f": {msgs[0][:300]}" if msgs else ""


def check(driver, url: str, info: dict, path: Path, shots: Path, timeout: float) -> dict:
    """One UI workflow: {loaded, ran, run_s, cached, cached_s, note}."""
    row = {"loaded": False, "ran": False, "run_s": 0.0, "cached": "-", "cached_s": 0.0, "note": ""}
    graph = json.loads(path.read_text())
    _open(driver, url)
    seen = driver.execute_async_script(LOAD, graph)
    if "failed" in seen:
        return {**row, "note": f"loadGraphData failed: {seen['failed']}"}
    unknown = sorted(set(seen["types"]) - set(info))
    if unknown or seen["errors"] or seen["rejected"]:
        return {**row, "note": f"unknown {unknown}, flagged {seen['errors']}, rejected widget values {seen['rejected']}"}
    row["loaded"] = True
    # a fresh cache, so that the first queue runs every node: the server resets it on this flag when its
    # worker wakes; a flag set while the worker is busy waits for the next prompt, so it is set twice
    for _ in range(2):
        _post(f"{url}/free", {"unload_models": True, "free_memory": True})
        time.sleep(1)
    t0 = time.time()
    hist = _queue(driver, url, timeout)
    row["run_s"] = time.time() - t0
    status = hist.get("status", {}).get("status_str", "timeout")
    time.sleep(1)                                   # let the page draw the outputs
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shots / f"{path.stem}.png"))
    if status != "success":
        return {**row, "note": status + _errors(hist)}
    row["ran"] = True
    if _cached(hist):
        row["note"] = f"first run took {sorted(_cached(hist))} from the cache; "
    # the same graph again, unchanged: ComfyUI must serve every node from its cache
    t0 = time.time()
    again = _queue(driver, url, timeout)
    row["cached_s"] = time.time() - t0
    nodes = set(hist.get("prompt", [None, None, {}])[2])
    cached = _cached(again) & nodes
    ok = again.get("status", {}).get("status_str") == "success" and cached == nodes and nodes
    row["cached"] = f"{len(cached)}/{len(nodes)}"
    row["cached_ok"] = bool(ok)
    if not ok:
        row["note"] += f"re-queue {again.get('status', {}).get('status_str', 'timeout')}, ran again: " \
                      f"{sorted(nodes - cached)}{_errors(again)}"
    return row


def _delta(v1: tuple, served: tuple) -> str:
    """What differs between two normalised inputs: section, name, type, then option by option."""
    parts = [f"{what} {a!r} vs {b!r}" for what, a, b in zip(("section", "name", "type"), v1[:3], served[:3]) if a != b]
    parts += [f"{k} {v1[3].get(k)!r} vs {served[3].get(k)!r}" for k in sorted(set(v1[3]) | set(served[3]))
              if v1[3].get(k) != served[3].get(k)]
    return ", ".join(parts) + " (V1 vs served)"


def v3_vs_v1(info: dict, base: Path) -> bool:
    """Our nodes in /object_info against the V1 declarations (model folders: the server's)."""
    sys.path.insert(0, str(ROOT / "bench" / "comfyui_checks"))
    os.environ["VAEKIT_MODEL_DIRS"] = str(base / "models")
    from check_core_nodes import _pack
    from check_v3 import _normal
    _pack()
    from vaekit.nodes import NODE_CLASS_MAPPINGS as v1
    ok_all = True
    for name, node in v1.items():
        served = info.get(name)
        if served is None:
            print(f"{name:<24} NOT in /object_info")
            ok_all = False
            continue
        ours, theirs = _normal(node.INPUT_TYPES()), _normal(served["input"])
        order = [n for sec in ("required", "optional") for n in served.get("input_order", {}).get(sec, [])]
        diffs = [f"{a[1]}: {_delta(a, b)}" for a, b in zip(ours, theirs) if a != b] + \
            ([f"{len(ours)} inputs vs {len(theirs)}"] if len(ours) != len(theirs) else []) + \
            ([f"input_order {order}"] if order and order != [x[1] for x in ours] else [])
        outs = (list(served["output"]), list(served.get("output_name", [])))
        want = (list(node.RETURN_TYPES), list(getattr(node, "RETURN_NAMES", node.RETURN_TYPES)))
        if outs != want:
            diffs.append(f"outputs {outs} != {want}")
        ok_all &= not diffs
        print(f"{name:<24} {len(theirs)} inputs, {len(outs[0])} outputs: "
              + ("same as V1" if not diffs else "DIFFERS from V1: " + "; ".join(diffs)[:600]))
    return ok_all


def main() -> int:
    p = server_arguments(__doc__.split("\n\n")[0], 8190)
    p.add_argument("--only", help="comma list of UI workflow names (without .json)")
    p.add_argument("--screenshots", type=Path, help="folder for one PNG per workflow")
    p.add_argument("--timeout", type=float, default=900, help="seconds per graph")
    p.add_argument("--vue-nodes", action="store_true", help="the frontend's Nodes 2.0 renderer (folds 'advanced' inputs)")
    p.add_argument("--front-end-root", help="another frontend build (a comfyui-frontend-package's static/ folder)")
    a = p.parse_args()
    paths = sorted(q for q in (ROOT / "workflows").glob("*.json") if not q.name.endswith("_api.json"))
    if a.only:
        paths = [q for q in paths if q.stem in a.only.split(",")]
    ok_all = True
    extra = ("--front-end-root", str(Path(a.front_end_root).resolve())) if a.front_end_root else ()
    with comfyui_server(a.comfyui, a.python, a.port, extra) as (url, info, base):
        advanced = sorted(f"{k}.{n}" for k, v in info.items() if k.startswith("VAEKit")
                          for sec in ("required", "optional") for n, d in v["input"].get(sec, {}).items()
                          if len(d) > 1 and isinstance(d[1], dict) and d[1].get("advanced"))
        print(f"inputs the server marks advanced: {', '.join(advanced)}")
        print("\n/object_info of our nodes vs their V1 declarations")
        ok_all &= v3_vs_v1(info, base)
        driver = _browser(url, a.vue_nodes)
        try:
            print(f"\n{'workflow':<40} {'loaded':<7} {'ran':<4} {'s':>6}  {'cached':<7} {'s':>5}  note")
            for path in paths:
                r = check(driver, url, info, path, a.screenshots, a.timeout)
                ok_all &= r["loaded"] and r["ran"] and r.get("cached_ok", False)
                print(f"{path.stem:<40} {'yes' if r['loaded'] else 'NO':<7} {'yes' if r['ran'] else 'NO':<4} "
                      f"{r['run_s']:>6.1f}  {r['cached']:<7} {r['cached_s']:>5.1f}  {r['note']}", flush=True)
        finally:
            driver.quit()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
