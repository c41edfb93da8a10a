"""The process tree, from Linux's /proc and prctl: who is below a pid, reaping what ended,
and the ties between a process and its parent (a parent-death signal, a child subreaper).

Standard library only, free of TensorFlow: a task's wrapper (worker_entry.lifeline) and a
lab host's agent (worker_entry.agent) both kill and reap what is below them with it.
Elsewhere than Linux the prctl's do nothing and no process is found below any other.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Iterator

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)


def parent_death_signal(sig: signal.Signals) -> None:
    """Get `sig` when the parent dies (PR_SET_PDEATHSIG)."""
    _prctl(_PR_SET_PDEATHSIG, sig)


def follow_parent(sig: signal.Signals) -> None:
    """Get `sig` when the parent dies; if it died before prctl took effect, exit now."""
    parent = os.getppid()
    parent_death_signal(sig)
    if os.getppid() != parent:
        os._exit(128 + sig)


def become_subreaper() -> None:
    """Orphans below us come to us, not to init (PR_SET_CHILD_SUBREAPER): whatever a child
    starts stays our descendant however it detaches."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def children(root: int) -> list[int]:
    """The processes whose parent is `root`, from /proc."""
    return _children_map().get(root, [])


def descendants(root: int) -> list[int]:
    """Every process below `root`, from /proc (Linux; elsewhere none are found)."""
    children = _children_map()
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _children_map() -> dict[int, list[int]]:
    """Each live process's children, by parent pid."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # The command name may hold spaces and ')': the fields after the last ')' are
        # state, ppid, ...
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    return children


def reaped() -> Iterator[tuple[int, int]]:
    """Every child that has ended, reaped now: (pid, wait status); never blocks."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def has_children() -> bool:
    """Any child, exited or not (none reaped here)? A subreaper without children has no
    descendants at all (an orphan below would have come to it): then no /proc scan, which
    costs each of 64 wrappers stopping at once milliseconds of a shared core."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True
