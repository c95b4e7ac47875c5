"""bench/harness/measure.py: the host peak of a block, from VmHWM after clear_refs, in a process started by
a larger parent (as each row of bench/gpu_check.py is), and the sampled fallback where clear_refs cannot
be written."""
from __future__ import annotations

import subprocess
import sys
import time

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from harness import measure  # noqa: E402

MIB = 1 << 20
HELD = 64 * MIB


def _hold(seconds: float = 0.0) -> None:
    """Touch ``HELD`` bytes (a fresh mapping: freed back to the system at once), hold them, let go."""
    block = b"\x01" * HELD
    time.sleep(seconds)
    del block


CHILD = f"""
import sys, time
sys.path.insert(0, {str(ROOT / "bench")!r})
from harness import measure
print(measure.maxrss_kib() - measure.vm_rss_kib(), measure.reset_peak(), flush=True)
with measure.HostPeak() as p:
    block = b"\\x01" * {HELD}
    del block
print(p.method, p.bytes())
"""


def test_the_peak_is_reset_in_a_process_started_by_a_larger_parent():
    """ru_maxrss of a process starts at the peak of the one that started it (the kernel folds the old
    memory map's peak in at exec): a mark compared with ru_maxrss never comes down there."""
    parent = b"\x02" * (128 * MIB)          # this process is larger than the child will ever be
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    del parent
    out = proc.stdout.split()
    above_kib, reset = int(out[0]), out[1]
    assert above_kib > 100 * 1024            # the child's ru_maxrss: the parent's peak, not its own
    assert reset == "True"
    assert proc.returncode == 0, proc.stderr
    method, held = out[2], int(out[3])
    assert method == "VmHWM"
    assert HELD - 2 * MIB <= held < HELD + 16 * MIB


def test_the_peak_of_a_block_from_vmhwm():
    _hold()                                  # an earlier peak the block must not report
    _hold()
    with measure.HostPeak() as p:
        _hold()
    assert p.method == "VmHWM"
    assert HELD - 2 * MIB <= p.bytes() < HELD + 16 * MIB


def test_where_clear_refs_cannot_be_written_the_rss_is_sampled(tmp_path, monkeypatch):
    monkeypatch.setattr(measure, "CLEAR_REFS", str(tmp_path / "absent" / "clear_refs"))
    assert not measure.reset_peak()
    with measure.HostPeak() as p:
        _hold(0.2)
    assert p.method == "sampled RSS"
    assert HELD - 4 * MIB <= p.bytes() < HELD + 16 * MIB
