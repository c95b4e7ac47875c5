"""A CUDA device apart from the host, on a CPU-only build: the device-apart check's stand-in.

On a CPU the compute device and the host are one device, so code that mixes them, or hands a tensor a
storage of the other, runs here and breaks only on a GPU. Inside ``Apart()`` a tensor moved to ``cuda``
really is a CPU tensor whose storage is marked as the stand-in device's: ``Tensor.device`` (and
``UntypedStorage.device``, ``is_cuda``, ...) says ``cuda:0``, values are real, and every torch operation is
checked as CUDA checks it:

- an operation on tensors of both devices raises PyTorch's own error (a 0-dim CPU tensor may join CUDA
  ones, as on a GPU); ``copy_``, ``to``, slice assignment and printing may cross, as on a GPU;
- ``Tensor.set_`` to a storage of the other device raises PyTorch's error (which a CPU-only ``set_`` never
  does: that is the defect this module was made for);
- ``numpy()`` of a device tensor raises; ``item()``/``tolist()``/``.cpu()`` wait for the device (below);
- pinned host memory comes from a stand-in caching host allocator: freed blocks stay cached (and counted)
  until ``torch.accelerator.empty_host_cache()``;
- streams are real queues: a ``non_blocking`` copy between the device and pinned memory is queued on the
  current stream and runs when that stream is synchronised (an event recorded after it, the stream, the
  device); a kernel on a stream runs the copies queued on it before it (stream order). Until then a copy's
  destination holds NaN, so a host read of a copy still in flight changes the result. Events are never
  found done by ``query()`` before they are waited for (a slow GPU);
- ``torch.cuda`` answers as one device of compute capability ``capability`` would; device memory is the
  bytes of live storages marked as the device's (``allocated``, ``peak``).

Every thread started inside the block runs under it too (exact tiles run in threads). What it cannot
check: the speed or the real numerics of CUDA kernels (cuDNN's algorithms, TF32), NCCL itself (gloo runs
the collectives, with the device checks NCCL makes on their tensors), and code that reads a tensor's
device in C++ only.
"""
from __future__ import annotations

import collections
import contextlib
import threading
import weakref
from typing import Any, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)
_TensorBase = torch._C.TensorBase
_REAL = {"device": _TensorBase.device.__get__, "is_cuda": _TensorBase.is_cuda.__get__,
         "is_cpu": _TensorBase.is_cpu.__get__}
_STORAGE_DEVICE = torch.UntypedStorage.device
_CROSSING = {"copy_", "to", "cpu", "cuda", "__setitem__", "set_", "pin_memory", "is_pinned", "untyped_storage",
             "_typed_storage", "storage", "__repr__", "__format__", "__str__", "data_ptr", "storage_offset", "size",
             "stride", "dim", "numel", "element_size", "nbytes", "is_contiguous", "__len__", "item", "tolist",
             "numpy", "__bool__", "__int__", "__float__", "__index__", "equal", "get_device", "__reduce_ex__",
             "__deepcopy__", "detach", "requires_grad_", "__get__", "__set__", "_is_view", "is_floating_point",
             "is_complex", "__hash__", "__eq__"}


def _storage_device(s) -> torch.device:
    return getattr(s, "_apart", None) or _STORAGE_DEVICE.__get__(s)


def device_of(t: torch.Tensor) -> torch.device:
    """``t``'s device as the stand-in says it (its storage's mark)."""
    with _plain():
        real = _REAL["device"](t)
        if real.type != "cpu":
            return real
        try:
            return getattr(t.untyped_storage(), "_apart", None) or real
        except (RuntimeError, NotImplementedError):    # a tensor with no storage (a subclass): as it is
            return real


def _plain():
    """Plain torch inside: the stand-in's own bookkeeping is not checked as user code is."""
    return torch._C.DisableTorchFunction()


def _as_device(d) -> Optional[torch.device]:
    if d is None:
        return None
    if isinstance(d, int):
        return torch.device("cuda", d)
    d = torch.device(d)
    return CUDA if d.type == "cuda" else d


class Apart:
    """The stand-in: ``with Apart() as dev: ...`` (one at a time per process)."""

    def __init__(self, capability: tuple[int, int] = (8, 0), total: int = 80 << 30):
        self.capability, self.total = capability, total
        self.allocated = self.peak = 0                # bytes of live device storages
        self.pinned_cached = 0                        # freed pinned bytes the host allocator keeps
        self.pinned_live = 0
        self.pinned_total = 0                         # bytes ever handed out pinned
        self.streams: list["Stream"] = []
        self._lock = threading.RLock()
        self._local = threading.local()
        self._stack = contextlib.ExitStack()
        self.default = Stream(self, default=True)
        self._marked: list = []                       # storages marked inside the block: unmarked at its end

    # ---- marks and accounting ----------------------------------------------------------------
    def mark(self, t: torch.Tensor, device: torch.device) -> None:
        s = t.untyped_storage()
        if getattr(s, "_apart", None) == device:
            return
        s._apart = device
        self._marked.append(weakref.ref(s))
        if device.type == "cuda":
            self._count(s.nbytes())
            weakref.finalize(s, self._count, -s.nbytes())

    def _count(self, n: int) -> None:
        with self._lock:
            self.allocated += n
            self.peak = max(self.peak, self.allocated)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        s._pinned = True
        self._marked.append(weakref.ref(s))
        n = s.nbytes()
        with self._lock:
            reused = min(self.pinned_cached, n)      # a cached block serves the request first
            self.pinned_cached -= reused
            self.pinned_live += n
            self.pinned_total += n
        weakref.finalize(s, self._unpin, n)
        return t

    def _unpin(self, n: int) -> None:
        with self._lock:
            self.pinned_live -= n
            self.pinned_cached += n

    def empty_host_cache(self) -> None:
        with self._lock:
            self.pinned_cached = 0

    # ---- streams ------------------------------------------------------------------------------
    def current(self) -> "Stream":
        return getattr(self._local, "stream", None) or self.default

    @contextlib.contextmanager
    def on(self, stream: "Stream"):
        before, self._local.stream = getattr(self._local, "stream", None), stream
        try:
            yield
        finally:
            self._local.stream = before

    def synchronize(self) -> None:
        for s in [self.default, *self.streams]:
            s.synchronize()

    # ---- the block -----------------------------------------------------------------------------
    def __enter__(self) -> "Apart":
        st = self._stack
        st.enter_context(_patched(torch.Tensor, "device", property(device_of)))
        st.enter_context(_patched(torch.Tensor, "is_cuda", property(lambda t: device_of(t).type == "cuda")))
        st.enter_context(_patched(torch.Tensor, "is_cpu", property(lambda t: device_of(t).type == "cpu")))
        st.enter_context(_patched(torch.Tensor, "set_", _set))
        st.enter_context(_patched(torch.UntypedStorage, "device", property(_storage_device)))
        st.enter_context(_patched(torch.UntypedStorage, "to", _storage_to(self)))
        st.enter_context(_patched(torch.UntypedStorage, "clone", _storage_clone(self)))
        st.enter_context(_patched(torch.UntypedStorage, "is_pinned", lambda s, device="cuda": getattr(s, "_pinned", False)))
        cuda = {
            "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
            "set_device": lambda d: None, "_lazy_init": lambda: None, "is_initialized": lambda: True,
            "get_device_capability": lambda device=None: self.capability,
            "is_bf16_supported": lambda including_emulation=True: including_emulation or self.capability >= (8, 0),
            "get_device_name": lambda device=None: "stand-in device",
            "current_stream": lambda device=None: self.current(), "default_stream": lambda device=None: self.default,
            "Stream": lambda device=None, priority=0: Stream(self), "Event": lambda *a, **k: Event(self),
            "stream": lambda s: self.on(s) if s is not None else contextlib.nullcontext(),
            "synchronize": lambda device=None: self.synchronize(), "empty_cache": lambda: None,
            "memory_allocated": lambda device=None: self.allocated,
            "max_memory_allocated": lambda device=None: self.peak,
            "memory_reserved": lambda device=None: self.allocated,
            "max_memory_reserved": lambda device=None: self.peak,
            "reset_peak_memory_stats": lambda device=None: setattr(self, "peak", self.allocated),
            "mem_get_info": lambda device=None: (self.total - self.allocated, self.total),
            "get_rng_state": lambda device="cuda": torch.get_rng_state(), "set_rng_state": lambda *a, **k: None,
        }
        for name, value in cuda.items():
            st.enter_context(_patched(torch.cuda, name, value))
        st.enter_context(_patched(torch.accelerator, "empty_host_cache", self.empty_host_cache))
        mode = _Mode(self)
        run = threading.Thread.run

        def run_apart(thread):           # threads started inside the block run under it too
            with mode:
                run(thread)
        st.enter_context(_patched(threading.Thread, "run", run_apart))
        st.enter_context(mode)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        for ref in self._marked:      # outside the block every tensor is what it is: on the CPU
            s = ref()
            if s is not None:
                vars(s).pop("_apart", None)
                vars(s).pop("_pinned", None)
        self._marked.clear()


class Stream:
    """A queue of copies in flight (kernels run at once, in order, on the host)."""

    def __init__(self, apart: Apart, default: bool = False):
        self.apart, self.pending, self.done = apart, collections.deque(), 0
        self.queued = 0
        self.device = CUDA
        if not default:
            apart.streams.append(self)

    def queue(self, run) -> None:
        self.pending.append(run)
        self.queued += 1

    def run_until(self, n: int) -> None:
        with _plain():
            while self.done < n and self.pending:
                self.pending.popleft()()
                self.done += 1

    def synchronize(self) -> None:
        self.run_until(self.queued)

    def wait_stream(self, other: "Stream") -> None:
        other.synchronize()          # kernels run at once; copies queued there must be before ours

    def wait_event(self, event: "Event") -> None:
        event.synchronize()

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        event = event or Event(self.apart)
        event.record(self)
        return event

    def query(self) -> bool:
        return not self.pending

    def __enter__(self):
        self._ctx = self.apart.on(self)
        self._ctx.__enter__()

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


class Event:
    def __init__(self, apart: Apart):
        self.apart, self.stream, self.at = apart, None, 0

    def record(self, stream: Optional[Stream] = None) -> None:
        self.stream = stream or self.apart.current()
        self.at = self.stream.queued

    def query(self) -> bool:        # a slow device: nothing is found done before it is waited for
        return self.stream is None or self.stream.done >= self.at

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.run_until(self.at)

    def wait(self, stream: Optional[Stream] = None) -> None:
        self.synchronize()


class _Mode(TorchFunctionMode):
    """Every torch function inside the block: device checks, device arguments mapped to the host, results
    marked with their device, copies to and from pinned memory queued on the current stream."""

    def __init__(self, apart: Apart):
        super().__init__()
        self.apart = apart

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in ("__get__", "__set__") or name.startswith("_") and not name.startswith("__"):
            return func(*args, **kwargs)       # properties and torch's own private helpers
        apart = self.apart
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        devices = {t: device_of(t) for t in tensors}
        if name == "numpy" and devices.get(args[0], CPU).type == "cuda":
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if name not in _CROSSING:
            seen = {d for t, d in devices.items() if d.type != "meta" and not (d.type == "cpu" and t.dim() == 0)}
            if len(seen) > 1:
                a, b = sorted(map(str, seen))
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                                   f"devices, {a} and {b}! (stand-in device check: {name})")
        if name == "copy_":
            return self._copy(func, args, kwargs)
        if any(d.type == "cuda" for d in devices.values()):
            apart.current().synchronize()      # stream order: this kernel runs after what was queued before it
        if name in ("to", "cuda", "cpu"):
            return self._to(func, name, args, kwargs)
        if name == "pin_memory":
            out = args[0].clone()
            return apart.pin(out)
        if name in ("item", "tolist") and devices.get(args[0], CPU).type == "cuda":
            apart.current().synchronize()
        target = _as_device(kwargs.get("device"))
        pinned = kwargs.pop("pin_memory", False)
        if "device" in kwargs:
            kwargs["device"] = None if target is None or target.type == "cuda" else kwargs["device"]
        out = func(*args, **kwargs)
        if target is None:
            target = next((d for t, d in devices.items() if d.type == "cuda"), CPU) if name != "__setitem__" else CPU
        if target.type == "cuda":
            tree_map(lambda t: apart.mark(t, target) if isinstance(t, torch.Tensor) else None, out)
        if pinned:
            tree_map(lambda t: apart.pin(t) if isinstance(t, torch.Tensor) else None, out)
        return out

    def _to(self, func, name, args, kwargs):
        t = args[0]
        src = device_of(t)
        if name == "cpu":
            dst, rest = CPU, {}
        elif name == "cuda":
            dst, rest = CUDA, {}
        elif args[1:] and isinstance(args[1], torch.Tensor):      # to(other): other's device and dtype
            dst, rest = device_of(args[1]), {"dtype": args[1].dtype}
        else:
            copy = kwargs.pop("copy", False)
            device, dtype, _, fmt = torch._C._nn._parse_to(*args[1:], **kwargs)
            dst = _as_device(device) or src
            rest = {k: v for k, v in (("dtype", dtype), ("memory_format", fmt), ("copy", copy)) if v}
        if dst != src and src.type == "cuda":
            self.apart.current().synchronize()          # a blocking copy out waits for the device
        out = t.to(**rest, **({} if dst.type == "cuda" else {"device": dst}))     # meta stays meta
        if dst != src and out.untyped_storage()._cdata == t.untyped_storage()._cdata:
            out = out.clone(memory_format=torch.preserve_format)
        if dst.type == "cuda":
            self.apart.mark(out, dst)
        return out

    def _copy(self, func, args, kwargs):
        dst, src = args[0], args[1]
        non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        a, b = device_of(dst), device_of(src)
        host = dst if a.type == "cpu" else src
        if a == b or not non_blocking or not getattr(host.untyped_storage(), "_pinned", False):
            if "cuda" in (a.type, b.type):   # a kernel, or a copy the host waits for: after what was queued
                self.apart.current().synchronize()
            return dst.copy_(src)
        if a.type == "cpu":          # device -> pinned host: garbage there until the copy runs
            dst.fill_(float("nan") if dst.is_floating_point() else 0)
        # queued behind the stream's earlier copies, not run now; the source is read when the stream runs
        # it, so its owner must keep it intact till then
        self.apart.current().queue(lambda: dst.copy_(src))
        return dst


def _set(t: torch.Tensor, source=None, *args, **kwargs):
    """``Tensor.set_`` (which torch function modes do not see), with CUDA's check of the storage's device."""
    if source is not None:
        where = device_of(source) if isinstance(source, torch.Tensor) else _storage_device(
            source.untyped() if isinstance(source, torch.TypedStorage) else source)
        if where != device_of(t):
            raise RuntimeError(f'Attempted to set the storage of a tensor on device "{device_of(t)}" to a '
                               f'storage on different device "{where}". This is no longer allowed; the devices '
                               "must match.")
        return _TensorBase.set_(t, source, *args, **kwargs)
    return _TensorBase.set_(t, *args, **kwargs)


def _bytes(s: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over storage ``s``, for the stand-in's own copies (no device check)."""
    return _TensorBase.set_(torch.empty(0, dtype=torch.uint8), s)


def _storage_to(apart: Apart):
    def to(s, *, device=None, non_blocking=False):
        dst, src = _as_device(device), _storage_device(s)
        if dst is None or dst == src:
            return s
        if src.type == "cuda":
            apart.current().synchronize()
        with _plain():
            out = _bytes(s).clone().untyped_storage()
            if dst.type == "cuda":
                apart.mark(_bytes(out), dst)
        return out
    return to


def _storage_clone(apart: Apart):
    real = torch.UntypedStorage.clone

    def clone(s):
        with _plain():
            out = real(s)
            where = _storage_device(s)
            if where.type == "cuda":
                apart.mark(_bytes(out), where)
        return out
    return clone


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any):
    had = name in vars(owner)
    before = vars(owner).get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if had:
            setattr(owner, name, before)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def nccl(apart: Optional[Apart] = None):
    """The stand-in device, with the default process group (gloo underneath) answering as NCCL does: its
    backend is "nccl" and every collective and point-to-point op takes tensors on the device only (they run
    after the work queued on the current stream, as NCCL's kernels do)."""
    import torch.distributed as dist
    apart = apart or Apart()

    def device_only(name, fn, pick):
        def checked(*args, **kwargs):
            for t in pick(*args, **kwargs):
                if device_of(t).type != "cuda":
                    raise RuntimeError(f"stand-in NCCL: {name} got a tensor on {device_of(t)}; NCCL moves CUDA "
                                       "tensors only (ProcessGroupNCCL: Tensors must be CUDA and dense)")
            apart.current().synchronize()
            with _plain():
                return fn(*args, **kwargs)
        return checked

    first = lambda t, *a, **k: [t]                                     # noqa: E731
    ops = lambda ops, *a, **k: [op.tensor for op in ops]               # noqa: E731
    with apart, contextlib.ExitStack() as st:
        st.enter_context(_patched(dist, "get_backend", lambda group=None: "nccl"))
        for name, pick in (("all_reduce", first), ("broadcast", first), ("batch_isend_irecv", ops)):
            st.enter_context(_patched(dist, name, device_only(name, getattr(dist, name), pick)))
        yield apart
