"""The coordinator's end of a fork server (worker_entry/forkserver.py): local task wrappers
forked from one process that imported TensorFlow, instead of each exec'd to import it again.

    forks = ForkServer(env, cwd, log_path)       # starts it; it imports TensorFlow meanwhile
    proc = forks.spawn(env, cwd)                 # a Popen-like wrapper process, or None
    forks.close()

Only the warm pool uses it (orchestrator/launch/pool.py): its standbys all share one environment
at their start, fixed before any job exists. `spawn` answers None (the caller execs as
before) where a fork would not give what an exec gives (another interpreter or startup
variables: worker_entry.forkstart.can_fork) or where the server failed; a failed server is
not asked again. The wrapper it makes is re-parented to this process, a child subreaper
(orphans.adopt), so it is our child as one we exec'd: `Forked` waits for it and reads its
exit as Popen does.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import BinaryIO

from orchestrator.launch import orphans
from worker_entry import forkstart

COMMAND = [sys.executable, "-m", "worker_entry"]  # what a forked wrapper stands for
# The first answer waits for the server's TensorFlow import (2 s here, more on a loaded
# machine); a server silent this long is given up and killed.
ANSWER_SECONDS = 120.0
CLOSE_SECONDS = 2.0


class Forked:
    """A wrapper the fork server made, our child by adoption: the part of Popen that
    LocalHandle uses (pid, stdin, stdout, poll, wait, returncode)."""

    def __init__(self, pid: int, stdin: BinaryIO, stdout: BinaryIO) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.args = COMMAND
        self.returncode: int | None = None
        self._lock = threading.Lock()  # one waitpid at a time, as Popen's: a second one
        # racing the first would find no child and take the exit for unknown

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # nothing else of ours reaps it; should anything,
                    self.returncode = 255  # its exit is unknown, and it is gone all the same
                    return self.returncode
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return code


class ForkServer:
    """One `python -m worker_entry.forkserver`, started with the environment of the wrappers
    it will fork (their startup variables must be its own)."""

    def __init__(self, env: dict[str, str], cwd: str, log_path: str) -> None:
        orphans.adopt()  # before any wrapper is forked: the middle child's orphans come here
        self._startup = forkstart.startup_env(env)
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(log_path, "ab") as log:
                self._proc: subprocess.Popen | None = subprocess.Popen(
                    [*COMMAND[:2], "worker_entry.forkserver"], stdin=theirs.fileno(),
                    stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                    start_new_session=True)
        finally:
            theirs.close()
        self._sock.settimeout(ANSWER_SECONDS)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def fits(self, command: list[str], env: dict[str, str]) -> bool:
        return (self._proc is not None and command == COMMAND
                and forkstart.startup_env(env) == self._startup)

    def spawn(self, command: list[str], env: dict[str, str], cwd: str) -> Forked | None:
        """`command` (`python -m worker_entry`) with `env` in `cwd`, forked; None where it
        cannot be (the caller execs it)."""
        if not self.fits(command, env):
            return None
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = None
        try:
            request = {"cwd": cwd, "env": env, "parent": os.getpid()}
            socket.send_fds(self._sock, [json.dumps(request).encode()], [in_r, out_w])
            pid = json.loads(self._sock.recv(4096) or b"{}").get("pid")
        except (OSError, ValueError, AttributeError):
            pid = None
        finally:
            os.close(in_r)
            os.close(out_w)
        if not isinstance(pid, int) or not _ours(pid):
            os.close(in_w)
            os.close(out_r)
            self.close()  # broken, silent or not adopted: not asked again
            return None
        return Forked(pid, os.fdopen(in_w, "wb", buffering=0), os.fdopen(out_r, "rb",
                                                                           buffering=0))

    def close(self) -> None:
        """End the server (its standbys are the pool's to end)."""
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        try:
            proc.wait(CLOSE_SECONDS)  # its socket's end: it returns
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ours(pid: int) -> bool:
    """Is `pid` our child (adopted: the fork server's middle child is gone)?"""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True
