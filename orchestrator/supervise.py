"""The loop: start order, health, restart policy, success policy, deadline, signals, teardown.

    supervisor = Supervisor(plan, start=backends.start)   # standby=backends.standby: spares
    result = supervisor.run()          # blocks; SIGINT/SIGTERM tear everything down
    sys.exit(result.exit_code)         # 0 ok, 1 failed, 129 SIGHUP, 130 SIGINT, 143 SIGTERM

One thread, one loop: pump output into logs and console, notice exits and stalls, decide
restarts, start what is due. Between rounds it sleeps until the kernel says something
happened: a task exited (its handle's pidfd) or a signal came, at once; output arrived
(orchestrator.wakeup), at most every OUTPUT_SECONDS; at most IDLE_SECONDS (timeouts,
backoffs); handles with no exit fd (SSH) are polled every POLL_SECONDS. Every step is
written to events.jsonl. What to do is the plan's: its policy (restarts, timeouts) and its
strategy's rules (which roles serve first, which are servers, what restarts with what, what
counts as done).

Hangs are failures: a training task whose steps stopped moving for its limit (or that has
been stopped that long, or whose whole group idles that long) fails its attempt like an exit
would (orchestrator.stall: `stall_seconds` fixed, or `auto`, which adapts to the job's
steps); its Python stacks are asked for first, and the summary says where it was stuck.
A task is ready at its ready marker, or at its first step (a one-process script opens no
port); one not ready by `startup_seconds` fails the attempt only while it idles.

Preemption is not a failure: a task that exits EXIT_PREEMPTED (TensorFlow's
PreemptionCheckpointHandler, having saved) after a SIGTERM is restarted without counting
against max_restarts. "After a SIGTERM" means its wrapper reported one (a `sigterm` marker)
this attempt, to it or to a task of its restart unit: the handler saves on every worker and
every worker exits with the code, but only the preempted one got the signal.

TensorFlow's teardown is not waited out: a training task whose code is over (its last atexit
handler said `exiting`) is only tearing down. Once a peer of its restart unit exited 0, or
every peer's code is over too, TEARDOWN_GRACE_SECONDS later it is waiting in the
interpreter's teardown for peers that have nothing more to give (measured here: in about
half of all 2-worker runs, by hand too, the workers exit 10 s after their code ended, or
one 10 s after the other, stack `Garbage-collecting`, `Failed to send RPC to coordination
service`; under gdb, Python's last collection takes 3 s to free TensorFlow's objects, and
freeing a tf.data iterator waits for its autotune thread, Model::OptimizeLoop, to wake
from a sleep that doubles up to 60 s). It is SIGKILLed (`task_teardown_stopped`), and its
exit is the status its code ended with, which the `exiting` marker says: 0 (or not said) a
success, 42 after a SIGTERM a preemption (every worker saved and exits 42, and may then
hang the same way), anything else a failure.

Warm spares (`standby`, orchestrator/launch/spares.py): once an attempt trains (its first
progress, or a while after ready), while a restart is still possible, the loop asks for a
standby of the task's next attempt (`task_standby_started`); a restart that gets it says
`warm: true` in `task_started`.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from orchestrator import decide, wakeup
from orchestrator.decide import (
    JOB_TRANSITIONS,
    STANDBY_AFTER_READY_SECONDS,
    START_BACKOFF_MAX,
    TASK_TRANSITIONS,
    TEARDOWN_GRACE_SECONDS,
    EndJob,
    IllegalTransition,
    JobState,
    Restart,
    TaskState,
    Timing,
    advance,
)
from orchestrator.launch import (
    TORN_DOWN,
    BatchLauncher,
    Launcher,
    TaskHandle,
    describe_exit,
    one_by_one,
)
from orchestrator.markers import (
    BadMarker,
    Evaluated,
    Exiting,
    FirstStep,
    Progress,
    SigTerm,
    Usage,
    is_marker,
    read_marker,
)
from orchestrator.plan import Plan, TaskPlan
from orchestrator.policy import restart_allowed
from orchestrator.rundir import RunDir, coordinator_identity
from orchestrator.stall import (
    IDLE_CPU,
    Frame,
    Pace,
    Stall,
    Watched,
    blame_order,
    find_stalls,
    paced,
    stuck_thread,
    threads,
    where,
)
from worker_entry import markers
from worker_entry.markers import Role

__all__ = ["JOB_TRANSITIONS", "STANDBY_AFTER_READY_SECONDS", "START_BACKOFF_MAX",
           "TASK_TRANSITIONS", "TEARDOWN_GRACE_SECONDS", "IllegalTransition",
           "JobState", "RunResult", "Supervisor", "TaskState", "advance", "restart_allowed",
           "tail"]

POLL_SECONDS = 0.05  # handles without an exit fd
IDLE_SECONDS = 0.25  # the longest the loop sleeps with nothing happening
# Output wakes the loop at most this often: a round costs O(tasks), and the usage markers of
# 64 tasks alone arrive 32 times a second (a round for each cost 0.04 of a core).
OUTPUT_SECONDS = 0.1
# Stalls are looked for at most this often (each look builds a Watched per task); they are
# found within their limit + 1 s.
STALL_CHECK_SECONDS = 0.25
WATCH_SECONDS = 1.0  # how often the loop hands itself to a watcher (the live view)
# A closed terminal or a dropped SSH session to the user's machine sends SIGHUP: a teardown
# like Ctrl-C, not a silent death that leaves the run looking alive.
SIGNAL_EXIT = {signal.SIGHUP: 129, signal.SIGINT: 130, signal.SIGTERM: 143}
# How long a stalled task's stacks are waited for before it is killed (faulthandler writes
# them at once; a task whose main thread holds the GIL still answers: it is C code).
STACKS_WAIT_SECONDS = 2.0
STACKS_QUIET_SECONDS = 0.3  # a dump has ended when its task printed nothing more this long
# A sidecar whose usage says this much CPU (percent of one core) is evaluating, not idle:
# one waiting for a checkpoint (SidecarEvaluator polls once a second) uses about none.
SIDECAR_BUSY_CPU = 10.0
T = TypeVar("T")


@dataclass
class Work:
    """How one attempt works, as its markers tell: the stall rules and the live view."""

    pace: Pace  # how its steps moved
    busy_at: float  # monotonic time of its last sign of work: a line, or CPU in use
    progress: Progress | None = None  # its last progress marker
    steps_per_second: float | None = None  # between the last two progress markers
    usage: Usage | None = None  # the wrapper's last measure of the task's processes
    usage_at: float | None = None  # monotonic time of `usage`
    stopped_since: float | None = None  # since when its usage says stopped (state T)


@dataclass
class Attempt:
    """What belongs to one attempt of a task: made fresh when it starts, so nothing of the
    attempt before is carried over, and nothing is reset by hand."""

    started_at: float  # monotonic time
    work: Work = field(init=False)
    last_marker: str = ""
    returncode: int | None = None
    exit_reason: str = ""  # how it ended, where its code says less (its handle's)
    running_at: float | None = None  # monotonic time of its ready marker
    sigterm: bool = False  # its wrapper got SIGTERM (preemption)
    done: bool = False  # its entry or script returned: exiting (TF may take its time)
    exiting_at: float | None = None  # monotonic time of its `exiting` marker
    exiting_code: int | None = None  # the exit status that marker said its code ended with
    ended_at: float | None = None  # monotonic time its exit was collected
    torn_down: bool = False  # stopped by us in its teardown (its exit: its exiting_code)
    standby_asked: bool = False  # a warm spare for its next attempt was asked for

    def __post_init__(self) -> None:
        self.work = Work(Pace(self.started_at), self.started_at)


@dataclass
class TaskRecord:
    """The supervisor's view of one task across attempts."""

    task: TaskPlan
    state: TaskState = TaskState.PENDING
    handle: TaskHandle | None = None
    attempt: int = -1
    restarts: int = 0
    start_after: float = 0.0  # monotonic time; the restart backoff
    log: IO[str] | None = None
    last_line: str = ""  # the last ordinary line the task printed (the live view)
    stack_lines: list[str] | None = None  # its output while its stacks are asked for
    said_at: float = 0.0  # monotonic time of its last ordinary line (a sidecar's idleness)
    cpu_busy_at: float = 0.0  # monotonic time its usage last said SIDECAR_BUSY_CPU or more
    start_failures: int = 0  # its starts that failed in a row (an unreachable host)
    current: Attempt = field(default_factory=lambda: Attempt(0.0))  # the last started

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def finished(self) -> bool:
        """Its work is done (exit 0, or stopped in its teardown after its code ended well):
        the job's success counts it, and nothing restarts it."""
        return self.state is TaskState.SUCCEEDED

    @property
    def torn_down_ok(self) -> bool:
        """Stopped in its teardown and its code ended well (0, or it did not say): a success,
        `teardown: true` in task_exited. With another code, that code is its exit."""
        return self.current.torn_down and not self.current.exiting_code

    @property
    def role(self) -> Role:
        return self.task.role


@dataclass
class TaskOutcome:
    name: str
    state: TaskState
    returncode: int | None
    restarts: int
    log_path: str
    host: str = ""
    progress: Progress | None = None  # the last attempt's last progress marker
    torn_down: bool = False  # stopped in its teardown (TEARDOWN_GRACE_SECONDS): a success
    exit_reason: str = ""  # `lost contact with lab2: ...`, where the exit code says less


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
    stalls: list[Stall] = field(default_factory=list)  # every stall, in order, cause first
    preemptions: int = 0  # restarts after a preemption (not in `restarts`)


class Interrupted(BaseException):
    """A signal came while the loop waited on a backend's start (a host that does not
    answer): the start is abandoned, the signal is handled as anywhere else."""


@dataclass(frozen=True)
class _Ending:
    """Why the loop ends: the job's final state, recorded once."""

    state: JobState
    reason: str
    failed_task: str | None = None


def tail(path: str, n: int = 20) -> list[str]:
    """The last `n` lines a task printed, without its markers (usage and progress come every
    second or two and would crowd out what it said before it failed)."""
    try:
        with open(path, errors="replace") as f:
            lines = [line.rstrip("\n") for line in f.readlines()]
    except OSError:
        return []
    said: list[str] = []
    for line in reversed(lines):
        if len(said) == n:
            break
        if not is_marker(line):
            said.append(line)
    return said[::-1]


class Supervisor:
    def __init__(self, plan: Plan, start: Launcher,
                 echo: Callable[[str, str], None] | None = None,
                 watch: Callable[[Supervisor], None] | None = None,
                 standby: Callable[[TaskPlan, int], int | None] | None = None,
                 start_batch: BatchLauncher | None = None, timing: Timing | None = None
                 ) -> None:
        self.plan, self._standby, self._timing = plan, standby, timing or Timing()
        # What is due in a round starts as one batch (Backends.start_batch); a caller that
        # gives only `start` has its tasks started one by one.
        self._start_many = start_batch or functools.partial(one_by_one, start)
        self.policy, self.rules = plan.policy, plan.rules
        self.echo = echo or _print_line
        # Called by the loop, on its thread, at most every WATCH_SECONDS: it may read the
        # records, and must return at once (the live view copies rows and returns).
        self.watch = watch
        self._watched_at = -WATCH_SECONDS
        self.state = JobState.PENDING
        self.records = {t.name: TaskRecord(t) for t in plan.tasks}
        self.restarts = 0  # job-level, against policy.max_restarts
        self.preemptions = 0  # restarts that do not count: a preempted task asked for them
        self.stalls: list[Stall] = []
        self.evaluation: dict[str, Any] | None = None
        self._ending: _Ending | None = None
        self._finishing_at = 0.0  # monotonic time training finished (FINISHING began)
        self._signal: signal.Signals | None = None
        self._signal_count = 0
        self._in_start = False  # a signal now raises Interrupted (a backend's start waits)
        self._t0 = time.monotonic()
        self._waiter = wakeup.Waiter()
        self._round_at = 0.0  # monotonic time the last round began (OUTPUT_SECONDS)
        self._exited: set[int] = set()  # exit fds readable when the loop last woke
        self._stalls_at = 0.0  # monotonic time of the last stall check (STALL_CHECK_SECONDS)
        # Made, with plan.json, before anything starts (cli.make_run_dir): a bad place or a
        # full disk is the user's error there, and plan.json is not serialized twice.
        self.run_dir = RunDir(plan.run_dir)
        self.events = self.run_dir.open_events()

    # ---- states -----------------------------------------------------------------------
    def _set(self, rec: TaskRecord | None, new: TaskState | JobState) -> None:
        """Every state change, of a task (`rec`) or of the job (None), comes through here."""
        if rec is None:
            self.state = advance(self.state, new)
        else:
            rec.state = advance(rec.state, new)

    def _end(self, state: JobState, reason: str, failed_task: str | None = None) -> None:
        """The job reached a final state; the first ending stands."""
        if self._ending is None:
            self._set(None, state)
            self._ending = _Ending(state, reason, failed_task)

    # ---- the loop ---------------------------------------------------------------------
    def run(self, started: Callable[[], None] | None = None) -> RunResult:
        """Blocks until the job ends. `started()` is called once, as soon as the first tasks
        are started: what the caller does there (`tfo run`: its announcement and rich's
        import, 0.05 s) then overlaps the tasks' own start-up instead of delaying it."""
        old = {s: signal.signal(s, self._on_signal) for s in SIGNAL_EXIT}
        self.events.write("run_started", run_id=self.plan.run_id, strategy=self.plan.strategy.value,
                          tasks=[t.name for t in self.plan.tasks], **coordinator_identity())
        self._set(None, JobState.RUNNING)
        try:
            if self._signal is None:
                self._start_due(time.monotonic())
            if started is not None:
                started()
            while self._ending is None:
                self._tick()
                if self.watch is not None and time.monotonic() - self._watched_at \
                        >= WATCH_SECONDS:
                    self._watched_at = time.monotonic()
                    self.watch(self)
                if self._ending is None:
                    self._sleep(self._live_handles(), self._idle_seconds())
        except Exception as e:  # a bug of ours: still tear down, and say where to look
            crash_log = Path(self.run_dir.crash_log)
            crash_log.write_text(traceback.format_exc())
            self._end(JobState.FAILED, f"supervisor error {e!r}; traceback in {crash_log}")
        finally:
            self._teardown(list(self.records.values()), "job finished")
            for s, handler in old.items():
                signal.signal(s, handler)
        end = self._ending
        assert end is not None
        if end.state is JobState.INTERRUPTED and self._signal is not None:
            code = SIGNAL_EXIT[self._signal]
        else:
            code = 0 if end.state is JobState.SUCCEEDED else 1
        self.events.write("job_finished", state=end.state.value, exit_code=code,
                          reason=end.reason, failed_task=end.failed_task, restarts=self.restarts)
        self.events.close()
        self.run_dir.remove_tmp()  # empty once every task cleaned up
        for rec in self.records.values():
            if rec.log:
                rec.log.close()
        return RunResult(
            state=end.state, exit_code=code, reason=end.reason, run_dir=self.plan.run_dir,
            restarts=self.restarts, failed_task=end.failed_task, evaluation=self.evaluation,
            stalls=self.stalls, preemptions=self.preemptions,
            tasks=[TaskOutcome(r.name, r.state, r.current.returncode, r.restarts, r.task.log_path,
                               r.task.host, r.current.work.progress, r.torn_down_ok,
                               r.current.exit_reason)
                   for r in self.records.values()],
        )

    def _tick(self) -> None:
        self._pump()
        finishing = self.state is JobState.FINISHING
        if self._signal is not None:
            # Once training is done, a signal only cuts the wait for the sidecars short.
            if finishing:
                return self._end(JobState.SUCCEEDED, "all training tasks finished")
            return self._end(JobState.INTERRUPTED, f"interrupted by {self._signal.name}")
        if finishing:
            self._poll_exits()
            return self._check_finished()
        now = time.monotonic()
        if (why := decide.deadline_passed(self.policy, now - self._t0)) is not None:
            return self._end(JobState.FAILED, why)
        self._start_due(now)
        self._poll_exits()
        if self._ending is None:
            self._check_teardowns(time.monotonic())
        if self._ending is None:
            self._check_startup(time.monotonic())
        if self._ending is None and (now := time.monotonic()) >= \
                self._stalls_at + STALL_CHECK_SECONDS:
            self._stalls_at = now
            self._check_stalls(now)
        if self._ending is None and self._standby is not None:
            self._make_standbys(time.monotonic())
        if self._ending is None:
            self._check_success()
        return None

    def _poll_exits(self) -> None:
        """Asks the handles the kernel said exited (their exit fd readable when the loop
        woke) and those without an exit fd. One that exits later, or before its fd was
        first watched, wakes the next sleep at once: the fd stays readable."""
        asked = {None, *self._exited}
        for rec in self.records.values():
            if rec.state.live and rec.handle is not None and \
                    getattr(rec.handle, "exit_fd", None) in asked:
                rc = rec.handle.poll()
                if rc is not None:
                    self._on_exit(rec, rc)
                    if self._ending is not None:
                        return

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signal_count += 1
        if self._signal is None:
            self._signal = signal.Signals(signum)
        wakeup.notify(urgent=True)
        if self._in_start:
            self._in_start = False
            raise Interrupted

    def _starting(self, start: Callable[[TaskPlan, int], T], task: TaskPlan, attempt: int
                  ) -> T:
        """A backend's start, which a signal interrupts: it may wait on a host for its
        connect timeout, and a signal is answered at once at every moment of a run."""
        if self._signal is not None:
            raise Interrupted
        self._in_start = True
        try:
            return start(task, attempt)
        finally:
            self._in_start = False

    # ---- sleeping ---------------------------------------------------------------------
    def _live_handles(self) -> list[TaskHandle]:
        return [r.handle for r in self.records.values() if r.state.live and r.handle is not None]

    def _idle_seconds(self) -> float:
        """Until the next task is due to start (a restart's backoff), at most IDLE_SECONDS."""
        now, idle = time.monotonic(), IDLE_SECONDS
        for r in self.records.values():
            if r.state is TaskState.PENDING and self._prerequisites_ready(r):
                idle = min(idle, r.start_after - now)
        return max(0.0, idle)

    def _sleep(self, handles: list[TaskHandle], timeout: float) -> None:
        """Until one of `handles` exits or a signal comes, or `timeout` passed; output ends
        the sleep too, but no sooner than OUTPUT_SECONDS after the last round began."""
        fds = {fd for h in handles if (fd := getattr(h, "exit_fd", None)) is not None}
        if len(fds) < len(handles):
            timeout = min(timeout, POLL_SECONDS)
        self._waiter.watch(fds)
        until, output = time.monotonic() + timeout, False
        while True:  # at least one look, even with no time to wait
            self._exited, notified = self._waiter.wait(until - time.monotonic(),
                                                       output=not output)
            if self._exited or self._signal is not None:
                break
            if notified:  # output (a signal ended the sleep above)
                output, until = True, min(until, self._round_at + OUTPUT_SECONDS)
            if time.monotonic() >= until:
                break
        self._round_at = time.monotonic()

    # ---- starting ---------------------------------------------------------------------
    def _prerequisites_ready(self, rec: TaskRecord) -> bool:
        """The roles that serve first (PS: ps and workers) are up before the others start."""
        first = decide.waits_for(rec.role, self.rules)
        return not first or all(r.state is TaskState.RUNNING for r in self.records.values()
                                if r.role in first)

    def _start_due(self, now: float) -> None:
        """Start what is due as one batch (the backend may start a host's tasks together).
        After a failed start what is due is looked at again: the failure may have
        scheduled a restart, or ended the job."""
        while due := self._due(now):
            if not self._start_batch(due):
                break
            if self._ending is not None or self._signal is not None:
                return
        if self._ending is not None or self._signal is not None:
            return
        if self.state is JobState.RESTARTING and not any(
                r.state is TaskState.PENDING for r in self.records.values()):
            self._set(None, JobState.RUNNING)

    def _due(self, now: float) -> list[TaskRecord]:
        # A task whose last start failed goes first: if its host still cannot be reached,
        # its healthy peers are not started only to be stopped again.
        first = sorted(self.records.values(), key=lambda r: -min(r.start_failures, 1))
        return [rec for rec in first if rec.state is TaskState.PENDING and now >= rec.start_after
                and self._prerequisites_ready(rec)]

    def _start_batch(self, due: list[TaskRecord]) -> bool:
        """Start `due`, in order, as one batch, each answer carried out as it comes; stops at
        the first failed start (True: look again), or when the run ends or a signal came.
        A task's attempt begins (its number, its log's header) as the backend takes it."""

        def items() -> Iterator[tuple[TaskPlan, int]]:
            for rec in due:
                self._in_start = False
                rec.attempt += 1
                if rec.log is None:
                    rec.log = open(rec.task.log_path, "a", buffering=1)  # noqa: SIM115 (kept)
                rec.log.write(f"===== tfo: {rec.name} attempt {rec.attempt} =====\n")
                if self._signal is not None:
                    raise Interrupted
                self._in_start = True  # a signal now abandons the start (a host may not answer)
                yield rec.task, rec.attempt

        answers = self._start_many(items())
        try:
            for rec in due:
                try:
                    self._in_start = True
                    answer = next(answers)
                except Interrupted:  # the signal ends the run; this attempt never started
                    rec.handle = None
                    return False
                finally:
                    self._in_start = False
                if isinstance(answer, Exception):  # e.g. a lab host dropped off the network
                    self._start_failed(rec, answer)
                    return True
                self._started(rec, answer)
                if self._ending is not None or self._signal is not None:
                    return False
            return False
        finally:
            answers.close()

    def _start_failed(self, rec: TaskRecord, error: Exception) -> None:
        rec.handle = None
        rec.start_failures += 1
        self._set(rec, TaskState.FAILED)
        self.events.write("task_start_failed", rec.name, attempt=rec.attempt, error=str(error))
        self._task_lost(rec, None, f"{rec.name} could not start: {error}")

    def _started(self, rec: TaskRecord, handle: TaskHandle) -> None:
        rec.handle = handle
        rec.start_failures = 0
        self._set(rec, TaskState.STARTING)
        rec.current = Attempt(time.monotonic())  # fresh: nothing of the last one carries over
        self.events.write("task_started", rec.name, pid=handle.pid, attempt=rec.attempt,
                          host=rec.task.host, port=rec.task.port,
                          warm=getattr(handle, "warm", False))

    def _make_standbys(self, now: float) -> None:
        """A warm spare for each running task's next attempt, once its start-up is over (so
        the spare's import does not slow it): at its first progress marker, or
        STANDBY_AFTER_READY_SECONDS after its ready marker for a task that reports none.
        Only while a restart may still need one."""
        for rec in self.records.values():
            if rec.state is not TaskState.RUNNING or rec.current.standby_asked or rec.current.done \
                    or decide.serving(rec.role, self.rules) or rec.current.running_at is None:
                continue
            if rec.current.work.progress is None \
                    and now - rec.current.running_at < self._timing.standby_after_ready:
                continue
            rec.current.standby_asked = True
            if decide.standby_wanted(rec.role, self.policy, self.rules, rec.restarts,
                                     self.restarts):
                self._make_standby(rec)

    def _make_standby(self, rec: TaskRecord) -> None:
        assert self._standby is not None
        try:
            pid = self._starting(self._standby, rec.task, rec.attempt + 1)
        except Interrupted:
            return
        except Exception as e:  # noqa: BLE001 - no spare is no failure: a restart starts cold
            self.events.write("task_standby_failed", rec.name, attempt=rec.attempt + 1,
                              error=str(e))
            return
        if pid is not None:
            self.events.write("task_standby_started", rec.name, pid=pid, attempt=rec.attempt + 1)

    # ---- output -----------------------------------------------------------------------
    def _pump(self) -> None:
        for rec in self.records.values():
            if rec.handle is not None and (lines := rec.handle.lines()):
                self._consume(rec, lines)

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
            if not isinstance(marker, Usage):
                rec.current.work.busy_at = time.monotonic()  # a sign of work (stalls, startup)
            if marker is None:
                rec.last_line, rec.said_at = line, time.monotonic()
                if rec.stack_lines is not None:
                    rec.stack_lines.append(line)
                self.echo(rec.name, line)
                continue
            if isinstance(marker, Usage):  # every few seconds per task: state, not an event
                self._measured(rec, marker)
                continue
            rec.current.last_marker = marker.event
            if isinstance(marker, SigTerm):
                rec.current.sigterm = True
            rec.current.done = rec.current.done or marker.event == markers.DONE
            if isinstance(marker, Exiting):
                rec.current.exiting_at, rec.current.exiting_code = time.monotonic(), marker.code
            if isinstance(marker, Progress):
                self._progressed(rec, marker)
            if marker.event == markers.READY and rec.state is TaskState.STARTING:
                self._set(rec, TaskState.RUNNING)
                rec.current.running_at = time.monotonic()
            elif isinstance(marker, Evaluated):
                self.evaluation = {"epoch": marker.epoch, "metrics": marker.metrics}
            self.events.write(f"task_{marker.event}", rec.name, **{**marker.record(), **own})
            if isinstance(marker, Progress | FirstStep) and rec.state is TaskState.STARTING:
                # It trains, so it is up: a one-process script (MirroredStrategy, the
                # default strategy) opens no port for its wrapper to see.
                self._set(rec, TaskState.RUNNING)
                rec.current.running_at = time.monotonic()
                self.events.write("task_ready", rec.name, **own, what="training", by="step")

    def _measured(self, rec: TaskRecord, marker: Usage) -> None:
        work = rec.current.work
        work.usage, work.usage_at = marker, time.monotonic()
        if marker.cpu >= IDLE_CPU:
            work.busy_at = work.usage_at
        if marker.cpu >= SIDECAR_BUSY_CPU:
            rec.cpu_busy_at = work.usage_at
        if not marker.stopped:
            work.stopped_since = None
        elif work.stopped_since is None:
            work.stopped_since = work.usage_at

    def _progressed(self, rec: TaskRecord, marker: Progress) -> None:
        work = rec.current.work
        now, before, moved_at = time.monotonic(), work.progress, work.pace.moved_at
        if before is not None and marker.step > before.step and moved_at is not None \
                and now > moved_at:
            work.steps_per_second = (marker.step - before.step) / (now - moved_at)
        work.pace = paced(work.pace, now, marker.step, marker.epoch, marker.step_in_epoch,
                          marker.steps, marker.epochs)
        work.progress = marker

    # ---- exits and restarts -----------------------------------------------------------
    def _collect(self, rec: TaskRecord, rc: int | None) -> None:
        assert rec.handle is not None
        self._consume(rec, rec.handle.close())  # the handle also removes the task's temp dir
        rec.current.returncode = rc
        rec.current.exit_reason = getattr(rec.handle, "exit_reason", None) or ""

    def _on_exit(self, rec: TaskRecord, rc: int) -> None:
        """Every task's exit, the sidecars' too, and while finishing."""
        if rec.torn_down_ok:
            how = TORN_DOWN
        elif rec.current.torn_down:
            # Stopped in its teardown, but its code had ended with an exit status of its own
            # (42: preempted, saved; 1: an error): that is how it exited, not a success.
            rc = rec.current.exiting_code or rc
            how = f"{describe_exit(rc)} ({TORN_DOWN})"
        else:
            how = _how(rec.handle, rc)
        # The state decided, recorded: readers (tfo status) never work it out again. A
        # preemption (exit 42) is FAILED too, and restarts.
        state = decide.exit_state(rc, rec.torn_down_ok, rec.role, self.rules)
        self.events.write("task_exited", rec.name, pid=rec.handle.pid if rec.handle else None,
                          returncode=rc, attempt=rec.attempt, how=how, state=state.value,
                          **({"teardown": True} if rec.torn_down_ok else {}))
        self._collect(rec, rc)
        rec.current.ended_at = time.monotonic()
        if rc == markers.EXIT_PREEMPTED and self.state is not JobState.FINISHING:
            self._pump()  # a peer's `sigterm` marker may still be on its way
            if self._preempted(rec):
                return
        lost = state is TaskState.FAILED
        self._set(rec, state)
        if self.state is JobState.FINISHING:
            return  # training is done: nothing restarts, nothing changes the outcome
        if not lost:
            if decide.training(rec.role, self.rules):
                self.echo("tfo", f"{rec.name} finished")
            return
        reason = getattr(rec.handle, "exit_reason", None)
        self._task_lost(rec, rc, f"{rec.name} {reason}" if reason
                        else f"{rec.name} exited with {describe_exit(rc)}"
                        f"{self._not_preempted(rec, rc)}")

    def _not_preempted(self, rec: TaskRecord, rc: int | None) -> str:
        """Why an exit 42 (EXIT_PREEMPTED) was not taken as a preemption, if it was not."""
        unit = self._restart_unit(rec)
        return decide.not_preempted_note(rc, [r.name for r in unit],
                                         any(r.current.sigterm for r in unit))

    def _check_teardowns(self, now: float) -> None:
        """Stop a task left waiting in its teardown for a peer that is gone (module doc)."""
        for rec in self.records.values():
            if not rec.state.live or rec.current.exiting_at is None or rec.current.torn_down \
                    or rec.handle is None or decide.serving(rec.role, self.rules):
                continue
            since = self._teardown_since(rec)
            if since is not None and now - since >= self._timing.teardown_grace:
                rec.current.torn_down = True
                self.events.write("task_teardown_stopped", rec.name, pid=rec.handle.pid,
                                  attempt=rec.attempt, waited=round(now - since, 2))
                rec.handle.kill()  # its code and atexit handlers are done: nothing to lose

    def _teardown_since(self, rec: TaskRecord) -> float | None:
        """Since when `rec` (in its teardown) waits for nothing: from its `exiting` on, the
        first exit 0 of a peer, or the time every peer's code was over (its `exiting`, or its
        exit 0 where it said none), whichever came first; None while neither holds.

        A peer that exits while the others wait (its own teardown ended first) does not
        restart the wait: they have waited for each other since the last `exiting`."""
        assert rec.current.exiting_at is not None
        return decide.teardown_since(rec.current.exiting_at, [
            (r.finished, r.state.live, r.current.exiting_at, r.current.ended_at)
            for r in self._restart_unit(rec) if r is not rec])

    def _preempted(self, rec: TaskRecord) -> bool:
        """`rec` exited EXIT_PREEMPTED: if a SIGTERM reached it or its restart unit this
        attempt, restart the unit without counting it (unless the restart policy is never)."""
        unit = self._restart_unit(rec)
        termed = [r.name for r in unit if r.current.sigterm]
        if not decide.preempted(rec.role, markers.EXIT_PREEMPTED, self.policy, bool(termed)):
            return False
        self._set(rec, TaskState.FAILED)
        why = (f"{rec.name} preempted (exit code {markers.EXIT_PREEMPTED} after SIGTERM to "
               f"{', '.join(termed)})")
        self.events.write("task_preempted", rec.name, attempt=rec.attempt,
                          pid=rec.handle.pid if rec.handle else None, sigterm=termed)
        self.preemptions += 1
        self._schedule_restart(unit, why, counted=False)
        return True

    def _task_lost(self, rec: TaskRecord, rc: int | None, why: str) -> None:
        """Carries out what decide.on_loss says: end the job, restart, or say so."""
        action = decide.on_loss(rec.name, rec.role, rc, why, self.plan.job, self.policy,
                                self.rules, rec.restarts, self.restarts)
        if isinstance(action, EndJob):
            self._end(JobState.FAILED, action.reason, action.task)
        elif isinstance(action, Restart):
            self.restarts += action.counted
            self._schedule_restart([rec] if action.alone else self._restart_unit(rec),
                                   action.reason)
        else:
            self.echo("tfo", action.text)

    def _restart_unit(self, rec: TaskRecord) -> list[TaskRecord]:
        """What goes down with a lost task (the strategy's rules): the task alone, or every
        training task (MWMS collectives need every worker)."""
        if decide.restarts_alone(rec.role, self.rules):
            return [rec]
        return [r for r in self.records.values() if decide.training(r.role, self.rules)]

    def _schedule_restart(self, unit: list[TaskRecord], why: str, counted: bool = True) -> None:
        """Tear `unit` down and start it again after the backoff. Not `counted`: a
        preemption, which no task's restarts count either. A task of the unit that finished
        stays finished: its work is done, and it could only do it again."""
        unit = [r for r in unit if not r.finished]
        self._set(None, JobState.RESTARTING)
        # A host that could not be reached is given longer each time: 1, 2, 4 ... 60 s.
        failures = max(r.start_failures for r in unit)
        backoff = decide.restart_backoff(self.policy, failures)
        self.echo("tfo", f"{why}; restarting {', '.join(r.name for r in unit)}"
                  + (f" in {backoff:g} s" if failures else ""))
        self._teardown([r for r in unit if r.state.live], "restart")
        due = time.monotonic() + backoff
        for r in unit:
            r.restarts += counted
            self._set(r, TaskState.PENDING)
            r.start_after = due
            self.events.write("task_restarted", r.name, attempt=r.attempt + 1,
                              restarts=r.restarts, reason=why, backoff=backoff, counted=counted)

    def _watched(self, rec: TaskRecord) -> Watched:
        work = rec.current.work
        return Watched(rec.name, work.pace, work.busy_at, work.stopped_since, work.usage_at,
                       work.usage.cpu if work.usage else None, up=rec.state is TaskState.RUNNING,
                       server=decide.serving(rec.role, self.rules))

    def _check_startup(self, now: float) -> None:
        """A task not up by the startup limit fails the attempt, unless it is working
        (orchestrator.stall.startup_over)."""
        starting = [r for r in self.records.values() if r.state is TaskState.STARTING]
        why = decide.startup_failed(self.policy, [
            (r.name, r.current.last_marker, self._watched(r)) for r in starting], now)
        if why is None:
            return
        for r in starting:
            self.events.write("task_startup_timeout", r.name, attempt=r.attempt,
                              pid=r.handle.pid if r.handle else None, last=r.current.last_marker)
        self._task_lost(starting[0], None, why)

    def _check_stalls(self, now: float) -> None:
        """A stalled training task fails its attempt (orchestrator.stall); its stacks, and
        those of every task stuck with it that can answer, are asked for first."""
        rule = decide.stall_rule(self.policy)
        if rule is None:
            return
        watched = [self._watched(r) for r in self.records.values()
                   if r.state.live and r.handle is not None and not r.current.done
                   and decide.training(r.role, self.rules)]
        stalls = find_stalls(watched, now, rule)
        if not stalls:
            return
        for s in stalls:
            r = self.records[s.task]
            self.events.write("task_stalled", s.task, attempt=r.attempt,
                              pid=r.handle.pid if r.handle else None, reason=s.reason,
                              stopped=s.stopped, stall_seconds=s.limit)
        stacks = self._ask_stacks(stalls)
        for s in stalls:
            s.where = where(stuck_thread(stacks.get(s.task, [])))
            if s.where:
                r = self.records[s.task]
                self.events.write("task_stacks", s.task, attempt=r.attempt,
                                  pid=r.handle.pid if r.handle else None, where=s.where)
        stalls = blame_order(stalls, stacks)
        self.stalls += stalls
        why = f"stalled ({stalls[0].limit}): " + "; ".join(s.describe() for s in stalls)
        self._task_lost(self.records[stalls[0].task], None, why)

    def _ask_stacks(self, stalls: list[Stall]) -> dict[str, list[list[Frame]]]:
        """Ask each stalled task that can answer (not stopped) for its stacks; wait until
        their dumps are in (or STACKS_WAIT_SECONDS). Each one's threads, by task."""
        asked = [self.records[s.task] for s in stalls if not s.stopped]
        for r in asked:
            r.stack_lines = []
            request = getattr(r.handle, "request_stacks", None)  # a backend without: none
            if request is not None:
                request()
        until = time.monotonic() + STACKS_WAIT_SECONDS
        seen, quiet_since = -1, time.monotonic()
        while asked and time.monotonic() < until and self._signal_count < 2:
            time.sleep(POLL_SECONDS)
            self._pump()
            count = sum(len(r.stack_lines or []) for r in asked)
            if count != seen:
                seen, quiet_since = count, time.monotonic()
            elif time.monotonic() - quiet_since >= STACKS_QUIET_SECONDS and all(
                    threads(r.stack_lines or []) for r in asked):
                break
        stacks = {r.name: threads(r.stack_lines or []) for r in asked}
        for r in asked:
            r.stack_lines = None
        return stacks

    def _check_success(self) -> None:
        recs = list(self.records.values())
        if not decide.training_done(self.rules, [(r.role, r.finished) for r in recs]):
            return
        servers = [r for r in recs if decide.serving(r.role, self.rules) and r.state.live]
        self._teardown(servers, "the chief finished")  # servers never exit on their own
        self._set(None, JobState.FINISHING)
        self._finishing_at = time.monotonic()
        waiting = self._sidecars_running()
        if waiting:
            self.events.write("job_finishing", waiting=[r.name for r in waiting],
                              **decide.finishing_fields("wait", self.policy))
            self.echo("tfo", decide.finishing_words("wait", self.policy,
                                                    ", ".join(r.name for r in waiting)))
        self._check_finished()

    def _sidecars_running(self) -> list[TaskRecord]:
        return [r for r in self.records.values() if not decide.training(r.role, self.rules)
                and r.state.live]

    def _check_finished(self) -> None:
        """FINISHING: the sidecars (the evaluator) may finish their last work, for a while:
        until they exit, `evaluator_seconds` passed, or (`evaluator_idle_seconds`) each has
        printed nothing and used no CPU that long since training finished (a SidecarEvaluator
        never exits: it evaluated the last checkpoint and waits for the next)."""
        waiting = self._sidecars_running()
        verdict = decide.finishing(time.monotonic(), self._finishing_at, self.policy,
                                   [max(r.said_at, r.cpu_busy_at) for r in waiting])
        if verdict == "wait":
            return None
        if verdict == "idle":
            self.events.write("job_evaluators_idle", waiting=[r.name for r in waiting],
                              **decide.finishing_fields("idle", self.policy))
        if verdict != "done":
            self.echo("tfo", decide.finishing_words(verdict, self.policy,
                                                    ", ".join(r.name for r in waiting)))
        return self._end(JobState.SUCCEEDED, "all training tasks finished")

    # ---- teardown ---------------------------------------------------------------------
    def _teardown(self, recs: list[TaskRecord], why: str) -> None:
        """SIGTERM to each task's group, a grace period, then SIGKILL."""
        live = [r for r in recs if r.state.live and r.handle is not None]
        if not live:
            return
        # A task whose code ended 42 before this SIGTERM: why that was no preemption.
        notes = {r.name: self._not_preempted(r, r.current.exiting_code) for r in live}
        for r in live:
            self.events.write("task_stopping", r.name, pid=r.handle.pid, reason=why)
            r.handle.terminate()
        grace = decide.grace(self.policy)
        until = time.monotonic() + grace
        while time.monotonic() < until and self._signal_count < 2:
            self._pump()
            running = [r.handle for r in live if r.handle.poll() is None]
            if not running:
                break
            self._sleep(running, until - time.monotonic())
        for r in live:
            if r.handle.poll() is None:
                self.events.write("task_killed", r.name, pid=r.handle.pid,
                                  reason=f"still running {grace:g} s after SIGTERM")
                r.handle.kill()
            with contextlib.suppress(Exception):
                _wait_exit(r.handle, 5.0)
            self._collect(r, r.handle.poll())
            self._set(r, TaskState.STOPPED)
            how = _how(r.handle, r.current.returncode)
            if r.current.exiting_code is not None and r.current.returncode is not None:
                # Its code had ended with a status of its own (the `exiting` marker) and it
                # waited in its teardown: that status is how it ended, as in _on_exit.
                how = (f"{describe_exit(r.current.exiting_code)}{notes[r.name]}, then stopped "
                       f"in its teardown ({how})")
                r.current.returncode = r.current.exiting_code
            self.events.write("task_stopped", r.name, pid=r.handle.pid,
                              returncode=r.current.returncode, how=how)


def _how(handle: TaskHandle | None, rc: int | None) -> str:
    """How a task ended, as its handle knows it (`lost contact with lab2: ...`) where its
    exit code says less, else from the code."""
    return getattr(handle, "exit_reason", None) or describe_exit(rc)


def _wait_exit(handle: TaskHandle, timeout: float) -> None:
    until = time.monotonic() + timeout
    while handle.poll() is None and time.monotonic() < until:
        time.sleep(0.02)


def _print_line(task: str, line: str) -> None:
    sys.stdout.write(f"[{task}] {line}\n")
    sys.stdout.flush()
