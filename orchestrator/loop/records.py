"""What the supervisor keeps of each task and hands back at the end: a task across its
attempts (`TaskRecord`), one attempt (`Attempt`, made fresh at each start, so nothing is
reset by hand) and how it works (`Work`), and the run's `RunResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from orchestrator.loop.closures import Finished
from orchestrator.loop.decide import JobState, TaskState
from orchestrator.loop.markers import Done, Joined, Progress, Usage, is_marker
from orchestrator.loop.rate import Rate
from orchestrator.loop.stall import Pace, Stall
from orchestrator.loop.starved import Waits
from orchestrator.planning.plan import TaskPlan
from worker_entry.markers import Role

if TYPE_CHECKING:
    from orchestrator.launch import TaskHandle


@dataclass
class Work:
    """How one attempt works, as its markers tell: the stall rules, the startup limit, the
    sidecars' idleness once training is done, and the live view."""

    pace: Pace  # how its steps moved
    # Its last sign of work: its start, a line or a marker, or a usage whose CPU says busy
    # (decide.busy_cpu: a training task's bar is lower than a sidecar's).
    busy_at: float
    progress: Progress | None = None  # its last progress marker
    rate: Rate = field(default_factory=Rate)  # its steps/s, from its markers' own times
    epoch_begun: int | None = None  # the last epoch its `epoch` marker said began
    usage: Usage | None = None  # the wrapper's last measure of the task's processes
    usage_at: float | None = None  # monotonic time of `usage`
    stopped_since: float | None = None  # since when its usage says stopped (state T)
    slow: bool = False  # named slow (task_slow, loop/slowness.py): the live table's mark
    waits: Waits = field(default_factory=Waits)  # how long it waited for input (loop/starved.py)


@dataclass
class Spare:
    """An attempt's warm spare for the attempt after it (orchestrator/loop/starts.py)."""

    asked: bool = False  # one was asked for
    pid: int | None = None  # its pid, once started: asked after now and then
    lost: int = 0  # spares that died waiting (and were replaced)


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
    spare: Spare = field(default_factory=Spare)  # its next attempt's warm spare
    joins: list[Joined] = field(default_factory=list)  # the clusters its strategies joined
    judged: bool = False  # whether it trained in the plan's cluster was asked (joined.judge)
    # A ParameterServer chief's: the closures each worker finished (loop/closures.py)
    closures: Finished = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.work = Work(Pace(self.started_at), self.started_at)


@dataclass
class TaskRecord:
    """The supervisor's view of one task across attempts."""

    task: TaskPlan
    state: TaskState = TaskState.PENDING
    handle: TaskHandle | None = None
    attempt: int = -1
    headed: int = -1  # the attempt whose header its log holds (a start not taken keeps it)
    restarts: int = 0
    start_after: float = 0.0  # monotonic time; the restart backoff
    log: IO[str] | None = None
    last_line: str = ""  # the last ordinary line the task printed (the live view)
    stack_lines: list[str] | None = None  # its output while its stacks are asked for
    start_failures: int = 0  # its starts that failed in a row (an unreachable host)
    crash_streak: int = 0  # its unit's quick failures in a row (decide.crash_streak)
    started: int = 0  # its attempts that started (task_started)
    done: Done | None = None  # its last `done` marker, of any attempt: what its entry returned
    current: Attempt = field(default_factory=lambda: Attempt(0.0))  # the last started

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def pid(self) -> int | None:
        return self.handle.pid if self.handle is not None else None

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
    attempts: int = 0  # that started
    done: Done | None = None  # its last `done` marker (orchestrator.run's `value`)


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
    resizes: list[dict[str, Any]] = field(default_factory=list)  # job_resized's, in order
    notes: list[str] = field(default_factory=list)  # the run directory's faults (rundirwatch)
    # task_resumed's (with `task`), in order: how each attempt after the first began
    resumes: list[dict[str, Any]] = field(default_factory=list)


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
