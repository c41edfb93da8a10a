"""Nothing outlives the coordinator: a task dies with it, and its temp dir goes too.

A task's main thread can sit inside a TensorFlow op holding the GIL for minutes (building
MultiWorkerMirroredStrategy while peers are missing, a collective that waits), so nothing
here relies on Python code running in the task:

- SIGTERM (teardown sends it to the task's whole group) is acted on by the watchdog below,
  which SIGKILLs the task: TensorFlow installs its own SIGTERM handler (preemption notice)
  in the task, so the task itself would not stop.
- PR_SET_PDEATHSIG(SIGKILL): the kernel kills the task when the process that started it
  (the coordinator locally, the SSH session remotely) dies.
- With "stdin:SECONDS", the coordinator sends heartbeats and the watchdog answers with a
  BEAT byte on stdout every second, so a cut network is seen from both ends.
- A watchdog process, forked before TensorFlow starts, waits on two pipes: the task's stdin,
  whose write end the coordinator holds and never writes (the lifeline: EOF means the
  coordinator or the SSH connection is gone), and a pipe from the task itself (EOF means the
  task ended, however). On lifeline EOF it kills the task and its whole process group; on
  task end it removes the task's temp dir and exits.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import select
import shutil
import signal
import sys
import time

from worker_entry import markers

_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal(sig: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)


def _watchdog(task_pid: int, task_pipe: int, watch_stdin: bool, quiet_limit: float | None,
              tmp_dir: str | None) -> None:
    def stop_task(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            os.kill(task_pid, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop_task)
    signal.signal(signal.SIGHUP, stop_task)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin = sys.stdin.fileno()
    fds = [task_pipe] + ([stdin] if watch_stdin else [])
    heard = beat = time.monotonic()
    while True:
        ready, _, _ = select.select(fds, [], [], 0.5 if quiet_limit else None)
        if quiet_limit and time.monotonic() - beat >= 1.0:
            beat = time.monotonic()
            with contextlib.suppress(OSError):
                os.write(sys.stdout.fileno(), markers.BEAT)  # tells the coordinator we are alive
        if quiet_limit and stdin not in ready and time.monotonic() - heard > quiet_limit:
            ready = [stdin]  # no heartbeat: the connection is cut; treat as closed
            os.close(stdin)
        for fd in ready:
            try:
                data = os.read(fd, 4096)
            except OSError:
                data = b""
            if data:
                heard = time.monotonic()
                continue
            if fd != task_pipe:  # the lifeline closed: the coordinator is gone
                print(f"[tfo] lifeline to the coordinator closed: killing task pid {task_pid}",
                      file=sys.stderr, flush=True)
                with contextlib.suppress(OSError):
                    os.kill(task_pid, signal.SIGKILL)
                select.select([task_pipe], [], [], 5.0)  # until the task is gone
            if tmp_dir:
                shutil.rmtree(tmp_dir, ignore_errors=True)
            if fd != task_pipe:
                # Anything the task started, and this watchdog last.
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgrp(), signal.SIGKILL)
            os._exit(0)


def install(tmp_dir: str | None, lifeline: str | None) -> None:
    """Call first thing in the task, before TensorFlow is imported (no threads yet).

    `lifeline`: None (no coordinator to follow), "stdin" (EOF means gone) or "stdin:SECONDS"
    (the coordinator also sends heartbeats; silence that long means gone).
    """
    watch_stdin = bool(lifeline and lifeline.startswith("stdin"))
    quiet_limit = float(lifeline.split(":", 1)[1]) if lifeline and ":" in lifeline else None
    parent = os.getppid()
    _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the coordinator died before prctl took effect
        os._exit(137)
    read_end, write_end = os.pipe()  # close-on-exec; the task holds the write end for life
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(write_end)
        try:
            _watchdog(os.getppid(), read_end, watch_stdin, quiet_limit, tmp_dir)
        finally:
            os._exit(0)
    os.close(read_end)
    if tmp_dir:
        atexit.register(shutil.rmtree, tmp_dir, True)
