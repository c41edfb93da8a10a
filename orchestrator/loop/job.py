"""The job as the loop knows it: the plan, a record per task, the job's state and counters,
the event log and the console, the clock, and what the loop waits for (`hold`). Every
state change goes through `Job.set` (supervisord's `change_state`: one write path, which
refuses a transition the Enum's docstring does not draw)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.launch import TaskHandle
from orchestrator.loop import decide
from orchestrator.loop.decide import JobState, TaskState, advance
from orchestrator.loop.joined import Alone
from orchestrator.loop.records import TaskRecord
from orchestrator.loop.resumes import Ledger
from orchestrator.loop.stall import Stall, Watched
from orchestrator.planning.plan import Plan
from orchestrator.planning.policy import Policy
from orchestrator.planning.strategy import StrategyRules
from orchestrator.runs.rundir import EventLog

Clock = Callable[[], float]  # monotonic seconds: time.monotonic, or a test's


class Hold(Protocol):
    """Something under way that the loop waits for before it looks at anything else (a
    teardown's stop, a stacks request): a deadline it wakes for, never a sleep."""

    def handles(self) -> list[TaskHandle]: ...  # whose exits end the loop's sleep
    def wake_in(self, now: float) -> float: ...  # the longest the loop may sleep
    def step(self, now: float) -> None: ...  # look again; once over, it releases the loop


@dataclass(frozen=True)
class Ending:
    """Why the loop ends: the job's final state, recorded once."""

    state: JobState
    reason: str
    failed_task: str | None = None


class Interrupted(BaseException):
    """A signal came while the loop waited on a backend's start (a host that does not
    answer): the start is abandoned, the signal is handled as anywhere else."""


class Job:
    def __init__(self, plan: Plan, events: EventLog, echo: Callable[[str, str], None],
                 timing: decide.Timing, clock: Clock | None) -> None:
        self.plan, self.events, self.echo = plan, events, echo
        self.timing, self.clock = timing, clock or time.monotonic
        self.state = JobState.PENDING
        self.records = {t.name: TaskRecord(t) for t in plan.tasks}
        self.restarts = 0  # job-level, against policy.max_restarts
        self.preemptions = 0  # restarts that do not count: a preempted task asked for them
        self.stalls: list[Stall] = []
        self.evaluation: dict[str, Any] | None = None
        # A script's own BackupAndRestore directory, from a worker's `backup` marker, as
        # backups.told keeps it ($TFO_BACKUP_DIR: each task's own; relative to the task's
        # cwd; absolute): what a restart or a resize fills (backupfill.Refill).
        self.script_backup: str | None = None
        # Tasks that trained outside the plan's cluster (joined.judge), told already: the
        # job ends failed (Checks.alone).
        self.alone: list[Alone] = []
        self.resumes = Ledger()  # where each attempt began, what a restart lost
        self.ending: Ending | None = None
        self.hold: Hold | None = None
        self.signal: signal.Signals | None = None
        self.signal_count = 0
        self.suspend_asked = 0  # Ctrl-Z: 1 once asked, 2 once refused aloud
        self.in_start = False  # a signal now raises Interrupted (a backend's start waits)

    @property
    def policy(self) -> Policy:
        return self.plan.policy

    @property
    def rules(self) -> StrategyRules:
        return self.plan.rules

    def set(self, rec: TaskRecord | None, new: TaskState | JobState) -> None:
        """Every state change, of a task (`rec`) or of the job (None), comes through here."""
        if rec is None:
            self.state = advance(self.state, new)
        else:
            rec.state = advance(rec.state, new)

    def restart(self, rec: TaskRecord, why: str, at: float, backoff: float = 0,
                counted: bool = False) -> None:
        """The one way a task is made to start again (`task_restarted`): PENDING, due `at`;
        a `counted` restart counts against its restarts (a resize's, a rejoin's and a
        preemption's do not)."""
        rec.restarts += counted
        self.set(rec, TaskState.PENDING)
        rec.start_after = at
        self.events.write("task_restarted", rec.name, attempt=rec.attempt + 1,
                          restarts=rec.restarts, reason=why, backoff=backoff, counted=counted)

    def end(self, state: JobState, reason: str, failed_task: str | None = None) -> None:
        """The job reached a final state; the first ending stands."""
        if self.ending is None:
            self.set(None, state)
            self.ending = Ending(state, reason, failed_task)

    @property
    def busy(self) -> bool:
        """The round is over for the rest of the checks: the job ended, or something under
        way holds the loop."""
        return self.ending is not None or self.hold is not None

    def live(self) -> list[TaskRecord]:
        return [r for r in self.records.values() if r.state.live and r.handle is not None]

    def unit(self, rec: TaskRecord) -> list[TaskRecord]:
        """What goes down with a lost task (the strategy's rules): the task alone, or every
        training task (MWMS collectives need every worker)."""
        if decide.restarts_alone(rec.role, self.rules):
            return [rec]
        return [r for r in self.records.values() if decide.training(r.role, self.rules)]

    def sidecars_running(self) -> list[TaskRecord]:
        return [r for r in self.records.values() if decide.sidecar(r.role, self.rules)
                and r.state.live]

    def watched(self, rec: TaskRecord) -> Watched:
        work = rec.current.work
        return Watched(rec.name, work.pace, work.busy_at, work.stopped_since, work.usage_at,
                       work.usage.wanted if work.usage else None,
                       up=rec.state is TaskState.RUNNING,
                       server=decide.serving(rec.role, self.rules))

    def not_preempted(self, rec: TaskRecord, rc: int | None) -> str:
        """Why an exit 42 (EXIT_PREEMPTED) was not taken as a preemption, if it was not."""
        unit = self.unit(rec)
        return decide.not_preempted_note(rc, [r.name for r in unit],
                                         any(r.current.sigterm for r in unit))
