"""When each part of a task's log was written: a small index beside the log, so that `tfo logs
RUN` can interleave the tasks' lines by time.

    index = TimeIndex("runs/ID/logs/worker-1.log")   # the coordinator's writer of that log
    index.mark(offset)                   # bytes are about to go to the log at `offset`
    stamped(read_lines(...), start, times_of(log))   # each line with the time it was written

The index is `<log>.t`: one `OFFSET TIME` line (TIME: wall-clock seconds) at most every
STEP seconds of output, so a busy task adds at most 20 short lines a second; a line's time is
that of the last entry at or before its first byte, which places it within STEP. A log
without an index (an older run's) reads as written at time 0: its lines keep their order.
Anything malformed in it (it is ours, but a full disk may cut a line) is skipped.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TextIO

STEP = 0.05  # seconds: an index entry at most this often
SUFFIX = ".t"


class TimeIndex:
    """Writes one log's index; never fails the log's writer (an error turns it off)."""

    def __init__(self, log_path: str | Path, clock: Callable[[], float] = time.time) -> None:
        self._path = f"{log_path}{SUFFIX}"
        self._clock = clock
        self._file: TextIO | None = None
        self._last = -math.inf
        self._broken = False

    def mark(self, offset: int) -> None:
        now = self._clock()
        if self._broken or now - self._last < STEP:
            return
        self._last = now
        try:
            if self._file is None:
                self._file = open(self._path, "a")  # noqa: SIM115 - held while the task runs
            self._file.write(f"{offset} {now:.3f}\n")
            self._file.flush()
        except OSError:
            self._broken = True  # a full disk: the log matters, its index does not

    def moved(self, log_path: str | Path) -> None:
        """The log was made again elsewhere (its run directory deleted and recreated): the
        index goes on there, from the next mark."""
        self.close()
        self._path, self._last = f"{log_path}{SUFFIX}", -math.inf

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


def times_of(log_path: str | Path) -> Iterator[tuple[int, float]]:
    """The index's entries, in order; none where there is no index."""
    try:
        f = open(f"{log_path}{SUFFIX}", encoding="ascii", errors="replace")  # noqa: SIM115
    except OSError:
        return
    with f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                try:
                    yield int(parts[0]), float(parts[1])
                except ValueError:
                    continue


def stamped(lines: Iterable[tuple[str, bool, int]], start: int,
            times: Iterable[tuple[int, float]]) -> Iterator[tuple[float, str, bool, int]]:
    """`read_lines`' (text, ended, offset after) from byte `start`, each with the time its
    first byte was written: the last entry at or before it (0.0 before any)."""
    entries = iter(times)
    current, upcoming = 0.0, next(entries, None)
    begin = start
    for text, ended, after in lines:
        while upcoming is not None and upcoming[0] <= begin:
            current, upcoming = upcoming[1], next(entries, None)
        yield current, text, ended, after
        begin = after
