"""What a task's processes use, as its wrapper measures them on the task's host.

    meter = Meter()
    fields = meter.measure(pids)   # {"cpu": 87.5, "wait": 40.2, "cpus": 2, "rss": 412_000_000,
                                   #  "processes": 3, "stopped": False}: the `usage` marker's

Read from /proc (Linux) with no psutil: the wrapper stays import-light (it never imports
TensorFlow, and a lab host may lack psutil). Elsewhere every process reads as gone.

`cpu` is the time the task's processes ran; `wait` the time their threads were runnable but
waited for a CPU (on a runqueue: a busy thread of their own, a capped CPU share, a crowded
host), from each thread's /proc/PID/task/TID/schedstat (its 2nd field, ns). Both in percent
of one core over the interval; cpu + wait is the CPU the task *wanted*, its demand
(orchestrator/loop/demand.py compares the workers of a synchronous job by it). A kernel
without schedstat (CONFIG_SCHED_INFO off) gives no `wait`: the marker leaves it out.
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


def read_waits(pid: int) -> dict[int, int] | None:
    """Each thread's time waiting on a runqueue so far, ns by thread id; None once the
    process is gone or where the kernel keeps no schedstat. A thread that ends between the
    listing and its read is left out. (os.open, not open(): a TensorFlow task has 100+
    threads, and this halves the cost, to 1.1 ms of CPU for 125 threads.)"""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    waits: dict[int, int] = {}
    for tid in tids:
        path = f"/proc/{pid}/task/{tid}/schedstat"
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None  # the kernel has no schedstat
        except OSError:
            continue
        try:
            waits[int(tid)] = int(os.read(fd, 128).split()[1])
        except (OSError, IndexError, ValueError):
            continue
        finally:
            os.close(fd)
    return waits


class Meter:
    """CPU and runqueue wait over the interval since the last measure (or since the meter
    was made): percent of one core, so 250 is two and a half cores. A process (or thread)
    new since the last measure counts with all its time (it began within the interval);
    one that ended meanwhile loses its last interval's share."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 read: Callable[[int], tuple[str, int, int] | None] = read_stat,
                 waits: Callable[[int], dict[int, int] | None] = read_waits) -> None:
        self._clock, self._read, self._waits = clock, read, waits
        self._at = clock()
        self._ticks: dict[int, int] = {}
        self._waited: dict[int, int] = {}  # ns by thread id, at the last measure
        # The CPUs this host lets the task use (its wrapper's affinity, which it inherits):
        # the coordinator compares only tasks on alike hosts (orchestrator/loop/demand.py).
        self._cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None

    def measure(self, pids: Iterable[int]) -> dict[str, Any]:
        now = self._clock()
        ticks: dict[int, int] = {}
        waited: dict[int, int] = {}
        rss, stopped, schedstat = 0, False, False
        for pid in pids:
            stat = self._read(pid)
            if stat is None:
                continue
            state, ticks[pid], size = stat
            rss += size
            stopped = stopped or state == STOPPED
            threads = self._waits(pid)
            if threads is not None:
                schedstat = True
                waited.update(threads)
        used = sum(t - self._ticks.get(pid, 0) for pid, t in ticks.items())
        wait_ns = sum(ns - self._waited.get(tid, 0) for tid, ns in waited.items())
        seconds = now - self._at
        cpu = 100.0 * used / _TICKS / seconds if seconds > 0 else 0.0
        wait = 100.0 * wait_ns / 1e9 / seconds if seconds > 0 else 0.0
        self._at, self._ticks, self._waited = now, ticks, waited
        fields: dict[str, Any] = {"cpu": round(max(cpu, 0.0), 1)}
        if schedstat:
            fields["wait"] = round(max(wait, 0.0), 1)
        if self._cpus:
            fields["cpus"] = self._cpus
        return fields | {"rss": rss, "processes": len(ticks), "stopped": stopped}
