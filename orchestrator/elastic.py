"""Elastic multi_worker_mirrored jobs (issue 27): which places train, decided as pure functions
of the group's state; no I/O, no clock. The loop carries the answers out
(orchestrator/resizing.py; docs/architecture.md, "Elastic jobs").

    places = pool(spec, ports)                  # tasks.worker: every place a worker may take
    group = first_group(spec.elastic, places)   # the first max_workers of them
    d = on_lost(spec.elastic, places, group, {"lab2": Why.LIFELINE})
    if isinstance(d, Resize):                   # else NoResize (follow_policy: the policy's)
        plan = plan_for(plan, places, d.group)  # TF_CONFIG of the new size, TFO_NUM_WORKERS
        log.write("job_resized", **d.event)     # {from, to, reason, hosts}

TensorFlow cannot resize a running MWMS group: a resize is a restart of the whole group at
a new size, resuming from the newest backup every remaining worker holds (`resume_from`).
Reading and copying the backups' files is orchestrator/backups.py's.

A place's host moves between these states (what `Group` holds, as sets):

    IN USE ──lost: unreachable or refusing a start, lifeline cut, N failures in a row──▶ LOST
    LOST ──answers a probe, at the next epoch boundary, below max_workers──▶ IN USE
    SPARE (listed, not in use) ──answers a probe, at an epoch boundary or a shrink──▶ IN USE
    IN USE ──the group would fall below min_workers, or max_resizes spent──▶ the restart policy
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from orchestrator.plan import Plan, make_plan, task_name
from orchestrator.rundir import task_file
from orchestrator.spec import LOCALHOST, Address, ClusterSpec, ElasticSpec
from worker_entry.markers import NUM_WORKERS_ENV, Role


class Why(str, Enum):
    """Why a host counts as lost."""

    UNREACHABLE = "unreachable"  # a start on it failed: no answer, or refused
    LIFELINE = "lifeline"  # its tasks' lifeline went silent (lost contact)
    FAILURES = "failures"  # its tasks failed lost_after_failures times in a row

    def words(self, elastic: ElasticSpec) -> str:
        return {Why.UNREACHABLE: "did not answer or refused a start",
                Why.LIFELINE: "its lifeline went silent",
                Why.FAILURES: f"its tasks failed {_times(elastic.lost_after_failures)} in "
                              "a row (elastic.lost_after_failures)"}[self]


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def lost_why(elastic: ElasticSpec, *, start_failed: bool = False, lifeline_cut: bool = False,
             failures_in_row: int = 0) -> Why | None:
    """Whether what happened to a host's task makes the host lost, and why."""
    if start_failed:
        return Why.UNREACHABLE
    if lifeline_cut:
        return Why.LIFELINE
    if failures_in_row >= elastic.lost_after_failures:
        return Why.FAILURES
    return None


def failures_in_row(before: int, trained: bool) -> int:
    """A place's failures in a row, one more failed: a failure after its task's first step
    starts a new row (it trained there, so the place worked); one before it adds to it."""
    return 1 if trained else before + 1


def probe_due(now: float, probed_at: float | None, elastic: ElasticSpec) -> bool:
    """Time to ask the lost and spare hosts again (every probe_seconds)."""
    return probed_at is None or now - probed_at >= elastic.probe_seconds


def at_epoch_boundary(seen: int | None, epoch: int | None) -> bool:
    """Worker 0's progress says a new epoch began since the loop last looked (`seen`: the
    epoch it saw then): the backup of the one before is written, a graceful stop loses
    at most the new epoch's first steps."""
    return seen is not None and epoch is not None and epoch > seen


def unfilled_joiners(places: Sequence[Place], old: Group, new: Group,
                     fillable: Callable[[str], bool]) -> list[str]:
    """The hosts of places joining `new` whose backup directory the coordinator cannot fill
    (`fillable(host)`: this machine's and a lab host's it can): there a stale directory
    would leave the group no backup in common, and it would start over, so the group does
    not grow onto them."""
    return list(dict.fromkeys(places[s].host for s in new.members
                              if s not in old.members and not fillable(places[s].host)))


@dataclass(frozen=True)
class Place:
    """One listed worker place: `tasks.worker[slot]`, on `host` (a name under hosts:,
    localhost, or the Slurm node the allocation gave it), at `port` (fixed in the file, or
    the one allocated for it)."""

    slot: int
    host: str
    port: int
    node: str | None = None  # a Slurm place's node (`host` is then the node too)

    @property
    def where(self) -> str:
        """What is lost as a whole: its host; on this machine the place alone
        (`localhost:PORT`): the coordinator's own machine is never lost, a place on it is."""
        return f"{LOCALHOST}:{self.port}" if self.host == LOCALHOST else self.host


def pool(spec: ClusterSpec, ports: Mapping[str, int],
         nodes: Mapping[str, str] | None = None) -> tuple[Place, ...]:
    """Every place `tasks.worker` lists. `ports` and `nodes` are what the first plan was made
    with (by task name, `worker:SLOT`): a place keeps its port and node whatever index its
    worker has later."""
    places = []
    for slot, address in enumerate(spec.tasks.worker):
        name = task_name(Role.WORKER, slot)
        port = address.port if address.port is not None else ports[name]
        node = (nodes or {}).get(name) if address.host == spec.scheduler else None
        places.append(Place(slot, node or address.host, port, node))
    return tuple(places)


@dataclass(frozen=True)
class Group:
    """Who trains now: `members[i]` is the slot of worker i (worker 0 the chief); the hosts
    lost (until they answer again); resizes so far, against max_resizes."""

    members: tuple[int, ...]
    lost: frozenset[str] = frozenset()
    resizes: int = 0


def _most(elastic: ElasticSpec, places: Sequence[Place]) -> int:
    return elastic.max_workers if elastic.max_workers is not None else len(places)


def first_group(elastic: ElasticSpec, places: Sequence[Place]) -> Group:
    """The group a run starts with: the first max_workers places listed."""
    return Group(members=tuple(p.slot for p in places[:_most(elastic, places)]))


def to_probe(places: Sequence[Place], group: Group) -> list[str]:
    """The hosts to ask every probe_seconds whether they answer: lost ones, and those of
    places not in use."""
    used = {places[s].where for s in group.members}
    spare = [p.where for p in places if p.slot not in group.members and p.where not in used]
    return sorted(set(spare) | set(group.lost))


@dataclass(frozen=True)
class Resize:
    """Restart the group as `group` (a new plan: plan_for); `event` is job_resized's
    payload, `words` what the console says."""

    group: Group
    event: dict[str, Any]
    words: str


@dataclass(frozen=True)
class NoResize:
    """The group goes on as it is (`group` may hold new lost hosts). `follow_policy`: no
    resize was possible for a loss (below min_workers, or max_resizes spent), and the restart
    policy decides, as for a fixed-size job (decide.on_loss)."""

    group: Group
    reason: str
    follow_policy: bool = False


Decision = Resize | NoResize


def _resize(places: Sequence[Place], old: Group, members: list[int], lost: frozenset[str],
            reason: str, hosts: Collection[str]) -> Resize:
    new = Group(members=tuple(members), lost=lost, resizes=old.resizes + 1)
    if old.members and old.members[0] != members[0]:
        reason += f"; worker 0 (the chief) is now on {places[members[0]].where}"
    event = {"from": len(old.members), "to": len(members), "reason": reason,
             "hosts": sorted(set(hosts))}
    return Resize(new, event, f"{len(old.members)} → {len(members)} workers: {reason}")


def on_lost(elastic: ElasticSpec, places: Sequence[Place], group: Group,
            lost: Mapping[str, Why], answering: Collection[str] = ()) -> Decision:
    """Hosts lost (`lost`: host → why): the group restarts without every place on them, the
    others keeping their order (contiguous indices; worker 0's role passes to the first one
    left). Spare places whose hosts answered the last probe (`answering`) fill in, up to
    max_workers. Below min_workers, or with max_resizes spent: the restart policy decides."""
    now_lost = group.lost | frozenset(lost)
    dropped = [s for s in group.members if places[s].where in lost]
    if not dropped:
        return NoResize(dataclasses.replace(group, lost=now_lost),
                        f"{', '.join(sorted(lost))}: no worker of the group on it")
    what = "; ".join(f"{host} lost: {why.words(elastic)}" for host, why in sorted(lost.items())
                     if any(places[s].where == host for s in dropped))
    kept = [s for s in group.members if s not in dropped]
    spares = [p.slot for p in places if p.slot not in group.members
              and p.where in answering and p.where not in now_lost]
    members = kept + spares[:max(0, _most(elastic, places) - len(kept))]
    if group.resizes >= elastic.max_resizes:
        return NoResize(dataclasses.replace(group, lost=now_lost), (
            f"{what}; no resize left (elastic.max_resizes {elastic.max_resizes}): the restart "
            "policy decides"), follow_policy=True)
    if len(members) < elastic.min_workers:
        return NoResize(dataclasses.replace(group, lost=now_lost), (
            f"{what}; {len(members)} worker(s) left, fewer than elastic.min_workers "
            f"{elastic.min_workers}: the restart policy decides"), follow_policy=True)
    joined = [places[s].where for s in members if s not in kept]
    if joined:
        what += f"; {', '.join(dict.fromkeys(joined))} takes its place"
    left = {places[s].where for s in dropped}
    return _resize(places, group, members, now_lost, what, left | set(joined))


def on_answer(elastic: ElasticSpec, places: Sequence[Place], group: Group,
              answering: Collection[str]) -> Decision:
    """At an epoch boundary, hosts that answered a probe: the group grows by their places
    (in listed order, after the workers it has: no index changes, the chief stays) up to
    max_workers. A lost host that answers is lost no more."""
    back = frozenset(answering)
    still_lost = group.lost - back
    room = _most(elastic, places) - len(group.members)
    joining = [p.slot for p in places if p.slot not in group.members and p.where in back]
    if not joining:
        return NoResize(dataclasses.replace(group, lost=still_lost), "no place to add")
    if room <= 0:
        return NoResize(dataclasses.replace(group, lost=still_lost),
                        f"{len(group.members)} workers already (elastic.max_workers)")
    if group.resizes >= elastic.max_resizes:
        return NoResize(dataclasses.replace(group, lost=still_lost), (
            f"no resize left (elastic.max_resizes {elastic.max_resizes}): stays at "
            f"{len(group.members)} workers"))
    joined = joining[:room]
    hosts = list(dict.fromkeys(places[s].where for s in joined))
    return _resize(places, group, [*group.members, *joined], still_lost,
                   f"{', '.join(hosts)} answered again", hosts)


def plan_for(plan: Plan, places: Sequence[Place], group: Group, **kwargs: Any) -> Plan:
    """The plan of the group: `plan` (the run's, of any size) with its workers the group's
    places, indices 0..n-1 in the group's order, each at its place's port and node; every
    other task as it was. TF_CONFIG lists n workers, TFO_IS_CHIEF is worker 0's, and every
    task's env has TFO_NUM_WORKERS. `kwargs` go to make_plan (`python`, `gpus`: what the
    first plan was made with). The plan's spec stays the run's (the whole pool)."""
    spec = plan.spec
    workers = [Address(host=spec.scheduler if places[s].node and spec.scheduler else places[s].host,
                       port=places[s].port) for s in group.members]
    sized = spec.model_copy(update={"tasks": spec.tasks.model_copy(update={"worker": workers})})
    others = [t for t in plan.tasks if t.role is not Role.WORKER]
    nodes = {t.name: t.placement.host for t in others
             if spec.scheduler and t.placement.kind == spec.scheduler}
    nodes |= {task_name(Role.WORKER, i): places[s].node for i, s in enumerate(group.members)
              if places[s].node}
    new = make_plan(sized, run_id=plan.run_id, run_dir=plan.run_dir, workdir=plan.workdir,
                    ports={t.name: t.port for t in others}, nodes=nodes, **kwargs)
    size = str(len(group.members))
    tasks = [dataclasses.replace(t, env=_place_backup({**t.env, NUM_WORKERS_ENV: size},
                                                      group.members[t.index]))
             if t.role is Role.WORKER else
             dataclasses.replace(t, env={**t.env, NUM_WORKERS_ENV: size}) for t in new.tasks]
    return dataclasses.replace(new, spec=spec, tasks=tasks)


def _place_backup(env: dict[str, str], slot: int) -> dict[str, str]:
    """A worker's backup directory is its place's (backup/worker-SLOT on the place's host),
    whatever its index: after a shrink every remaining worker finds its own backups where it
    left them, on its own host, with nothing to copy (a lab host's too)."""
    old = env[BACKUP_DIR_ENV]
    mine = posixpath.join(posixpath.dirname(old), task_file(Role.WORKER, slot))
    if mine == old:
        return env
    job = env["TFO_JOB"].replace(f'"backup_dir": {json.dumps(old)}',
                                 f'"backup_dir": {json.dumps(mine)}')
    return {**env, BACKUP_DIR_ENV: mine, "TFO_JOB": job}


# ---- which backup the resized group resumes from --------------------------------------
Dir = tuple[str, str]  # a backup directory: (host, its path there)
BACKUP_DIR_ENV = "TFO_BACKUP_DIR"


def backup_dirs(plan: Plan, script: str | None = None) -> dict[str, Dir]:
    """Each worker's backup directory in `plan`: task name → (host, path on that host).
    `script`: a script's own BackupAndRestore directory (its `backup` marker's), relative to
    the task's cwd or absolute, in place of tfo's TFO_BACKUP_DIR."""
    return {t.name: (t.host, posixpath.join(t.cwd, script) if script else t.env[BACKUP_DIR_ENV])
            for t in plan.tasks if t.role is Role.WORKER}


def previous_dirs(old_plan: Plan, old: Group, new_plan: Plan, new: Group,
                  script: str | None = None) -> dict[str, Dir | None]:
    """For each worker of `new_plan`, the backup directory its place wrote in `old_plan`
    (None: its place was not in the group, a worker joining)."""
    before = backup_dirs(old_plan, script)
    return {task_name(Role.WORKER, i): before[task_name(Role.WORKER, old.members.index(s))]
            if s in old.members else None for i, s in enumerate(new.members)}


@dataclass(frozen=True)
class Resume:
    """Where the resized group starts: `save` (ckpt-N, the save number BackupAndRestore
    numbers its backups by; None: no backup every remaining worker holds, training starts
    over) and, for each worker whose backup directory lacks it, the directory to copy it
    from (`fills`: task → (host, path))."""

    save: int | None
    fills: dict[str, Dir]


def resume_from(wanted: Mapping[str, Dir], had: Mapping[str, Dir | None],
                held: Mapping[Dir, Collection[int]], chief_keeps: bool = False) -> Resume:
    """The newest backup every remaining worker holds, and who needs it copied in.

    `wanted`: each worker's backup directory in the new plan (backup_dirs); `had`: the one
    its place wrote before (previous_dirs; None for a worker joining, which holds nothing
    and constrains nothing); `held`: the save numbers found in each directory
    (backups.held). A worker whose index changed writes a new directory on its own host:
    its copy comes from its own old one there; a joining one's from a peer, one on its own
    host first. The tasks themselves (worker_entry's _TaskBackup) then agree on the same
    backup, and drop newer ones.

    `chief_keeps`: tf-keras's own BackupAndRestore (a script's), where the chief alone keeps
    the backup and every worker restores from its own host's copy of that directory: the
    newest any remaining worker's directory holds (the save numbers only grow), copied to
    the others'."""
    remaining = [d for d in had.values() if d is not None]
    sets = [set(held.get(d, ())) for d in remaining]
    common = (set.union if chief_keeps else set.intersection)(*sets) if sets else set()
    if not common:
        return Resume(None, {})
    save = max(common)
    holders = [d for d in dict.fromkeys([*remaining, *sorted(held)]) if save in held.get(d, ())]
    fills = {}
    for task, target in wanted.items():
        if save in held.get(target, ()):
            continue
        mine = had.get(task)
        fills[task] = mine if mine is not None and mine in holders else \
            min(holders, key=lambda d: d[0] != target[0])  # stable: the first on its host
    return Resume(save, fills)


__all__ = ["NUM_WORKERS_ENV", "Decision", "Group", "NoResize", "Place", "Resize",
           "Resume", "Why", "at_epoch_boundary", "backup_dirs", "failures_in_row",
           "first_group", "lost_why", "on_answer", "on_lost", "plan_for", "pool",
           "previous_dirs", "probe_due", "resume_from", "to_probe", "unfilled_joiners"]
