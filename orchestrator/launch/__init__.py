"""Starting tasks: one Backend per placement kind, the same TaskHandle from each.

    backends = Backends(spec.hosts)              # the registry below picks each kind's class
    nodes = backends.place(spec, dry_run, say)   # a scheduler's nodes (`backend:`), or {}
    ports = backends.allocate(spec)              # `port: auto` tasks
    gpus = backends.gpus(spec, ask_hosts=True)   # hosts whose gpus are `auto`
    rows = backends.check(plan)                  # preflight: one HostCheck per host
    backends.sync(plan)                          # the job's code where it must go
    handle = backends.start(task, attempt=0)     # by task.placement.kind
    backends.close()

A new backend is one class with the Backend methods, in a module of its own, and one line
in BACKENDS (orchestrator/launch/backends.py): a host backend (local, ssh) starts tasks on
the hosts the cluster file names; a scheduler (slurm) has `options`, the model of its
`backend: {KIND: {…}}` request, and places the tasks itself. The supervisor never asks
where a task runs.

This module is the contract (TaskHandle, Backend, what a backend reports of a host);
`ssh/` holds the lab hosts' side, `pool` the kit's warm processes, `output` a
task's lines. May import: planning, runs, errors, worker_entry. Never the loop, elastic or
the CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from orchestrator.planning.plan import Plan, TaskPlan
    from orchestrator.planning.spec import ClusterSpec, HostSpec, SchedulerOptions

Say = Callable[[str], None]


# What a backend reports of a host (Backend.gpus, Backend.check): nvidia-smi's GPUs, and
# the preflight's row (launch.preflight fills it).
@dataclass(frozen=True)
class GpuReport:
    ids: list[int]
    note: str = ""  # why there are none, when nvidia-smi could not tell

    def __str__(self) -> str:
        listed = f"{len(self.ids)} ({','.join(map(str, self.ids))})" if self.ids else "none"
        return f"{listed} ({self.note})" if self.note else listed


@dataclass
class HostCheck:
    host: str
    address: str
    reachable: bool = False
    python: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    gpus: GpuReport | None = None  # what nvidia-smi -L reports there
    cpus: int | None = None
    mem_available: int | None = None  # bytes
    sessions: int | None = None  # SSH sessions tfo holds there at most at once (its agent's)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said, but the run starts


class TaskHandle(Protocol):
    """The coordinator's grip on one running task (one attempt)."""

    task: TaskPlan
    attempt: int

    @property
    def pid(self) -> int | None: ...

    @property
    def exit_fd(self) -> int | None:
        """A file descriptor that turns readable when the task exits (a pidfd), and stays
        so: the supervisor sleeps on it and calls poll() only once it is readable. None (or
        no such attribute): the supervisor polls it every POLL_SECONDS instead (SSH tasks:
        their channel has no fd that says so)."""

    def poll(self) -> int | None:
        """None while running, >= 0 an exit code, < 0 the number of the signal that
        killed it (as subprocess)."""

    def terminate(self) -> None:
        """SIGTERM to the task's whole process group. The task's wrapper passes it on to the
        task and SIGKILLs it after the plan's grace_seconds (worker_entry.lifeline)."""

    def request_stacks(self) -> None:
        """Ask the task for its Python stacks (STACKS down its lifeline): they come in its
        output, a faulthandler dump. Nothing happens when it cannot answer (stopped, gone)."""

    def kill(self) -> None:
        """SIGKILL to the task's whole process group and any straggler in its tree."""

    def lines(self) -> list[str]:
        """Output lines (stdout and stderr) that arrived since the last call, each cut at
        output.LINE_CAP. The handle itself writes the complete output to task.log_path."""

    def close(self, timeout: float = 1.0) -> list[str]:
        """After exit: wait briefly for the rest of the output, release pipes, remove the
        task's temp dir; the last lines."""


class Launcher(Protocol):
    def __call__(self, task: TaskPlan, attempt: int) -> TaskHandle: ...


class BatchLauncher(Protocol):
    """Starts tasks as one batch: for each (task, attempt), in order, its handle or the
    error its start raised (the caller judges each: an unreachable host fails its task)."""

    def __call__(self, items: Iterable[tuple[TaskPlan, int]]) -> Iterator[TaskHandle | Exception]:
        ...


def one_by_one(start: Launcher, items: Iterable[tuple[TaskPlan, int]]
               ) -> Iterator[TaskHandle | Exception]:
    """A batch started a task at a time, in order. The next item is taken only once the last
    one is answered, so a caller that stops after a failure starts no more; an interrupt
    (BaseException) ends the batch."""
    for task, attempt in items:
        try:
            yield start(task, attempt)
        except Exception as e:  # noqa: BLE001 - the caller's to judge, task by task
            yield e


class Discardable(Protocol):
    def discard(self) -> None: ...


H = TypeVar("H", bound=Discardable)


def answered(started: list[H | Exception]) -> Iterator[H | Exception]:
    """A batch started all at once, answered in order. A caller that stops early (after a
    failed start) never takes the rest: they are discarded (killed), not left running."""
    for i, answer in enumerate(started):
        try:
            yield answer
        except GeneratorExit:
            for rest in started[i + 1:]:
                if not isinstance(rest, Exception):
                    rest.discard()
            raise


class Backend(Protocol):
    """Starts the tasks of one placement kind. Made once per run from the spec's hosts;
    each method gets only the tasks (hosts) of its kind. In a run's order: place, allocate,
    gpus, check, sync, start (standby), close."""

    # A scheduler's request, `backend: {KIND: {…}}` (spec.SchedulerOptions); None: a host
    # backend, named by `hosts.NAME.backend`, whose tasks go where the cluster file says.
    options: ClassVar[type[SchedulerOptions] | None]

    def __init__(self, hosts: Mapping[str, HostSpec]) -> None: ...

    def place(self, spec: ClusterSpec, dry_run: bool, say: Say) -> dict[str, str]:
        """Where a scheduler puts each of the job's tasks (task name → node, the task's host
        and address), asked before ports; what it waits for goes to `say`. A dry run asks
        no scheduler. A host backend places nothing: {}."""

    def allocate(self, names: list[str], avoid: set[int]) -> dict[str, int]:
        """A free port for each task (by name) whose port is `auto`, none in `avoid`."""

    def gpus(self, hosts: list[str], ask: bool) -> dict[str, GpuReport]:
        """What `nvidia-smi -L` reports on these hosts (their gpus are `auto`); a host that
        cannot tell, or that only `ask` may reach (a dry run connects nowhere), is left out."""

    def check(self, tasks: list[TaskPlan]) -> list[HostCheck]:
        """Preflight: can each host run its tasks? One row per host, problems named."""

    def sync(self, plan: Plan, tasks: list[TaskPlan]) -> Iterable[str]:
        """Put the job's code where the tasks will look for it; what was done, for the user
        (an iterator says it as it goes). Raises BackendError."""

    def start(self, task: TaskPlan, attempt: int) -> TaskHandle: ...

    # Optional: `standby(task, attempt) -> int | None` starts a warm spare for that attempt,
    # which `start` then hands over (local.py, spares.py). A backend without it has none.
    # Optional: `start_batch(items) -> Iterator[TaskHandle | Exception]` starts several of
    # its tasks together (a host's, a node's) and answers each, in order; without it
    # `Backends.start_batch` starts them one by one (`one_by_one`).
    # Optional: `expect_code(plan)`, told before `check` by a backend that copies code
    # (ssh.py): its preflight then asks what is there already, and whether the rest fits.

    def close(self) -> None:
        """The run is over: release what the backend holds (its warm spares too)."""


class HostBackend:
    """What a host backend (local, ssh) has in common: no request, and it places nothing,
    the cluster file did."""

    options: ClassVar[type[SchedulerOptions] | None] = None

    def place(self, spec: ClusterSpec, dry_run: bool, say: Say) -> dict[str, str]:
        return {}


class BackendError(Exception):
    """A host could not be reached, authenticated or used; the message names the host."""
