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

Issue 39 chose this over forking tasks from a per-host process that imported TensorFlow
(the test kit's fork server): both skip the import (a restart's ~2.2 s), but a fork path
ships only with a 1,000-start soak free of hangs (the kit's forked tasks hung once in 3
`pytest -n 2` runs, still being found), and a standby is a plain process, fork-safe. What
it costs: its import's CPU, taken at the lowest priority (worker_entry.standby: it takes
no core from training), and its memory for the rest of the run: `auto` weighs memory
alone (spares_pay_off). A standby whose startup would differ from a cold start now (the
task's environment, its command or Python: a resize, a changed environment) is discarded
and the task starts cold; one that died waiting is replaced (orchestrator/loop/starts.py).
The path a start took is `task_started`'s `path`: warm, forked (the kit's pool) or cold.
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

# What a warm standby holds: TensorFlow 2.21 and tf-keras imported, on CPU (its wrapper and
# task; bench/run.py's `spare RSS` detail: 650 MiB, issue 39's runs 600-640 MiB).
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

    def __init__(self, start: Callable[[TaskPlan, int], S],
                 startup: Callable[[TaskPlan, int], object] = lambda task, attempt: None
                 ) -> None:
        """`startup(task, attempt)`: what a start of it now would start with beyond its plan
        (the backend's environment for it); a standby made with other is not used."""
        self._start, self._startup = start, startup
        self._held: dict[str, S] = {}
        # The task each was made for, and its startup: an elastic resize gives a name a new
        # plan (its size's TF_CONFIG, perhaps another place), and a spare of the old one
        # must not take it; nor one made with another environment.
        self._for: dict[str, tuple[TaskPlan, object]] = {}

    def make(self, task: TaskPlan, attempt: int) -> int | None:
        held = self._held.get(task.name)
        if held is not None and held.attempt == attempt and held.poll() is None:
            return None
        self._drop(task.name)
        standby = self._held[task.name] = self._start(task, attempt)
        self._for[task.name] = (task, self._startup(task, attempt))
        return standby.pid

    def take(self, task: TaskPlan, attempt: int) -> S | None:
        held = self._held.pop(task.name, None)
        made_for = self._for.pop(task.name, None)
        if held is None:
            return None
        if held.attempt != attempt or made_for != (task, self._startup(task, attempt)) \
                or held.poll() is not None:
            # stale (another attempt, another plan: a resize, another environment), or dead
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


def spares_pay_off(available: int, tasks: int, spare_rss: int = SPARE_RSS) -> bool:
    """`warm_spares: auto`: a standby imports TensorFlow once, at the lowest CPU priority
    (it takes no core from training: worker_entry.standby), then holds its memory for the
    whole run. So memory decides, not cores: on where the host's available memory holds
    its training tasks' standbys twice over (available >= 2 × tasks × spare_rss)."""
    return tasks > 0 and available >= 2 * tasks * spare_rss


def spares_wanted(plan: Plan, checks: Iterable[HostCheck]) -> frozenset[str]:
    """The tasks that keep a warm spare in this run, by name (never a server: it serves,
    nothing to resume). `restart.warm_spares: true`: all of them (the backend makes them
    where it can). `auto`: those of each host where spares_pay_off says the
    host has the memory for its training tasks' standbys, from preflight's `checks` (its
    available memory; local tasks share this machine's row; a Slurm node's row is the
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
        if row is not None and row.mem_available is not None \
                and spares_pay_off(row.mem_available, trainers):
            wanted.update(t.name for t in on_host)
    return frozenset(wanted)


def spares_line(plan: Plan, checks: Iterable[HostCheck]) -> str:
    """`tfo check`'s word on the warm spares: which tasks keep one and the memory they hold
    for the run, or why none (the setting, no restart, or too little free memory)."""
    wanted = spares_wanted(plan, checks)
    if wanted:
        return (f"warm spares: {len(wanted)} ({', '.join(sorted(wanted))}), about "
                f"{len(wanted) * SPARE_RSS / 2**30:.1f} GiB held while the job runs "
                f"({SPARE_RSS // 2**20} MiB each); restart.warm_spares: false turns them off")
    policy = plan.policy
    if policy.warm_spares is False:
        return "warm spares: off (restart.warm_spares: false)"
    if not any(restarts_left(t.role, policy, plan.rules, 0, 0) for t in plan.tasks):
        return "warm spares: none (nothing restarts)"
    return (f"warm spares: off (no host has twice its training tasks' standbys, "
            f"{SPARE_RSS // 2**20} MiB each, in free memory; restarts start cold)")
