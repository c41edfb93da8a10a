"""Waking the supervisor's loop, which sleeps until something happens instead of polling.

    wakeup.notify()        # any thread, or a signal handler: the loop wakes now
    wakeup.fileno()        # the loop waits on this (with the tasks' pidfds)
    wakeup.drain()         # the loop, once awake

A self-pipe, one per process: a task's output reader (launch/output.py) notifies when lines
arrive for the supervisor, its signal handler when a signal came. Never blocks: a pipe that
is full already wakes the loop.
"""

from __future__ import annotations

import contextlib
import os

_pipe: tuple[int, int] | None = None


def _fds() -> tuple[int, int]:
    global _pipe
    if _pipe is None:
        r, w = os.pipe()  # not inherited by the tasks (O_CLOEXEC, and Popen closes fds)
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        _pipe = (r, w)
    return _pipe


def fileno() -> int:
    return _fds()[0]


def notify() -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        os.write(_fds()[1], b"\0")


def drain() -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        while os.read(_fds()[0], 4096):
            pass
