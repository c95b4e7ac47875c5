"""The GPU check: one command that shows, on a CUDA device, what VAEKit promises, in at most 8 minutes on
one H100, printing one markdown table (and writing it to ``--out``) line by line as it measures.

    python3 bench/gpu_check.py --out gpu_check.md              # the check (a CUDA device)
    python3 bench/gpu_check.py --calibrate --out cal.md        # only the calibration points and the fit
    python3 bench/gpu_check.py --device cpu --small            # the same code at tiny sizes (a test runs it)
    python3 bench/gpu_check.py --rows f --out more.md          # rows left over by the time guard
    python3 bench/gpu_check.py --comfyui /path/to/ComfyUI      # adds row g, beside ComfyUI core

docs/gpu.md says what each row (``ROWS``) measures, its target and its time. Each row runs in a process of
its own (``run_row``) within its share of the time left of ``--limit``; the plans are computed meanwhile in
a thread of this one (``start_plans``). Weights are random, drawn under a fixed seed (bench/harness/configs.py).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import gc
import logging
import math
import multiprocessing
import os
import platform
import signal
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Callable, NamedTuple, Optional
from unittest import mock

sys.path[:0] = [p for p in (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1]))
                if p not in sys.path]

import torch  # noqa: E402

from harness import configs  # noqa: E402
from harness.measure import HostPeak  # noqa: E402

MIB, GIB = 1 << 20, 1 << 30
ORDER = "abdekcfgn"
# seconds each row is expected to take, its process's start included: (one H100, default sizes; a shared
# 2-core CPU, --small). The GPU figures are estimates (docs/gpu.md: FLOPs at an assumed 60 TFLOPS in bf16,
# the planner's CPU time measured), the CPU's were measured; they weigh each row's share of the time left.
ESTIMATE_S = {"a": (60, 110), "b": (95, 30), "d": (65, 35), "e": (30, 20), "k": (30, 25), "c": (150, 30),
              "f": (90, 25), "g": (60, 30), "n": (60, 50)}
MIN_ROW_S = 10      # a share shorter than this is not worth a process (its start alone takes seconds)
GRACE_S = 20        # a row's process still running this long after its limit is killed
# half precision against fp32 (0..1 pixels, latents): relative RMS error, about three times the most the
# CPU's own bf16 / fp16 give at the test configs (docs/gpu.md has every family's figure)...
HALF_TOLERANCE = {("decode", torch.bfloat16): 0.12, ("decode", torch.float16): 0.012,
                  ("encode", torch.bfloat16): 0.3, ("encode", torch.float16): 0.02}
# ...except where half precision is as far off on the CPU: compared with the CPU's in the same dtype. Mochi's
# encoder takes Fourier features of the pixels up to 2^7 * 2 pi: a pixel rounded to half moves them by radians.
HALF_AGAINST_HALF = {("mochi", "encode")}
NEEDS_CUDA = "needs CUDA"         # a line's result where its measurement exists on a CUDA device only
SMALL_FAMILIES = ("kl", "tiny", "wan", "qwen21", "mochi")     # --small: every family in fp32, these in half too
# rows b, c, d (exact tiles in a budget): case -> (family, op, input seed, what the case shows)
BUDGET = {"b": ("wan", "decode", 0, ", as a user calls it"), "d_enc": ("wan", "encode", 3, ""),
          "d_kl": ("kl", "decode", 4, " (tiles in rounds, parked)"), "c": ("wan", "decode", 1, "")}
# per case, (H, W, frames) in pixels and the budget: bytes, or at --small ("tile", px), what exact tiles of
# at most px pixels may need (at tiny sizes the calibration's fixed bytes would let one pass fit any budget)
SIZES = {False: dict(b=((720, 1280, 81), 4 * GIB), c=((1080, 1920, 241), 4 * GIB), d_enc=((720, 1280, 81), 4 * GIB),
                     d_kl=((2048, 2048, 1), 2 * GIB), e=(480, 832, 17), f=(1024, 1024, 1), g=(480, 832, 33),
                     n=(480, 832, 33), k_wan=[((480, 832, 9), None), ((720, 1280, 9), 256), ((720, 1280, 9), 384)],
                     k_kl=[((1024, 1024, 1), None), ((1024, 1024, 1), 512)]),
         True: dict(b=((32, 48, 5), ("tile", 32)), c=((32, 48, 9), ("tile", 32)), d_enc=((32, 48, 5), ("tile", 32)),
                    d_kl=((128, 128, 1), ("tile", 64)), e=(32, 48, 5), f=(64, 64, 1), g=(32, 32, 5), n=(32, 48, 5),
                    k_wan=[((32, 48, 5), None), ((32, 48, 5), 32)], k_kl=[((64, 64, 1), None), ((64, 64, 1), 32)])}
CALIBRATE = dict(k_wan=[((256, 256, 9), None), ((480, 832, 9), None), ((720, 1280, 5), None), ((720, 1280, 9), 192),
                        ((720, 1280, 9), 256), ((720, 1280, 9), 384), ((720, 1280, 9), 512)],
                 k_kl=[((512, 512, 1), None), ((1024, 1024, 1), None), ((2048, 2048, 1), None),
                       ((1024, 1024, 1), 256), ((2048, 2048, 1), 512)])


class Line(NamedTuple):
    case: str
    result: str          # ok, FAIL, info, skipped, stopped (at its time limit), error, needs CUDA
    figures: str
    target: str = ""


class Table:
    """Prints and appends each line as it comes (a killed run keeps what it measured)."""
    HEAD = "| row | case | result | figures | target | s |\n|---|---|---|---|---|---:|"

    def __init__(self, out: Optional[Path]):
        self.out = out.open("w", buffering=1) if out else None

    def write(self, text: str) -> None:
        print(text, flush=True)
        self.out and print(text, file=self.out, flush=True)

    def line(self, row: str, line: Line, seconds: float) -> None:
        cells = [row, *line, f"{seconds:.1f}"]
        self.write("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")


class TimeUp(BaseException):
    """A row's time limit was reached inside it."""


class Env:
    """The run's options; in a row's process also its deadline, the calibration points measured so far, and
    the pipe to the check: its lines, points and what it has reached go there as they come."""

    def __init__(self, a, until: float, limit: float, conn=None, points=()):
        self.a, self.until, self.limit, self.conn = a, until, limit, conn
        self.device, self.host = torch.device(a.device), torch.device("cpu")
        self.cuda, self.small, self.comfyui = self.device.type == "cuda", a.small, a.comfyui
        self.half = torch.bfloat16 if self.cuda else torch.float32    # rows b-g (the CPU's bf16 convolutions are slow)
        self.points: list = list(points)          # (case, live, allocated, reserved)
        self.reached, self.meter = "", None

    def entry(self, family: str) -> tuple:
        return (configs.TEST if self.small else configs.PUBLISHED)[family]

    def label(self, family: str) -> str:
        return {"wan": "Wan 2.1", "kl": "SDXL-shape KL"}[family] + (" (test config)" if self.small else "")

    def left(self) -> float:
        return self.until - time.time()

    def send(self, kind: str, message) -> None:
        if self.conn is not None:
            self.conn.send((kind, message))

    def reach(self, text: str) -> None:
        """What the row has reached, sent at once: if its process dies, the check still prints it."""
        self.reached = text
        self.send("reached", text)

    def point(self, case: str, live: int, peak: "Peak") -> None:
        """A calibration point for row k's fit (rows b-e measure them too)."""
        self.points.append((case, live, peak.allocated, peak.reserved))
        self.send("point", self.points[-1])

    def plan(self, key: str) -> dict:
        """A plan computed by the check (``start_plans``), asked for and waited on."""
        self.send("plan", key)
        kind, value = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"planning {key}: {value}")
        return value


class Peak(NamedTuple):
    seconds: float
    allocated: int       # CUDA: max_memory_allocated above before; CPU: peak RSS above before
    reserved: int        # CUDA: max_memory_reserved above before; CPU: as allocated
    host: int            # peak RSS above before (output, maps, staging buffers)
    how: str             # how the host peak was found (harness.measure.HostPeak)

    def text(self, cuda: bool) -> str:
        return memory(cuda, *self[1:]) + f", {self.seconds:.1f} s"


def memory(cuda: bool, allocated: int, reserved: int, host: int, how: str, tail: str = "") -> str:
    if cuda:
        return f"allocated{tail} {mib(allocated)}, reserved{tail} {mib(reserved)}, host{tail} {mib(host)} ({how})"
    return f"working set{tail} {mib(allocated)} ({how})"


def mib(n: float) -> str:
    return f"{n / MIB:.0f} MiB"


def short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def peaks(env: Env, a0: int, r0: int, host: HostPeak) -> tuple[int, int, int, str]:
    if not env.cuda:
        return host.bytes(), host.bytes(), host.bytes(), host.method
    return (torch.cuda.max_memory_allocated(env.device) - a0, torch.cuda.max_memory_reserved(env.device) - r0,
            host.bytes(), host.method)


def measured(env: Env, fn: Callable[[], object]) -> tuple[object, Peak]:
    """``fn()``, its time and the peaks of what it added on the device and the host."""
    gc.collect()
    a0 = r0 = 0
    if env.cuda:
        torch.cuda.synchronize(env.device)
        torch.cuda.empty_cache()
        a0, r0 = torch.cuda.memory_allocated(env.device), torch.cuda.memory_reserved(env.device)
        torch.cuda.reset_peak_memory_stats(env.device)
    with HostPeak() as host:
        env.meter, t0 = (a0, r0, host), time.perf_counter()
        try:
            out = fn()
            env.cuda and torch.cuda.synchronize(env.device)
            seconds = time.perf_counter() - t0
        finally:
            env.meter = None
    return out, Peak(seconds, *peaks(env, a0, r0, host))


def so_far(env: Env) -> str:
    """What the measurement running now has used so far (device and host peaks above its start)."""
    return memory(env.cuda, *peaks(env, *env.meter), " so far") if env.meter else "no measurement running"


def progress(env: Env, what: str) -> Callable[[int, int], None]:
    """A call's progress callback reporting what it reached (units of work, time, memory so far), at most
    once a second: a row stopped at its limit, or whose process dies, still says how far its call got."""
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
    n = min(2, a.dim() - 3)
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a.flatten(0, n), b.flatten(0, n)))


def rel_rms(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double().cpu(), ref.double().cpu()
    return float((a - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-12))


@contextlib.contextmanager
def logged(level=logging.INFO):
    """The VAEKit log records of the block, each with the device's allocated bytes when it was made."""
    records, log = [], logging.getLogger("VAEKit")
    handler, old = logging.Handler(level), log.level
    handler.emit = lambda r: records.append(r) or setattr(
        r, "allocated", torch.cuda.memory_allocated() if torch.cuda.is_initialized() else -1)
    log.addHandler(handler)
    log.setLevel(min(level, old or level))
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


def shape_of(entry: tuple, op: str, hwt: tuple) -> tuple:
    """The input of ``op`` for (H, W, frames) pixels: the latent of a decode, the pixels of an encode."""
    c, (h, w, t) = configs.spec(entry[0]).capabilities(entry[1]), hwt
    frames = ((t if op == "encode" else 1 + (t - 1) // c.temporal_ratio),) if c.temporal_ratio else ()
    if op == "encode":
        return (1, c.image_channels, *frames, h, w)
    return (1, c.latent_channels, *frames, h // c.spatial_ratio, w // c.spatial_ratio)


def inputs(entry: tuple, op: str, hwt: tuple, seed: int) -> torch.Tensor:
    """Seeded: randn latents, rand pixels."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand if op == "encode" else torch.randn)(shape_of(entry, op, hwt), generator=g)


def copied(v, device: torch.device, dtype: torch.dtype):
    """Another handle over a copy of ``v``'s model, on ``device`` in ``dtype``."""
    return type(v)(v.spec, v.config, copy.deepcopy(v.model), dtype, device, v.source)


def guarded(case: str, fn: Callable, *args):
    """The lines of one part of a row (a Line or an iterator of them); its failure becomes a line and the
    row goes on."""
    try:
        got = fn(*args)
        yield from ([got] if isinstance(got, Line) else got)
    except Exception as e:         # noqa: BLE001 - reported in the line
        yield Line(case, "error", error_text(e))


def error_text(e: BaseException) -> str:
    """The error's type, first line and where it was raised."""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}" + (f" ({Path(where.filename).name}:{where.lineno})" if where else "")


def plan_job(env: Env, key: str) -> dict:
    """On the meta device, the planner's choice for case ``key`` of BUDGET in its budget: bytes, or ("tile",
    px): the most any exact tiling of at most px pixels is predicted to need, plus 1 MiB."""
    from vae.engine import budget as planner
    (fam, op, _, _), (hwt, budget) = BUDGET[key], SIZES[env.small][key]
    v, dev, t0 = configs.build(env.entry(fam), "meta", env.half), env.device, time.perf_counter()
    most = budget[1] if isinstance(budget, tuple) else None
    call = v.call_for(op, shape_of(env.entry(fam), op, hwt), tile=most or 4096, mode="exact")

    def need(t: int) -> int:
        with contextlib.suppress(Exception):      # tiles the input checks refuse are not tried either
            p = planner.predict(v, dataclasses.replace(call, tile=t), dev, env.host)
            return planner.on_device(p, dev, env.host, env.host)
        return 0
    budget = max(need(t) for t in planner._candidates(v, call, most)) + MIB if most else budget
    p = planner.plan(v, call, budget, dev, env.host, env.host)
    return dict(tile=p.call.tile, tile_frames=p.call.tile_frames, device=p.on_device(), live=p.prediction.live,
                most=most, maps=p.prediction.maps, output=p.prediction.output, budget=budget,
                describe=p.describe(), seconds=time.perf_counter() - t0)


def start_plans(env: Env, rows: str) -> dict[str, Future]:
    """Every plan the rows will ask for, computed one after another in the rows' order by a thread of this
    process (a core of the host while the device works); key: its row's letter first."""
    plans = {key: Future() for row in rows for key in BUDGET if key[0] == row}

    def work() -> None:
        for key in plans:
            try:
                plans[key].set_result(plan_job(env, key))
            except Exception as e:     # noqa: BLE001 - the row that needs it reports it
                plans[key].set_exception(e)
    threading.Thread(target=work, daemon=True).start()       # daemon: a plan no row waits for ends with the run
    return plans


def row_a(env: Env):
    for family in env.a.families.split(",") if env.a.families else configs.TEST:
        yield from guarded(f"{family} (test config)", family_line, env, family)
    yield from guarded("fp16 NaN guard", guard_line, env)
    for family in ("kl", "tiny") + (() if env.small else ("qwen21",)):
        yield from guarded(f"{family}: exact tiles on the device", exact_line, env, family)


def upcast(v) -> str:
    up = v.last_upcast
    return "/".join(short(d) for d in dict.fromkeys(up.dtypes)) if up is not None and up.tiles else ""


def family_line(env: Env, family: str) -> Line:
    """One family at its test config, 2x2 latent pixels (2 latent frames): the device in fp32 against the
    CPU's fp32, then bf16 and fp16 on the device against the CPU's fp32 (or its own half: HALF_AGAINST_HALF)."""
    cpu = configs.build(configs.TEST[family], "cpu", seed=0)
    c, g = cpu.caps, torch.Generator().manual_seed(0)
    s, t = 2 * c.spatial_ratio_packed, ((2,), (1 + c.temporal_ratio,)) if cpu.is_video else ((), ())
    inp = dict(decode=torch.randn(1, c.latent_channels_packed, *t[0], 2, 2, generator=g),
               **(dict(encode=torch.rand(1, c.image_channels, *t[1], s, s, generator=g)) if c.can_encode else {}))
    dtypes = (torch.float32,) + ((torch.bfloat16, torch.float16) if not env.small or family in SMALL_FAMILIES else ())
    figures, ok, known = [], True, [op for fam, op in HALF_AGAINST_HALF if fam == family]
    for op, x in inp.items():
        parts, want = [], getattr(cpu, op)(x)
        for dtype in dtypes:
            half, v = dtype != torch.float32, copied(cpu, env.device, dtype)
            ref = getattr(copied(cpu, env.host, dtype), op)(x) if half and op in known else want
            got = getattr(v, op)(x)
            err = (rel_rms(got, ref) if half else max_abs(got.cpu(), ref)) if torch.isfinite(got).all() else math.inf
            ok &= err <= (HALF_TOLERANCE[op, dtype] if half else 1e-4)
            parts.append(f"{short(dtype)} " + (f"{err:.1e}" if err < math.inf else "non-finite")
                         + (f" (upcast {upcast(v)})" if upcast(v) else ""))
        figures.append(f"{op}: " + ", ".join(parts))
    return Line(f"{family} (test config)", "ok" if ok else "FAIL", "; ".join(figures),
                "fp32 max abs <= 1e-4; half: rel RMS vs CPU fp32 (docs/gpu.md)"
                + (f"; {known[0]} half vs the CPU's half" if known else ""))


def guard_line(env: Env) -> Line:
    """The fp16 guard where it must act: an SDXL-like overflow (the decoder's first conv x3000, as
    tests/vae/test_guard.py makes it)."""
    cpu = configs.build(configs.TEST["kl"], "cpu", seed=0)
    with torch.no_grad():
        cpu.model.decoder.conv_in.weight.mul_(3000.0)
        cpu.model.decoder.conv_in.bias.mul_(3000.0)
    z = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    z[:, :, 2:6, 11:15] *= 30
    want, v = cpu.decode(z), copied(cpu, env.device, torch.float16)
    with torch.inference_mode():
        overflowed = not bool(torch.isfinite(v.model.decode(v._model_input(z))).all())
    got = v.decode(z)
    # redone in bf16 first (CUDA): bf16's own limit; in fp32 (the CPU): within fp16 weights' rounding of fp32
    bf16 = upcast(v).endswith("bfloat16")
    err, limit = (rel_rms(got, want), HALF_TOLERANCE["decode", torch.bfloat16]) if bf16 else (max_abs(got.cpu(), want), 1e-2)
    ok = overflowed and bool(torch.isfinite(got).all()) and err <= limit and upcast(v) != ""
    return Line("fp16 NaN guard (KL, decoder conv_in x3000)", "ok" if ok else "FAIL",
                f"raw fp16 {'overflows' if overflowed else 'is finite (no test)'}; guarded: redone in "
                f"{upcast(v) or 'none'}, {'rel RMS' if bf16 else 'max abs'} {err:.1e} vs CPU fp32",
                "raw non-finite; guarded finite: redone in fp32 max abs <= 1e-2, in bf16 (CUDA, first) "
                f"rel RMS <= {HALF_TOLERANCE['decode', torch.bfloat16]}")


def exact_line(env: Env, family: str) -> Line:
    """Exact 2x2 tiles on the device: tiles in rounds with paused tiles parked in host memory (KL), tile
    after tile with maps in host memory (TAESD; Qwen-Image 2.1 = Wan's code in 2-D)."""
    cpu = configs.build(configs.TEST[family], "cpu", seed=0)
    z = torch.randn(1, cpu.caps.latent_channels_packed, 8, 8, generator=torch.Generator().manual_seed(2))
    err = max_abs(copied(cpu, env.device, torch.float32).decode(z, tile=4 * cpu.caps.spatial_ratio_packed, mode="exact"),
                  cpu.decode(z))
    return Line(f"{family}: exact 2x2 tiles on the device", "ok" if err <= 1e-4 else "FAIL",
                f"max abs {err:.1e} vs CPU fp32 one pass", "<= 1e-4")


def budget_line(env: Env, case: str, peak: Peak, plan: dict, err: float, ref: Optional[Peak], note: str,
                extra: str = "") -> Line:
    """Peaks against the budget and the prediction, error and time against one pass (ok: the budget kept,
    and the error within 0.05 where there is a one pass to compare with)."""
    budget, pred = plan["budget"], plan["device"]
    figs = [peak.text(env.cuda), f"predicted {mib(pred)} ({plan['describe']})"]
    if env.cuda:
        figs.append(f"pred/alloc {pred / max(peak.allocated, 1):.2f}, pred/reserved {pred / max(peak.reserved, 1):.2f}")
    figs.append(f"max abs {err:.1e} vs {note}" if err == err else "no one pass")
    figs += [f"time {peak.seconds / max(ref.seconds, 1e-9):.2f}x one pass"] if ref else []
    ok = peak.allocated <= budget and peak.reserved <= budget and not err > 0.05
    return Line(case, "ok" if ok else "FAIL", "; ".join(figs + [extra] if extra else figs),
                f"allocated and reserved <= budget {mib(budget)}; max abs <= 0.05 vs {note} (bf16 rounds per tile shape)")


def budget_lines(env: Env, key: str):
    """One case of BUDGET: the exact call in its budget (row b as a user calls it, the planning inside the
    call; the others with the helper's plan), then the one pass it is compared with (row c: of the first
    5 latent frames, the decoder being causal in time; ``--full-untiled``: the whole clip)."""
    from vae.engine import budget as planner
    from vae.engine import transfer
    fam, op, seed, shows = BUDGET[key]
    (h, w, t), entry, plan, user = SIZES[env.small][key][0], env.entry(fam), env.plan(key), key == "b"
    v, x = configs.build(entry, env.device, env.half), inputs(entry, op, (h, w, t), seed)
    call, most = getattr(v, op), f" (tiles at most {plan['most']} px)" if user and plan["most"] else ""
    name = f"{env.label(fam)}{' encode' * (op == 'encode')} {w}x{h}{f'x{t}' * (t > 1)} {short(env.half)}"
    case = f"{name}: exact in {mib(plan['budget'])}{shows}{most}"
    # as a user calls it: the budget (--small: and a tile of at most this size), the planning inside the call
    kw = dict(budget=plan["budget"], tile=plan["most"]) if user else dict(tile=plan["tile"], tile_frames=plan["tile_frames"])
    for warm in (dict(), dict(tile=64, mode="exact")) if user else ():    # first kernels, workspaces: not timed
        v.decode(x[:, :, :2, :16, :16], **warm)
    start = []
    with logged() as records:
        out, pe = measured(env, lambda: start.append(time.time()) or call(
            x, mode="exact", progress=progress(env, case), **kw))
    env.point(f"{name} exact {plan['tile']} px", plan["live"], pe)
    env.reach(f"{case}: " + budget_line(env, case, pe, plan, math.nan, None, "").figures)
    planned = [r for r in records if "predicted" in r.getMessage()]
    plan_s = planned[0].created - start[0] if planned else math.nan
    err, note, p1 = math.nan, "one pass", None
    if key != "c" or env.a.full_untiled:
        one = planner.predict(v, v.call_for(op, x.shape), env.device, env.host)
        ref, p1 = measured(env, lambda: call(x))
        env.point(f"{name} one pass", one.live, p1)
        yield Line(f"{name}: one pass", "info", f"{p1.text(env.cuda)}; predicted {mib(one.device)}")
        err = max_abs(out, ref)
        del ref
    elif env.left() > 30 or env.small:
        first = v.decode(x[:, :, :5])
        err, note = max_abs(out[:, :, :first.shape[2]], first), f"one pass of the first {first.shape[2]} frames"
    if user:
        extra = (f"of which planning {plan_s:.1f} s (without it {(pe.seconds - plan_s) / max(p1.seconds, 1e-9):.2f}x)"
                 + ("" if planned and plan["describe"] in planned[0].getMessage() else
                    f"; the call planned otherwise: {planned[0].getMessage() if planned else '?'}"))
    else:
        extra = (f"planned in {plan['seconds']:.0f} s beside the device's work; host held maps {mib(plan['maps'])} + "
                 f"output {mib(plan['output'])} predicted")
    yield budget_line(env, case, pe, plan, err, p1, note, extra)
    del out
    if user and not env.cuda:
        yield Line(f"{name}: no empty_cache between stages", NEEDS_CUDA,
                   "the caching allocator's reserved bytes exist on CUDA only")
    elif user and env.left() > 2 * pe.seconds:
        with mock.patch.object(transfer, "EMPTY_CACHE_BETWEEN_STAGES", False):
            _, p2 = measured(env, lambda: v.decode(x, tile=plan["tile"], tile_frames=plan["tile_frames"], mode="exact"))
        yield Line(f"{name}: the same plan, no empty_cache between stages", "info",
                   f"{p2.text(env.cuda)} (with it: reserved {mib(pe.reserved)}, {pe.seconds:.1f} s incl. planning)",
                   "where empty_cache pays: reserved with vs without")


def budget_rows(env: Env, keys: tuple):
    for key in keys:
        yield from guarded(f"{key}: exact tiles in a budget", budget_lines, env, key)


def row_e(env: Env):
    (h, w, t), entry = SIZES[env.small]["e"], env.entry("wan")
    v, z = configs.build(entry, env.device, torch.float32), inputs(entry, "decode", (h, w, t), 5)
    ref, p1 = measured(env, lambda: v.decode(z))
    with capped(env, v, p1) as (cap, base), logged(logging.WARNING) as records:
        out, pr = measured(env, lambda: v.decode(z))
    retries = [r for r in records if "retrying with" in r.getMessage()]
    err, held = max_abs(out, ref), [mib(r.allocated - base) for r in retries if r.allocated >= 0]
    ok = bool(retries) and "exact" in retries[-1].getMessage() and err <= 1e-4
    yield Line(f"{env.label('wan')} {w}x{h}x{t} fp32, no budget, "
               + (f"capped at {mib(cap)}" if env.cuda else "out of memory simulated (its first call raises)"),
               "ok" if ok else "FAIL",
               f"one pass needs {mib(p1.allocated)}; {len(retries)} replan(s): "
               f"{retries[-1].getMessage().split(';')[-1].strip() if retries else 'none'}; "
               + (f"held at each replan {', '.join(held)}; " if held else "")
               + f"{pr.text(env.cuda)}; max abs {err:.1e} vs one pass",
               "replanned in exact tiles, max abs <= 1e-4 (fp32, TF32 off)")
    if not env.cuda:
        yield Line("the cap (torch.cuda.set_per_process_memory_fraction)", NEEDS_CUDA,
                   "above, torch.OutOfMemoryError raised by hand inside the model: the same replan code")


@contextlib.contextmanager
def capped(env: Env, v, one_pass: Peak):
    """(cap, bytes held before): the device capped at the weights plus 60% of one pass's need (the caching
    allocator's per-process fraction); on the CPU, where no cap exists, the first call fails with the
    out-of-memory error a device raises (the replan after it is the same code)."""
    if env.cuda:
        base = torch.cuda.memory_allocated(env.device)
        cap, total = base + int(0.6 * one_pass.allocated), torch.cuda.get_device_properties(env.device).total_memory
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(cap / total, env.device)
        try:
            yield cap, base
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, env.device)
        return
    real, first = v.model.decode, iter([True])

    def failing_once(*a, **k):         # one pass fails mid-forward, as a capped device would make it
        if next(first, False):
            raise torch.OutOfMemoryError("out of memory (as a capped device would raise it)")
        return real(*a, **k)
    v.model.decode = failing_once
    try:
        yield int(0.6 * one_pass.allocated), 0
    finally:
        v.model.decode = real


def row_k(env: Env):
    """Calibration points: the measured peaks against the prediction; then the fit over the run's points."""
    cal = CALIBRATE if env.a.calibrate and not env.small else SIZES[env.small]
    for fam in ("wan", "kl"):
        yield from guarded(f"{fam} points", k_lines, env, fam, cal[f"k_{fam}"])
    yield from fit_lines(env)


def k_lines(env: Env, fam: str, points: list):
    from vae.engine import budget as planner
    v = configs.build(env.entry(fam), env.device, env.half)
    for (h, w, t), tile in points:
        z = inputs(env.entry(fam), "decode", (h, w, t), 6)
        pred = planner.predict(v, v.call_for("decode", z.shape, tile=tile or 0, mode="exact"), env.device, env.host)
        _, peak = measured(env, lambda: v.decode(z, **(dict(tile=tile, mode="exact") if tile else {})))
        case = f"{fam} {w}x{h}x{t} " + (f"exact {tile} px" if tile else "one pass")
        env.point(case, pred.live, peak)
        yield Line(case, "info", f"live {mib(pred.live)} predicted {mib(pred.device)}; {peak.text(env.cuda)}")


def fit(points: list[tuple[int, int]]) -> tuple[float, int, int]:
    """measured = factor * live + fixed: the least-squares factor (at least 1), the least-squares fixed
    bytes and the fixed bytes that put every point under the line (the conservative fit)."""
    n = len(points)
    if n < 2:
        live, meas = points[0] if points else (1, 0)
        return meas / max(live, 1), 0, 0
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    factor = max(sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else my / max(mx, 1), 1.0)
    return factor, int(my - factor * mx), math.ceil(max(p[1] - factor * p[0] for p in points))


def fit_lines(env: Env):
    """The fit over every point the run measured (this row's and rows b-e's)."""
    from vae.engine import memory
    pts = [p for p in env.points if p[1] > 0]
    if not pts:
        yield Line("fit", "skipped", "no points measured")
        return
    now = memory.calibration_entry(env.device)
    yield Line(f"calibration in use on {env.device.type}", "info", f"{now.factor} x live + {mib(now.fixed)}, "
               f"{'measured' if now.measured else 'NOT measured'}: {now.source}", "vae/engine/memory.py CALIBRATION")
    for what, k in (("allocated", 2), ("reserved", 3)):
        factor, fixed, envelope = fit([(p[1], p[k]) for p in pts])
        worst = max(p[k] / max(memory.calibrated(p[1], env.device), 1) for p in pts)
        yield Line(f"fit of {what} over {len(pts)} points", "info",
                   f"factor {factor:.3f}, fixed {mib(fixed)} (least squares), {mib(envelope)} (every point under "
                   f"it); measured/predicted with the table's ({now.factor}, {mib(now.fixed)}): at most {worst:.2f}",
                   "the calibration is conservative if measured/predicted <= 1")
    yield Line("suggested CALIBRATION", "info",     # the reserved fit's, every point under the line
               f'"{env.device.type}": Calibration({factor:.3f}, {math.ceil(max(envelope, 0) / MIB)} << 20, True, '
               f'"{"max_memory_reserved" if env.cuda else "peak RSS"}, {len(pts)} points '
               f'({", ".join(p[0] for p in pts)}), bench/gpu_check.py, {device_text(env)}, torch {torch.__version__}, '
               f'{datetime.date.today().isoformat()}")', "vae/engine/memory.py (every point under the line)")


def row_f(env: Env):
    """Compile VAE on the KL decoder against eager (time, equality), and exact tiles through it."""
    from vae.compile import compile_vae
    dtype, backend, (h, w, t) = env.half, "inductor" if env.cuda else "aot_eager", SIZES[env.small]["f"]
    v, z = configs.build(env.entry("kl"), env.device, dtype), inputs(env.entry("kl"), "decode", (h, w, t), 7)
    v.decode(z)
    eager, pe = measured(env, lambda: v.decode(z))
    cv, _ = compile_vae(v, encoder=False, backend=backend)
    _, p0 = measured(env, lambda: cv.decode(z))
    out, pc = measured(env, lambda: cv.decode(z))
    err, fallback, tol = max_abs(out, eager), cv.fallbacks(), 2e-2 if dtype != torch.float32 else 1e-4
    ok = not fallback and cv.graph_count("decode") > 0 and err <= tol
    yield Line(f"KL {w} px {short(dtype)} decode, {backend}", "ok" if ok else "FAIL",
               f"eager {pe.seconds:.2f} s; compiled: first call {p0.seconds:.1f} s (compiling), then {pc.seconds:.2f} s "
               f"= {pc.seconds / max(pe.seconds, 1e-9):.2f}x eager; {cv.graph_count('decode')} graph(s); "
               f"max abs {err:.1e} vs eager" + (f"; FELL BACK: {fallback}" if fallback else ""),
               f"compiled, max abs <= {tol:g}, faster than eager")
    r = v.caps.spatial_ratio
    tile, before = 2 * r * max(4, h // r // 4), cv.graph_count("decode")
    ex_eager, pxe = measured(env, lambda: v.decode(z, tile=tile, mode="exact"))
    ex, pxc = measured(env, lambda: cv.decode(z, tile=tile, mode="exact"))
    built, err = cv.graph_count("decode") - before, max_abs(ex, ex_eager)
    yield Line(f"exact {tile} px tiles, compiled", ("ok" if err <= tol else "FAIL") if built else "info",
               (f"{built} graph(s) built; " if built else "not available in this build: exact tiles ran eagerly (")
               + f"{pxc.seconds:.2f} s vs eager exact {pxe.seconds:.2f} s" + ("; " if built else "); ")
               + f"max abs {err:.1e}", "exact tiles through compiled graphs")
    if not env.cuda:
        yield Line("inductor (CUDA kernels)", NEEDS_CUDA, "aot_eager above checks the graphs, not the kernels")


def row_g(env: Env):
    """ComfyUI core's VAE Decode and VAE Decode (Tiled) on the same Wan 2.1 weights and latent as ours."""
    from harness import comfy_core
    comfy_core.start(str(Path(env.comfyui).resolve()), cpu=not env.cuda)
    import comfy.sd

    from vae.archs.wan_layout import to_original
    (h, w, t), dtype = SIZES[env.small]["g"], env.half
    v = configs.build(env.entry("wan"), env.device, dtype)
    core = comfy.sd.VAE(sd={k: x.contiguous() for k, x in to_original(v.state_dict(), nested=False).items()})
    z = inputs(env.entry("wan"), "decode", (h, w, t), 8)
    ours, po = measured(env, lambda: v.decode(z, mode="exact", budget=4 * GIB if env.cuda else None))
    mine, name = ours.permute(0, 2, 3, 4, 1), f"{env.label('wan')} {w}x{h}x{t}"     # [B, T, H, W, C] as core's
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


def row_n(env: Env):
    """The exact decode across two devices (NCCL; on the CPU two gloo ranks) against one device."""
    import vae
    from harness import save
    from vae.workers import Pool
    devices, dtype, (h, w, t) = ["cuda:0", "cuda:1"] if env.cuda else ["cpu", "cpu"], env.half, SIZES[env.small]["n"]
    z, tile = inputs(env.entry("wan"), "decode", (h, w, t), 9), 16 * max(1, w // 64)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        save(configs.build(env.entry("wan"), env.device, dtype).state_dict(), f"{tmp}/wan.safetensors")
        v = vae.load(f"{tmp}/wan.safetensors", dtype=dtype, device=devices[0])
        one, p1 = measured(env, lambda: v.decode(z, tile=tile, mode="exact"))
        pool = Pool(devices)
        try:
            out, p2 = measured(env, lambda: pool.run(v, "decode", z, tile=tile, mode="exact"))
        finally:
            pool.close()
    err = max_abs(out, one)
    yield Line(f"Wan {w}x{h}x{t} exact {tile} px on {', '.join(devices)} ({'NCCL' if env.cuda else 'gloo'})",
               "ok" if err <= 1e-4 else "FAIL", f"{p2.seconds:.1f} s vs {p1.seconds:.1f} s on one; rank 0 "
               f"{p2.text(env.cuda)}; max abs {err:.1e} vs one device", "<= 1e-4 vs one device's exact tiles")


ROWS = {"a": ("every family, every dtype", row_a), "b": ("720p x 81 in 4 GiB", partial(budget_rows, keys=("b",))),
        "d": ("encode and parked rounds in a budget", partial(budget_rows, keys=("d_enc", "d_kl"))),
        "e": ("the replan", row_e), "k": ("calibration", row_k),
        "c": ("1080p x 241 in 4 GiB", partial(budget_rows, keys=("c",))), "f": ("Compile VAE", row_f),
        "g": ("beside ComfyUI core", row_g), "n": ("several devices", row_n)}


def skip_reason(env, key: str) -> Optional[str]:
    """Why row ``key`` cannot run here (it is then skipped without a process, and takes no share)."""
    if key == "g" and not env.comfyui:
        return "no --comfyui DIR given (no ComfyUI on this machine)"
    if key == "n" and env.cuda and torch.cuda.device_count() < 2:
        return f"{torch.cuda.device_count()} GPU visible"
    return None


def row_limit(env, key: str, rest: str) -> float:
    """Row ``key``'s time limit: its share of the time left, in proportion to its estimate among the rows
    still to run (``key``, then ``rest``): a row slower than estimated takes no time from the rows after it,
    and the time a row leaves unused goes to them."""
    weights = {k: ESTIMATE_S[k][env.small] for k in key + rest if not skip_reason(env, k)}
    return env.left() * weights[key] / sum(weights.values())


def alarm(*_) -> None:
    raise TimeUp()


def child(a, title: str, fn, until: float, limit: float, points: list, conn, output: str) -> None:
    """A row's process: its own session (ending it ends what it started), its output to the file ``output``,
    its lines and what it reached sent as they come; stopped at ``until`` with a line saying what it
    reached. Ends without tearing the device's context down (a sticky CUDA error can make that hang)."""
    os.setsid()
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    # fp32 on the device as fp32 (cuDNN's default lets convolutions round inputs to TF32); bf16 is unchanged
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    env = Env(a, until, limit, conn, points)
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(max(1, math.ceil(env.left())))
    try:
        for line in fn(env):
            env.reached = ""
            env.send("line", tuple(line))
    except TimeUp:
        env.send("line", (title, "stopped", f"at its limit ({limit:.0f} s) inside the row; reached: "
                          f"{env.reached or 'nothing measured since its last line'}"))
    except Exception as e:      # noqa: BLE001 - one row's failure is reported in its line
        env.send("line", (title, "error", error_text(e) + (f"; reached: {env.reached}" if env.reached else "")))
    finally:
        signal.alarm(0)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run_row(env: Env, table: Table, key: str, rest: str, plans: dict, points: list, run_dir: str) -> None:
    """Row ``key`` in a process of its own within its share of the time left (``rest``: the rows after it):
    its lines written as they come (each with the seconds since the last), the plans it asks for sent; where
    its process dies, a line with what it had reached and why it ended; where it overruns its limit by
    ``GRACE_S``, it is killed with what it started."""
    title, fn = ROWS[key]
    why = skip_reason(env, key)
    limit = 0 if why else row_limit(env, key, rest)
    if why or limit < MIN_ROW_S:
        return table.line(key, Line(title, "skipped", why or f"needs ~{ESTIMATE_S[key][env.small]} s; its share of the "
                                    f"{env.left():.0f} s left of {env.limit:.0f} s is {limit:.0f} s"), 0)
    until, output, ctx = time.time() + limit, f"{run_dir}/row_{key}.out", multiprocessing.get_context("spawn")
    conn, theirs = ctx.Pipe()
    proc = ctx.Process(target=child, args=(env.a, title, fn, until, limit, points, theirs, output))
    proc.start()
    theirs.close()
    reached, killed, t0 = "", False, time.perf_counter()
    try:
        while not (killed := not conn.poll(max(0.1, until + GRACE_S - time.time()))):
            kind, message = conn.recv()
            if kind == "line":
                table.line(key, Line(*message), time.perf_counter() - t0)
                reached, t0 = "", time.perf_counter()
            elif kind == "plan":
                try:
                    answer = ("ok", plans[message].result(timeout=max(0.0, until - time.time())))
                except Exception as e:     # noqa: BLE001 - the row reports it
                    answer = ("error", error_text(e) if str(e) else f"not planned in the row's time ({type(e).__name__})")
                with contextlib.suppress(OSError):
                    conn.send(answer)
            elif kind == "point":
                points.append(message)
            else:
                reached = message
    except EOFError:            # its end of the pipe closed: the process has ended
        pass
    finally:
        for end in (proc.kill, lambda: os.killpg(proc.pid, signal.SIGKILL)):
            with contextlib.suppress(OSError):
                end()
        proc.join(30)
    reached, code = reached or "nothing measured since its last line", proc.exitcode
    if killed:
        table.line(key, Line(title, "stopped", f"its process did not stop at its limit ({limit:.0f} s) and was "
                             f"killed {GRACE_S} s after it; reached: {reached}"), time.perf_counter() - t0)
    elif code:
        lines = [t.strip() for t in Path(output).read_text(errors="replace").splitlines() if t.strip()]
        table.line(key, Line(title, "error", f"its process ended with "
                             f"{f'signal {signal.Signals(-code).name}' if code < 0 else f'exit code {code}'}; last "
                             f"error line: {lines[-1][:300] if lines else '(none)'}; reached: {reached}"),
                   time.perf_counter() - t0)
        sys.stderr.write(f"row {key}'s process, the end of its output:\n" + "\n".join(lines[-20:]) + "\n")


def device_text(env: Env) -> str:
    if env.cuda:
        p = torch.cuda.get_device_properties(env.device)
        return f"{p.name}, {p.total_memory / GIB:.0f} GiB, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="also write the table to this file (line by line)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--small", action="store_true", help="tiny sizes (the CPU smoke run)")
    p.add_argument("--rows", default=None, help=f"rows to run, in this order (default {ORDER})")
    p.add_argument("--calibrate", action="store_true", help="only the calibration points (more of them) and the fit")
    p.add_argument("--comfyui", help="a ComfyUI folder: row g runs core beside ours")
    p.add_argument("--limit", type=float, default=480, help="seconds for the whole run (the time guard)")
    p.add_argument("--full-untiled", action="store_true", help="row c also decodes the whole clip in one pass")
    p.add_argument("--families", help="row a: only these families (comma-separated)")
    a = p.parse_args(argv)
    if set(a.rows or "") - set(ROWS) or a.families and set(a.families.split(",")) - set(configs.TEST):
        p.error(f"the rows are {''.join(ROWS)}; the families {', '.join(configs.TEST)}")
    env, t0 = Env(a, time.time() + a.limit, a.limit), time.perf_counter()
    # on the CPU, row n (two gloo ranks: a minute of a small machine) runs only when named
    rows = a.rows or ("k" if a.calibrate else ORDER if env.cuda else ORDER.replace("n", ""))
    table = Table(a.out)
    table.write(f"**VAEKit GPU check** - {device_text(env)}; torch {torch.__version__}; "
                f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; `python3 bench/gpu_check.py "
                f"{' '.join(argv)}`{' (small sizes)' if env.small else ''}\n")
    plans, points = start_plans(env, rows), []
    table.write(Table.HEAD)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as run_dir:
        for i, key in enumerate(rows):
            if env.left() < MIN_ROW_S:
                for rest in rows[i:]:
                    table.line(rest, Line(ROWS[rest][0], "skipped", "the time limit was reached"), 0)
                break
            run_row(env, table, key, rows[i + 1:], plans, points, run_dir)
    table.write(f"\n{time.perf_counter() - t0:.0f} s in all (limit {a.limit:.0f} s).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
