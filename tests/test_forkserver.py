"""The pool's fork server forks only while it is the one thread of its process (issue 37
item 9): a fork copies other threads' locks but not the threads, the hazard behind a forked
task that waits forever. Real servers that import TensorFlow, real forks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.launch.forkserver import COMMAND, ForkServer
from tests.conftest import REPO
from worker_entry import markers

pytestmark = [pytest.mark.tf]

# Started at the interpreter's start (site imports it from the path), before the server's
# own code: a library that starts a thread at its import.
THREAD_AT_START = """\
import threading
import time

with open("/proc/self/cmdline", "rb") as f:
    command = f.read().split(b"\\0")
if b"worker_entry.forkserver" in command:
    threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
"""


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


@pytest.mark.timeout(300)
def test_the_fork_server_forks_alone_and_refuses_where_a_thread_is_there(tmp_path: Path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(THREAD_AT_START)
    for path, forks_ok in (([], True), ([site], False)):
        env = server_env(path)
        forks = ForkServer(env, str(tmp_path), str(tmp_path / "forks.log"))
        server = forks.pid
        proc = None
        try:
            proc = forks.spawn(COMMAND, standby_env(env), str(tmp_path))
            log = (tmp_path / "forks.log").read_text(errors="replace")[-3000:]
            if forks_ok:
                assert proc is not None, log
                # After TensorFlow's import and a fork: OpenBLAS's idle pools joined by its
                # atfork handler, nothing of TensorFlow's, gRPC's or absl's started.
                assert threads_of(server) == 1
            else:
                assert proc is None, "forked from a server with 2 threads"
                assert forks.pid is None  # not asked again: the pool execs its standbys
                said = (tmp_path / "forks.log").read_text(errors="replace")
                assert "2 threads in the fork server" in said, said[-3000:]
        finally:
            if proc is not None:
                proc.stdin.close()  # the lifeline's EOF: the standby ends
                assert proc.wait(60) is not None
            forks.close()
