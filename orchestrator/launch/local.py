"""Local tasks (placement kind `local`): one subprocess per task, each in its own process
group (and session).

    handle = LocalBackend({}).start(task, attempt=0)
    handle.poll(); handle.lines(); handle.terminate(); handle.kill()
    handle.exit_fd    # a pidfd: readable once the task exited (the supervisor waits on it)

The task's stdin is a pipe we hold and never write: its lifeline. If the coordinator dies,
the kernel closes it and the task's wrapper kills the task and everything it started (see
worker_entry.lifeline). The pid we know is that wrapper's. Should the wrapper itself be
SIGKILLed, what its task started comes to the coordinator, a child subreaper (orphans.py).

A standby (`LocalHandle(task, attempt, standby=True)`, a warm spare: spares.py) is the same
process started ahead: its task imports TensorFlow and waits. `go()` starts it for real;
its output, held in the pipe until then, goes to the log from that moment. `discard()` ends
one that was never used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.launch import HostBackend, loopback, orphans
from orchestrator.launch.gpus import GpuReport, local_gpus
from orchestrator.launch.output import TaskOutput, close_pipes, pipe_output, send_lifeline
from orchestrator.launch.ports import free_ports
from orchestrator.launch.preflight import HostCheck, check_local, run_owner
from orchestrator.launch.spares import DISCARD_SECONDS, Spares
from orchestrator.planning.plan import Plan, TaskPlan
from orchestrator.planning.spec import HostSpec
from worker_entry import markers
from worker_entry.portlocks import Reservations, owner_line

if TYPE_CHECKING:
    from orchestrator.launch.pool import WarmPool


def task_env(task: TaskPlan, attempt: int, shim: Path | None) -> dict[str, str]:
    """The environment a local task's wrapper starts with."""
    env = {**os.environ, **task.env, "TFO_ATTEMPT": str(attempt),
           markers.LIFELINE_ENV: markers.LIFELINE_STDIN}
    if shim is not None:  # an all-local job: its servers listen on the loopback only
        env = loopback.with_preload(env, shim)
    return env


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class LocalHandle:
    def __init__(self, task: TaskPlan, attempt: int, standby: bool = False,
                 shim: Path | None = None) -> None:
        self.task, self.attempt = task, attempt
        self.warm = False  # a standby that was told to go
        self.path = "cold"  # how it started (task_started's `path`): cold or warm
        env = task_env(task, attempt, shim)
        if standby:
            env[markers.STANDBY_ENV] = "1"
        os.makedirs(task.cwd, exist_ok=True)
        orphans.adopt()
        # No sweep runs while a wrapper is made: until `started` below, it would be taken for
        # a leftover (it carries TFO_ATTEMPT).
        orphans.settle()
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
        # A standby's output waits in the pipe until go(): nobody's attempt yet.
        self._output: TaskOutput | None = None if standby else self._read_output()

    def _read_output(self) -> TaskOutput:
        return pipe_output(self._proc, self.task.log_path, f"out-{self.task.name}")

    def go(self) -> None:
        """A standby's turn: it runs as a task started now would (worker_entry.standby)."""
        send_lifeline(self._proc, markers.GO)
        self.warm = True
        self.path = "warm"
        self._output = self._read_output()

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
        return self._output.lines() if self._output is not None else []

    def relink_log(self, path: str) -> bool:
        """The run directory was made again: the attempt's log goes on at `path`."""
        return self._output is not None and self._output.relink(path)

    def terminate(self) -> None:
        _signal_group(self._pgid, signal.SIGTERM)

    def request_stacks(self) -> None:
        send_lifeline(self._proc, markers.STACKS)

    def kill(self) -> None:
        _signal_group(self._pgid, signal.SIGKILL)  # the wrapper too: what it leaves comes to us
        self.poll()

    def close(self, timeout: float = 1.0) -> list[str]:
        # The task is gone; whatever it started goes too: its wrapper cleaned up before it
        # exited, or, SIGKILLed, left it to us. Then the output pipe closes.
        assert self._output is not None, "a standby that never ran is discarded, not closed"
        self._sweep()
        rest = self._output.close(timeout)
        self._close_pidfd()
        close_pipes(self._proc, self._output)
        # The wrapper removes the task's temp dir, except when it was SIGKILLed itself.
        shutil.rmtree(self.task.tmp_dir, ignore_errors=True)
        return rest

    def discard(self) -> None:
        """End a standby that was never used: kill it, reap it, close its pipes. The task's
        temp dir is the running attempt's, not its own to remove."""
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(DISCARD_SECONDS)
        self._sweep()
        self._close_pidfd()
        close_pipes(self._proc, None)

    def _sweep(self) -> None:
        code = self.poll()
        if code is None:
            return
        if orphans.left_by(self._pgid):
            orphans.sweep_soon(since=self._reaped_at)  # the next start settles it
        elif code == -signal.SIGKILL:  # perhaps a double fault: see orphans.py
            orphans.suspect(since=self._reaped_at)

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None


class LocalBackend(HostBackend):
    """Tasks on this machine."""

    def __init__(self, hosts: Mapping[str, HostSpec]) -> None:
        self._spares = Spares(lambda task, attempt: LocalHandle(
            task, attempt, standby=True, shim=self._shim(task)),
            startup=lambda task, attempt: task_env(task, attempt, self._shim(task)))
        self._built: tuple[Path | None, str | None] | None = None  # loopback.try_build's
        self.pool: WarmPool | None = None  # processes warm before their job (launch/pool.py)
        # This job's ports, held until `close` (the job's end): another job asking for one
        # of them, together or between two attempts of its task, is told whose it is.
        self._ports = Reservations(owner_line(None, None))

    def _shim(self, task: TaskPlan) -> Path | None:
        """The loopback shim for a task whose whole cluster is on this machine (built at
        first use, loopback.py); None for a task others must reach, or where none builds."""
        if not loopback.loopback_only(loopback.cluster_addresses(task)):
            return None
        if self._built is None:
            self._built = loopback.try_build()
        return self._built[0]

    def allocate(self, names: list[str], avoid: set[int]) -> dict[str, int]:
        """Free ports no other live job holds, this job's from now on."""
        ports = free_ports(len(names), avoid=avoid,
                           reserve=lambda port: self._ports.reserve(port) is None)
        return dict(zip(names, ports, strict=True))

    def gpus(self, hosts: list[str], ask: bool) -> dict[str, GpuReport]:
        return {host: local_gpus() for host in hosts}  # localhost: always asked (cached)

    def check(self, tasks: list[TaskPlan]) -> list[HostCheck]:
        """The ports reserved first (every task's: they are held until `close`), then
        checked free."""
        self._ports.rename(run_owner(tasks))
        row = check_local(tasks, self._ports.reserve_all([t.port for t in tasks]))
        for t in tasks:  # a profiler's port held elsewhere costs its profile, not the run
            if t.profiler_port is not None:
                self._ports.reserve(t.profiler_port)
        return [row]

    def sync(self, plan: Plan, tasks: list[TaskPlan]) -> list[str]:
        """Local tasks run in the workdir, where the code is. Here, once before the first
        start, the loopback shim is built; where it cannot be, the user hears it now."""
        confined = [t for t in tasks if loopback.loopback_only(loopback.cluster_addresses(t))]
        if not confined or self._shim(confined[0]) is not None:
            return []
        assert self._built is not None
        return [loopback.unconfined_warning(self._built[1] or "", [t.port for t in confined])]

    def start(self, task: TaskPlan, attempt: int) -> LocalHandle:
        """The task's warm spare for this attempt, if one waits; else a new process."""
        orphans.sweep_suspected()
        return self._spares.take(task, attempt) or (
            self.pool and self.pool.take(task, attempt, self._shim(task))) or LocalHandle(
            task, attempt, shim=self._shim(task))

    def standby(self, task: TaskPlan, attempt: int) -> int | None:
        """Start a warm spare for the task's `attempt` (spares.py); its pid, None if one
        already waits."""
        return self._spares.make(task, attempt)

    def close(self) -> None:
        self._spares.close()
        orphans.sweep_suspected()
        self._ports.close()
