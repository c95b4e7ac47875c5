"""A progress bar on a terminal for the engines' ``progress(done, total)`` calls (tiles, chunks,
exact-mode rounds): what ComfyUI's ProgressBar shows inside ComfyUI, for the command line.

``terminal_bar(stream)`` draws on ``stream`` only when it is a terminal (a log file or a pipe gets
nothing); ``reporting(bar)`` makes it the bar of every call in this context that has none of its
own (the headless runner's nodes ask ``current()``).

What the bar counts is what the engines report: tiles x time chunks, in fast and exact mode alike
(exact mode weights them by work); ``done`` may be fractional (part of a tile)."""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Callable, Iterator, Optional, TextIO

Progress = Callable[[int, int], None]
_CURRENT: contextvars.ContextVar[Optional[Progress]] = contextvars.ContextVar("vaekit_progress", default=None)


class TerminalBar:
    """``[#####.....]  12/40 tiles  3.1 s, ETA 7.2 s`` redrawn in place; a new line when a run ends."""

    def __init__(self, stream: TextIO, width: int = 30, label: str = "steps", min_interval: float = 0.1,
                 note: Optional[Callable[[], str]] = None):
        self.stream, self.width, self.label, self.min_interval = stream, width, label, min_interval
        self.note = note            # more text after the count (the cache's frames per second)
        self.start = self.last = None
        # The first callback comes after the first tile or chunk, so a run's clock starts at the
        # previous event (the bar's creation, the last callback): timed from its own first
        # callback, a 3-chunk decode would show "ETA 0.0 s" after one chunk of minutes.
        self.mark = time.perf_counter()
        self.open = False

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if self.start is None or not self.open:
            self.start, self.last = self.mark, 0.0
        self.mark = now
        finished = total > 0 and done >= total
        if not finished and now - self.last < self.min_interval:
            return                                          # redrawing costs more than the tiles
        self.last = now
        elapsed = now - self.start
        share = done / total if total else 0.0
        eta = f", ETA {elapsed / share - elapsed:.1f} s" if 0 < share < 1 else ""
        filled = int(self.width * share)
        note = f"  {self.note()}" if self.note else ""
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {_count(done):>4}/{_count(total)} {self.label}"
                          f"{note}  {elapsed:.1f} s{eta}   ")
        self.open = not finished
        if finished:
            self.stream.write("\n")
        self.stream.flush()

    def close(self) -> None:
        """End a bar left open (an interrupted run) with its line."""
        if self.open:
            self.stream.write("\n")
            self.stream.flush()
            self.open = False


def _count(n) -> str:
    return str(int(n)) if float(n).is_integer() else f"{n:.1f}"


def terminal_bar(stream: TextIO, quiet: bool = False, **kw) -> Optional[TerminalBar]:
    """A bar on ``stream`` if it is a terminal and not ``quiet``; otherwise None (no output at all)."""
    isatty = getattr(stream, "isatty", None)
    return TerminalBar(stream, **kw) if not quiet and isatty is not None and isatty() else None


def current() -> Optional[Progress]:
    return _CURRENT.get()


@contextlib.contextmanager
def reporting(bar: Optional[Progress]) -> Iterator[None]:
    token = _CURRENT.set(bar)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        if isinstance(bar, TerminalBar):
            bar.close()
