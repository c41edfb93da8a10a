"""What a task's processes use, as its wrapper measures them on the task's host.

    meter = Meter()
    fields = meter.measure(pids)   # {"cpu": 87.5, "rss": 412_000_000, "processes": 3,
                                   #  "stopped": False}: the `usage` marker's fields

Read from /proc (Linux) with no psutil: the wrapper stays import-light (it never imports
TensorFlow, and a lab host may lack psutil). Elsewhere every process reads as gone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# State T: stopped by a signal (SIGSTOP, SIGTSTP). Not `t`, tracing stop: a debugger that
# attaches for a look is not a stall.
STOPPED = "T"


def read_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, CPU ticks used, rss bytes) of one process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and ')': the fields after the last ')' are state,
    # ppid, ...; utime and stime are the 14th and 15th fields of the line, rss the 24th.
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return fields[0].decode(), int(fields[11]) + int(fields[12]), int(fields[21]) * _PAGE
    except (IndexError, ValueError):
        return None


class Meter:
    """CPU over the interval since the last measure (or since the meter was made): percent of
    one core, so 250 is two and a half cores busy. A process new since the last measure
    counts with all its CPU time (it began within the interval); one that ended meanwhile
    loses its last interval's share."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 read: Callable[[int], tuple[str, int, int] | None] = read_stat) -> None:
        self._clock, self._read = clock, read
        self._at = clock()
        self._ticks: dict[int, int] = {}

    def measure(self, pids: Iterable[int]) -> dict[str, Any]:
        now = self._clock()
        ticks: dict[int, int] = {}
        rss, stopped = 0, False
        for pid in pids:
            stat = self._read(pid)
            if stat is None:
                continue
            state, ticks[pid], size = stat
            rss += size
            stopped = stopped or state == STOPPED
        used = sum(t - self._ticks.get(pid, 0) for pid, t in ticks.items())
        seconds = now - self._at
        cpu = 100.0 * used / _TICKS / seconds if seconds > 0 else 0.0
        self._at, self._ticks = now, ticks
        return {"cpu": round(max(cpu, 0.0), 1), "rss": rss, "processes": len(ticks),
                "stopped": stopped}
