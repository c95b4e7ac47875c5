"""bench/gpu_check.py with rows that fail as a device can make them fail, for tests/bench/test_gpu_check.py.
Run in place of the check (``python3 tests/bench/gpu_check_rows.py --device cpu --small --rows yhz``); the
rows' processes import this file. Rows: y dies (abort, after a device error's last line), h ignores
its time limit, z overruns it. With SLOW_PROGRESS=1 in the environment, every progress report of the
real rows waits 10 minutes (rows b, c and d then stop at their limits inside their long calls)."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gpu_check  # noqa: E402

DEVICE_ERROR = "RuntimeError: CUDA error: an illegal memory access was encountered"


def dies(env):
    yield gpu_check.Line("first", "info", "measured before the crash")
    env.reach("2/5 units of work")
    print(DEVICE_ERROR, file=sys.stderr, flush=True)
    os.abort()


def ignores_its_limit(env):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    env.reach("a call that never returns")
    time.sleep(600)
    yield gpu_check.Line("never", "info", "")


def overruns(env):
    yield gpu_check.Line("first", "info", "measured before the limit")
    env.reach("half of the work")
    time.sleep(600)
    yield gpu_check.Line("never", "info", "")


def _slow(real):
    def progress(env, what):
        report = real(env, what)

        def slow(done, total):
            report(done, total)
            time.sleep(600)
        return slow
    return progress


if os.environ.get("SLOW_PROGRESS"):        # here: the rows' processes import this file, not run it
    gpu_check.progress = _slow(gpu_check.progress)


def install() -> None:
    gpu_check.GRACE_S = 5
    for key, title, fn in (("y", "a row whose process dies", dies),
                           ("h", "a row that ignores its limit", ignores_its_limit),
                           ("z", "a row that overruns", overruns)):
        gpu_check.ROWS[key] = (title, fn)
        gpu_check.ESTIMATE_S[key] = (10, 10)


if __name__ == "__main__":
    install()
    sys.exit(gpu_check.main())
