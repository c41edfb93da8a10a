"""The task's side of `python -m worker_entry`: what the task proper does between the fork
(worker_entry.lifeline.start) and the first line of the job's code, and what it tells its
wrapper at the end.

- It gets SIGKILL when its wrapper dies (a SIGKILLed wrapper never leaves a task holding
  its port), and takes its process title (`tfo worker:1 train.py`).
- It tells the wrapper over a pipe whenever a Python SIGTERM handler is set or unset
  (signal.signal is wrapped here, before any user code runs): only then can a SIGTERM do
  any good, so only then does the wrapper pass it on and wait the grace.
- Its faulthandler is registered on STACKS_SIGNAL: the wrapper's signal writes every Python
  thread's stack to the task's log (where a stalled task is stuck).
- Its stdout and stderr go to the wrapper's output pipe, its markers to a pipe of their own
  (markers.use_channel); its stdin, the coordinator's lifeline, is the wrapper's to read.
- A standby waits here for GO (worker_entry.standby).
- As its main code ends (`exiting_with`, from worker_entry/__main__), and again at exit, it
  says so in an `exiting` marker with its exit code, and tells the wrapper that no SIGTERM
  handler can save anything any more: a teardown hung after a peer's death gets no grace.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import signal
import sys
from typing import Any

from worker_entry import markers, proctree, standby, title

_exit_code: int | None = None  # the task's own, once its main code is over (exiting_with)
_handler_fd: int | None = None  # the task's end of the pipe _report_sigterm_handlers writes


def begin(handler_w: int, output_w: int | None, marker_w: int, go_r: int | None,
          stdin_held: bool, theirs: list[int]) -> None:
    """In the task, just forked: everything before the job's code. `handler_w`: the SIGTERM
    handler reports' pipe; `output_w`: stdout and stderr's (None: unframed, they stay ours);
    `marker_w`: the markers'; `go_r`: a standby's GO; `stdin_held`: a coordinator holds our
    stdin (the wrapper's to read); `theirs`: the wrapper's ends of the pipes, closed here."""
    proctree.follow_parent(signal.SIGKILL)
    title.set_title(title.describe(os.environ, room=title.room()))  # `tfo worker:1 train.py`
    # First registered, so it runs last: after the user's and TensorFlow's handlers.
    atexit.register(_say_exiting)
    for fd in theirs:
        os.close(fd)
    _report_sigterm_handlers(handler_w)
    # Where a stalled task is stuck, on request (the wrapper signals): to its log.
    with contextlib.suppress(ValueError, OSError, RuntimeError, AttributeError):
        faulthandler.register(getattr(signal, markers.STACKS_SIGNAL), all_threads=True)
    # Its output to the wrapper, and its markers on a pipe of their own, which nothing it
    # prints can reach: a line that looks like a marker is text.
    if output_w is not None:
        os.dup2(output_w, 1)
        os.dup2(output_w, 2)
        os.close(output_w)
    markers.use_channel(marker_w)
    if stdin_held:  # the wrapper's to read (EOF, GO, STACKS)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, sys.stdin.fileno())
        os.close(devnull)
    if go_r is not None:
        standby.serve(go_r)


def exiting_with(code: object) -> None:
    """In the task, as its main code ends: the exit status its SystemExit code makes (None:
    0; an int: its low byte; anything else: 1), said in the `exiting` marker."""
    global _exit_code
    _exit_code = 0 if code is None else code & 0xFF if isinstance(code, int) else 1


def _say_exiting() -> None:
    with contextlib.suppress(Exception):  # stdout may be closed: nothing to tell then
        if _exit_code is None:  # e.g. a KeyboardInterrupt, or code that never got there
            markers.emit(markers.EXITING)
        else:
            markers.emit(markers.EXITING, code=_exit_code)
    # The task's code is over: a SIGTERM handler can save nothing any more. What is left is
    # the interpreter's and TensorFlow's teardown, which can hang for good after a collective
    # failed (a peer's death); the wrapper then SIGKILLs at once rather than wait the grace.
    if _handler_fd is not None:
        with contextlib.suppress(OSError):
            os.write(_handler_fd, b"0")


def _report_sigterm_handlers(fd: int) -> None:
    """Tell the wrapper (b"1"/b"0" on `fd`) whenever a Python SIGTERM handler is set or
    unset, so that it knows whether a SIGTERM can do any good."""
    global _handler_fd
    _handler_fd = fd
    os.set_blocking(fd, False)  # a full pipe drops a report rather than block the task
    original = signal.signal

    def reporting(signalnum: int, handler: Any) -> Any:
        previous = original(signalnum, handler)
        if signalnum == signal.SIGTERM:
            with contextlib.suppress(OSError):
                os.write(fd, b"1" if callable(handler) else b"0")
        return previous

    signal.signal = reporting
