"""The pool's fork server forks only where nothing a fork breaks is there (issue 37 item 9):
it is the one thread of its process (a fork copies other threads' locks but not the
threads), no event loop's descriptor (one epoll set shared by every child), no writable
shared memory. Real servers that import TensorFlow, real forks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.launch.forkserver import COMMAND, ForkServer
from tests.conftest import REPO
from worker_entry import markers

pytestmark = [pytest.mark.tf]

# Run at the interpreter's start (site imports it from the path), before the server's own
# code, in the fork server only: a library that starts a thread, or an event loop and
# shared memory, at its import.
AT_START = """\
import mmap
import select
import threading
import time

with open("/proc/self/cmdline", "rb") as f:
    command = f.read().split(b"\\0")
if b"worker_entry.forkserver" in command:
    {}
"""
THREAD = "threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()"
# An event loop's set (as gRPC's poller makes) and an anonymous MAP_SHARED mapping (mmap's
# default), kept.
LOOP = "select.KEEP = select.epoll(); mmap.KEEP = mmap.mmap(-1, 4096)"


def server_env(path: list[Path]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH",) and not k.startswith("TFO_")}
    return {**env, "PYTHONPATH": os.pathsep.join([*map(str, path), str(REPO)]),
            "CUDA_VISIBLE_DEVICES": "", "TF_USE_LEGACY_KERAS": "1", "TFO_JOB": "{}"}


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def standby_env(env: dict[str, str]) -> dict[str, str]:
    """A standby's: it waits for GO, and ends at its lifeline's EOF (our end's close)."""
    return {**env, markers.STANDBY_ENV: "1", markers.LIFELINE_ENV: markers.LIFELINE_STDIN}


@pytest.mark.timeout(600)
def test_the_fork_server_forks_alone_and_refuses_what_a_fork_breaks(tmp_path: Path):
    cases = ((None, []), (THREAD, ["2 threads in the fork server"]),
             (LOOP, ["anon_inode:[eventpoll]", "shared and writable"]))
    for n, (at_start, refused) in enumerate(cases):
        site = tmp_path / f"site-{n}"
        site.mkdir()
        if at_start is not None:
            (site / "sitecustomize.py").write_text(AT_START.format(at_start))
        env = server_env([site])
        log_path = tmp_path / f"forks-{n}.log"
        forks = ForkServer(env, str(tmp_path), str(log_path))
        server = forks.pid
        proc = None
        try:
            proc = forks.spawn(COMMAND, standby_env(env), str(tmp_path))
            said = log_path.read_text(errors="replace")
            if not refused:
                assert proc is not None, said[-3000:]
                # After TensorFlow's import and a fork: OpenBLAS's idle pools joined by its
                # atfork handler, nothing of TensorFlow's, gRPC's or absl's started.
                assert threads_of(server) == 1
            else:
                assert proc is None, f"forked despite {at_start}"
                assert forks.pid is None  # not asked again: the pool execs its standbys
                assert all(r in said for r in refused), said[-3000:]
        finally:
            if proc is not None:
                proc.stdin.close()  # the lifeline's EOF: the standby ends
                assert proc.wait(60) is not None
            forks.close()
