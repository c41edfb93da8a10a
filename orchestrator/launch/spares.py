"""Warm spares: a task's next attempt, started ahead, so a restart need not wait for
TensorFlow to import (most of a restart: about 6 of 8 s on a 2-core machine).

    spares = Spares(start=lambda task, attempt: LocalHandle(task, attempt, standby=True))
    spares.make(task, attempt)        # a standby for (task, attempt); its pid (None: one waits)
    spares.take(task, attempt)        # that standby, told to go; None: none alive, start anew
    spares.close()                    # kill every standby left (the run ends)
    spares_wanted(plan)               # the placement kinds that keep them in this run

A standby is the task's own command (`python -m worker_entry`) with the task's environment
and the attempt it will serve; its task imports TensorFlow and waits for GO
(worker_entry.standby) without touching the task's port or files. One per task at most.
The supervisor asks for one at an attempt's first progress (its own start-up is over, so
the import does not slow it) while a restart is still possible; the backend hands it over
in `start`. Local and SSH tasks have them (`launch/local.py`, `launch/ssh.py`: the standby
runs on the task's host); Slurm tasks have none: that backend has no `standby`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from orchestrator.plan import LOCAL

if TYPE_CHECKING:
    from orchestrator.plan import Plan, TaskPlan

# What a warm standby holds: TensorFlow 2.21 and tf-keras imported, on CPU (measured 650 MiB).
SPARE_RSS = 650 * 2**20


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

    def make(self, task: TaskPlan, attempt: int) -> int | None:
        held = self._held.get(task.name)
        if held is not None and held.attempt == attempt and held.poll() is None:
            return None
        self._drop(task.name)
        standby = self._held[task.name] = self._start(task, attempt)
        return standby.pid

    def take(self, task: TaskPlan, attempt: int) -> S | None:
        held = self._held.pop(task.name, None)
        if held is None:
            return None
        if held.attempt != attempt or held.poll() is not None:  # stale, or it died
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


def spares_wanted(plan: Plan) -> frozenset[str]:
    """The placement kinds whose tasks keep warm spares in this run. `restart.warm_spares:
    true`: every kind whose backend has them (local, SSH). `auto`: local tasks, where
    spares_pay_off says this machine has room for the plan's local training tasks; a lab
    host's cores and memory are not known here, so its tasks get spares only when asked.
    None without restarts to serve."""
    policy = plan.policy
    if policy.max_restarts == 0 or policy.warm_spares is False:
        return frozenset()
    kinds = frozenset(t.placement.kind for t in plan.tasks)
    if policy.warm_spares is True:
        return kinds
    tasks = sum(1 for t in plan.tasks if t.placement.kind == LOCAL
                and t.role not in plan.rules.servers and t.role not in plan.rules.sidecars)
    import psutil  # here: `tfo plan` and `tfo --help` do without it

    room = spares_pay_off(os.cpu_count() or 1, psutil.virtual_memory().available, tasks)
    return frozenset({LOCAL}) if room else frozenset()
