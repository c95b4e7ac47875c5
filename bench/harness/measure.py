"""What a benchmark worker measures of its own process: RSS and its peak (VmHWM, with the mark reset after
loading), process CPU time, and one timed measurement (``measure``) whose figures and output the parent
script reads back. Linux /proc; ``ru_maxrss`` where /proc is missing.

The peak is VmHWM, never ``ru_maxrss``: the kernel folds into ``ru_maxrss`` the peak of the memory map a
process had before its exec (a process started by a larger parent begins at the parent's peak) and of
its exited thread group, and writing /proc/self/clear_refs resets neither."""
from __future__ import annotations

import gc
import json
import resource
import threading
import time
from pathlib import Path

MIB = 1024.0


def vm_rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux


def vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return maxrss_kib()


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


CLEAR_REFS = "/proc/self/clear_refs"


def reset_peak() -> bool:
    """Reset the peak-RSS mark (VmHWM) to the current RSS by writing 5 to /proc/self/clear_refs
    (Linux >= 4.0); False where that file cannot be written or the mark did not come down."""
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        return False
    return vm_hwm_kib() <= vm_rss_kib() + 1024


class HostPeak:
    """``with HostPeak() as p:`` the most RSS the block held above its RSS at the start (``p.bytes()``,
    also while the block runs), and how it was found (``p.method``): "VmHWM" after resetting the mark
    (``reset_peak``); where the mark cannot be reset, "sampled RSS": a thread reads VmRSS every
    ``every`` seconds, a lower bound that misses peaks shorter than that."""

    def __init__(self, every: float = 0.005):
        self.every = every
        self.method = ""
        self.rss0 = self.seen = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "HostPeak":
        self.rss0 = self.seen = vm_rss_kib()
        if reset_peak():
            self.method = "VmHWM"
        else:
            self.method = "sampled RSS"
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            self.seen = max(self.seen, vm_rss_kib())

    def peak_kib(self) -> int:
        if self._stop.is_set():           # the block has ended: its peak, not what came after it
            return self.seen
        if self.method == "VmHWM":
            return vm_hwm_kib()
        return max(self.seen, vm_rss_kib())

    def bytes(self) -> int:
        return max(self.peak_kib() - self.rss0, 0) * 1024

    def __exit__(self, *exc) -> None:
        self.seen = self.peak_kib()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def loaded_rss_kib(model, copy: bool = False) -> int:
    """RSS once every weight of ``model`` has been read: safetensors weights may stay memory-mapped and be
    paged in on first use, and paging them in is loading, not the call. With ``copy`` every weight is
    copied into the process's own memory instead (see measure)."""
    import torch

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if copy:
                t.data = t.data.clone()
            else:
                t.sum()
    gc.collect()
    _trim()             # what loading freed goes back first: the call must not count it, nor reuse it unseen
    return vm_rss_kib()


def _trim() -> None:
    """glibc's malloc_trim (a no-op elsewhere); core's workers run this too, where vae is not importable."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure(fn, x, model, repeat: int, out_stem: Path) -> None:
    """One worker's measurement: copy every weight of ``model`` into the process's own memory (that is
    loading, not the call), reset the peak-RSS mark, time ``repeat`` calls of ``fn(x)``; the last output
    goes to ``out_stem``.npy, the figures (times, the best call's process CPU time, RSS after load, peak,
    working set) to ``out_stem``.json.

    Weights read from a .safetensors file are pages of the mapped file: on a busy machine the kernel
    may drop them during the call and read them again, and the RSS peak then misses the working set by
    as much (measured: HunyuanVideo 1.5, 256x384x9, 1528 MiB under memory pressure against 3082 MiB
    alone). Copied, they stay resident like the weights a ComfyUI model holds after load_state_dict."""
    import numpy as np
    import torch

    rss_load = loaded_rss_kib(model, copy=True)
    reset = reset_peak()
    times, cpu, out = [], [], None
    with torch.inference_mode():
        for _ in range(repeat):
            out = None
            t0, c0 = time.perf_counter(), cpu_s()
            out = fn(x)
            times.append(time.perf_counter() - t0)
            cpu.append(cpu_s() - c0)
    peak = vm_hwm_kib()      # not ru_maxrss: the reset leaves it at peaks from before (module docstring)
    np.save(f"{out_stem}.npy", out.float().numpy())
    Path(f"{out_stem}.json").write_text(json.dumps(dict(
        times_s=times, best_s=min(times), cpu_s=cpu[times.index(min(times))], rss_after_load_mib=rss_load / MIB,
        peak_rss_mib=peak / MIB, working_set_mib=(peak - rss_load) / MIB, peak_reset=reset, shape=list(out.shape))))
