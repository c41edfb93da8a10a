"""Warm spares: a task's next attempt, started ahead, so a restart need not wait for
TensorFlow to import (most of a restart: about 6 of 8 s on a 2-core machine).

    spares = Spares(start=lambda task, attempt: LocalHandle(task, attempt, standby=True))
    spares.make(task, attempt)        # a standby for (task, attempt); its pid (None: one waits)
    spares.take(task, attempt)        # that standby, told to go; None: none alive, start anew
    spares.close()                    # kill every standby left (the run ends)
    spares_wanted(plan, checks)       # the tasks that keep one in this run (preflight's rows)

A standby is the task's own command (`python -m worker_entry`) with the task's environment
and the attempt it will serve; its task imports TensorFlow and waits for GO
(worker_entry.standby) without touching the task's port or files. One per task at most.
The supervisor asks for one at an attempt's first progress (its own start-up is over, so
the import does not slow it) while a restart is still possible; the backend hands it over
in `start`. Every backend has them (`launch/local.py`, `ssh.py`, `slurm.py`): the standby
runs on the task's host, under Slurm as a step of its own (not for a task with GPUs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from orchestrator.planning.plan import LOCAL
from orchestrator.planning.spec import LOCALHOST
from orchestrator.planning.strategy import restarts_left, serving, training

if TYPE_CHECKING:
    from orchestrator.launch.preflight import HostCheck
    from orchestrator.planning.plan import Plan, TaskPlan

# What a warm standby holds: TensorFlow 2.21 and tf-keras imported, on CPU (measured 650 MiB).
SPARE_RSS = 650 * 2**20
DISCARD_SECONDS = 2.0  # a killed standby is gone in milliseconds (srun: a scancel); no longer


class Standby(Protocol):
    attempt: int

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def go(self) -> None: ...

    def discard(self) -> None: ...


S = TypeVar("S", bound=Standby)


class Spares(Generic[S]):
    """The standbys of one backend's tasks, by task name."""

    def __init__(self, start: Callable[[TaskPlan, int], S]) -> None:
        self._start = start
        self._held: dict[str, S] = {}
        # The task each was made for: an elastic resize gives a name a new plan (its size's
        # TF_CONFIG, perhaps another place), and a spare of the old one must not take it.
        self._for: dict[str, TaskPlan] = {}

    def make(self, task: TaskPlan, attempt: int) -> int | None:
        held = self._held.get(task.name)
        if held is not None and held.attempt == attempt and held.poll() is None:
            return None
        self._drop(task.name)
        standby = self._held[task.name] = self._start(task, attempt)
        self._for[task.name] = task
        return standby.pid

    def take(self, task: TaskPlan, attempt: int) -> S | None:
        held = self._held.pop(task.name, None)
        made_for = self._for.pop(task.name, None)
        if held is None:
            return None
        if held.attempt != attempt or made_for != task or held.poll() is not None:
            # stale (another attempt, or another plan: a resize), or it died
            held.discard()
            return None
        held.go()
        return held

    def close(self) -> None:
        for name in list(self._held):
            self._drop(name)

    def _drop(self, name: str) -> None:
        held = self._held.pop(name, None)
        if held is not None:
            held.discard()


def spares_pay_off(cpus: int, available: int, tasks: int, spare_rss: int = SPARE_RSS) -> bool:
    """`warm_spares: auto`: a standby imports TensorFlow (seconds of a core) while the job
    trains, then holds its memory for the whole run. Worth it only where that costs the job
    nothing: a core for each training task, as many again for their standbys' imports and
    one for the coordinator (cpus >= 2 × tasks + 1), and memory for the standbys twice over
    (available >= 2 × tasks × spare_rss)."""
    return tasks > 0 and cpus >= 2 * tasks + 1 and available >= 2 * tasks * spare_rss


def spares_wanted(plan: Plan, checks: Iterable[HostCheck]) -> frozenset[str]:
    """The tasks that keep a warm spare in this run, by name (never a server: it serves,
    nothing to resume). `restart.warm_spares: true`: all of them (the backend makes them
    where it can). `auto`: those of each host where spares_pay_off says the
    host has room for its training tasks' standbys, from preflight's `checks` (its cores
    and available memory; local tasks share this machine's row; a Slurm node's row is the
    job's share of it). None without restarts."""
    policy, rules = plan.policy, plan.rules
    # The restart budget's one rule (orchestrator.loop.decide), before any restart was used.
    if policy.warm_spares is False or not any(
            restarts_left(t.role, policy, rules, 0, 0) for t in plan.tasks):
        return frozenset()
    tasks = [t for t in plan.tasks if not serving(t.role, rules)]
    if policy.warm_spares is True:
        return frozenset(t.name for t in tasks)
    rows = {LOCAL if c.host == LOCALHOST else c.host: c for c in checks}
    by_host: dict[str, list[TaskPlan]] = {}
    for t in tasks:
        by_host.setdefault(LOCAL if t.placement.kind == LOCAL else t.host, []).append(t)
    wanted = set()
    for host, on_host in by_host.items():
        row = rows.get(host)
        trainers = sum(1 for t in on_host if training(t.role, rules))
        if row is not None and row.cpus and row.mem_available is not None \
                and spares_pay_off(row.cpus, row.mem_available, trainers):
            wanted.update(t.name for t in on_host)
    return frozenset(wanted)
