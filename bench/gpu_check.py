"""The GPU check: one command that shows, on a CUDA device, what VAEKit promises, in at most 8 minutes
on one H100, printing one markdown table (and writing it to ``--out``) row by row as it measures.

    python3 bench/gpu_check.py --out gpu_check.md              # the check (a CUDA device)
    python3 bench/gpu_check.py --calibrate --out cal.md        # only the calibration points and the fit
    python3 bench/gpu_check.py --device cpu --small            # the same code at tiny sizes (a test runs it)
    python3 bench/gpu_check.py --rows f --out more.md          # rows left over by the time guard
    python3 bench/gpu_check.py --comfyui /path/to/ComfyUI      # adds row g, beside ComfyUI core

Rows (docs/gpu.md says what each measures, its target and its time on an H100):
  a  every family at its test config: the device in fp32 against the CPU in fp32 (decode, encode),
     bf16 and fp16 on the device against the CPU's fp32, the fp16 NaN guard where it must act, and
     exact tiles on the device (the copies to host memory, parked tiles) against the CPU's one pass;
  b  Wan 2.1 (published config, random weights) bf16 decode 1280x720x81 in a 4 GiB budget, as a user
     calls it: allocated and reserved peaks against the budget and the prediction, then max abs and
     time against one pass, host memory; then the same plan without ``empty_cache`` between stages;
  d  Wan 2.1 tiled encode 1280x720x81 in 4 GiB; an SDXL-shape KL decode at 2048 px in 2 GiB (tiles
     meeting in rounds, paused tiles parked in host memory);
  e  the replan: the process capped (``set_per_process_memory_fraction``) below one pass's need, a
     decode without a budget runs out of memory, frees, replans in exact tiles and equals one pass;
  k  calibration points: measured peaks against the meta-device prediction, and the fitted calibration;
  c  Wan 2.1 1920x1080x241 in 4 GiB (one pass of the whole clip is skipped by design: ~70 s; its first
     17 frames are compared with one pass of theirs, the decoder being causal in time);
  f  Compile VAE on the device against eager (time, equality), and exact tiles compiled if offered;
  g  beside ComfyUI core (``--comfyui DIR``): core's VAE Decode and VAE Decode (Tiled) on the same
     weights and latent, time and peak;
  n  several devices (more than one GPU visible: NCCL; ``--device cpu``: two CPU ranks, gloo).

Each row runs in a process of its own, which sends its lines to this one as it measures them: a sticky
CUDA error or a crash ends that row, and the table goes on with the next (the row's line then says what
it had reached and why it ended: exit code or signal, last error line). Inside a row, an exception or
out-of-memory error is reported in its line. Each row's time limit is its share of the time left of
``--limit`` (480 s), in proportion to its estimate among the rows still to run; a row stopped at its
limit prints what it reached (rows b, c and d: units of work done, time, memory so far), and one that
does not stop is killed. Plans and the CPU references of row a are computed in helper processes on the
host's other cores while the device works. Weights are random, drawn on the device under a fixed seed
(bench/harness/configs.py); nothing is downloaded.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import functools
import gc
import hashlib
import json
import logging
import math
import multiprocessing
import os
import pickle
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, NoReturn, Optional

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "bench"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

from harness import configs  # noqa: E402
from harness.measure import HostPeak  # noqa: E402

MIB, GIB = 1 << 20, 1 << 30
LIMIT_S = 480
ORDER = "abdekcfgn"
# seconds each row is expected to take, its process's start included: (one H100, default sizes; a
# shared 2-core CPU, --small). The GPU figures are estimates (docs/gpu.md: from the FLOPs counted on the
# meta device at an assumed 60 TFLOPS in bf16, and the planner's CPU time measured here); the CPU
# figures were measured. They weigh each row's share of the time left (``row_limit``); the check prints
# what each row really took.
ESTIMATE_S = {"a": (60, 110), "b": (95, 30), "d": (65, 35), "e": (30, 20), "k": (30, 25), "c": (150, 30),
              "f": (90, 25), "g": (60, 30), "n": (60, 50)}
MIN_ROW_S = 10      # a share shorter than this is not worth a process (its start alone takes seconds)
GRACE_S = 20        # a row's process still running this long after its limit is killed
TAG = "@gpu_check "     # a row's process to this one: one JSON message a line on its stdout
CHILD_SCRIPT = Path(__file__).resolve()         # what a row's process runs
# half precision against fp32 on 0..1 pixels (decode) and latents (encode): relative RMS error (of the
# difference over the reference). The CPU's own bf16 / fp16 at these configs give at most: decode
# 0.041 / 0.0041 (HunyuanVideo), encode 0.099 (SeedVR2) / 0.0066; the limits are about three times that
# (docs/gpu.md has every family's CPU figure).
HALF_TOLERANCE = {("decode", torch.bfloat16): 0.12, ("decode", torch.float16): 0.012,
                  ("encode", torch.bfloat16): 0.3, ("encode", torch.float16): 0.02}
# ...except where half precision is as far off on the CPU: there the device's half precision is compared
# with the CPU's in the same dtype (same limits). Mochi's encoder takes Fourier features of the pixels up
# to 2^7 * 2 pi: a pixel rounded to half precision moves them by radians (the CPU: 1.1 bf16, 0.51 fp16).
HALF_AGAINST_HALF = {("mochi", "encode")}
NEEDS_CUDA = "needs CUDA"         # a line's result where its measurement exists on a CUDA device only
SMALL_FAMILIES = ("kl", "tiny", "wan", "qwen21", "mochi")     # --small: every family in fp32, these in half


# ---- the table ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Line:
    case: str
    result: str          # ok, FAIL, info, skipped, stopped (at its time limit), error, needs CUDA
    figures: str
    target: str = ""


class Table:
    """Prints and appends each line as it comes (a killed run keeps what it measured)."""

    HEAD = "| row | case | result | figures | target | s |\n|---|---|---|---|---|---:|"

    def __init__(self, out: Optional[Path]):
        self.out = out
        if out:
            out.write_text("")

    def write(self, text: str) -> None:
        print(text, flush=True)
        if self.out:
            with self.out.open("a") as f:
                f.write(text + "\n")
                f.flush()

    def line(self, row: str, line: Line, seconds: float) -> None:
        cells = [row, line.case, line.result, line.figures, line.target, f"{seconds:.1f}"]
        self.write("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")


class TimeUp(BaseException):
    """The run's time limit was reached inside a row."""


# ---- the run's environment ----------------------------------------------------------------------

class Env:
    """The run's options and state; in a row's process (``--child``), that row's: its deadline, the
    helpers' results read from the run's folder, and what the row has reached so far."""

    def __init__(self, a):
        self.args = a
        self.device = torch.device(a.device)
        self.cuda = self.device.type == "cuda"
        self.small = a.small
        self.limit = a.row_limit or a.limit
        self.start = time.perf_counter()
        self.until = a.until or time.time() + a.limit       # wall clock: shared with the rows' processes
        self.run_dir: Optional[Path] = Path(a.run_dir) if a.run_dir else None
        self.reached = ""            # what the row has measured since its last line (sent to the parent)
        self.meter: Optional[Meter] = None      # the measurement running now
        self.comfyui = a.comfyui
        self.full_untiled = a.full_untiled
        self.calibrate = a.calibrate
        self.families = a.families.split(",") if a.families else None
        self.points: list[tuple[str, int, int, int]] = _read_points(self.run_dir)   # (case, live, allocated, reserved)
        self.helpers = None          # Helpers in the parent, Results in a row's process
        self.host = torch.device("cpu")
        self.models = "TEST" if self.small else "PUBLISHED"      # --small: the tests' tiny configs

    def entry(self, family: str) -> tuple:
        return getattr(configs, self.models)[family]

    def label(self, family: str) -> str:
        name = {"wan": "Wan 2.1", "kl": "SDXL-shape KL"}[family]
        return f"{name} (test config)" if self.small else name

    def half(self) -> torch.dtype:
        """The dtype of rows b-g: bf16 on a GPU, fp32 on the CPU (whose bf16 convolutions are slow)."""
        return torch.bfloat16 if self.cuda else torch.float32

    def left(self) -> float:
        return self.until - time.time()

    def reach(self, text: str) -> None:
        """Say what the row has reached (sent at once: if its process dies, the parent still prints it)."""
        self.reached = text
        send(reached=text)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def send(**message) -> None:
    """One message of a row's process to the check (on its stdout, which the check reads)."""
    print(TAG + json.dumps(message), flush=True)


@dataclasses.dataclass
class Peak:
    seconds: float
    allocated: int       # CUDA: max_memory_allocated - allocated before; CPU: peak RSS - RSS before
    reserved: int        # CUDA: max_memory_reserved - reserved before; CPU: the same as allocated
    host: int            # peak RSS - RSS before (output, maps, staging buffers)
    how: str = "VmHWM"   # how the host peak was found (harness.measure.HostPeak)

    def text(self, cuda: bool) -> str:
        if cuda:
            return (f"allocated {mib(self.allocated)}, reserved {mib(self.reserved)}, host {mib(self.host)} "
                    f"({self.how}), {self.seconds:.1f} s")
        return f"working set {mib(self.allocated)} ({self.how}), {self.seconds:.1f} s"


@dataclasses.dataclass
class Meter:
    """The baselines of the measurement running now, for what it has used so far."""
    allocated: int
    reserved: int
    host: HostPeak


def mib(n: float) -> str:
    return f"{n / MIB:.0f} MiB"


def measured(env: Env, fn: Callable[[], object]) -> tuple[object, Peak]:
    """``fn()``, its time and the peaks of what it added on the device and the host."""
    gc.collect()
    a0 = r0 = 0
    if env.cuda:
        env.sync()
        torch.cuda.empty_cache()
        a0, r0 = torch.cuda.memory_allocated(env.device), torch.cuda.memory_reserved(env.device)
        torch.cuda.reset_peak_memory_stats(env.device)
    with HostPeak() as host:
        env.meter = Meter(a0, r0, host)
        try:
            t0 = time.perf_counter()
            out = fn()
            env.sync()
            seconds = time.perf_counter() - t0
        finally:
            env.meter = None
    alloc = res = host.bytes()
    if env.cuda:
        alloc = torch.cuda.max_memory_allocated(env.device) - a0
        res = torch.cuda.max_memory_reserved(env.device) - r0
    return out, Peak(seconds, alloc, res, host.bytes(), host.method)


def so_far(env: Env) -> str:
    """What the measurement running now has used so far (device and host peaks above its start)."""
    m = env.meter
    if m is None:
        return "no measurement running"
    host = f"{mib(m.host.bytes())} ({m.host.method})"
    if not env.cuda:
        return f"working set so far {host}"
    return (f"allocated so far {mib(torch.cuda.max_memory_allocated(env.device) - m.allocated)}, reserved so far "
            f"{mib(torch.cuda.max_memory_reserved(env.device) - m.reserved)}, host so far {host}")


def progress(env: Env, what: str) -> Callable[[int, int], None]:
    """A call's progress callback that reports what the call has reached (units of work done, time,
    memory so far), at most once a second: a row stopped at its limit, or whose process dies, still says
    how far its long call got."""
    t0, last = time.perf_counter(), [-1.0]

    def report(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= 1 or done >= total:
            last[0] = now
            env.reach(f"{what}: {done}/{total} units of work (tiles x chunks, by cost) in {now - t0:.1f} s; "
                      f"{so_far(env)}")
    return report


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference, in slices (outputs of several GB on the host)."""
    if a.shape != b.shape:
        return float("nan")
    worst = 0.0
    for x, y in zip(a.flatten(0, min(2, a.dim() - 3)), b.flatten(0, min(2, b.dim() - 3))):
        worst = max(worst, float((x.float() - y.float()).abs().max()))
    return worst


def rel_rms(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double().cpu(), ref.double().cpu()
    return float((a - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-12))


@contextlib.contextmanager
def no_tf32():
    """fp32 on the device as fp32 (cuDNN's default lets convolutions round inputs to TF32)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@contextlib.contextmanager
def logged(level=logging.INFO) -> Iterator[list]:
    """The VAEKit log records of the block (with the device's allocated bytes when each was made)."""
    records: list = []

    class Keep(logging.Handler):
        def emit(self, record):
            record.allocated = torch.cuda.memory_allocated() if torch.cuda.is_initialized() else -1
            records.append(record)
    log = logging.getLogger("VAEKit")
    handler, old = Keep(level), log.level
    log.addHandler(handler)
    log.setLevel(min(level, old or level))
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


# ---- helper processes: plans on the meta device and CPU references, beside the device's work ------

def _plan_job(entry_name: str, family: str, op: str, shape: tuple, budget, device_type: str, tile=None) -> dict:
    """The planner's choice for ``budget`` (bytes, or ("tile", px): what exact tiles of px pixels are
    predicted to need), or, with ``tile``, the prediction of that exact call; on the meta device."""
    from vae.engine import budget as planner
    torch.set_num_threads(1)
    entry = getattr(configs, entry_name)[family]
    v = configs.build(entry, "meta", torch.bfloat16 if device_type == "cuda" else torch.float32)
    device, host = torch.device(device_type), torch.device("cpu")
    t0 = time.perf_counter()
    if tile is not None:
        call = v.call_for(op, shape, tile=tile, mode="exact")
        p = planner.predict(v, call, device, host)
        return dict(tile=tile, tile_frames=None, device=p.device, live=p.live, maps=p.maps, output=p.output,
                    describe=f"exact, {tile} px tiles" if tile else "one pass", seconds=time.perf_counter() - t0)
    call = v.call_for(op, shape, tile=4096, mode="exact")
    if isinstance(budget, tuple):
        # --small: tiles of at most this size and room for them (at tiny sizes the fixed bytes of the
        # calibration dominate, and one pass would fit the budget of any tiling)
        call = v.call_for(op, shape, tile=budget[1], mode="exact")
        budget = _tile_budget(v, op, shape, budget[1], device, host)
    p = planner.plan(v, call, budget, device, host, host)
    return dict(tile=p.call.tile, tile_frames=p.call.tile_frames, device=p.on_device(), live=p.prediction.live,
                most=call.tile if call.tile != 4096 else None,
                maps=p.prediction.maps, output=p.prediction.output, budget=budget, describe=p.describe(),
                seconds=time.perf_counter() - t0)


def _tile_budget(v, op: str, shape: tuple, px: int, device: torch.device, host: torch.device) -> int:
    """The most any exact tiling of at most ``px`` pixels is predicted to need (the planner's search may
    try any of them, and a smaller tile can need more: parked rounds, docs/memory.md), plus 1 MiB."""
    from vae.engine import budget as planner
    capped = v.call_for(op, shape, tile=px, mode="exact")
    need = 0
    for t in planner._candidates(v, capped, px):
        try:
            p = planner.predict(v, dataclasses.replace(capped, tile=t), device, host)
        except Exception:       # noqa: BLE001 - tiles the input checks refuse are not tried either
            continue
        need = max(need, planner.on_device(p, device, host, host))
    return need + (1 << 20)


def _row_a_inputs(v, seed: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Row a's latent and pixels for a tiny model: 2x2 latent pixels (2 latent frames for video)."""
    c, g = v.caps, torch.Generator().manual_seed(seed)
    s = c.spatial_ratio_packed
    if v.is_video:
        z = torch.randn(1, c.latent_channels_packed, 2, 2, 2, generator=g)
        x = torch.rand(1, c.image_channels, 1 + c.temporal_ratio, 2 * s, 2 * s, generator=g)
    else:
        z = torch.randn(1, c.latent_channels_packed, 2, 2, generator=g)
        x = torch.rand(1, c.image_channels, 2 * s, 2 * s, generator=g)
    return z, x if c.can_encode else None


def _reference_job(family: str, seed: int) -> dict:
    """Row a's CPU fp32 references of one family (and a checksum of its weights)."""
    torch.set_num_threads(1)
    v = configs.build(configs.TEST[family], "cpu", seed=seed)
    z, x = _row_a_inputs(v, seed)
    t0 = time.perf_counter()
    out = dict(decode=v.decode(z), encode=v.encode(x) if x is not None else None)
    for fam, op in HALF_AGAINST_HALF:
        if fam == family:
            for dtype in (torch.bfloat16, torch.float16):
                h = configs.build(configs.TEST[family], "cpu", dtype, seed=seed)
                out[op, dtype] = getattr(h, op)(z if op == "decode" else x)
    # numpy: pickled plainly (torch tensors would travel through shared memory, small in a bare container)
    out = {k: None if t is None else t.float().numpy() for k, t in out.items()}
    return dict(out, weights=_checksum(v.model), seconds=time.perf_counter() - t0)


def _checksum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum().cpu() for p in model.parameters()))


def _result_path(run_dir: Path, key) -> Path:
    return run_dir / f"job_{hashlib.sha1(repr(key).encode()).hexdigest()[:16]}.pkl"


def _store(path: Path, future) -> None:
    """A helper's result, or its failure, written (whole, by a rename) where the rows' processes read it."""
    try:
        value = ("ok", future.result())
    except BaseException as e:      # noqa: BLE001 - the row that needs it reports it
        value = ("error", _error_text(e))
    with contextlib.suppress(OSError):          # the run's folder is gone: the run has ended
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(value))
        os.replace(tmp, path)


class Helpers:
    """A pool of processes (spawned: no CUDA state inherited) for the CPU's share of the check; each
    result goes to a file of the run's folder, read there by the row that needs it (``Results``)."""

    def __init__(self, workers: int, run_dir: Path):
        self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        self.run_dir = run_dir

    def submit(self, key, fn, *args) -> None:
        self.pool.submit(fn, *args).add_done_callback(functools.partial(_store, _result_path(self.run_dir, key)))

    def close(self) -> None:
        """Stops the helpers at once: a plan still running for a row that was skipped would otherwise
        hold the interpreter's exit until it ends."""
        procs = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(10)


class Results:
    """In a row's process: the helpers' results, as the parent's helpers write them."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def get(self, key, env: Env):
        path = _result_path(self.run_dir, key)
        while not path.exists():
            if env.left() <= 0:
                raise TimeoutError(f"no helper result for {key!r} in the row's time")
            time.sleep(0.1)
        kind, value = pickle.loads(path.read_bytes())
        if kind == "error":
            raise RuntimeError(f"in a helper process: {value}")
        return value


# ---- sizes per mode -----------------------------------------------------------------------------

def sizes(env: Env) -> dict:
    """Per case: (H, W, frames) in pixels and the budget (bytes, or a share of one pass's prediction)."""
    if env.small:
        def f(px: int) -> tuple:         # the budget of exact px tiles: no room for one pass
            return "tile", px
        return dict(b=((32, 48, 5), f(32)), c=((32, 48, 9), f(32)), d_enc=((32, 48, 5), f(32)),
                    d_kl=((128, 128, 1), f(64)),
                    e=(32, 48, 5), f=(64, 64, 1), g=(32, 32, 5), n=(32, 48, 5),
                    k_wan=[((32, 48, 5), None), ((32, 48, 5), 32)], k_kl=[((64, 64, 1), None), ((64, 64, 1), 32)])
    return dict(b=((720, 1280, 81), 4 * GIB), c=((1080, 1920, 241), 4 * GIB), d_enc=((720, 1280, 81), 4 * GIB),
                d_kl=((2048, 2048, 1), 2 * GIB), e=(480, 832, 17), f=(1024, 1024, 1), g=(480, 832, 33),
                n=(480, 832, 33),
                k_wan=[((480, 832, 9), None), ((720, 1280, 9), 256), ((720, 1280, 9), 384)],
                k_kl=[((1024, 1024, 1), None), ((1024, 1024, 1), 512)])


CALIBRATE = dict(k_wan=[((256, 256, 9), None), ((480, 832, 9), None), ((720, 1280, 5), None),
                        ((720, 1280, 9), 192), ((720, 1280, 9), 256), ((720, 1280, 9), 384), ((720, 1280, 9), 512)],
                 k_kl=[((512, 512, 1), None), ((1024, 1024, 1), None), ((2048, 2048, 1), None),
                       ((1024, 1024, 1), 256), ((2048, 2048, 1), 512)])


def latent(entry: tuple, hwt: tuple, seed: int = 0) -> torch.Tensor:
    """A latent (randn, seeded) that decodes to ``hwt`` = (H, W, frames) pixels for the model of ``entry``."""
    caps = configs.spec(entry[0]).capabilities(entry[1])
    h, w, t = hwt
    r, g = caps.spatial_ratio, torch.Generator().manual_seed(seed)
    lead = (1, caps.latent_channels) + ((1 + (t - 1) // caps.temporal_ratio,) if caps.temporal_ratio else ())
    return torch.randn(*lead, h // r, w // r, generator=g)


def submit_jobs(env: Env, rows: str) -> None:
    """What the rows will ask of the helper processes, submitted up front in the order the rows need it
    (with fewer helpers than jobs, the first row does not wait for the last row's plans)."""
    h, s = env.helpers, sizes(env)
    dev, m = env.device.type, env.models
    wan, kl = env.entry("wan"), env.entry("kl")

    def plan(key, fam, op, shape, budget, tile=None):
        h.submit(key, _plan_job, m, fam, op, tuple(shape), budget, dev, tile)
    for row in rows:
        if row == "a":
            for f in families(env):
                h.submit(("ref", f), _reference_job, f, 0)
        elif row == "b":
            plan("b", "wan", "decode", latent(wan, s["b"][0]).shape, s["b"][1])
        elif row == "d":
            hh, ww, tt = s["d_enc"][0]
            plan("d_enc", "wan", "encode", (1, 3, tt, hh, ww), s["d_enc"][1])
            plan("d_kl", "kl", "decode", latent(kl, s["d_kl"][0]).shape, s["d_kl"][1])
        elif row == "k":
            cal = CALIBRATE if env.calibrate and not env.small else s
            for fam in ("wan", "kl"):
                for hwt, tile in cal[f"k_{fam}"]:
                    plan(("k", fam, hwt, tile), fam, "decode", latent(env.entry(fam), hwt).shape, None, tile or 0)
        elif row == "c":
            plan("c", "wan", "decode", latent(wan, s["c"][0]).shape, s["c"][1])


def families(env: Env) -> list[str]:
    return env.families or list(configs.TEST)


# ---- row a: every family, every dtype ------------------------------------------------------------

def row_a(env: Env) -> Iterator[Line]:
    for family in families(env):
        yield _caught(f"{family} (test config)", lambda: _family_line(env, family))
    yield _caught("fp16 NaN guard", lambda: _guard_line(env))
    for family in ("kl", "tiny") + (() if env.small else ("qwen21",)):
        yield _caught(f"{family}: exact tiles on the device", lambda: _exact_line(env, family))


def _caught(case: str, make: Callable[[], Line]) -> Line:
    """One line of a row that reports its own failure (the row goes on with its next line)."""
    try:
        return make()
    except TimeUp:
        raise
    except Exception as e:         # noqa: BLE001 - reported in the line
        return Line(case, "error", _error_text(e))


def _family_line(env: Env, family: str) -> Line:
    """One family at its test config: the device in fp32 against the CPU's fp32 (from a helper
    process), then bf16 and fp16 on the device."""
    half = (torch.bfloat16, torch.float16)
    ref = {k: torch.from_numpy(v) if hasattr(v, "dtype") else v for k, v in env.helpers.get(("ref", family), env).items()}
    cpu = configs.build(configs.TEST[family], "cpu", seed=0)
    if abs(_checksum(cpu.model) - ref["weights"]) > 1e-6 * max(1.0, abs(ref["weights"])):
        return Line(f"{family} (test config)", "error", "the helper process drew other weights (seed)")
    z, x = _row_a_inputs(cpu, 0)
    figures, ok = [], True
    dtypes = (torch.float32,) + (half if (not env.small or family in SMALL_FAMILIES) else ())
    for op, inp in (("decode", z), ("encode", x)):
        if inp is None:
            continue
        want, parts = ref[op], []
        for dtype in dtypes:
            v = _copy(cpu, env.device, dtype)
            with no_tf32():
                got = getattr(v, op)(inp)
            if not torch.isfinite(got).all():
                ok, text = False, "non-finite"
            elif dtype == torch.float32:
                err = max_abs(got.cpu(), want)
                ok &= err <= 1e-4
                text = f"{err:.1e}"
            else:
                err = rel_rms(got, ref.get((op, dtype), want))
                ok &= err <= HALF_TOLERANCE[op, dtype]
                text = f"{err:.1e}"
            up = v.last_upcast
            if up is not None and up.tiles:
                text += " (upcast " + "/".join(str(d).removeprefix("torch.") for d in dict.fromkeys(up.dtypes)) + ")"
            parts.append(f"{str(dtype).removeprefix('torch.')} {text}")
            del v, got
        figures.append(f"{op}: " + ", ".join(parts))
    known = [op for fam, op in HALF_AGAINST_HALF if fam == family]
    target = "fp32 max abs <= 1e-4; half: rel RMS vs CPU fp32 (docs/gpu.md)" + (
        f"; {known[0]} half vs the CPU's half" if known else "")
    return Line(f"{family} (test config)", "ok" if ok else "FAIL", "; ".join(figures), target)


def _copy(v, device: torch.device, dtype: torch.dtype):
    """Another handle over a copy of ``v``'s model, on ``device`` in ``dtype``."""
    from vae.handle import VAE
    return VAE(v.spec, v.config, copy.deepcopy(v.model), dtype, device, v.source)


def _guard_line(env: Env) -> Line:
    """The fp16 guard where it must act: an SDXL-like overflow (the decoder's first conv x3000, as
    tests/vae/test_guard.py makes it)."""
    cpu = configs.build(configs.TEST["kl"], "cpu", seed=0)
    with torch.no_grad():
        cpu.model.decoder.conv_in.weight.mul_(3000.0)
        cpu.model.decoder.conv_in.bias.mul_(3000.0)
    z = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    z[:, :, 2:6, 11:15] *= 30
    want = cpu.decode(z)
    v = _copy(cpu, env.device, torch.float16)
    with torch.inference_mode():
        raw = v.model.decode(v._model_input(z))
    overflowed = not bool(torch.isfinite(raw).all())
    got = v.decode(z)
    err = max_abs(got.cpu(), want)
    up = v.last_upcast
    dtypes = "/".join(str(d).removeprefix("torch.") for d in dict.fromkeys(up.dtypes)) if up and up.tiles else "none"
    # redone in fp32 (the CPU): within fp16 weights' rounding of fp32; in bf16 (CUDA): bf16's own limit
    if up and up.tiles and up.dtypes[-1] == torch.bfloat16:
        err, limit, what = rel_rms(got, want), HALF_TOLERANCE["decode", torch.bfloat16], "rel RMS"
    else:
        limit, what = 1e-2, "max abs"
    ok = overflowed and bool(torch.isfinite(got).all()) and err <= limit and dtypes != "none"
    return Line("fp16 NaN guard (KL, decoder conv_in x3000)", "ok" if ok else "FAIL",
                f"raw fp16 {'overflows' if overflowed else 'is finite (no test)'}; guarded: redone in {dtypes}, "
                f"{what} {err:.1e} vs CPU fp32",
                "raw non-finite; guarded finite: redone in fp32 max abs <= 1e-2, in bf16 (CUDA, first) "
                f"rel RMS <= {HALF_TOLERANCE['decode', torch.bfloat16]}")


def _exact_line(env: Env, family: str) -> Line:
    """Exact 2x2 tiles on the device: tiles in rounds with paused tiles parked in host memory (KL), tile
    after tile with maps in host memory (TAESD; Qwen-Image 2.1 = Wan's code in 2-D)."""
    cpu = configs.build(configs.TEST[family], "cpu", seed=0)
    c = cpu.caps
    z = torch.randn(1, c.latent_channels_packed, 8, 8, generator=torch.Generator().manual_seed(2))
    want = cpu.decode(z)
    v = _copy(cpu, env.device, torch.float32)
    with no_tf32():
        got = v.decode(z, tile=4 * c.spatial_ratio_packed, mode="exact")
    err = max_abs(got, want)
    return Line(f"{family}: exact 2x2 tiles on the device", "ok" if err <= 1e-4 else "FAIL",
                f"max abs {err:.1e} vs CPU fp32 one pass", "<= 1e-4")


# ---- rows b, c, d: the budget kept ---------------------------------------------------------------

def _budget_line(env: Env, case: str, peak: Peak, budget: int, pred: dict, err: float, ref: Optional[Peak],
                 err_target: str, extra: str = "") -> Line:
    """One budget line: peaks against the budget and the prediction, error and time against one pass
    (ok: the budget kept, and the error within 0.05 where there is a one pass to compare with)."""
    kept = peak.allocated <= budget and peak.reserved <= budget and not err > 0.05
    figs = [peak.text(env.cuda), f"predicted {mib(pred['device'])} ({pred['describe']})"]
    if env.cuda:
        figs.append(f"pred/alloc {pred['device'] / max(peak.allocated, 1):.2f}, "
                    f"pred/reserved {pred['device'] / max(peak.reserved, 1):.2f}")
    figs.append(f"max abs {err:.1e} vs one pass" if err == err else "no one pass")
    if ref is not None:
        figs.append(f"time {peak.seconds / max(ref.seconds, 1e-9):.2f}x one pass")
    if extra:
        figs.append(extra)
    return Line(case, "ok" if kept else "FAIL", "; ".join(figs),
                f"allocated and reserved <= budget {mib(budget)}; {err_target}")


def _point(env: Env, case: str, live: int, peak: Peak) -> None:
    """A calibration point, kept for row k's fit (in the run's folder: each row has its own process)."""
    point = (case, live, peak.allocated, peak.reserved)
    env.points.append(point)
    if env.run_dir is not None:
        with (env.run_dir / "points.jsonl").open("a") as f:
            f.write(json.dumps(point) + "\n")


def _read_points(run_dir: Optional[Path]) -> list[tuple[str, int, int, int]]:
    path = run_dir / "points.jsonl" if run_dir else None
    if path is None or not path.exists():
        return []
    return [tuple(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def row_b(env: Env) -> Iterator[Line]:
    from vae.engine import budget as planner
    from vae.engine import transfer
    hwt, _ = sizes(env)["b"]
    dtype = env.half()
    v = configs.build(env.entry("wan"), env.device, dtype)
    z = latent(env.entry("wan"), hwt)
    name = f"{env.label('wan')} {hwt[1]}x{hwt[0]}x{hwt[2]} {str(dtype).removeprefix('torch.')}"
    one_pred = planner.predict(v, v.call_for("decode", z.shape), env.device, env.host)
    warm = z[:, :, :2, :16, :16]              # the device's first kernels and workspaces, outside the timings
    v.decode(warm)
    v.decode(warm, tile=64, mode="exact")
    plan = env.helpers.get("b", env)
    budget, start = plan["budget"], []
    most = dict(tile=plan["most"]) if plan["most"] else {}     # --small: tiles of at most this size
    case = f"{name}: exact in {mib(budget)}, as a user calls it" + (f" (tiles at most {most['tile']} px)" if most else "")

    def call():
        start.append(time.time())
        return v.decode(z, mode="exact", budget=budget, progress=progress(env, case), **most)
    # the budget first (the row's point), one pass after it: a row stopped in the one pass has its figures
    with logged() as records:
        out, pe = measured(env, call)
    planned = [r for r in records if "predicted" in r.getMessage()]
    plan_s = planned[0].created - start[0] if planned else float("nan")
    same = bool(planned) and plan["describe"] in planned[0].getMessage()
    _point(env, f"{name} exact {plan['tile']} px", plan["live"], pe)
    env.reach(f"{case}: " + _budget_line(env, case, pe, budget, plan, float("nan"), None, "").figures)
    ref, p1 = measured(env, lambda: v.decode(z))
    _point(env, f"{name} one pass", one_pred.live, p1)
    yield Line(f"{name}: one pass", "info", f"{p1.text(env.cuda)}; predicted {mib(one_pred.device)}")
    yield _budget_line(env, case, pe, budget, plan, max_abs(out, ref), p1, "max abs <= 0.05 (bf16 rounds per tile shape)",
                       f"of which planning {plan_s:.1f} s (without it {(pe.seconds - plan_s) / max(p1.seconds, 1e-9):.2f}x)"
                       + ("" if same else f"; the call planned otherwise: {planned[0].getMessage() if planned else '?'}"))
    del out, ref
    if env.cuda and env.left() > 2 * pe.seconds:
        transfer.EMPTY_CACHE_BETWEEN_STAGES = False
        try:
            out, p2 = measured(env, lambda: v.decode(z, tile=plan["tile"], tile_frames=plan["tile_frames"],
                                                     mode="exact"))
        finally:
            transfer.EMPTY_CACHE_BETWEEN_STAGES = True
        yield Line(f"{name}: the same plan, no empty_cache between stages", "info",
                   f"{p2.text(env.cuda)} (with it: reserved {mib(pe.reserved)}, {pe.seconds:.1f} s incl. planning)",
                   "where empty_cache pays: reserved with vs without")
    elif not env.cuda:
        yield Line(f"{name}: no empty_cache between stages", NEEDS_CUDA,
                   "the caching allocator's reserved bytes exist on CUDA only", "")


def row_c(env: Env) -> Iterator[Line]:
    hwt, _ = sizes(env)["c"]
    dtype = env.half()
    v = configs.build(env.entry("wan"), env.device, dtype)
    z = latent(env.entry("wan"), hwt, seed=1)
    name = f"{env.label('wan')} {hwt[1]}x{hwt[0]}x{hwt[2]} {str(dtype).removeprefix('torch.')}"
    plan = env.helpers.get("c", env)
    case = f"{name}: exact in {mib(plan['budget'])}"
    out, pe = measured(env, lambda: v.decode(z, tile=plan["tile"], tile_frames=plan["tile_frames"], mode="exact",
                                             progress=progress(env, case)))
    _point(env, f"{name} exact {plan['tile']} px", plan["live"], pe)
    env.reach(f"{case}: " + _budget_line(env, case, pe, plan["budget"], plan, float("nan"), None, "").figures)
    err, ref, note = float("nan"), None, "one pass"
    if env.full_untiled:
        ref_full, ref = measured(env, lambda: v.decode(z))
        err = max_abs(out, ref_full)
        del ref_full
    elif env.left() > 30 or env.small:
        first = v.decode(z[:, :, :5])       # causal in time: its frames are the clip's first ones
        err = max_abs(out[:, :, :first.shape[2]], first)
        note = f"one pass of the first {first.shape[2]} frames"
        del first
    yield _budget_line(env, case, pe, plan["budget"], plan, err, ref, f"max abs <= 0.05 vs {note}", f"plan {plan['seconds']:.0f} s in a helper process; "
                       f"host held maps {mib(plan['maps'])} + output {mib(plan['output'])} predicted")


def row_d(env: Env) -> Iterator[Line]:
    yield from _lines("tiled encode in a budget", lambda: _d_encode(env))
    yield from _lines("parked rounds in a budget", lambda: _d_rounds(env))


def _lines(case: str, make: Callable[[], Iterator[Line]]) -> Iterator[Line]:
    """The lines of one part of a row; its failure becomes a line and the row goes on."""
    try:
        yield from make()
    except TimeUp:
        raise
    except Exception as e:         # noqa: BLE001 - reported in the line
        yield Line(case, "error", _error_text(e))


def _d_encode(env: Env) -> Iterator[Line]:
    dtype = env.half()
    hwt, _ = sizes(env)["d_enc"]
    v = configs.build(env.entry("wan"), env.device, dtype)
    h, w, t = hwt
    x = torch.rand(1, 3, t, h, w, generator=torch.Generator().manual_seed(3))
    name = f"{env.label('wan')} encode {w}x{h}x{t}"
    one_pred = _predict(v, "encode", x.shape, env)
    ref, p1 = measured(env, lambda: v.encode(x))
    _point(env, f"{name} one pass", one_pred.live, p1)
    yield Line(f"{name}: one pass", "info", f"{p1.text(env.cuda)}; predicted {mib(one_pred.device)}")
    plan = env.helpers.get("d_enc", env)
    out, pe = measured(env, lambda: v.encode(x, tile=plan["tile"], tile_frames=plan["tile_frames"], mode="exact",
                                             progress=progress(env, f"{name}: exact")))
    _point(env, f"{name} exact {plan['tile']} px", plan["live"], pe)
    yield _budget_line(env, f"{name}: exact in {mib(plan['budget'])}", pe, plan["budget"], plan, max_abs(out, ref),
                       p1, "max abs <= 0.05 (latent, bf16)", f"plan {plan['seconds']:.0f} s in a helper process")


def _d_rounds(env: Env) -> Iterator[Line]:
    dtype = env.half()
    hwt, _ = sizes(env)["d_kl"]
    v = configs.build(env.entry("kl"), env.device, dtype)
    z = latent(env.entry("kl"), hwt, seed=4)
    name = f"{env.label('kl')} {hwt[1]}x{hwt[0]}"
    one_pred = _predict(v, "decode", z.shape, env)
    ref, p1 = measured(env, lambda: v.decode(z))
    _point(env, f"{name} one pass", one_pred.live, p1)
    yield Line(f"{name}: one pass", "info", f"{p1.text(env.cuda)}; predicted {mib(one_pred.device)}")
    plan = env.helpers.get("d_kl", env)
    out, pe = measured(env, lambda: v.decode(z, tile=plan["tile"], mode="exact", progress=progress(env, f"{name}: exact")))
    _point(env, f"{name} exact {plan['tile']} px", plan["live"], pe)
    yield _budget_line(env, f"{name}: exact in {mib(plan['budget'])} (tiles in rounds, parked)", pe,
                       plan["budget"], plan, max_abs(out, ref), p1, "max abs <= 0.05 (bf16)",
                       f"plan {plan['seconds']:.0f} s in a helper process")


def _predict(v, op: str, shape, env: Env):
    from vae.engine import budget as planner
    return planner.predict(v, v.call_for(op, tuple(shape)), env.device, env.host)


# ---- row e: the replan -----------------------------------------------------------------------------

def row_e(env: Env) -> Iterator[Line]:
    hwt = sizes(env)["e"]
    v = configs.build(env.entry("wan"), env.device, torch.float32)
    z = latent(env.entry("wan"), hwt, seed=5)
    with no_tf32():
        ref, p1 = measured(env, lambda: v.decode(z))
        with _capped(env, v, p1) as cap, logged(logging.WARNING) as records:
            out, pr = measured(env, lambda: v.decode(z))
    retries = [r for r in records if "retrying with" in r.getMessage()]
    err = max_abs(out, ref)
    held = [r.allocated - cap["base"] for r in retries if r.allocated >= 0]
    ok = bool(retries) and "exact" in retries[-1].getMessage() and err <= 1e-4
    capped = f"capped at {mib(cap['cap'])}" if env.cuda else "out of memory simulated (its first call raises)"
    yield Line(f"{env.label('wan')} {hwt[1]}x{hwt[0]}x{hwt[2]} fp32, no budget, {capped}",
               "ok" if ok else "FAIL",
               f"one pass needs {mib(p1.allocated)}; {len(retries)} replan(s): "
               f"{retries[-1].getMessage().split(';')[-1].strip() if retries else 'none'}; "
               + (f"held at each replan {', '.join(mib(b) for b in held)}; " if held else "")
               + f"{pr.text(env.cuda)}; max abs {err:.1e} vs one pass",
               "replanned in exact tiles, max abs <= 1e-4 (fp32, TF32 off)")
    if not env.cuda:
        yield Line("the cap (torch.cuda.set_per_process_memory_fraction)", NEEDS_CUDA,
                   "above, torch.OutOfMemoryError raised by hand inside the model: the same replan code", "")


@contextlib.contextmanager
def _capped(env: Env, v, one_pass: Peak):
    """The device capped at the weights plus 60% of one pass's need (CUDA: the caching allocator's
    per-process fraction); on the CPU, no cap exists: the first call fails with the out-of-memory error a
    device raises (the replan after it is the same code)."""
    if env.cuda:
        total = torch.cuda.get_device_properties(env.device).total_memory
        base = torch.cuda.memory_allocated(env.device)
        cap = base + int(0.6 * one_pass.allocated)
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(cap / total, env.device)
        try:
            yield dict(cap=cap, base=base)
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, env.device)
        return
    real, calls = v.model.decode, []

    def failing_once(x, *a, **k):         # one pass fails mid-forward, as a capped device would make it
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("out of memory (as a capped device would raise it)")
        return real(x, *a, **k)
    v.model.decode = failing_once
    try:
        yield dict(cap=int(0.6 * one_pass.allocated), base=0)
    finally:
        v.model.decode = real


# ---- row k: calibration ------------------------------------------------------------------------------

def row_k(env: Env) -> Iterator[Line]:
    cal = CALIBRATE if env.calibrate and not env.small else sizes(env)
    for fam in ("wan", "kl"):
        yield from _lines(f"{fam} points", lambda: _points(env, fam, cal[f"k_{fam}"]))
    yield from fit_lines(env)


def _points(env: Env, fam: str, cases: list) -> Iterator[Line]:
    v = configs.build(env.entry(fam), env.device, env.half())
    for hwt, tile in cases:
        z = latent(env.entry(fam), hwt, seed=6)
        pred = env.helpers.get(("k", fam, hwt, tile), env)
        kw = dict(tile=tile, mode="exact") if tile else {}
        _, peak = measured(env, lambda: v.decode(z, **kw))
        case = f"{fam} {hwt[1]}x{hwt[0]}x{hwt[2]} " + (f"exact {tile} px" if tile else "one pass")
        _point(env, case, pred["live"], peak)
        yield Line(case, "info", f"live {mib(pred['live'])} predicted {mib(pred['device'])}; {peak.text(env.cuda)}")


def fit(points: list[tuple[int, int]]) -> tuple[float, int, int]:
    """measured = factor * live + fixed: the least-squares factor, the least-squares fixed bytes and the
    fixed bytes that put every point under the line (the conservative fit)."""
    n = len(points)
    if n < 2:
        live, meas = points[0] if points else (1, 0)
        factor = meas / max(live, 1)
        return factor, 0, 0
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    factor = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else my / max(mx, 1)
    factor = max(factor, 1.0)
    fixed = int(my - factor * mx)
    envelope = math.ceil(max(p[1] - factor * p[0] for p in points))
    return factor, fixed, envelope


def fit_lines(env: Env) -> Iterator[Line]:
    """The fit over every point the run measured (this row's and rows b-e's)."""
    from vae.engine import memory
    pts = [p for p in env.points if p[1] > 0]
    if not pts:
        yield Line("fit", "skipped", "no points measured")
        return
    now = memory.calibration_entry(env.device)
    yield Line(f"calibration in use on {env.device.type}", "info",
               f"{now.factor} x live + {mib(now.fixed)}, {'measured' if now.measured else 'NOT measured'}: {now.source}",
               "vae/engine/memory.py CALIBRATION")
    for what, k in (("allocated", 2), ("reserved", 3)):
        factor, fixed, envelope = fit([(p[1], p[k]) for p in pts])
        worst = max(p[k] / max(memory.calibrated(p[1], env.device), 1) for p in pts)
        yield Line(f"fit of {what} over {len(pts)} points", "info",
                   f"factor {factor:.3f}, fixed {mib(fixed)} (least squares), {mib(envelope)} (every point under "
                   f"it); measured/predicted with the table's ({now.factor}, {mib(now.fixed)}): at most {worst:.2f}",
                   "the calibration is conservative if measured/predicted <= 1")
        if what == "reserved":
            where, day = header_device(env), datetime.date.today().isoformat()
            against = "max_memory_reserved" if env.cuda else "peak RSS"
            yield Line("suggested CALIBRATION", "info",
                       f'"{env.device.type}": Calibration({factor:.3f}, {math.ceil(max(envelope, 0) / MIB)} << 20, True, "{against}, '
                       f'{len(pts)} points ({", ".join(p[0] for p in pts)}), bench/gpu_check.py, {where}, '
                       f'torch {torch.__version__}, {day}")',
                       "vae/engine/memory.py (every point under the line)")


# ---- row f: Compile VAE ----------------------------------------------------------------------------------

def row_f(env: Env) -> Iterator[Line]:
    from vae.compile import compile_vae
    entry = env.entry("kl")
    dtype = env.half()
    backend = "inductor" if env.cuda else "aot_eager"
    hwt = sizes(env)["f"]
    v = configs.build(entry, env.device, dtype)
    r = v.caps.spatial_ratio
    z = torch.randn(1, v.caps.latent_channels, hwt[0] // r, hwt[1] // r, generator=torch.Generator().manual_seed(7))
    v.decode(z)
    eager, pe = measured(env, lambda: v.decode(z))
    cv, report = compile_vae(v, encoder=False, backend=backend)
    first, p0 = measured(env, lambda: cv.decode(z))
    out, pc = measured(env, lambda: cv.decode(z))
    err = max_abs(out, eager)
    fallback = cv.fallbacks()
    tol = 2e-2 if dtype != torch.float32 else 1e-4
    ok = not fallback and cv.graph_count("decode") > 0 and err <= tol
    yield Line(f"KL {hwt[1]} px {str(dtype).removeprefix('torch.')} decode, {backend}", "ok" if ok else "FAIL",
               f"eager {pe.seconds:.2f} s; compiled: first call {p0.seconds:.1f} s (compiling), then {pc.seconds:.2f} s "
               f"= {pc.seconds / max(pe.seconds, 1e-9):.2f}x eager; {cv.graph_count('decode')} graph(s); "
               f"max abs {err:.1e} vs eager" + (f"; FELL BACK: {fallback}" if fallback else ""),
               f"compiled, max abs <= {tol:g}, faster than eager")
    tile = 2 * r * max(4, hwt[0] // r // 4)
    ex_eager, pxe = measured(env, lambda: v.decode(z, tile=tile, mode="exact"))
    before = cv.graph_count("decode")
    ex, pxc = measured(env, lambda: cv.decode(z, tile=tile, mode="exact"))
    built = cv.graph_count("decode") - before
    err = max_abs(ex, ex_eager)
    if built:
        yield Line(f"exact {tile} px tiles, compiled", "ok" if err <= tol else "FAIL",
                   f"{built} graph(s) built; {pxc.seconds:.2f} s vs eager exact {pxe.seconds:.2f} s; max abs {err:.1e}",
                   "exact tiles through compiled graphs")
    else:
        yield Line(f"exact {tile} px tiles, compiled", "info",
                   f"not available in this build: exact tiles ran eagerly ({pxc.seconds:.2f} s vs {pxe.seconds:.2f} s); "
                   f"max abs {err:.1e}", "exact tiles through compiled graphs")
    _ = first
    if not env.cuda:
        yield Line("inductor (CUDA kernels)", NEEDS_CUDA, "aot_eager above checks the graphs, not the kernels", "")


# ---- row g: beside ComfyUI core -------------------------------------------------------------------------

def row_g(env: Env) -> Iterator[Line]:
    sys.path.insert(0, str(Path(env.comfyui).resolve()))
    from comfy.cli_args import args
    args.cpu = not env.cuda
    import comfy.sd

    from vae.archs.wan_layout import to_original
    hwt = sizes(env)["g"]
    dtype = env.half()
    v = configs.build(env.entry("wan"), env.device, dtype)
    core = comfy.sd.VAE(sd={k: t.contiguous() for k, t in to_original(v.state_dict(), nested=False).items()})
    z = latent(env.entry("wan"), hwt, seed=8)
    ours, po = measured(env, lambda: v.decode(z, mode="exact", budget=4 * GIB if env.cuda else None))
    mine = ours.permute(0, 2, 3, 4, 1)                      # [B, T, H, W, C], as core's images
    name = f"{env.label('wan')} {hwt[1]}x{hwt[0]}x{hwt[2]}"
    with torch.inference_mode():
        core.decode(z[:, :, :1, :8, :8])        # core loads its weights onto the device: not part of the call
    yield Line(f"{name}: ours exact" + (" in 4 GiB" if env.cuda else ""), "info", po.text(env.cuda))
    for label, call in (("core VAE Decode", lambda: core.decode(z)),
                        ("core VAE Decode (Tiled) 512/64, 64/8 frames",
                         lambda: core.decode_tiled(z, tile_x=64, tile_y=64, overlap=8, tile_t=16, overlap_t=2))):
        with torch.inference_mode():          # as ComfyUI's executor runs its nodes
            out, pc = measured(env, call)
        out = out.reshape(mine.shape) if out.numel() == mine.numel() else out
        yield Line(f"{name}: {label}", "info", f"{pc.text(env.cuda)}; max abs vs ours {max_abs(out.float().cpu(), mine):.1e}; "
                   f"time {pc.seconds / max(po.seconds, 1e-9):.2f}x ours", f"core's VAE dtype {core.vae_dtype}")
        del out


# ---- row n: several devices ------------------------------------------------------------------------------

def row_n(env: Env) -> Iterator[Line]:
    from safetensors.torch import save_file

    import vae
    from vae.workers import Pool
    devices = ["cuda:0", "cuda:1"] if env.cuda else ["cpu", "cpu"]
    entry = env.entry("wan")
    dtype = env.half()
    hwt = sizes(env)["n"]
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        path = Path(tmp) / "wan.safetensors"
        built = configs.build(entry, env.device, dtype)
        save_file({k: t.contiguous().cpu() for k, t in built.state_dict().items()}, str(path))
        del built
        v = vae.load(str(path), dtype=dtype, device=devices[0])
        z = latent(entry, hwt, seed=9)
        tile = 16 * max(1, hwt[1] // 64)
        one, p1 = measured(env, lambda: v.decode(z, tile=tile, mode="exact"))
        pool = Pool(devices)
        try:
            out, p2 = measured(env, lambda: pool.run(v, "decode", z, tile=tile, mode="exact"))
        finally:
            pool.close()
    err = max_abs(out, one)
    backend = "NCCL" if env.cuda else "gloo"
    yield Line(f"Wan {hwt[1]}x{hwt[0]}x{hwt[2]} exact {tile} px on {', '.join(devices)} ({backend})",
               "ok" if err <= 1e-4 else "FAIL", f"{p2.seconds:.1f} s vs {p1.seconds:.1f} s on one; rank 0 "
               f"{p2.text(env.cuda)}; max abs {err:.1e} vs one device", "<= 1e-4 vs one device's exact tiles")


ROWS = {"a": ("every family, every dtype", row_a), "b": ("720p x 81 in 4 GiB", row_b),
        "d": ("encode and parked rounds in a budget", row_d), "e": ("the replan", row_e),
        "k": ("calibration", row_k), "c": ("1080p x 241 in 4 GiB", row_c), "f": ("Compile VAE", row_f),
        "g": ("beside ComfyUI core", row_g), "n": ("several devices", row_n)}


# ---- the run ---------------------------------------------------------------------------------------------

def _error_text(e: BaseException) -> str:
    """The error's type, first line and where it was raised."""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}" + (f" ({Path(where.filename).name}:{where.lineno})" if where else "")


def _alarm(signum, frame):
    raise TimeUp()


def estimate(env: Env, key: str) -> float:
    return ESTIMATE_S[key][1 if env.small else 0]


def skip_reason(env: Env, key: str) -> Optional[str]:
    """Why row ``key`` cannot run here (it is then skipped without a process, and takes no share)."""
    if key == "g" and not env.comfyui:
        return "no --comfyui DIR given (no ComfyUI on this machine)"
    if key == "n" and env.cuda and torch.cuda.device_count() < 2:
        return f"{torch.cuda.device_count()} GPU visible"
    return None


def row_limit(env: Env, key: str, rest: str) -> float:
    """Row ``key``'s time limit: its share of the time left, in proportion to its estimate among the rows
    still to run (``key``, then ``rest``). A row slower than estimated takes no time from the rows after
    it, and the time a row leaves unused goes to them."""
    weights = {k: estimate(env, k) for k in key + rest if not skip_reason(env, k)}
    return env.left() * weights[key] / sum(weights.values())


def run_row(env: Env, table: Table, key: str, rest: str) -> None:
    """Row ``key`` in a process of its own, within its share of the time left (``rest``: the rows after
    it); whatever happens to it, the table goes on."""
    title = ROWS[key][0]
    why = skip_reason(env, key)
    if why:
        table.line(key, Line(title, "skipped", why), 0)
        return
    limit = row_limit(env, key, rest)
    if limit < MIN_ROW_S:
        table.line(key, Line(title, "skipped", f"needs ~{estimate(env, key):.0f} s; its share of the "
                             f"{env.left():.0f} s left of {env.limit:.0f} s is {limit:.0f} s"), 0)
        return
    try:
        in_process(env, table, key, limit)
    except Exception as e:          # noqa: BLE001 - the check's own failure around one row: reported
        table.line(key, Line(title, "error", f"running the row's process: {_error_text(e)}"), 0)


def child_command(env: Env, key: str, until: float, limit: float) -> list[str]:
    a = env.args
    cmd = [sys.executable, str(CHILD_SCRIPT), "--device", a.device, "--limit", str(a.limit), "--child", key,
           "--run-dir", str(env.run_dir), "--until", repr(until), "--row-limit", f"{limit:.1f}"]
    for flag, on in (("--small", a.small), ("--calibrate", a.calibrate), ("--full-untiled", a.full_untiled)):
        cmd += [flag] if on else []
    for flag, value in (("--comfyui", a.comfyui), ("--families", a.families)):
        cmd += [flag, value] if value else []
    return cmd


def in_process(env: Env, table: Table, key: str, limit: float) -> None:
    """Row ``key`` run by a process of its own (``--child``, its own session, so that ending it ends what
    it started): its lines written as they come; where the process dies, a line with what it had
    reached and why it ended; where it overruns its limit by ``GRACE_S``, it is killed."""
    title = ROWS[key][0]
    until = time.time() + limit
    errors = env.run_dir / f"row_{key}.stderr"
    with errors.open("w") as err:
        proc = subprocess.Popen(child_command(env, key, until, limit), stdout=subprocess.PIPE, stderr=err,
                                text=True, cwd=str(ROOT), start_new_session=True)
    messages: queue.Queue = queue.Queue()
    threading.Thread(target=_read_messages, args=(proc.stdout, messages), daemon=True).start()
    reached, killed, t0 = "", False, time.perf_counter()
    try:
        while True:
            try:
                message = messages.get(timeout=max(0.1, until + GRACE_S - time.time()))
            except queue.Empty:
                killed = True
                break
            if message is None:           # its stdout closed: the process has ended
                break
            if "line" in message:
                table.line(key, Line(*message["line"]), message["s"])
                reached, t0 = "", time.perf_counter()
            else:
                reached = message.get("reached", reached)
    finally:
        code = _end(proc)
    reached = reached or "nothing measured since its last line"
    if killed:
        table.line(key, Line(title, "stopped", f"its process did not stop at its limit ({limit:.0f} s) and was "
                             f"killed {GRACE_S} s after it; reached: {reached}"), time.perf_counter() - t0)
    elif code:
        last = _last_line(errors)
        table.line(key, Line(title, "error", f"its process ended with {_exit_text(code)}; last error line: {last}; "
                             f"reached: {reached}"), time.perf_counter() - t0)
        sys.stderr.write(f"row {key}'s process, the end of its stderr:\n{_tail(errors)}\n")


def _read_messages(stream, messages: queue.Queue) -> None:
    """A row's messages into ``messages`` (None at the end); anything else it prints goes to stderr."""
    try:
        for text in stream:
            if text.startswith(TAG):
                messages.put(json.loads(text[len(TAG):]))
            else:
                sys.stderr.write(text)
    finally:
        messages.put(None)


def _end(proc: subprocess.Popen) -> int:
    """The row's process and all it started (helpers, compile workers) ended; its exit status. Never
    raises: a failed row's cleanup must not end the check."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)       # its own session: the group of what it started
    try:
        return proc.wait(timeout=30)
    except Exception:         # noqa: BLE001 - reported as an unknown status
        return -1


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def _tail(path: Path, n: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    return ""


def _last_line(path: Path) -> str:
    lines = [t.strip() for t in _tail(path, 200).splitlines() if t.strip()]
    return lines[-1][:300] if lines else "(none)"


def run_in_this_process(env: Env, key: str) -> int:
    """A row's process: the row's lines, and what it reached, sent to the parent as they come; stopped
    at its deadline (``--until``) with a line saying what it reached."""
    title, fn = ROWS[key]
    env.helpers = Results(env.run_dir)
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(1, math.ceil(env.left())))
    t0 = time.perf_counter()

    def out(line: Line) -> None:
        nonlocal t0
        send(line=dataclasses.astuple(line), s=time.perf_counter() - t0)
        env.reached, t0 = "", time.perf_counter()
    try:
        for line in fn(env):
            out(line)
    except TimeUp:
        out(Line(title, "stopped", f"at its limit ({env.limit:.0f} s) inside the row; reached: "
                 f"{env.reached or 'nothing measured since its last line'}"))
    except BaseException as e:      # noqa: BLE001 - one row's failure is reported in its line
        if isinstance(e, KeyboardInterrupt):
            raise
        out(Line(title, "error", _error_text(e) + (f"; reached: {env.reached}" if env.reached else "")))
    finally:
        signal.alarm(0)
    return 0


def child_main(env: Env, key: str) -> NoReturn:
    """Ends without tearing the device's context down (a sticky CUDA error can make that hang or crash):
    the row's lines are sent, and the driver frees what the process held."""
    code = 1
    try:
        code = run_in_this_process(env, key)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def header_device(env: Env) -> str:
    if env.cuda:
        p = torch.cuda.get_device_properties(env.device)
        return f"{p.name}, {p.total_memory / GIB:.0f} GiB, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def header(env: Env, argv: list[str]) -> str:
    dev = header_device(env)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = "python3 bench/gpu_check.py " + " ".join(argv)
    return (f"**VAEKit GPU check** - {dev}; torch {torch.__version__}; {when}; "
            f"`{cmd.strip()}`{' (small sizes)' if env.small else ''}\n")


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="also write the table to this file (line by line)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--small", action="store_true", help="tiny sizes (the CPU smoke run)")
    p.add_argument("--rows", default=None, help=f"rows to run, in this order (default {ORDER})")
    p.add_argument("--calibrate", action="store_true", help="only the calibration points (more of them) and the fit")
    p.add_argument("--comfyui", help="a ComfyUI folder: row g runs core beside ours")
    p.add_argument("--limit", type=float, default=LIMIT_S, help="seconds for the whole run (the time guard)")
    p.add_argument("--full-untiled", action="store_true", help="row c also decodes the whole clip in one pass")
    p.add_argument("--workers", type=int, default=None, help="helper processes (default: the cores but 2, <= 6)")
    p.add_argument("--families", help="row a: only these families (comma-separated)")
    # a row's process (started by the check itself)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--until", type=float, help=argparse.SUPPRESS)
    p.add_argument("--row-limit", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    unknown = set(a.rows or "") - set(ROWS)
    if unknown:
        p.error(f"unknown rows {''.join(sorted(unknown))}: the rows are {''.join(ROWS)}")
    if a.families and set(a.families.split(",")) - set(configs.TEST):
        p.error(f"unknown families in {a.families!r}: {', '.join(configs.TEST)}")
    if a.child:
        child_main(Env(a), a.child)
    env = Env(a)
    # by default on the CPU, two gloo ranks (row n) only when asked for: a minute of a small machine
    rows = a.rows or ("k" if a.calibrate else ORDER if env.cuda else ORDER.replace("n", ""))
    table = Table(a.out)
    table.write(header(env, argv))
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as run_dir:
        env.run_dir = Path(run_dir)
        env.helpers = Helpers(a.workers or max(1, min(6, (os.cpu_count() or 2) - 2)), env.run_dir)
        try:
            submit_jobs(env, rows)
            table.write(Table.HEAD)
            for i, key in enumerate(rows):
                if env.left() < MIN_ROW_S:
                    for rest in rows[i:]:
                        table.line(rest, Line(ROWS[rest][0], "skipped", "the time limit was reached"), 0)
                    break
                run_row(env, table, key, rows[i + 1:])
        finally:
            env.helpers.close()
    table.write(f"\n{time.perf_counter() - env.start:.0f} s in all (limit {env.limit:.0f} s).")
    return 0

if __name__ == "__main__":
    sys.exit(main())
