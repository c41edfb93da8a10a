"""The loop: start order, health, restart policy, success policy, deadline, signals, teardown.

    supervisor = Supervisor(plan, spec, start=start_local)
    result = supervisor.run()          # blocks; SIGINT/SIGTERM tear everything down
    sys.exit(result.exit_code)         # 0 ok, 1 failed, 129 SIGHUP, 130 SIGINT, 143 SIGTERM

One thread, one loop (poll every 50 ms): pump output into logs and console, notice
exits, decide restarts, start what is due. Every step is written to events.jsonl.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

import psutil

from orchestrator.launch import Launcher, TaskHandle, describe_exit
from orchestrator.markers import BadMarker, Evaluated, read_marker
from orchestrator.plan import Plan, TaskPlan
from orchestrator.spec import ClusterSpec, RestartPolicy, Strategy
from worker_entry import markers

POLL_SECONDS = 0.05
# A closed terminal or a dropped SSH session to the user's machine sends SIGHUP: a teardown
# like Ctrl-C, not a silent death that leaves the run looking alive.
SIGNAL_EXIT = {signal.SIGHUP: 129, signal.SIGINT: 130, signal.SIGTERM: 143}


class TaskState(str, Enum):
    """One task across its attempts.

        PENDING ──start──▶ STARTING ──ready marker──▶ RUNNING ──exit 0──▶ SUCCEEDED
                              │                          │
                              └──── exit ≠ 0, signal, startup timeout ──▶ FAILED
        STARTING/RUNNING ──teardown──▶ STOPPED
        FAILED/STOPPED/SUCCEEDED ──restart──▶ PENDING (attempt + 1)
    """

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def live(self) -> bool:
        return self in (TaskState.STARTING, TaskState.RUNNING)


class JobState(str, Enum):
    """The whole run.

        PENDING ──launch──▶ RUNNING ──success policy met──▶ SUCCEEDED
                              │  ▲
          task lost, restart  │  │ relaunched after the backoff
          allowed and left    ▼  │
                            RESTARTING
        RUNNING/RESTARTING ──lost with no restart left, startup timeout, deadline──▶ FAILED
        RUNNING/RESTARTING ──SIGHUP/SIGINT/SIGTERM──▶ INTERRUPTED
    """

    PENDING = "pending"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


def restart_allowed(policy: RestartPolicy, returncode: int | None) -> bool:
    """TFJob's rules; `returncode` None means the task never came up (retryable). A task
    that exits EXIT_PERMANENT (its entry does not exist) is never restarted."""
    if returncode == markers.EXIT_PERMANENT:
        return False
    if policy is RestartPolicy.ALWAYS:
        return True
    if policy is RestartPolicy.NEVER:
        return False
    if returncode is None:
        return True
    if policy is RestartPolicy.ON_FAILURE:
        return returncode != 0
    # EXIT_CODE: 1-127 are the program's own verdict (permanent); signals are retried.
    return returncode < 0 or returncode >= 128


@dataclass
class TaskRecord:
    """The supervisor's view of one task across attempts."""

    task: TaskPlan
    state: TaskState = TaskState.PENDING
    handle: TaskHandle | None = None
    attempt: int = -1
    restarts: int = 0
    start_after: float = 0.0  # monotonic time; the restart backoff
    started_at: float = 0.0
    last_marker: str = ""
    returncode: int | None = None
    log: IO[str] | None = None

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def role(self) -> str:
        return self.task.role


@dataclass
class TaskOutcome:
    name: str
    state: TaskState
    returncode: int | None
    restarts: int
    log_path: str


@dataclass
class RunResult:
    state: JobState
    exit_code: int
    reason: str
    run_dir: str
    tasks: list[TaskOutcome] = field(default_factory=list)
    restarts: int = 0
    failed_task: str | None = None
    evaluation: dict[str, Any] | None = None  # the evaluator's last: {"epoch", "metrics"}


class EventLog:
    """events.jsonl: one JSON object a line, with `time` (unix seconds) and `event`."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", buffering=1)

    def write(self, event: str, task: str | None = None, **fields: Any) -> None:
        record = {"time": round(time.time(), 4), "event": event, "task": task, **fields}
        self._file.write(json.dumps(record, default=str) + "\n")

    def close(self) -> None:
        self._file.close()


def coordinator_identity() -> dict[str, Any]:
    """Who supervises the run, for `tfo status` to tell a live run from a dead one; the
    create time tells a reused pid apart."""
    me = psutil.Process()
    return {"coordinator_pid": me.pid, "coordinator_created": me.create_time(),
            "coordinator_host": socket.gethostname()}


def coordinator_gone(run_started: dict[str, Any]) -> bool:
    """Whether the coordinator named in a run_started record is gone. False when that
    cannot be told: a run from an older tfo, or one supervised from another machine."""
    pid, created = run_started.get("coordinator_pid"), run_started.get("coordinator_created")
    if not isinstance(pid, int) or not isinstance(created, int | float) \
            or run_started.get("coordinator_host") != socket.gethostname():
        return False
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - created) > 1.0 or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def read_events(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of an events.jsonl, and how many lines were not records (a line cut
    short by a crash, garbage): skipped, never fatal. Raises OSError."""
    records, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            records.append(record)
        else:
            bad += 1
    return records, bad


def tail(path: str, n: int = 20) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip("\n") for line in f.readlines()[-n:]]
    except OSError:
        return []


class _Stop(Exception):
    """Ends the loop: the job reached a final state."""

    def __init__(self, state: JobState, reason: str, failed_task: str | None = None) -> None:
        super().__init__(reason)
        self.state, self.reason, self.failed_task = state, reason, failed_task


class Supervisor:
    def __init__(self, plan: Plan, spec: ClusterSpec, start: Launcher,
                 echo: Callable[[str, str], None] | None = None) -> None:
        self.plan, self.spec, self._start = plan, spec, start
        self.echo = echo or _print_line
        self.state = JobState.PENDING
        self.records = {t.name: TaskRecord(t) for t in plan.tasks}
        self.restarts = 0  # job-level, against spec.restart.max_restarts
        self.evaluation: dict[str, Any] | None = None
        self._signal: signal.Signals | None = None
        self._signal_count = 0
        self._t0 = time.monotonic()
        run_dir = Path(plan.run_dir)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=2))
        self.events = EventLog(run_dir / "events.jsonl")

    # ---- the loop ---------------------------------------------------------------------
    def run(self) -> RunResult:
        old = {s: signal.signal(s, self._on_signal) for s in SIGNAL_EXIT}
        self.events.write("run_started", run_id=self.plan.run_id, strategy=self.plan.strategy.value,
                          tasks=[t.name for t in self.plan.tasks], **coordinator_identity())
        self.state = JobState.RUNNING
        stop = _Stop(JobState.FAILED, "supervisor crashed")
        try:
            while True:
                self._tick()
                time.sleep(POLL_SECONDS)
        except _Stop as s:
            stop = s
        except Exception as e:  # a bug of ours: still tear down, and say where to look
            crash_log = Path(self.plan.run_dir) / "supervisor-error.log"
            crash_log.write_text(traceback.format_exc())
            stop = _Stop(JobState.FAILED, f"supervisor error {e!r}; traceback in {crash_log}")
        finally:
            self._teardown(list(self.records.values()), "job finished")
            for s, handler in old.items():
                signal.signal(s, handler)
        self.state = stop.state
        if stop.state is JobState.INTERRUPTED and self._signal is not None:
            code = SIGNAL_EXIT[self._signal]
        else:
            code = 0 if stop.state is JobState.SUCCEEDED else 1
        self.events.write("job_finished", state=stop.state.value, exit_code=code,
                          reason=stop.reason, failed_task=stop.failed_task, restarts=self.restarts)
        self.events.close()
        with contextlib.suppress(OSError):
            (Path(self.plan.run_dir) / "tmp").rmdir()  # empty once every task cleaned up
        for rec in self.records.values():
            if rec.log:
                rec.log.close()
        return RunResult(
            state=stop.state, exit_code=code, reason=stop.reason, run_dir=self.plan.run_dir,
            restarts=self.restarts, failed_task=stop.failed_task, evaluation=self.evaluation,
            tasks=[TaskOutcome(r.name, r.state, r.returncode, r.restarts, r.task.log_path)
                   for r in self.records.values()],
        )

    def _tick(self) -> None:
        self._pump()
        if self._signal is not None:
            raise _Stop(JobState.INTERRUPTED, f"interrupted by {self._signal.name}")
        now = time.monotonic()
        deadline = self.spec.timeouts.deadline_seconds
        if deadline is not None and now - self._t0 > deadline:
            raise _Stop(JobState.FAILED, f"deadline of {deadline:g} s reached; job stopped")
        self._start_due(now)
        for rec in self.records.values():
            if rec.state.live and rec.handle is not None:
                rc = rec.handle.poll()
                if rc is not None:
                    self._on_exit(rec, rc)
        self._check_startup(time.monotonic())
        self._check_success()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signal_count += 1
        if self._signal is None:
            self._signal = signal.Signals(signum)

    # ---- starting ---------------------------------------------------------------------
    def _prerequisites_ready(self, rec: TaskRecord) -> bool:
        """PS jobs start ps, then workers, then chief and evaluator once the servers serve."""
        if self.plan.strategy is not Strategy.PARAMETER_SERVER:
            return True
        if rec.role in ("ps", "worker"):
            return True
        servers = [r for r in self.records.values() if r.role in ("ps", "worker")]
        return all(r.state is TaskState.RUNNING for r in servers)

    def _start_due(self, now: float) -> None:
        for rec in self.records.values():
            if rec.state is TaskState.PENDING and now >= rec.start_after \
                    and self._prerequisites_ready(rec):
                self._launch(rec)
        if self.state is JobState.RESTARTING and not any(
                r.state is TaskState.PENDING for r in self.records.values()):
            self.state = JobState.RUNNING

    def _launch(self, rec: TaskRecord) -> None:
        rec.attempt += 1
        if rec.log is None:
            rec.log = open(rec.task.log_path, "a", buffering=1)  # noqa: SIM115 (kept open)
        rec.log.write(f"===== tfo: {rec.name} attempt {rec.attempt} =====\n")
        try:
            rec.handle = self._start(rec.task, rec.attempt)
        except Exception as e:  # noqa: BLE001 - e.g. a lab host dropped off the network
            rec.handle, rec.state = None, TaskState.FAILED
            self.events.write("task_start_failed", rec.name, attempt=rec.attempt, error=str(e))
            self._task_lost(rec, None, f"{rec.name} could not start: {e}")
            return
        rec.state, rec.started_at, rec.last_marker, rec.returncode = (
            TaskState.STARTING, time.monotonic(), "", None)
        self.events.write("task_started", rec.name, pid=rec.handle.pid, attempt=rec.attempt,
                          host=rec.task.host, port=rec.task.port)

    # ---- output -----------------------------------------------------------------------
    def _pump(self) -> None:
        for rec in self.records.values():
            if rec.handle is not None:
                self._consume(rec, rec.handle.lines())

    def _consume(self, rec: TaskRecord, lines: list[str]) -> None:
        """Lines a task printed (its handle wrote them to its log): markers, or the console.
        Output is untrusted: a line that only looks like a marker is an ordinary line."""
        for line in lines:
            own = {"attempt": rec.attempt, "pid": rec.handle.pid if rec.handle else None}
            try:
                marker = read_marker(line)
            except BadMarker as e:
                self.events.write("task_bad_marker", rec.name, **own, error=str(e))
                marker = None
            if marker is None:
                self.echo(rec.name, line)
                continue
            rec.last_marker = marker.event
            if marker.event == markers.READY and rec.state is TaskState.STARTING:
                rec.state = TaskState.RUNNING
            elif isinstance(marker, Evaluated):
                self.evaluation = {"epoch": marker.epoch, "metrics": marker.metrics}
            self.events.write(f"task_{marker.event}", rec.name, **{**marker.record(), **own})

    # ---- exits and restarts -----------------------------------------------------------
    def _collect(self, rec: TaskRecord, rc: int | None) -> None:
        assert rec.handle is not None
        self._consume(rec, rec.handle.close())  # the handle also removes the task's temp dir
        rec.returncode = rc

    def _exited(self, rec: TaskRecord, rc: int) -> None:
        self.events.write("task_exited", rec.name, pid=rec.handle.pid if rec.handle else None,
                          returncode=rc, attempt=rec.attempt, how=describe_exit(rc))
        self._collect(rec, rc)

    def _on_exit(self, rec: TaskRecord, rc: int) -> None:
        self._exited(rec, rc)
        ps_job = self.plan.strategy is Strategy.PARAMETER_SERVER
        # PS servers never exit on their own: any exit of one is a loss.
        lost = rc != 0 or (ps_job and rec.role in ("ps", "worker"))
        rec.state = TaskState.FAILED if lost else TaskState.SUCCEEDED
        if not lost:
            if rec.role != "evaluator":
                self.echo("tfo", f"{rec.name} finished")
            return
        self._task_lost(rec, rc, f"{rec.name} exited with {describe_exit(rc)}")

    def _task_lost(self, rec: TaskRecord, rc: int | None, why: str) -> None:
        policy = self.spec.restart.for_role(rec.role)
        if rc == markers.EXIT_PERMANENT:
            why = (f"{rec.name}: entry {self.spec.job.entry} cannot be found "
                   f"(exit code {rc}: permanent, not restarted)")
            if rec.role != "evaluator":
                raise _Stop(JobState.FAILED, why, rec.name)
        if rec.role == "evaluator":
            # A sidecar: restarts alone, and fails the job only when the spec says so.
            if restart_allowed(policy, rc) and rec.restarts < self.spec.restart.max_restarts:
                self._schedule_restart([rec], why)
            elif self.spec.evaluator_required:
                raise _Stop(JobState.FAILED, why, rec.name)
            else:
                self.echo("tfo", f"{why}; the evaluator is a sidecar, the job goes on")
            return
        if not restart_allowed(policy, rc):
            raise _Stop(JobState.FAILED, f"{why} (restart policy {policy.value})", rec.name)
        if self.restarts >= self.spec.restart.max_restarts:
            raise _Stop(JobState.FAILED, f"{why}; no restarts left "
                        f"(max_restarts {self.spec.restart.max_restarts})", rec.name)
        self.restarts += 1
        self._schedule_restart(self._restart_unit(rec), why)

    def _restart_unit(self, rec: TaskRecord) -> list[TaskRecord]:
        """What goes down with a lost task: MWMS collectives need every worker, so the
        whole group; in PS a worker restarts alone, a ps or the chief restarts the job."""
        training = [r for r in self.records.values() if r.role != "evaluator"]
        if self.plan.strategy is Strategy.PARAMETER_SERVER and rec.role == "worker":
            return [rec]
        return training

    def _schedule_restart(self, unit: list[TaskRecord], why: str) -> None:
        self.state = JobState.RESTARTING
        self.echo("tfo", f"{why}; restarting {', '.join(r.name for r in unit)}")
        self._teardown([r for r in unit if r.state.live], "restart")
        backoff = self.spec.restart.backoff_seconds
        due = time.monotonic() + backoff
        for r in unit:
            r.restarts += 1
            r.state, r.start_after = TaskState.PENDING, due
            self.events.write("task_restarted", r.name, attempt=r.attempt + 1,
                              restarts=r.restarts, reason=why, backoff=backoff)

    def _check_startup(self, now: float) -> None:
        limit = self.spec.timeouts.startup_seconds
        starting = [r for r in self.records.values() if r.state is TaskState.STARTING]
        if not any(now - r.started_at > limit for r in starting):
            return
        # Every task not up yet is named: one that hangs keeps its peers waiting too.
        names = ", ".join(f"{r.name} (last: {r.last_marker or 'no output from tfo yet'})"
                          for r in starting)
        why = f"startup timeout ({limit:g} s): never came up: {names}"
        for r in starting:
            self.events.write("task_startup_timeout", r.name, attempt=r.attempt,
                              pid=r.handle.pid if r.handle else None, last=r.last_marker)
        self._task_lost(starting[0], None, why)

    def _check_success(self) -> None:
        recs = list(self.records.values())
        if self.plan.strategy is Strategy.PARAMETER_SERVER:
            done = all(r.state is TaskState.SUCCEEDED for r in recs if r.role == "chief")
        else:
            done = all(r.state is TaskState.SUCCEEDED for r in recs if r.role != "evaluator")
        if not done:
            return
        servers = [r for r in recs if r.role in ("ps", "worker") and r.state.live]
        self._teardown(servers, "the chief finished")  # PS servers never exit on their own
        self._wait_evaluator()
        raise _Stop(JobState.SUCCEEDED, "all training tasks finished")

    def _wait_evaluator(self) -> None:
        evaluators = [r for r in self.records.values() if r.role == "evaluator"]
        until = time.monotonic() + self.spec.timeouts.evaluator_seconds
        while any(r.state.live for r in evaluators) and time.monotonic() < until:
            self._pump()
            if self._signal is not None:
                return
            for r in evaluators:
                if r.state.live and r.handle is not None and (rc := r.handle.poll()) is not None:
                    self._exited(r, rc)
                    r.state = TaskState.SUCCEEDED if rc == 0 else TaskState.FAILED
            time.sleep(POLL_SECONDS)

    # ---- teardown ---------------------------------------------------------------------
    def _teardown(self, recs: list[TaskRecord], why: str) -> None:
        """SIGTERM to each task's group, a grace period, then SIGKILL."""
        live = [r for r in recs if r.state.live and r.handle is not None]
        if not live:
            return
        for r in live:
            self.events.write("task_stopping", r.name, pid=r.handle.pid, reason=why)
            r.handle.terminate()
        grace = self.spec.timeouts.grace_seconds
        until = time.monotonic() + grace
        while time.monotonic() < until and self._signal_count < 2:
            self._pump()
            if all(r.handle.poll() is not None for r in live):
                break
            time.sleep(POLL_SECONDS)
        for r in live:
            if r.handle.poll() is None:
                self.events.write("task_killed", r.name, pid=r.handle.pid,
                                  reason=f"still running {grace:g} s after SIGTERM")
                r.handle.kill()
            with contextlib.suppress(Exception):
                _wait_exit(r.handle, 5.0)
            self._collect(r, r.handle.poll())
            r.state = TaskState.STOPPED
            self.events.write("task_stopped", r.name, pid=r.handle.pid,
                              returncode=r.returncode, how=describe_exit(r.returncode))

def _wait_exit(handle: TaskHandle, timeout: float) -> None:
    until = time.monotonic() + timeout
    while handle.poll() is None and time.monotonic() < until:
        time.sleep(0.02)


def _print_line(task: str, line: str) -> None:
    sys.stdout.write(f"[{task}] {line}\n")
    sys.stdout.flush()
