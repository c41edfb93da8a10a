"""Local tasks (placement kind `local`): one subprocess per task, each in its own process
group (and session).

    handle = LocalBackend({}).start(task, attempt=0)
    handle.poll(); handle.lines(); handle.terminate(); handle.kill()
    handle.exit_fd    # a pidfd: readable once the task exited (the supervisor waits on it)

The task's stdin is a pipe we hold and never write: its lifeline. If the coordinator dies,
the kernel closes it and the task's wrapper kills the task and everything it started (see
worker_entry.lifeline). The pid we know is that wrapper's. Should the wrapper itself be
SIGKILLed, what its task started comes to the coordinator, a child subreaper (orphans.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping

from orchestrator.launch import orphans
from orchestrator.launch.output import TaskOutput, close_pipes, send_lifeline
from orchestrator.launch.ports import free_ports
from orchestrator.launch.preflight import HostCheck, check_local
from orchestrator.plan import Plan, TaskPlan
from orchestrator.spec import HostSpec
from worker_entry import markers


class LocalHandle:
    def __init__(self, task: TaskPlan, attempt: int) -> None:
        self.task, self.attempt = task, attempt
        env = {**os.environ, **task.env, "TFO_ATTEMPT": str(attempt),
               markers.LIFELINE_ENV: markers.lifeline(heartbeat=False)}
        os.makedirs(task.cwd, exist_ok=True)
        orphans.adopt()
        self._proc = subprocess.Popen(
            task.command, cwd=task.cwd, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, bufsize=0,
        )
        self._pgid = self._proc.pid  # start_new_session: the leader's pid is the group id
        orphans.started(self._proc.pid)
        self._reaped_at: float | None = None
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # Linux 5.3+ (else: polled)
            self._pidfd = os.pidfd_open(self._proc.pid)
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        self._output = TaskOutput(task.log_path, lambda: os.read(fd, 65536), f"out-{task.name}")

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def exit_fd(self) -> int | None:
        return self._pidfd

    def poll(self) -> int | None:
        rc = self._proc.poll()
        if rc is not None and self._reaped_at is None:
            self._reaped_at = time.monotonic()
            orphans.reaped(self._proc.pid)
        return rc

    def lines(self) -> list[str]:
        return self._output.lines()

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pgid, sig)

    def terminate(self) -> None:
        self._signal_group(signal.SIGTERM)

    def request_stacks(self) -> None:
        send_lifeline(self._proc, markers.STACKS)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)  # the wrapper too: what it leaves comes to us
        self.poll()

    def close(self, timeout: float = 1.0) -> list[str]:
        # The task is gone; whatever it started goes too: its wrapper cleaned up before it
        # exited, or, SIGKILLed, left it to us. Then the output pipe closes.
        if self.poll() is not None and orphans.left_by(self._pgid):
            orphans.sweep(since=self._reaped_at)
        rest = self._output.close(timeout)
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None
        close_pipes(self._proc, self._output)
        # The wrapper removes the task's temp dir, except when it was SIGKILLed itself.
        shutil.rmtree(self.task.tmp_dir, ignore_errors=True)
        return rest


class LocalBackend:
    """Tasks on this machine."""

    def __init__(self, hosts: Mapping[str, HostSpec]) -> None:
        pass  # nothing to connect to

    def allocate(self, names: list[str], avoid: set[int]) -> dict[str, int]:
        return dict(zip(names, free_ports(len(names), avoid=avoid), strict=True))

    def check(self, tasks: list[TaskPlan]) -> list[HostCheck]:
        return [check_local(tasks)]

    def sync(self, plan: Plan, tasks: list[TaskPlan]) -> list[str]:
        return []  # local tasks run in the workdir, where the code is

    def start(self, task: TaskPlan, attempt: int) -> LocalHandle:
        return LocalHandle(task, attempt)

    def close(self) -> None:
        pass
