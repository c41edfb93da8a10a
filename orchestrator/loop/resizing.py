"""An elastic job's resizes, carried out (issue 27): orchestrator/elastic/groups.py decides who
trains, this acts on the loop's Job, as exits.py acts on decide's answers.

    first = elastic.first(plan)                     # the first group's plan (pipeline.run)
    resizing = make(job, intake, first, probe)      # the job's plan is first.plan
    exits.resize = resizing.lost                    # a loss: shrink, or the policy decides
    resizing.tick(now)                              # each round: probes, and a grow at an
                                                    # epoch boundary

A resize is a restart of the whole training group at a new size, not counted against
max_restarts: the group is stopped (SIGTERM, the grace, SIGKILL: a grow's stop is a
preemption the tasks save at), `job_resized` is written, the backups are filled where a
joining worker lacks the group's (backups.copy_backup), and the records follow the new plan (a
name gone is set aside, one back takes its record again: its attempts go on counting).

A parameter_server job's resize stops less (elastic.Act): a lost worker is dropped (its
record set aside; nothing else stops: the chief's ClusterCoordinator goes on with the
others), and rejoins alone on the same plan once its host answers a probe; a lost ps
restarts the training tasks on the plan of the ps left, the chief from its own backup.

A place is lost (elastic.Why) when a start on it failed, its lifeline was cut (its
handle lost contact), or its tasks failed lost_after_failures times
of their own in a row (elastic.failures_in_row: a failure that followed a peer's loss or stall
is not the place's own, `own_failure`; an epoch trained ends the row, `trained_well`).
Probes run in a daemon thread, each bounded by the host's connect timeout: the loop never
waits on a host that does not answer.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Collection

from orchestrator.elastic import groups as elastic
from orchestrator.elastic.backupstore import BackupStore
from orchestrator.elastic.groups import Act, First, Group, NoResize, Place, Resize
from orchestrator.loop import decide
from orchestrator.loop.backupfill import Refill
from orchestrator.loop.decide import JobState, TaskState
from orchestrator.loop.intake import Intake
from orchestrator.loop.job import Job
from orchestrator.loop.records import TaskRecord
from orchestrator.loop.stopping import lost_contact, stop
from orchestrator.planning.plan import Plan, task_name
from orchestrator.planning.spec import LOCALHOST, ClusterSpec
from worker_entry.markers import Role

Probe = Callable[[str], bool]  # a place's `where` → does it answer


def make(job: Job, intake: Intake, first: First, probe: Probe | None = None,
         store: BackupStore | None = None, refill: Refill | None = None) -> Resizing:
    """The job's Resizing: a parameter_server job's (its ps places) is a PsResizing.
    `refill`: the job's (the restart policy's restarts fill the same copies)."""
    if first.ps_places:
        return PsResizing(job, intake, first.places, first.group, first.ps_places, probe, store)
    return Resizing(job, intake, first.places, first.group, probe, store, refill)


def _set_aside(gone: dict[str, TaskRecord], rec: TaskRecord) -> None:
    """A record whose name left the plan, kept for when the name comes back."""
    gone[rec.name] = rec
    if rec.log is not None:  # reopened (appended to) if the name comes back
        rec.log.close()
        rec.log = None


def reachable(spec: ClusterSpec, where: str) -> bool:
    """A probe: does a place's host answer. This machine always does; an SSH host when its
    SSH port accepts a connection within its connect timeout; a scheduler's node is not
    asked (the allocation says which nodes there are): no."""
    host = where.partition(":")[0] if where.startswith(f"{LOCALHOST}:") else where
    if host == LOCALHOST:
        return True
    h = spec.hosts.get(host)
    if h is None:
        return False
    try:
        socket.create_connection((h.address, h.port), timeout=h.connect_timeout_seconds).close()
    except OSError:
        return False
    return True


def trained_well(rec: TaskRecord) -> bool:
    """Its attempt trained well (elastic.trained_well): an epoch, or a step where it tells
    no epochs."""
    pace = rec.current.work.pace
    return elastic.trained_well(pace.epoch is not None, pace.epoch_over or pace.epoch_end,
                                pace.step is not None)


class Resizing:
    """An elastic multi_worker_mirrored job's (and, through PsResizing, a parameter_server
    job's) resizes in the loop."""

    def __init__(self, job: Job, intake: Intake, places: tuple[Place, ...], group: Group,
                 probe: Probe | None = None, store: BackupStore | None = None,
                 refill: Refill | None = None) -> None:
        self.job, self.intake, self.places, self.group = job, intake, places, group
        self.store = store or BackupStore()  # this machine's backups only
        # The chief's backup copied where a script's BackupAndRestore needs it (its copies
        # removed once the group trains: Refill.tick, each round of the loop).
        self.refill = refill or Refill(job, self.store)
        assert job.plan.spec.elastic is not None
        self.elastic = job.plan.spec.elastic
        self.probe = probe or (lambda where: reachable(job.plan.spec, where))
        self.failures: dict[str, int] = {}  # place (`where`) → its failures in a row
        self.answering: frozenset[str] = frozenset()  # those that answered the last probe
        self.probed_at: float | None = job.clock()  # the first probe a probe_seconds in
        self._probing: threading.Thread | None = None
        self._answers: frozenset[str] | None = None  # a probe's result, for the loop to take
        self.seen_epoch: int | None = None  # worker 0's epoch when the loop last looked
        self.gone: dict[str, TaskRecord] = {}  # records of names a shrink dropped
        self.resized: list[dict] = []  # each job_resized's fields (RunResult.resizes)
        self._not_grown: set[str] = set()  # lab hosts back that a grow was refused, said once

    # ---- shrink -------------------------------------------------------------------------
    def where(self, rec: TaskRecord) -> str | None:
        """The place of a worker's task; None: a task whose loss no resize answers."""
        if rec.role is Role.WORKER:
            return self.places[self.group.members[rec.task.index]].where
        return None

    def lost(self, rec: TaskRecord, rc: int | None, why: str) -> bool:
        """A training task lost (Exits.lost, before decide.on_loss): True when the group
        resizes without its place; False: the restart policy decides, as for any job."""
        job = self.job
        where = self.where(rec)
        if where is None or job.state is JobState.FINISHING:
            return False
        own = elastic.own_failure(
            (r.state is TaskState.FAILED or bool(lost_contact(r)) or (
                r.handle is not None and r.handle.poll() not in (None, 0)),
             r.current.work.stopped_since is not None)
            for r in job.unit(rec) if r is not rec and r.state is not TaskState.PENDING)
        before = 0 if trained_well(rec) else self.failures.get(where, 0)
        self.failures[where] = elastic.failures_in_row(before, own)
        lifeline = bool(lost_contact(rec))
        how = elastic.lost_why(self.elastic, start_failed=rec.handle is None and rc is None,
                               lifeline_cut=lifeline, failures_in_row=self.failures[where])
        if how is None:
            return False
        d = self._decide({where: how})
        if isinstance(d, NoResize):
            self.group = d.group
            if d.follow_policy:
                job.echo("tfo", d.reason)
            return not d.follow_policy
        self._act(d, why)
        return True

    def _decide(self, lost: dict[str, elastic.Why]) -> elastic.Decision:
        return elastic.on_lost(self.elastic, self.places, self.group, lost, self.answering)

    def _act(self, d: Resize, why: str) -> None:
        self.resize(d, f"{why}; {d.words}", peer_lost=True)

    def _resized(self, d: Resize, save: int | None) -> None:
        """job_resized, the run's list of resizes, and the [tfo] line."""
        self.job.events.write("job_resized", **d.event, save=save)
        self.resized.append({**d.event, "save": save})
        self.job.echo("tfo", f"resized: {d.words}" + (
            f"; resuming from backup {save}" if save is not None else ""))

    # ---- grow ---------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Each round: a place whose task trained well ends its row of failures; take a
        probe's answers, start the next probe when due, and at an epoch boundary with a
        place answering, grow."""
        for rec in self.job.records.values() if self.failures else ():
            # A running attempt's success ends its place's row (a failed one's: `lost`).
            where = self.where(rec)
            if where in self.failures and rec.state is TaskState.RUNNING and \
                    trained_well(rec):
                del self.failures[where]
        if self._answers is not None:
            self.answering, self._answers = self._answers, None
        if self._probing is None or not self._probing.is_alive():
            wanted = elastic.to_probe(self.places, self.group)
            if wanted and elastic.probe_due(now, self.probed_at, self.elastic):
                self.probed_at = now
                self._probing = threading.Thread(target=self._probe, args=(wanted,),
                                                 name="tfo-probe", daemon=True)
                self._probing.start()
        self._grow()

    def _grow(self) -> None:
        """At worker 0's next epoch, with a place answering: the group grows."""
        chief = self.job.records.get("worker:0")
        epoch = chief.current.work.progress.epoch if chief is not None and \
            chief.current.work.progress is not None and chief.state is TaskState.RUNNING \
            else None
        boundary = elastic.at_epoch_boundary(self.seen_epoch, epoch)
        self.seen_epoch = epoch
        if not boundary or not self.answering or self.job.state is not JobState.RUNNING:
            return
        d = elastic.on_answer(self.elastic, self.places, self.group, self.answering)
        if not isinstance(d, Resize):
            self.group = d.group
        elif far := elastic.unfilled_joiners(self.places, self.group, d.group,
                                             self.store.reaches):
            if set(far) - self._not_grown:
                self._not_grown |= set(far)
                self.job.echo("tfo", f"{', '.join(far)} answered again; not grown onto it: "
                              "its backup directory cannot be filled from here, and the "
                              "group would start over")
        else:
            self.resize(d, d.words)

    def _probe(self, wanted: Collection[str]) -> None:
        self._answers = frozenset(w for w in wanted if self.probe(w))

    # ---- the resize itself --------------------------------------------------------------
    def resize(self, d: Resize, why: str, peer_lost: bool = False) -> None:
        """Stop the training group, then restart it as `d.group`: not counted. `peer_lost`:
        a shrink (its survivors get the short grace); a grow's stop is a preemption the
        tasks save at, with the whole grace."""
        job = self.job
        job.set(None, JobState.RESTARTING)
        job.echo("tfo", f"resizing, {why}")
        unit = [r for r in job.records.values()
                if decide.training(r.role, job.rules) and not r.finished]
        stop(job, self.intake, unit, "resize", then=lambda: self._regroup(d, why),
             peer_lost=peer_lost)

    def _regroup(self, d: Resize, why: str) -> None:
        job = self.job
        old_plan, old_group = job.plan, self.group
        new = self._plan_for(d.group)
        save = self._fill_backups(old_plan, old_group, new, d.group)
        self._resized(d, save)
        self._follow(new, d.group)
        now = job.clock()
        for rec in job.records.values():
            if decide.training(rec.role, job.rules) and not rec.finished:
                job.restart(rec, why, now)

    def _plan_for(self, group: Group) -> Plan:
        return elastic.plan_for(self.job.plan, self.places, group)

    def replan(self, unit: list[TaskRecord]) -> bool:
        """Before the restart policy restarts `unit` (Exits.restart): a new plan? (a
        parameter_server job's only)"""
        return False

    def _follow(self, new: Plan, group: Group) -> None:
        """The records follow the new plan: a name gone is set aside, one back takes its
        record again (its attempts go on counting)."""
        job = self.job
        names = {t.name for t in new.tasks}
        for name in [n for n in job.records if n not in names]:
            _set_aside(self.gone, job.records.pop(name))
        records = {}
        for t in new.tasks:
            rec = job.records.get(t.name) or self.gone.pop(t.name, None) or TaskRecord(t)
            rec.task = t
            records[t.name] = rec
        job.records.clear()
        job.records.update(records)
        job.plan, self.group = new, group
        self.failures = {w: n for w, n in self.failures.items()
                         if w in {self.places[s].where for s in group.members}}
        self.seen_epoch = None

    def _fill_backups(self, old_plan: Plan, old: Group, new_plan: Plan,
                      new: Group) -> int | None:
        """The backup the new group resumes from (None: none in common, or not known),
        copied into the directories of workers that lack it (Refill.fill). Each worker's
        directory is its place's (elastic.plan_for), so after a shrink none lacks tfo's own
        backup; a place joining may, and with a script's own BackupAndRestore (the chief's
        alone) every worker but the chief does."""
        script = self.job.script_backup
        return self.refill.fill(elastic.backup_dirs(new_plan, script),
                                elastic.previous_dirs(old_plan, old, new_plan, new, script))


class PsResizing(Resizing):
    """A parameter_server job's (elastic.ps_on_lost, ps_on_answer): a lost worker dropped
    while the chief trains on, and back alone when its host answers; a lost ps restarts the
    job with the ps left."""

    def __init__(self, job: Job, intake: Intake, places: tuple[Place, ...], group: Group,
                 ps_places: tuple[Place, ...], probe: Probe | None = None,
                 store: BackupStore | None = None) -> None:
        super().__init__(job, intake, places, group, probe, store)
        self.ps_places = ps_places

    def where(self, rec: TaskRecord) -> str | None:
        if rec.role is Role.PS:
            return self.ps_places[self.group.ps[rec.task.index]].where
        return super().where(rec)

    def _decide(self, lost: dict[str, elastic.Why]) -> elastic.Decision:
        chief = next((r for r in self.job.records.values() if r.role is Role.CHIEF), None)
        return elastic.ps_on_lost(self.elastic, self.places, self.ps_places, self.group, lost,
                                  self.answering, chief_up=chief is not None
                                  and chief.state is TaskState.RUNNING)

    def _act(self, d: Resize, why: str) -> None:
        if d.act is Act.DROP:
            self._drop(d)
        else:
            super()._act(d, why)

    def _grow(self) -> None:
        """Dropped workers whose hosts answered rejoin at once: the chief never stopped."""
        if self.answering and self.group.dropped and self.job.state is JobState.RUNNING:
            d = elastic.ps_on_answer(self.elastic, self.places, self.group, self.answering)
            if isinstance(d, Resize):
                self._rejoin(d)
            else:
                self.group = d.group

    def _plan_for(self, group: Group) -> Plan:
        return elastic.plan_for(self.job.plan, self.places, group, ps_places=self.ps_places)

    def _drop(self, d: Resize) -> None:
        """A parameter_server job's lost workers set aside (stopped where one still runs: a
        stall's loss); the chief and the others go on, nothing else stops."""
        job = self.job
        names = [task_name(Role.WORKER, i) for i, s in enumerate(d.group.members)
                 if s in d.group.dropped - self.group.dropped]
        gone = {self.places[s].where for s in d.group.dropped}
        self.failures = {w: n for w, n in self.failures.items() if w not in gone}
        self.answering -= gone  # back only once a probe after this says so
        self.group = d.group
        recs = [job.records[n] for n in names if n in job.records]

        def dropped() -> None:
            for rec in recs:
                _set_aside(self.gone, job.records.pop(rec.name))
            self._resized(d, None)

        stop(job, self.intake, recs, "resize", then=dropped)

    def _rejoin(self, d: Resize) -> None:
        """A parameter_server job's dropped workers whose hosts answered: each starts again
        alone, on the same plan (the chief's TF_CONFIG still names it), not counted."""
        job = self.job
        back = [task_name(Role.WORKER, i) for i, s in enumerate(d.group.members)
                if s in self.group.dropped - d.group.dropped]
        self.group = d.group
        self._resized(d, None)
        now = job.clock()
        for name in back:
            rec = self.gone.pop(name)
            job.records[name] = rec
            job.restart(rec, d.words, now)
        ordered = {t.name: job.records[t.name] for t in job.plan.tasks if t.name in job.records}
        job.records.clear()  # in the plan's order again (the tables list them so)
        job.records.update(ordered)

    def replan(self, unit: list[TaskRecord]) -> bool:
        """Before the restart policy restarts a parameter_server job's chief (Exits.restart,
        its unit stopped): the plan without the dropped workers, whose places leave the
        chief's TF_CONFIG (a chief does not connect while a worker it names does not
        serve). True: the records changed."""
        group = self.group
        if not group.dropped or not any(r.role is Role.CHIEF for r in unit):
            return False
        left = [self.places[s].where for s in sorted(group.dropped)]
        new = Group(tuple(s for s in group.members if s not in group.dropped), group.lost,
                    group.resizes, group.ps)
        self._follow(self._plan_for(new), new)
        self.job.echo("tfo", f"{', '.join(left)} left out of the chief's TF_CONFIG as the "
                      "job restarts (dropped: the chief would wait for it)")
        return True

    def _fill_backups(self, old_plan: Plan, old: Group, new_plan: Plan,
                      new: Group) -> int | None:
        """The newest backup in the chief's directory (its coordinator restores it; the
        servers hold none): nothing to fill."""
        chief = next(t for t in new_plan.tasks if t.role is Role.CHIEF)
        where = (chief.host, chief.env[elastic.BACKUP_DIR_ENV])
        try:
            held = self.store.held(where) if self.store.reaches(chief.host) else ()
        except Exception as e:  # noqa: BLE001 - a host gone mid-resize: the chief still reads it
            self.job.events.write("job_backups_not_read", error=str(e))
            return None
        return max(held, default=None)
