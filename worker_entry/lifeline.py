"""Nothing outlives the coordinator: a task dies with it and removes its temp dir.

Three ways out, each ends in `_cleanup_and_exit`:
- SIGTERM (teardown, or the parent-death signal when the coordinator process dies):
  blocked in every thread before TensorFlow starts its own, and taken by one thread with
  `sigwait`, so it is handled even while the main thread is stuck inside a TF op.
- stdin EOF (the lifeline): the coordinator holds the write end of our stdin (a pipe
  locally, the SSH channel remotely) and never writes; EOF means it is gone.
- normal interpreter exit (`atexit`).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1
_tmp_dir: str | None = None


def _cleanup() -> None:
    if _tmp_dir:
        shutil.rmtree(_tmp_dir, ignore_errors=True)


def _cleanup_and_exit(reason: str, code: int, kill_group: bool) -> None:
    print(f"[tfo] {reason}: stopping this task", file=sys.stderr, flush=True)
    _cleanup()
    if kill_group:
        # Take down anything the task started too; we are in our own process group.
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(code)


def _watch_signals() -> None:
    sig = signal.sigwait({signal.SIGTERM, signal.SIGHUP})
    _cleanup_and_exit(f"received {signal.Signals(sig).name}", 128 + sig, kill_group=False)


def _watch_stdin() -> None:
    try:
        while os.read(sys.stdin.fileno(), 4096):
            pass
    except OSError:
        pass
    _cleanup_and_exit("lifeline to the coordinator closed", 137, kill_group=True)


def install(tmp_dir: str | None, watch_stdin: bool) -> None:
    """Call first thing in the task, before TensorFlow is imported."""
    global _tmp_dir
    _tmp_dir = tmp_dir
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
    threading.Thread(target=_watch_signals, name="tfo-signals", daemon=True).start()
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            _cleanup_and_exit("coordinator gone at start", 137, kill_group=True)
    if watch_stdin:
        threading.Thread(target=_watch_stdin, name="tfo-lifeline", daemon=True).start()
    atexit.register(_cleanup)
