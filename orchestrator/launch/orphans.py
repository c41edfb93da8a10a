"""What a SIGKILLed task wrapper leaves: the coordinator adopts it and kills it.

    orphans.adopt()                  # before the first local task starts (once a process)
    orphans.started(pid)             # a wrapper we started (its pid is its process group)
    orphans.reaped(pid)              # ... and we collected its exit
    if orphans.left_by(pid):         # when its handle closes: did it die uncleanly?
        orphans.sweep_soon(since=reaped_at)   # kill and reap what it left, on a thread
    orphans.settle()                 # before a start: that sweep is over (ports are free)

The wrapper (worker_entry.lifeline) kills everything its task started, whenever the task
ends; it cannot once it is SIGKILLed itself. The task then dies with it (PDEATHSIG), and
what the task started (a child in a session of its own, a double-forked daemon) is
re-parented by the kernel to the nearest child subreaper: the coordinator, which is one.
So those processes are the coordinator's children and nothing needs sampling while tasks
run (the old backstop read every task's process tree from /proc each second: the 64-task
CPU hog). Whether a wrapper died uncleanly costs one waitid: its task, in its process group,
is then our child (or zombie), where a wrapper that cleaned up had reaped it. Only then a
sweep, which covers every wrapper reaped before it started: our children, from our threads'
children lists in /proc (not a scan of every process on the machine: 9-12 ms with a few
hundred, between a SIGKILLed wrapper and its peers' SIGTERM).

The sweep of a wrapper's leftovers runs on a thread of its own (`sweep_soon`): its task got
SIGKILL with the wrapper (PDEATHSIG) and is dying already, but a TensorFlow process takes
its time to go (its memory freed, each of its threads ended: SIGKILL → its pidfd readable
took 0.14-0.40 s for a 580 MiB TensorFlow process at load 15-20 on 2 cores, against 15-41
ms for a numpy process of 625 MiB).
Waited out on the loop, that death came before the peers' SIGTERM, and theirs after it: a
restart waited for two deaths in a row, where now they overlap (bench/run.py's recovery
section). Every start on this machine first waits for the sweep under way (`settle`, in
`sweep_suspected`): the task it kills may hold the port the new attempt binds; and no
wrapper is made while one runs (LocalHandle settles first: a new wrapper, not yet
`started`, would look like a leftover). A death is
waited for on its pidfd, not by polling (psutil's wait polls at up to 40 ms).

A wrapper SIGKILLed after it reaped its task, while it killed the rest (a double fault),
leaves no task in its group: that is told only by its exit by SIGKILL, which is also how
every wrapper of a SIGKILLed task ends (it mirrors the task's signal). A sweep on each
would cost a scan per exit when a teardown kills 64 tasks, so that case is `suspect`ed,
and swept once, before the next local task starts (what is left must not hold its port)
and when the run ends:

    orphans.suspect(since=reaped_at)     # a wrapper ended by SIGKILL
    orphans.sweep_suspected()            # before a start, and at the end

Only our own are touched: a child of ours that is no wrapper we started, and that either
carries TFO_ATTEMPT in its environment (every local task's processes inherit it) or is
in a wrapper's process group (the task itself, already a zombie).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

_PR_SET_CHILD_SUBREAPER = 36
_SWEEP_SECONDS = 2.0  # at most this long killing generation after generation (a fork bomb)

_adopted = False
_wrappers: set[int] = set()  # started, exit not collected yet
_groups: set[int] = set()  # process groups of the wrappers we started
_swept_at = float("-inf")  # monotonic start of the last sweep
_suspected: float | None = None  # the earliest reap a sweep is still owed for
_pending: threading.Thread | None = None  # a sweep under way (sweep_soon)
_lock = threading.Lock()  # one sweep at a time


def adopt() -> None:
    global _adopted
    if not _adopted and sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _adopted = True


def started(pid: int) -> None:
    _wrappers.add(pid)
    _groups.add(pid)


def reaped(pid: int) -> None:
    _wrappers.discard(pid)


def left_by(pid: int) -> bool:
    """Has the wrapper `pid` (exited) left a child of ours in its process group?"""
    try:
        os.waitid(os.P_PGID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except (AttributeError, OSError):  # no waitid here: look
        return True
    return True


def _ours(p: psutil.Process) -> bool:
    import psutil

    if p.pid in _wrappers:
        return False
    try:
        return "TFO_ATTEMPT" in p.environ()
    except psutil.Error:  # a zombie: its environment is gone, its group is not
        with contextlib.suppress(OSError):
            return os.getpgid(p.pid) in _groups
    return False


def _children() -> list[psutil.Process]:
    """Our children, those we did not start as wrappers. From each of our threads' list of
    children in /proc (a re-parented orphan is a child of one of them): psutil's children()
    reads every process's stat on the machine, 9-12 ms with a few hundred, on the way from
    a SIGKILLed wrapper to its peers' SIGTERM. The threads are listed again after: one that
    ended meanwhile handed its children to another, perhaps one already read, so then the
    lists are read again. Where /proc has no children lists (a kernel without
    CONFIG_PROC_CHILDREN), psutil's."""
    import psutil

    def tids() -> set[str]:
        return set(os.listdir("/proc/self/task"))

    pids: set[int] = set()
    try:
        for _ in range(3):
            before, pids = tids(), set()
            for tid in before:
                with contextlib.suppress(FileNotFoundError, ProcessLookupError), \
                        open(f"/proc/self/task/{tid}/children") as f:  # gone: it ended
                    pids.update(int(pid) for pid in f.read().split())
            if tids() == before:
                break
        else:
            raise OSError("our threads kept changing")
        if not pids and not os.path.exists(f"/proc/self/task/{os.getpid()}/children"):
            raise OSError("no children lists here")
    except OSError:
        return psutil.Process().children()
    found = []
    for pid in pids - _wrappers:
        with contextlib.suppress(psutil.NoSuchProcess):  # reaped meanwhile
            found.append(psutil.Process(pid))
    return found


def sweep(since: float | None = None) -> int:
    """Kill and reap our orphans; how many. Skipped when a sweep started after `since` (the
    monotonic time the wrapper's exit was collected: its orphans were ours by then)."""
    global _swept_at
    import psutil  # only when a wrapper left something: `tfo plan` goes without

    with _lock:
        if since is not None and _swept_at > since:
            return 0
        start, killed = time.monotonic(), 0
        while time.monotonic() - start < _SWEEP_SECONDS:
            try:
                found = [p for p in _children() if _ours(p)]
            except psutil.Error:
                break
            if not found:
                break
            for p in found:
                with contextlib.suppress(psutil.Error):
                    p.kill()  # psutil checks the create time: never a reused pid
            _reap([p.pid for p in found], 0.5)  # their children come to us, for the next round
            killed += len(found)
        _swept_at = start
        return killed


def _reap(pids: list[int], timeout: float) -> None:
    """Wait for our children `pids` to end (on their pidfds: at once, no polling), at most
    `timeout`, and reap those that did. Unreaped, a child's pid is not reused meanwhile."""
    fds: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError, AttributeError):  # gone already; no pidfd here
            fds[os.pidfd_open(pid)] = pid
    try:
        until = time.monotonic() + timeout
        waiting = set(fds)
        while waiting and (left := until - time.monotonic()) > 0:
            ready, _, _ = select.select(list(waiting), [], [], left)
            waiting -= set(ready)
    finally:
        for fd in fds:
            os.close(fd)
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def sweep_soon(since: float | None = None) -> None:
    """`sweep(since)` on a thread of its own: the loop goes on (to the peers' stop) while
    what the wrapper left dies; `settle` waits for it."""
    global _pending
    settle()
    _pending = threading.Thread(target=sweep, args=(since,), name="tfo-orphans", daemon=True)
    _pending.start()


def settle() -> None:
    """Wait for the sweep under way, if any (at most as long as a sweep may take)."""
    global _pending
    if _pending is not None:
        _pending.join(_SWEEP_SECONDS + 1.0)
        _pending = None


def suspect(since: float | None) -> None:
    """A wrapper reaped at `since` may have left something: sweep before the next start."""
    global _suspected
    at = float("-inf") if since is None else since
    _suspected = at if _suspected is None else min(_suspected, at)


def sweep_suspected() -> int:
    """The sweep under way, waited for (`settle`); then the one `suspect` owes, if any; how
    many that one killed."""
    global _suspected
    settle()
    if _suspected is None:
        return 0
    since, _suspected = _suspected, None
    return sweep(since=since)
