"""Waking the supervisor's loop, which sleeps until something happens instead of polling.

    wakeup.notify()             # any thread: output arrived for the loop
    wakeup.notify(urgent=True)  # the signal handler: wake the loop now, whatever it waits for
    waiter = Waiter()           # the loop's one poll object: the pipes and the fds watched
    waiter.watch({fd, …})       # the tasks' pidfds, registered as the set changes
    waiter.wait(seconds, output=True)   # -> (the watched fds readable, output notified)

Two self-pipes, one per process each: a task's output reader (launch/output.py) notifies
when lines arrive for the supervisor, its signal handler when a signal came. The loop may
wait without output (it is going to take it a little later anyway), never without signals.
Never blocks: a pipe that is full already wakes the loop.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select


@functools.cache
def _pipe(urgent: bool) -> tuple[int, int]:
    r, w = os.pipe()  # not inherited by the tasks (O_CLOEXEC, and Popen closes fds)
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def notify(urgent: bool = False) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        os.write(_pipe(urgent)[1], b"\0")


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        while os.read(fd, 4096):
            pass


class Waiter:
    """One poll object for the loop's whole life. Registering every task's pidfd anew each
    round cost more, with 64 tasks, than the rest of the round. poll(2) keeps no state
    between calls, so a number closed and reused meanwhile is simply the new file's."""

    def __init__(self) -> None:
        self._output, self._urgent = _pipe(False)[0], _pipe(True)[0]
        self._poll = select.poll()
        self._poll.register(self._urgent, select.POLLIN)
        self._watched: set[int] = set()

    def watch(self, fds: set[int]) -> None:
        for fd in self._watched - fds:
            self._poll.unregister(fd)
        for fd in fds - self._watched:
            self._poll.register(fd, select.POLLIN)
        self._watched = fds

    def wait(self, seconds: float, output: bool = True) -> tuple[set[int], bool]:
        """Until a watched fd is readable, notify(urgent=True) was called, or (`output`)
        notify() was, at most `seconds`: (the watched fds that are readable, notified).
        Not waiting for output, its pipe is drained anyway: the round that follows takes
        every line notified so far (a reader notifies after it queued its line)."""
        if output:
            self._poll.register(self._output, select.POLLIN)
        else:
            with contextlib.suppress(KeyError):
                self._poll.unregister(self._output)
        ready = {fd for fd, _ in self._poll.poll(max(0.0, seconds) * 1000)}  # < 0: forever
        notified = self._output in ready or self._urgent in ready
        if notified or not output:
            _drain(self._output)
        if self._urgent in ready:
            _drain(self._urgent)
        return ready - {self._output, self._urgent}, notified
