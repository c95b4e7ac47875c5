"""Every UI workflow in ComfyUI's real frontend, in headless Chromium, with this pack installed.

    python bench/browser_check.py --comfyui PATH/TO/ComfyUI --python PATH/TO/venv/bin/python
    python bench/browser_check.py ... --only image_tiled_roundtrip --screenshots workflows/screenshots

Needs Chromium and its driver (Debian: `chromium`, `chromium-driver`) and `selenium` for this python;
ComfyUI's venv needs `comfyui-frontend-package`. The server is the one `run_in_comfyui.py` starts (a
fresh base directory with the demo files and tiny random-weight VAEs under the names the graphs use).
Per workflow: `app.loadGraphData(file)`; every node type must be known to the server and no node
flagged with errors; every combo widget must hold one of its choices (a value the frontend would
reject); the graph is queued from the page (`app.queuePrompt`) and must end in success in /history;
a screenshot is saved. Then the round trip is queued again unchanged: ComfyUI must serve the decode
from its cache (the `execution_cached` message lists it), as a graph without randomizing widgets
allows. Exit status 1 on any failure.
"""
from __future__ import annotations

import json
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


def check(driver, url: str, info: dict, path: Path, shots: Path, timeout: float) -> tuple[bool, str]:
    graph = json.loads(path.read_text())
    _open(driver, url)
    seen = driver.execute_async_script(LOAD, graph)
    if "failed" in seen:
        return False, f"loadGraphData failed: {seen['failed']}"
    unknown = sorted(set(seen["types"]) - set(info))
    if unknown or seen["errors"] or seen["rejected"]:
        return False, f"unknown {unknown}, flagged {seen['errors']}, rejected widget values {seen['rejected']}"
    t0 = time.time()
    hist = _queue(driver, url, timeout)
    status = hist.get("status", {}).get("status_str", "timeout")
    time.sleep(1)                                   # let the page draw the outputs
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shots / f"{path.stem}.png"))
    errors = [m[1].get("exception_message", "") for m in hist.get("status", {}).get("messages", [])
              if m[0] == "execution_error"]
    return status == "success", f"{status} in {time.time() - t0:.1f} s" + (f": {errors[0][:300]}" if errors else "")


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
        driver = _browser(url, a.vue_nodes)
        try:
            print(f"{'workflow':<40} {'ok':<4} result")
            for path in paths:
                ok, note = check(driver, url, info, path, a.screenshots, a.timeout)
                ok_all &= ok
                print(f"{path.stem:<40} {'yes' if ok else 'NO':<4} {note}", flush=True)
            # the cache: the same graph queued twice in a row runs its decode once
            driver.execute_async_script(LOAD, json.loads((ROOT / "workflows" / "image_tiled_roundtrip.json").read_text()))
            first, again = _queue(driver, url, a.timeout), _queue(driver, url, a.timeout)
            decode = [nid for nid, n in json.loads((ROOT / "workflows" / "image_tiled_roundtrip_api.json")
                                                  .read_text()).items() if n["class_type"] == "VAEKitTiledDecode"]
            cached = _cached(again)
            ok = set(decode) <= cached and again.get("status", {}).get("status_str") == "success"
            ok_all &= ok
            print(f"{'re-queue image_tiled_roundtrip unchanged':<40} {'yes' if ok else 'NO':<4} "
                  f"cached nodes {sorted(cached)} (decode is node {decode[0]}; first run cached {sorted(_cached(first))})")
        finally:
            driver.quit()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
