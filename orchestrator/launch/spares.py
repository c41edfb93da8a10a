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
(the test kit's fork server, since removed): both skip the import (a restart's ~2.2 s),
but a standby is a plain exec'd process, with nothing a fork could have broken. What it
costs: its import's CPU, taken at the lowest priority (worker_entry.standby: it takes no
core from training), and its memory for the rest of the run: `auto` weighs memory alone
(spares_pay_off). A standby whose startup would differ from a cold start now (the task's
environment, its command or Python: a resize, a changed environment) is discarded and the
task starts cold; one that died waiting is replaced (orchestrator/loop/starts.py). The path
a start took is `task_started`'s `path`: warm (a standby's, the kit's pool's too) or cold.

Design: Warm spares
====================

Most of a restart is the new processes importing TensorFlow (1.6–1.8 of the 2.2–2.4 s from a
kill to both workers' first step in the bench's job, on 2 cores). With `restart.warm_spares`
on, the loop asks the backend for a standby of each training task's next attempt once the
attempt trains (its first `progress` marker, or `STANDBY_AFTER_READY_SECONDS`, 5 s, after
READY for a task that reports none), while a restart is still possible
(`task_standby_started`). A standby is the task's own command with its environment,
`TFO_ATTEMPT` of the attempt it will serve and `TFO_STANDBY=1`: its task imports TensorFlow,
tf-keras and an entry's module (`worker_entry/standby.py`), then blocks on a pipe from its
wrapper. The wrapper meanwhile writes nothing (nobody reads its stdout yet: a full pipe
would block it), neither measures nor watches the port (both the running attempt's), and
leaves the temp dir alone; lifeline EOF, its parent's death and signals end it as any task.
A restart's `start(task, attempt)` finds the standby for that attempt alive and sends `!`
(GO) down its lifeline: the wrapper makes the temp dir and passes GO on, the task runs from
UP on as a fresh one would, and its output, held in the pipe until then, goes to the log
after the attempt's header (`task_started` says `warm: true`). A dead or stale standby is
discarded and a fresh process started. A standby that dies while it waits (SIGKILLed, the
OOM killer) is noticed within `STANDBY_CHECK_SECONDS` (2 s): the loop asks for it again, the
backend reaps the dead one (no `<defunct>` wrapper left) and starts another
(`task_standby_lost` with `replaced_by`, a `[tfo]` line), at most `STANDBY_REPLACEMENTS` (3)
times an attempt, so the next restart is still warm. At most one per task; `Backends.close`
(every end of a run) SIGKILLs the standbys' process groups. `warm_spares: auto` (the
default) turns them on where the host's memory holds them, host by host: its available
memory ≥ 2 × its training tasks × 650 MiB (a warm standby's RSS), as preflight found it
(`HostCheck.mem_available`: this machine's from psutil, a lab host's from the probe); the
import runs at nice 19, so cores are not asked. `spares_wanted(plan, checks)` gives the
tasks that keep spares, by name (`Backends.check` keeps them, `Backends.spares`), and
`Backends.standby` makes none for another; `true` means every task but the servers, wherever
the backend has them (local, SSH, Slurm). An SSH standby is one more task of its host's
agent, with `TFO_STANDBY=1`: what it prints before GO (nothing, normally) is held until GO,
the host's beats are the agent's, and `discard` kills its process group there. A Slurm
standby is a step of its own on the task's node (`--overlap`, `TFO_STANDBY=1`, GO down
srun's stdin); a task with GPUs gets none, since its step would wait for the running
attempt's GPUs. For `auto`, a granted Slurm job's preflight adds a row per node with the
job's share of it (`SlurmBackend._node_rows`: `scontrol show job -d`'s CPU_IDs and Mem, else
sinfo's free memory), not the node's idle cores: where the cluster confines steps to the
job's cgroup, a standby competes with its own task.

A **pool standby** (`orchestrator/launch/pool.py`, the pytest plugin's warm pool) is a local
standby started before any plan exists: `python -m worker_entry` with `TFO_STANDBY=1`,
`TFO_JOB={}` (it imports TensorFlow and tf-keras), the loopback shim preloaded, and
`TFO_POOL_ENV` naming a file in a private directory. To hand it a task, the pool writes the
task's whole environment and directory into that file and sends GO; at GO the wrapper and
then the task (`standby.adopt_pool_env`) replace their environment with it, apply the
wrapper's defaults again, change directory, and go on as a task started now (the wrapper
reads its temp dir, grace and script port again). What the import already read (the
interpreter, sys.path's directory, CUDA devices, the Keras choice, LD_PRELOAD, and what an
interpreter's start reads: `LD_LIBRARY_PATH`, a locale, `PYTHONHASHSEED`) must match, or the
task starts cold. Each take starts a replacement for the next test, except where the plugin
knows none follows (`refill` off): one started after the session's last cluster test was
only killed at its end.

Pool standbys are exec'd like every other standby, and import TensorFlow themselves at
nice 19 while the test before theirs runs (each taken one is replaced at once). Until issue
37 item 9 they were forked from a fork server that had imported TensorFlow once (issue 28:
a standby's own import was 1.3-1.4 s of a core, 80 % of a file of small cluster tests'
CPU). A user's 2-worker tests under `pytest -n 2` hung in their first collective (MWMS's
initial-value broadcast) 1 run in 3 with forked tasks; the search that followed
(docs/evidence/kit-hang/) showed every fork was from one thread with no TensorFlow runtime
started, found no path between two xdist workers' clusters, and never reproduced the hang
in 520+ soak runs: its cause is unknown. So the kit stopped forking from a process that
imported TensorFlow, and its tasks start as tfo's own restarts do.
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
