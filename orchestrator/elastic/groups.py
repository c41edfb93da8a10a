"""Elastic jobs (issue 27): which places train, decided as pure functions of the group's
state; no I/O, no clock. The loop carries the answers out
(orchestrator/loop/resizing.py; the package's docstring, "Elastic jobs").

    places = pool(spec, ports)                  # tasks.worker: every place a worker may take
    group = first_group(spec.elastic, places)   # the first max_workers of them
    d = on_lost(spec.elastic, places, group, {"lab2": Why.LIFELINE})
    if isinstance(d, Resize):                   # else NoResize (follow_policy: the policy's)
        plan = plan_for(plan, places, d.group)  # TF_CONFIG of the new size, TFO_NUM_WORKERS
        log.write("job_resized", **d.event)     # {from, to, reason, hosts}

TensorFlow cannot resize a running MWMS group: a resize is a restart of the whole group at
a new size, resuming from the newest backup every remaining worker holds (`resume_from`).
Reading and copying the backups' files is orchestrator/elastic/backups.py's.

A parameter_server job (`ps_on_lost`, `ps_on_answer`) keeps its chief running: a lost
worker is dropped where it is (`Act.DROP`: its place stays in the chief's TF_CONFIG, whose
ClusterCoordinator reschedules its functions on the others), and rejoins alone, on the same
plan, when its host answers again (`Act.REJOIN`); a lost ps holds variables, so the job
restarts (`Act.REGROUP`) with the ps that remain, from the chief's backup; with none left,
the restart policy decides.

A place's host moves between these states (what `Group` holds, as sets):

    IN USE ──lost: unreachable or refusing a start, lifeline cut, N failures of its own in a
             row (a failure after a peer's loss or stall is not its own; an epoch trained
             ends the row)──▶ LOST
    LOST ──answers a probe, at the next epoch boundary, below max_workers──▶ IN USE
    SPARE (listed, not in use) ──answers a probe, at an epoch boundary or a shrink──▶ IN USE
    IN USE ──the group would fall below min_workers, or max_resizes spent──▶ the restart policy
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from orchestrator.elastic import backups
from orchestrator.planning.plan import Plan, make_plan, profiler_key, task_name
from orchestrator.planning.spec import LOCALHOST, Address, ClusterSpec, ElasticSpec
from orchestrator.runs.rundir import task_file
from worker_entry.markers import NUM_WORKERS_ENV, Role, Strategy


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


def failures_in_row(before: int, own: bool) -> int:
    """A place's failures in a row after its task failed: one more where the failure was its
    own (`own_failure`); one that followed a peer's loss or stall leaves the row as it was.
    A success resets the row (`trained_well`: the loop forgets the count)."""
    return before + 1 if own else before


def own_failure(peers: Iterable[tuple[bool, bool]]) -> bool:
    """Was a task's failure its own? Not where, when it failed, a peer of its group was
    (gone, stopped): gone (failed, exited with a failure, its contact lost) or stopped (its
    usage said state T: a SIGSTOP). A worker's collective fails when its peer does."""
    return not any(gone or stopped for gone, stopped in peers)


def trained_well(epoch_known: bool, epoch_done: bool, stepped: bool) -> bool:
    """A success that ends a place's row of failures: an epoch trained this attempt; for a
    task that tells no epochs (a counted loop), a step."""
    return epoch_done if epoch_known else stepped


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
    profiler_port: int | None = None  # its task's profiler's, whatever index it has later

    @property
    def where(self) -> str:
        """What is lost as a whole: its host; on this machine the place alone
        (`localhost:PORT`): the coordinator's own machine is never lost, a place on it is."""
        return f"{LOCALHOST}:{self.port}" if self.host == LOCALHOST else self.host


def pool(spec: ClusterSpec, ports: Mapping[str, int],
         nodes: Mapping[str, str] | None = None, role: Role = Role.WORKER) -> tuple[Place, ...]:
    """Every place `tasks.worker` lists (`tasks.ps`: a parameter_server job's ps places).
    `ports` and `nodes` are what the first plan was made with (by task name, `worker:SLOT`):
    a place keeps its port and node whatever index its task has later."""
    places = []
    for slot, address in enumerate(getattr(spec.tasks, role.value)):
        name = task_name(role, slot)
        port = address.port if address.port is not None else ports[name]
        node = (nodes or {}).get(name) if address.host == spec.scheduler else None
        places.append(Place(slot, node or address.host, port, node,
                            ports.get(profiler_key(name))))
    return tuple(places)


@dataclass(frozen=True)
class Group:
    """Who trains now: `members[i]` is the slot of worker i (worker 0 the chief); the hosts
    lost (until they answer again); resizes so far, against max_resizes. A parameter_server
    job's also: `ps[i]`, the slot of ps i; `dropped`, the slots of workers dropped where they
    are (still in the chief's TF_CONFIG, not running)."""

    members: tuple[int, ...]
    lost: frozenset[str] = frozenset()
    resizes: int = 0
    ps: tuple[int, ...] = ()
    dropped: frozenset[int] = frozenset()

    @property
    def size(self) -> int:
        """The workers working."""
        return len(self.members) - len(self.dropped)


class Act(str, Enum):
    """What a resize asks of the loop."""

    REGROUP = "regroup"  # stop the training tasks; restart them on the group's new plan
    DROP = "drop"  # parameter_server: set the dropped workers aside; nothing else stops
    REJOIN = "rejoin"  # parameter_server: start the workers back alone, on the same plan


def _most(elastic: ElasticSpec, places: Sequence[Place]) -> int:
    return elastic.max_workers if elastic.max_workers is not None else len(places)


def first_group(elastic: ElasticSpec, places: Sequence[Place],
                ps_places: Sequence[Place] = ()) -> Group:
    """The group a run starts with: the first max_workers places listed (and, for a
    parameter_server job, every ps place)."""
    return Group(members=tuple(p.slot for p in places[:_most(elastic, places)]),
                 ps=tuple(p.slot for p in ps_places))


def to_probe(places: Sequence[Place], group: Group) -> list[str]:
    """The hosts to ask every probe_seconds whether they answer: lost ones, and those of
    places not in use (a dropped worker's too)."""
    working = [s for s in group.members if s not in group.dropped]
    used = {places[s].where for s in working}
    spare = [p.where for p in places if p.slot not in working and p.where not in used]
    return sorted(set(spare) | set(group.lost))


@dataclass(frozen=True)
class Resize:
    """Restart the group as `group` (a new plan: plan_for); `event` is job_resized's
    payload, `words` what the console says."""

    group: Group
    event: dict[str, Any]
    words: str
    act: Act = Act.REGROUP


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
            reason: str, hosts: Collection[str], act: Act = Act.REGROUP,
            ps: tuple[int, ...] | None = None, dropped: frozenset[int] = frozenset()) -> Resize:
    new = Group(members=tuple(members), lost=lost, resizes=old.resizes + 1,
                ps=old.ps if ps is None else ps, dropped=dropped)
    if old.members and old.members[0] != members[0] and not old.ps:
        reason += f"; worker 0 (the chief) is now on {places[members[0]].where}"
    event = {"from": old.size, "to": new.size, "reason": reason, "hosts": sorted(set(hosts))}
    words = f"{old.size} → {new.size} workers"
    if len(new.ps) != len(old.ps):
        event["ps"] = {"from": len(old.ps), "to": len(new.ps)}
        words += f", {len(old.ps)} → {len(new.ps)} ps"
    return Resize(new, event, f"{words}: {reason}", act)


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


def ps_on_lost(elastic: ElasticSpec, places: Sequence[Place], ps_places: Sequence[Place],
               group: Group, lost: Mapping[str, Why], answering: Collection[str] = (),
               chief_up: bool = True) -> Decision:
    """A parameter_server job's hosts lost. Only workers on them: each is dropped where it
    is (`Act.DROP`: nothing else stops; the chief's ClusterCoordinator goes on with the
    others). A ps on them too, or a chief not up yet (`chief_up`: it does not connect while
    a worker its TF_CONFIG names does not serve): the job restarts (`Act.REGROUP`) with the
    ps left and the workers left (contiguous indices; dropped workers whose hosts answered
    the last probe, and spare places, back in), from the chief's backup. Below min_workers,
    with no ps left, or with max_resizes spent: the restart policy decides."""
    now_lost = group.lost | frozenset(lost)
    working = [s for s in group.members if s not in group.dropped]
    gone = {s for s in working if places[s].where in lost}
    gone_ps = [s for s in group.ps if ps_places[s].where in lost]
    if not gone and not gone_ps:
        return NoResize(dataclasses.replace(group, lost=now_lost),
                        f"{', '.join(sorted(lost))}: no task of the job on it")
    what = "; ".join(f"{host} lost: {why.words(elastic)}" for host, why in sorted(lost.items())
                     if any(places[s].where == host for s in gone)
                     or any(ps_places[s].where == host for s in gone_ps))
    kept_ps = tuple(s for s in group.ps if s not in gone_ps)
    regroup = bool(gone_ps) or not chief_up
    if regroup:
        kept = [s for s in working if s not in gone]
        # `answering`: a probe since the drop (Resizing forgets a dropped host's answer).
        back = [p.slot for p in places if p.slot not in kept and p.where in answering
                and p.where not in lost]
        members = kept + back[:max(0, _most(elastic, places) - len(kept))]
    else:
        members = working
    size = len(members) if regroup else len(working) - len(gone)
    bound = None
    if group.resizes >= elastic.max_resizes:
        bound = f"no resize left (elastic.max_resizes {elastic.max_resizes})"
    elif gone_ps and not kept_ps:
        bound = "no ps task left to hold the variables"
    elif size < elastic.min_workers:
        bound = (f"{size} worker(s) left, fewer than elastic.min_workers "
                 f"{elastic.min_workers}")
    if bound is not None:
        return NoResize(dataclasses.replace(group, lost=now_lost),
                        f"{what}; {bound}: the restart policy decides", follow_policy=True)
    hosts = {places[s].where for s in gone} | {ps_places[s].where for s in gone_ps}
    if not regroup:
        return _resize(places, group, list(group.members), now_lost,
                       f"{what}; the others go on", hosts, Act.DROP,
                       dropped=group.dropped | frozenset(gone))
    joined = [places[s].where for s in members if s not in working]
    if joined:
        what += f"; {', '.join(dict.fromkeys(joined))} back in"
    how = f"restarting with {len(kept_ps)} ps from the chief's backup" if gone_ps else \
        "restarting without it: the chief, not connected yet, would wait for it"
    return _resize(places, group, members, now_lost - set(joined), f"{what}; {how}",
                   hosts | set(joined), Act.REGROUP, ps=kept_ps)


def ps_on_answer(elastic: ElasticSpec, places: Sequence[Place], group: Group,
                 answering: Collection[str]) -> Decision:
    """A parameter_server job's hosts that answered a probe: its dropped workers there start
    again alone (`Act.REJOIN`: the chief's TF_CONFIG still lists them, and its
    ClusterCoordinator takes them back once they serve); no epoch boundary is waited for.
    A place that is not in the chief's TF_CONFIG (left out at a ps loss's restart) waits for
    the job's next restart. A lost host that answers is lost no more."""
    back = frozenset(answering)
    still_lost = group.lost - back
    joining = frozenset(s for s in group.dropped if places[s].where in back)
    if not joining:
        return NoResize(dataclasses.replace(group, lost=still_lost), "no place to add")
    if group.resizes >= elastic.max_resizes:
        return NoResize(dataclasses.replace(group, lost=still_lost), (
            f"no resize left (elastic.max_resizes {elastic.max_resizes}): stays at "
            f"{group.size} workers"))
    hosts = list(dict.fromkeys(places[s].where for s in sorted(joining)))
    return _resize(places, group, list(group.members), still_lost,
                   f"{', '.join(hosts)} answered again", hosts, Act.REJOIN,
                   dropped=group.dropped - joining)


def plan_for(plan: Plan, places: Sequence[Place], group: Group,
             ps_places: Sequence[Place] = (), **kwargs: Any) -> Plan:
    """The plan of the group: `plan` (the run's, of any size) with its workers the group's
    places, indices 0..n-1 in the group's order, each at its place's port and node; every
    other task as it was. TF_CONFIG lists n workers, TFO_IS_CHIEF is worker 0's, and every
    task's env has TFO_NUM_WORKERS. A parameter_server group's ps are its ps places
    (`ps_places`, `group.ps`), as its workers are. `kwargs` go to make_plan (`python`,
    `gpus` defaults to the GPUs the first plan's `auto` hosts reported, `plan.host_gpus`).
    The plan's spec stays the run's (the whole pool)."""
    spec = plan.spec
    sized = {Role.WORKER: [places[s] for s in group.members]}
    if group.ps:
        sized[Role.PS] = [ps_places[s] for s in group.ps]

    def address(p: Place) -> Address:
        return Address(host=spec.scheduler if p.node and spec.scheduler else p.host, port=p.port)

    tasks_spec = spec.tasks.model_copy(update={
        role.value: [address(p) for p in at] for role, at in sized.items()})
    others = [t for t in plan.tasks if t.role not in sized]
    nodes = {t.name: t.placement.host for t in others
             if spec.scheduler and t.placement.kind == spec.scheduler}
    nodes |= {task_name(role, i): p.node for role, at in sized.items()
              for i, p in enumerate(at) if p.node}
    ports = {t.name: t.port for t in others}
    ports |= {profiler_key(t.name): t.profiler_port for t in others
              if t.profiler_port is not None}
    ports |= {profiler_key(task_name(role, i)): p.profiler_port for role, at in sized.items()
              for i, p in enumerate(at) if p.profiler_port is not None}
    kwargs.setdefault("gpus", plan.host_gpus)
    new = make_plan(spec.model_copy(update={"tasks": tasks_spec}), run_id=plan.run_id,
                    run_dir=plan.run_dir, workdir=plan.workdir, ports=ports, nodes=nodes,
                    **kwargs)
    size = str(len(group.members))
    tasks = [dataclasses.replace(t, env=_place_backup({**t.env, NUM_WORKERS_ENV: size},
                                                      group.members[t.index]))
             if t.role is Role.WORKER else
             dataclasses.replace(t, env={**t.env, NUM_WORKERS_ENV: size}) for t in new.tasks]
    return dataclasses.replace(new, spec=spec, tasks=tasks)


class First(NamedTuple):
    """An elastic run's start, planned once (pipeline.run) and handed to the Supervisor:
    the plan of its first group, the places it keeps (their ports and nodes the run's plan
    gave them) and the group."""

    plan: Plan  # the first group's
    places: tuple[Place, ...]
    group: Group
    ps_places: tuple[Place, ...] = ()  # a parameter_server job's


def first(plan: Plan) -> First:
    """The run's plan (of the whole pool: plan.json's) → the plan of the first group, the
    places and the group."""
    spec = plan.spec
    assert spec.elastic is not None
    nodes = {t.name: t.placement.host for t in plan.tasks
             if spec.scheduler and t.placement.kind == spec.scheduler}
    places = pool(spec, plan.ports(), nodes)
    ps_places = pool(spec, plan.ports(), nodes, Role.PS) \
        if plan.strategy is Strategy.PARAMETER_SERVER else ()
    group = first_group(spec.elastic, places, ps_places)
    return First(plan_for(plan, places, group, ps_places=ps_places), places, group, ps_places)


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
    """Each worker's backup directory in `plan` (and a multi_worker_mirrored chief task's,
    where there is one): task name → (host, path on that host). `script`: a script's own
    BackupAndRestore directory (its `backup` marker's, as backups.told keeps it: relative to
    the task's cwd, absolute, or in its TFO_BACKUP_DIR)."""
    return {t.name: (t.host, backups.script_dir(script, t.cwd, t.env[BACKUP_DIR_ENV])
                     if script else t.env[BACKUP_DIR_ENV])
            for t in plan.tasks if t.role is Role.WORKER
            or (t.role is Role.CHIEF and plan.strategy is Strategy.MULTI_WORKER_MIRRORED)}


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
    host first. The tasks themselves (worker_entry.backup.TaskBackup) then agree on the same
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


__all__ = ["NUM_WORKERS_ENV", "Act", "Decision", "Group", "NoResize", "Place", "Resize",
           "Resume", "Why", "at_epoch_boundary", "backup_dirs", "failures_in_row",
           "first_group", "lost_why", "on_answer", "on_lost", "own_failure", "plan_for", "pool",
           "previous_dirs", "probe_due", "ps_on_answer", "ps_on_lost", "resume_from",
           "to_probe", "trained_well", "unfilled_joiners"]
