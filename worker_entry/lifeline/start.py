"""`wrap`: the start of `python -m worker_entry`, where it becomes two processes (see
worker_entry.lifeline): the pipes between them, the fork, and each side's beginning (the
task's in lifeline.prologue, the wrapper's loop in lifeline.wrapper).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys

from worker_entry import markers, proctree, title
from worker_entry.lifeline import job, prologue
from worker_entry.lifeline.relay import READ_BYTES
from worker_entry.lifeline.wrapper import Wrapper


def wrap() -> None:
    """Call first thing in `python -m worker_entry`, before TensorFlow is imported.

    Returns in the task (a forked child); in the wrapper it never returns. TFO_LIFELINE:
    unset (no coordinator to follow) or "stdin" (EOF means gone).
    """
    proctree.follow_parent(signal.SIGHUP)  # the coordinator is gone: no grace to wait out
    proctree.become_subreaper()
    waits = os.environ.get(markers.STANDBY_ENV) == "1"  # a standby: see the package's doc
    tmp_dir = job.tmp_dir()
    if tmp_dir:
        for var in ("TMPDIR", "TEMP", "TMP"):  # a lab host's workdir may be ~/something
            if var in os.environ:
                os.environ[var] = os.path.expanduser(os.environ[var])
        if not waits and not job.make_tmp_dir(tmp_dir):
            os._exit(1)
    lifeline = os.environ.get(markers.LIFELINE_ENV)
    # A coordinator reads our stdout (every backend sets a lifeline): frames. Without one (a
    # Kubernetes pod, `python -m worker_entry` by hand) our stdout is the task's, as text.
    framed = bool(lifeline)
    sys.stdout.flush()
    sys.stderr.flush()
    handler_r, handler_w = os.pipe()  # not inherited across exec: only the task writes it
    go_r, go_w = os.pipe() if waits else (None, None)
    # The task's stdout and stderr, and its markers: pipes to us (worker_entry.channel).
    output_r, output_w = os.pipe() if framed else (-1, -1)
    if framed:
        with contextlib.suppress(OSError, AttributeError):  # Linux: fewer hops through us
            fcntl.fcntl(output_r, fcntl.F_SETPIPE_SZ, READ_BYTES)
    # Not inherited: what the task starts cannot write it. Unframed: a copy of stdout.
    marker_r, marker_w = os.pipe() if framed else (-1, os.dup(sys.stdout.fileno()))
    # Before the fork, so setproctitle loads once (2.3-2.9 ms here); the task renames itself.
    title.set_title(title.describe(os.environ, "wrapper", title.room()))
    task_pid = os.fork()
    if task_pid == 0:
        theirs = [handler_r] + ([output_r, marker_r] if framed else []) \
            + ([go_w] if go_w is not None else [])  # the wrapper's ends: its exit, our EOF
        prologue.begin(handler_w, output_w if framed else None, marker_w, go_r,
                       stdin_held=bool(lifeline), theirs=theirs)
        return
    os.close(handler_w)
    if go_r is not None:
        os.close(go_r)
    os.close(marker_w)
    if framed:
        os.close(output_w)
        for fd in (output_r, marker_r, 1):
            os.set_blocking(fd, False)
        # Our stdout carries frames only: nothing else of ours may write into it (our words
        # go in SAY frames).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    Wrapper(task_pid, tmp_dir, lifeline, job.grace(), handler_r,
            (output_r, marker_r) if framed else None, go_w).run()
