"""How much memory a call needs, measured from the architecture on the ``meta`` device before any work.

The call itself (or the one unit of work the engines repeat: a tile of a chunk) runs on a copy of the
model on the ``meta`` device: shapes only, no memory, no arithmetic. A ``Tracker`` (a torch dispatch
mode) sees every tensor each op creates and when its storage is freed, so it knows the bytes alive at
every moment and their peak: the working set, as the allocator would see it, with views and in-place
ops costing nothing. Tensors the engines put on the offload device (maps kept between stages, the
output) are reported to the tracker (``offloaded``) and counted apart from the compute device.

The real peak exceeds the live bytes by what the tensor library keeps besides: a share that grows with
the tensors (allocator rounding, convolution workspaces) and a fixed part (thread pools, the allocator's
arenas). ``CALIBRATION`` per device type is that affine fit, from measurements against these
predictions (CPU: ``bench/run.py budget``; CUDA: ``bench/gpu_check.py --calibrate``), with where it
came from and whether it was measured at all. One workspace no fit over the live bytes covers: on the
CPU every convolution reorders its weight into oneDNN's blocked layout (HunyuanVideo 1.5's 1024 -> 8192
channel up-sampler: 906 MiB a call, measured by peak RSS per op), and one whose input is not
channels-last (the video families') its input or output too: transient copies that weigh most where
the live bytes are fewest, in an exact tile. The tracker also keeps the peak of live bytes plus the
copies of the convolution running (``copies``), used on the devices in ``WEIGHT_COPIES``.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Union

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .. import run



@dataclass(frozen=True)
class Calibration:
    """measured peak working set = ``factor`` * the tracker's live peak + ``fixed`` bytes on a device type,
    ``measured`` there (or a default until it is), and where the figures come from."""
    factor: float
    fixed: int
    measured: bool
    source: str


# The fit per device type. CPU: peak RSS after load (glibc malloc, oneDNN). CUDA: what the caching
# allocator reserves (torch.cuda.max_memory_reserved: the device memory this process holds; allocator
# rounding and fragmentation, cuDNN workspaces): `python3 bench/gpu_check.py --calibrate` prints the fit
# from measurements against these predictions; until it has run on a GPU, a conservative default.
CALIBRATION = {
    "cpu": Calibration(1.07, 200 << 20, True, "peak RSS over the RSS after load and a malloc_trim, planned "
                       "(trimmed, host_limit) exact calls, 2026-12-06: Wan 2.1 decode 512x768x9 in 160 px tiles "
                       "(live 372 MiB, 580 measured less maps and output: the most above 1.07 x live, 182), "
                       "LTX-Video 0.9 decode 512x768x49 in 160 px tiles (249 -> 392) and encode in 128 / 192 px "
                       "(326 -> 392, 410 -> 498); the factor from Wan 2.1's one pass at 512x768 (live 7362 MiB, "
                       "8311 measured), bench/run.py budget; an unplanned call is not trimmed and keeps up "
                       "to about 330 MiB more of freed blocks (Wan 2.1 in 96 px, LTX-Video in 128 px tiles)"),
    "cuda": Calibration(1.5, 512 << 20, False, "not yet measured on a GPU: a conservative default (above the "
                        "CPU's fit); bench/gpu_check.py --calibrate measures it"),
}
DEFAULT_CALIBRATION = Calibration(1.5, 512 << 20, False, "not measured for this device type: CUDA's default")
# device types whose convolutions make a transient copy of their weight at every call (see above)
WEIGHT_COPIES = {"cpu"}
_CONVOLUTIONS = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                 "conv_transpose2d", "conv_transpose3d"}


def calibration_entry(device: torch.device) -> Calibration:
    """The device type's calibration, with whether it was measured and where it comes from."""
    return CALIBRATION.get(torch.device(device).type, DEFAULT_CALIBRATION)


def calibration(device: torch.device) -> tuple[float, int]:
    """(factor, fixed bytes) of the device type's working set over the tracker's live bytes."""
    c = calibration_entry(device)
    return c.factor, c.fixed


def calibrated(live: int, device: torch.device) -> int:
    """The working set a live peak of ``live`` bytes means on ``device``."""
    factor, fixed = calibration(device)
    return int(factor * live) + fixed


def working(m: "Measure", device: torch.device, scale: float = 1.0) -> int:
    """The working set measurement ``m`` (its live bytes times ``scale``) means on ``device``: the
    calibrated live peak, or a convolution's copies on top of what is alive then, if larger (the
    copies are fresh blocks, freed at once: they take neither the factor nor the fixed bytes; measured,
    HunyuanVideo 1.5 at 128x192x5: 889 MiB one pass, 900 exact, the copy peak 874)."""
    out = calibrated(int(m.device * scale), device)
    if torch.device(device).type in WEIGHT_COPIES:
        out = max(out, int(m.copies * scale))
    return out


def _conv_copies(func, args, out) -> int:
    """Bytes a convolution op copies on the CPU besides its input and output (0 for any other op): its
    weight, reordered into oneDNN's blocked layout, and, where the input is not channels-last, the
    larger of input and output, reordered too (measured by peak RSS per call, fp32, 2 threads: Conv3d
    96 -> 96 on [1, 96, 6, 176, 176], 68 MiB in, 44 out: 69 MiB besides; channels_last_3d: 1 MiB;
    Conv2d on 68 MiB: 68 MiB besides, channels_last: none)."""
    if func.overloadpacket.__name__ not in _CONVOLUTIONS or len(args) < 2 or not isinstance(args[1], torch.Tensor):
        return 0
    x, w = args[0], args[1]
    n = w.numel() * w.element_size()
    last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    if last is None or not x.is_contiguous(memory_format=last) or x.is_contiguous():
        n += max(x.numel() * x.element_size(), out.numel() * out.element_size() if isinstance(out, torch.Tensor) else 0)
    return n


def _libc_trim() -> Callable[[], object]:
    """glibc's malloc_trim, or a no-op. glibc keeps freed blocks under its (self-raising) mmap threshold
    in the arena that made them, and each exact tile thread has its own arena: with tiles taking turns,
    every arena keeps a tile's worth of freed memory; run one after the other, the main arena keeps the
    last unit's. Trimming after each turn or unit gives it back (measured, SD decoder at 512 px, 2x2
    exact tiles: peak working set 987 -> 532 MiB; ~15 us a call)."""
    try:
        import ctypes
        libc_trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: libc_trim(0)


trim = _libc_trim()


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _resident() -> Optional[int]:
    """This process's resident bytes (Linux /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class _HostLimit:
    limit: int            # what the call may add to the resident bytes it began with
    low: int              # the least resident bytes seen at a check since the last trim


_HOST_LIMIT: contextvars.ContextVar[Optional[_HostLimit]] = contextvars.ContextVar("vaekit_host_limit", default=None)


@contextlib.contextmanager
def host_limit(limit: int, device: torch.device) -> Iterator[None]:
    """While a call computes on the CPU within a budget: ``keep_within`` holds the process's resident
    memory to ``limit`` bytes (the plan's prediction) above where the call began. The tracker counts the
    bytes alive; the C allocator keeps more: glibc serves blocks below its mmap threshold (which rises to
    32 MiB: a tile's activations) from its heap and gives freed ones back only above the highest block
    still alive or when trimmed, so between trims an exact run's resident memory outgrows its live bytes
    (measured, Wan 2.1 256x384x9 in 80 px tiles: 531 MiB resident at the peak with 110 MiB alive). The
    checks come only at re-cut points, and the stretch after one (Wan 2.1's full-resolution level) adds
    its live tensors, a convolution's copies and what the allocator keeps of its own freed blocks before
    the next: so the freed blocks are given back at every check where the resident memory has risen a
    thirty-second of the limit above its lowest since the last trim, wherever it stands against the
    limit. Waiting for the limit to draw near let them fill the room the stretch needed (Wan 2.1 512x768x9
    in 1.25 GiB: 1394 MiB measured against 1237 predicted, 406-538 MiB of them freed blocks). A trim
    costs a page walk."""
    if torch.device(device).type != "cpu":
        yield
        return
    trim()
    rss = _resident()
    if rss is None:
        yield
        return
    token = _HOST_LIMIT.set(_HostLimit(limit, rss))
    try:
        yield
    finally:
        _HOST_LIMIT.reset(token)


def keep_within() -> None:
    """At a point an engine passes often (the stage engine's re-cut points): trim the C allocator if the
    call's resident memory (``host_limit``) has risen a thirty-second of its limit above the lowest it
    was at a check since the last trim (the rise may be freed blocks the allocator keeps)."""
    h = _HOST_LIMIT.get()
    if h is None:
        return
    rss = _resident()
    if rss is None:
        return
    if rss > h.low + (h.limit >> 5):
        trim()
        h.low = _resident() or rss
    else:
        h.low = min(h.low, rss)


class Tracker(TorchDispatchMode):
    """Live storage bytes of the tensors ops create on the meta device, and their peak; tensors
    reported as offloaded are kept apart (``offload``: their bytes alive at the end, at most)."""

    def __init__(self):
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self._away: dict[int, tuple[StorageWeakRef, int]] = {}
        self._bound = 0          # live bytes counting the freed ones not swept yet: an upper bound
        self._ignored: set[int] = set()      # storages that live elsewhere (the input, the output)
        self.peak = 0
        self.offload = 0
        self.copies = 0          # peak of live bytes plus what a running convolution copies
        self.placing = 0         # > 0: new storages are born on the offload device (``placed_away``)
        self.apart = 0           # > 0: new storages are born where the output lives, counted nowhere

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        into = self._away if self.placing else self._live
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                if self.apart:
                    self._ignored.add(t.untyped_storage()._cdata)
                else:
                    self._add(t, into)
        if self._bound > self.peak:          # perhaps a new peak: count what is really alive
            self._sweep()
        copy = _conv_copies(func, args, out)
        if copy and self._bound + copy > self.copies:    # inputs and output are alive during the copies
            self._sweep()
            self.copies = max(self.copies, self._bound + copy)
        return out

    def _add(self, t: torch.Tensor, into: dict) -> None:
        """Count a storage an op handed out, once: a view of (or an in-place write to) a storage that
        lives elsewhere (offloaded, ignored) adds nothing."""
        s = t.untyped_storage()
        key = s._cdata
        if key in self._ignored or self._holds(self._live, key) or self._holds(self._away, key):
            return
        into[key] = (StorageWeakRef(s), s.nbytes())
        if into is self._live:
            self._bound += s.nbytes()

    def _holds(self, entries: dict, key: int) -> bool:
        """Whether ``entries`` holds the storage at ``key`` alive (a freed one's address may be reused
        before the next sweep: its stale entry goes)."""
        entry = entries.get(key)
        if entry is None:
            return False
        if entry[0].expired():
            del entries[key]
            if entries is self._live:
                self._bound -= entry[1]
            return False
        return True

    def _sweep(self) -> None:
        self._live = {k: v for k, v in self._live.items() if not v[0].expired()}
        self._away = {k: v for k, v in self._away.items() if not v[0].expired()}
        self._bound = sum(n for _, n in self._live.values())
        self.peak = max(self.peak, self._bound)
        self.offload = max(self.offload, sum(n for _, n in self._away.values()))

    def move_away(self, t: torch.Tensor, count: bool = True) -> None:
        """``t`` lives on the offload device (``count``: among the offload bytes) or the intermediate
        device (the output: known in advance, not counted here)."""
        key = t.untyped_storage()._cdata
        entry = self._live.pop(key, None) or (StorageWeakRef(t.untyped_storage()), t.untyped_storage().nbytes())
        if count:
            self._away[key] = entry
        else:
            self._ignored.add(key)
        self._sweep()

    def move_back(self, t: torch.Tensor) -> None:
        key = t.untyped_storage()._cdata
        entry = self._away.pop(key, None)
        if entry is not None:
            self._live[key] = entry
        self._sweep()

    def hold(self, t: torch.Tensor) -> None:
        """Count ``t`` (made before tracking began, e.g. the input) as live while it lives."""
        self._add(t, self._live)
        self._sweep()


_TRACKER: contextvars.ContextVar[Optional[Tracker]] = contextvars.ContextVar("vaekit_tracker", default=None)


def offloaded(t: torch.Tensor, count: bool = True) -> None:
    """The engines call this for tensors they keep off the compute device: maps on the offload device,
    the output on the intermediate device (``count=False``)."""
    tracker = _TRACKER.get()
    if tracker is not None and t.device.type == "meta":
        tracker.move_away(t, count)


@contextlib.contextmanager
def placed_away(count: bool = True) -> Iterator[None]:
    """Tensors made inside live on the offload device from birth (a map kept between stages): the
    tracker counts them there, never among the compute device's bytes, not even for the op that
    allocates them. ``count=False``: they live where the output does (the output itself, counted apart
    by the planner), counted nowhere; reported after their birth instead, the op that made them would
    already have set a peak of the compute device (LTX-Video's 220 MiB output at 512x768x49: a decode
    in 128 px tiles predicted 231 MiB live where its tiles hold 22)."""
    tracker = _TRACKER.get()
    if tracker is None:
        yield
        return
    attr = "placing" if count else "apart"
    setattr(tracker, attr, getattr(tracker, attr) + 1)
    try:
        yield
    finally:
        setattr(tracker, attr, getattr(tracker, attr) - 1)
        tracker._sweep()


def returned(t: torch.Tensor) -> None:
    """A tensor reported as offloaded is back on the compute device (a parked tile resumed)."""
    tracker = _TRACKER.get()
    if tracker is not None and t.device.type == "meta":
        tracker.move_back(t)


def current_tracker() -> Optional[Tracker]:
    return _TRACKER.get()


@contextlib.contextmanager
def tracking(tracker: Optional[Tracker] = None) -> Iterator[Tracker]:
    """Track the ops of this thread (and of coroutine threads that re-enter ``tracker``)."""
    tracker = tracker or Tracker()
    token = _TRACKER.set(tracker)
    try:
        with tracker:
            yield tracker
    finally:
        _TRACKER.reset(token)


@contextlib.contextmanager
def following(tracker: Optional[Tracker]) -> Iterator[None]:
    """In another thread (an exact run's tile): count its ops in ``tracker`` too."""
    if tracker is None:
        yield
        return
    token = _TRACKER.set(tracker)
    try:
        with _Follower(tracker):
            yield
    finally:
        _TRACKER.reset(token)


class _Follower(TorchDispatchMode):
    def __init__(self, tracker: Tracker):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.tracker.__torch_dispatch__(func, types, args, kwargs)


_META: "weakref.WeakKeyDictionary[nn.Module, nn.Module]" = weakref.WeakKeyDictionary()


def meta_model(model: nn.Module) -> nn.Module:
    """A copy of ``model`` on the meta device (remembered per model): no memory, no arithmetic."""
    if model not in _META:
        from .guard import eager_copy
        _META[model] = eager_copy(model, lambda t: t.to("meta"))
    return _META[model]


@dataclass(frozen=True)
class Measure:
    device: int        # peak live bytes on the compute device (uncalibrated)
    offload: int       # bytes the engines kept on the offload device
    copies: int = 0    # peak live bytes with a convolution's copies (devices in WEIGHT_COPIES)


def measure(call: Callable[[], object], inputs: tuple[torch.Tensor, ...] = (),
            model: Optional[nn.Module] = None) -> Measure:
    """Run ``call`` (on meta tensors) under a tracker, ``inputs`` counted as live; the weights of
    ``model`` are not working memory, however an op hands them on (``detach``, a no-op ``to``)."""
    with torch.inference_mode(), run.using(run.Run()), tracking() as tracker:
        if model is not None:
            tracker._ignored.update(t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()])
        for t in inputs:
            tracker.hold(t)
        call()
        tracker._sweep()
    return Measure(tracker.peak, tracker.offload, tracker.copies)


_SEEN: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def unit_bytes(model: nn.Module, op: str, shape: tuple[int, ...], dtype: torch.dtype,
               chunks: Union[int, tuple[int, ...]] = 1) -> Measure:
    """The meta measurement of ``getattr(model, op)`` on an input of ``shape`` (a stream of ``chunks``
    such inputs, the later ones seeing the earlier ones' caches; or of chunks of these lengths along
    time, e.g. an encode's first frame alone, then its chunks), remembered per model."""
    seen = _SEEN.setdefault(model, {})
    key = (op, tuple(shape), dtype, chunks)
    if key not in seen:
        meta = meta_model(model)
        x = torch.empty(shape, device="meta", dtype=dtype)
        lengths = (shape[2],) * chunks if isinstance(chunks, int) else chunks

        def call():
            with run.stream() if len(lengths) > 1 else contextlib.nullcontext():
                for n in lengths:
                    getattr(meta, op)(x[:, :, :n] if n != shape[2] else x)
        seen[key] = measure(call, (x,), meta)
    return seen[key]


def working_set(model: nn.Module, op: str, unit: tuple[int, ...], dtype: torch.dtype,
                streamed: bool = False, device: torch.device = torch.device("cpu")) -> Optional[int]:
    """Bytes one unit of work of input shape ``unit`` needs on the device (``streamed``: a later chunk
    of a stream, with the caches the earlier ones left), or None if the model cannot run on the meta
    device (the caller then asks for nothing)."""
    try:
        m = unit_bytes(model, op, tuple(unit), dtype, 2 if streamed else 1)
    except Exception:     # noqa: BLE001 - an estimate, never a failure
        return None
    return working(m, device)
