"""Every worker of a multi_worker_mirrored group that starts again restores the same backup.

A script's own tf-keras BackupAndRestore (the tutorial's; `BackupAndRestore(backup_dir=
os.environ["TFO_BACKUP_DIR"])` too) lets the chief alone keep the backup, in
`backup_dir/chief`, and has every worker restore from its own `backup_dir/chief`. Where that
path is not one directory for all (each task's TFO_BACKUP_DIR; a relative or absolute path on
lab hosts without a shared filesystem), the others hold nothing, or a stale copy, beside the
chief's epoch N, and the restore's collectives mismatch on every restart. So before the
group starts again (a restart of the policy, an elastic resize) the chief's newest backup is
copied into the directories that lack it (elastic.resume_from decides, the BackupStore
acts: this machine's files, a lab host's over its SSH connection), and those copies are
removed once every worker took a step (tf-keras never updates them: a later start would
restore the stale copy beside the chief's newer backup).

tfo's own `TaskBackup` (ctx.callbacks()) keeps a backup in every task's directory and the
workers agree on one among themselves: nothing to fill (job.script_backup None).

    refill = Refill(job, store)
    refill.restarting(unit)            # Exits.restart, the unit stopped, before it starts
    refill.fill(wanted, had)           # an elastic resize's (resizing._fill_backups)
    refill.tick()                      # each round: copies removed once the group trains;
                                       # a directory that cannot be filled, said once

Design: Backups across restarts
====================

Issue 37. Every worker of an MWMS group that starts again must restore the same backup, or
the restore's collectives mismatch ("Collective instance 118 expected … data_type 9 but got
… 1") on every restart. tfo's own `TaskBackup` (`ctx.callbacks()`) keeps a backup in every
task's TFO_BACKUP_DIR and the workers agree on one (an all-gather before restoring): nothing
for the coordinator to do. tf-keras's `BackupAndRestore`, as a script uses it, lets the
chief alone keep the backup, in `backup_dir/chief`, and has every worker restore from its
own `backup_dir/chief`: with `backup_dir=os.environ["TFO_BACKUP_DIR"]` (one directory per
task) or a path on lab hosts without a shared filesystem, the others hold nothing beside the
chief's epoch N. So progress.auto tells the directory (a `backup` marker, once a task, as the
fit starts; not with `TFO_AUTO_PROGRESS=0`), the coordinator keeps it for every worker
(`Job.script_backup`, `backups.told`: `$TFO_BACKUP_DIR` for each task's own, else relative
to the task's cwd, the same under each host's workdir, else absolute), and
`backupfill.Refill` copies the chief's newest backup (the newest any worker's directory
holds, `elastic.resume_from(chief_keeps=True)`) into the directories that lack it (hard
links on one filesystem: a model's size costs nothing, and TensorFlow never rewrites a
checkpoint's files) before the group starts again: a restart of the policy (`Exits.restart`
→ `exits.refill`, the unit stopped, before its backoff), a resize
(`Resizing._fill_backups`), a rerun's first start. Through `launch/backupstore.BackupStore`:
this machine's files, a lab host's over its SSH connection (the store is the run's for every
job now, not only an elastic one's). The copies (not worker 0's directory) are removed once
every worker took a step (`Refill.tick`, each round): tf-keras never updates them, and a
later start would restore the stale copy beside the chief's newer backup. A path every
worker shares (one machine) is held everywhere and nothing is copied. A worker's directory
the store cannot reach (a scheduler's node) is said in a `[tfo]` line as the fit starts
(`backupfill.unfillable`): a restart would fail unless the path is shared.

A rerun (`tfo rerun`, `tfo run runs/<id>/plan.json`; `pipeline.Loaded.old`) resumes:
before its first start, `backupfill.rerun` copies each task's old TFO_BACKUP_DIR into its
new one on the same host (`BackupStore.carry`: `cp -pR` on a lab host), learns a script's
directory from the old run's `task_backup` events (`told_before`), fills as for a restart,
and says what training resumes from (`rerun of ID: training resumes from its backup N`, or
`it left no backup …: training starts over`; a `job_rerun` event `{of, carried, save}`). A
run that finished leaves no backup (tf-keras removes the chief's at the end).

Tested (`tests/test_backups.py`, real processes, the epochs from each task's own `Epoch N/M`
lines in its last attempt; 2 cores at load 20-27): the tutorial on TFO_BACKUP_DIR, 2
workers, worker:1 SIGKILLed in epoch 3: one restart, both resume at the same epoch ≥ 2 and
finish, no copy left (136 s; before: every restart failed as above, the job lost); the same
in an elastic job, 3 → 2 from the chief's backup (134 s; before: no backup in common, both
places lost); tfo SIGKILLed in epoch 3 and `tfo rerun`: both workers of the new run resume
at the old run's backup (90 s; before: epoch 1); on real directories, without TensorFlow: a
restart's copy and its removal once the group trains or finished, a rerun's carry-over or
its "starts over", a directory it cannot fill said once. `tests/test_backups_lab.py` (SSH
lab): the tutorial with `--backup_dir bk` on two lab hosts, lab2's link down 23 s, restart
policy only: both resume at the same epoch from the chief's backup copied to lab2 over sftp
(194 s; before: 10 restarts, each failing on the collectives, job failed after 416 s); the
tutorial on TFO_BACKUP_DIR on two lab hosts, tfo SIGKILLed, `tfo rerun`: both resume from
the old run's backup (carried with `cp -pR` on each host, the chief's copied to lab2; 106
s).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from orchestrator.elastic import backups
from orchestrator.elastic import groups as elastic
from orchestrator.elastic.backupstore import BackupStore
from orchestrator.elastic.groups import BACKUP_DIR_ENV, Dir
from orchestrator.loop.decide import TaskState
from orchestrator.loop.job import Job
from orchestrator.loop.records import TaskRecord
from orchestrator.planning.plan import Plan
from orchestrator.runs.rundir import RunDir
from worker_entry.markers import Role, Strategy


def group_trains(records: Iterable[TaskRecord]) -> bool:
    """Every worker of the group runs and took a step since its start (a fresh attempt's
    progress): it restored its backup; or finished (tf-keras removed the chief's backup
    then: a copy left would be a rerun's newest)."""
    return all(r.finished or (r.state is TaskState.RUNNING
                              and r.current.work.progress is not None)
               for r in records if r.role in (Role.WORKER, Role.CHIEF))


def chief_dir(wanted: Mapping[str, Dir]) -> Dir | None:
    """The chief's directory among the training tasks' (elastic.backup_dirs): a chief
    task's, else worker 0's."""
    return wanted.get("chief:0") or wanted.get("worker:0")


def unfillable(wanted: Mapping[str, Dir], reaches: Callable[[str], bool]) -> list[str]:
    """The workers whose backup directory is on another host than the chief's and cannot
    be filled from here (`reaches(host)` False: a scheduler's node): with the chief's backup
    the only one, they restore nothing beside the chief's epoch unless the path is shared."""
    chief = chief_dir(wanted)
    if chief is None:
        return []
    return [task for task, (host, path) in wanted.items()
            if (host, path) != chief and host != chief[0] and not reaches(host)]


class Refill:
    """The copies of the chief's backup a multi_worker_mirrored job's starts need."""

    def __init__(self, job: Job, store: BackupStore | None = None) -> None:
        self.job, self.store = job, store or BackupStore()
        # Copies of a script's backup in workers' directories other than worker 0's, removed
        # once the group trains.
        self.copies: list[Dir] = []
        self._checked: str | None = None  # the script_backup `tick` last looked at
        self.filled: list[str] = []  # the last fill's: the tasks whose directory got it
        self.unfilled: str | None = None  # the last fill's: why some could not get it

    def fill(self, wanted: Mapping[str, Dir], had: Mapping[str, Dir | None]) -> int | None:
        """The backup the group resumes from (None: none in common, or not known), copied
        into the directories of `wanted` (each worker's) that lack it; `had`: the directory
        each worker's place wrote before (elastic.previous_dirs; the same on a restart)."""
        job, script = self.job, self.job.script_backup
        self.filled, self.unfilled = [], None
        dirs = set(wanted.values()) | {x for x in had.values() if x is not None}
        if far := sorted({host for host, _ in dirs if not self.store.reaches(host)}):
            self.unfilled = f"{', '.join(far)}: cannot be reached from here"
            return None
        try:
            r = elastic.resume_from(wanted, had, {x: self.store.held(x) for x in dirs},
                                    chief_keeps=script is not None)
        except Exception as e:  # noqa: BLE001 - a host gone mid-restart: its start fails
            job.events.write("job_backups_not_read", error=str(e))
            self.unfilled = f"reading the backups: {e}"
            return None
        filled = self.filled
        for task, source in r.fills.items():
            try:
                self.store.copy(source, wanted[task], r.save)  # type: ignore[arg-type]
                filled.append(task)
            except Exception as e:  # noqa: BLE001 - as above
                job.events.write("task_backup_not_copied", task, source=list(source),
                                 error=str(e))
                self.unfilled = f"copying to {task}'s: {e}"
        if filled:
            job.events.write("job_backups_filled", save=r.save, tasks=filled)
        chief = chief_dir(wanted)
        new = [wanted[t] for t in filled if script and wanted[t] != chief]
        self.copies = [d for d in dict.fromkeys([*self.copies, *new]) if d != chief]
        return r.save

    def restarting(self, unit: list[TaskRecord]) -> None:
        """Before the restart policy starts `unit` again (stopped): where the chief keeps
        the only backup, the other workers' directories get it."""
        job = self.job
        if job.script_backup is None or job.plan.strategy is not Strategy.MULTI_WORKER_MIRRORED \
                or not any(r.role in (Role.WORKER, Role.CHIEF) for r in unit):
            return
        wanted = elastic.backup_dirs(job.plan, job.script_backup)
        save = self.fill(wanted, wanted)
        if self.unfilled is not None:
            job.echo("tfo", f"the chief's backup could not be copied to every worker "
                     f"({self.unfilled}): the workers may restore different epochs, and "
                     "this start fail on mismatched collectives")
        elif self.filled:
            job.echo("tfo", f"the chief's backup {save} copied to "
                     f"{', '.join(self.filled)}: every worker resumes from it")

    def tick(self) -> None:
        """Each round: the copies removed once the group trains; a script's backup directory
        that cannot be filled on some worker's host, said once, as training begins."""
        job = self.job
        if self.copies and group_trains(job.records.values()):
            copies, self.copies = self.copies, []
            for d in copies:
                try:
                    self.store.remove(d)
                except Exception as e:  # noqa: BLE001 - a host gone since: its copy stays
                    job.events.write("job_backup_not_removed", dir=list(d), error=str(e))
        script = job.script_backup
        if script is None or script == self._checked \
                or job.plan.strategy is not Strategy.MULTI_WORKER_MIRRORED:
            return
        self._checked = script
        far = unfillable(elastic.backup_dirs(job.plan, script), self.store.reaches)
        if far:
            shared = "each task's own TFO_BACKUP_DIR is never one directory, so" \
                if script.startswith(backups.TASK_DIR) else \
                "unless that path is on a filesystem every host shares,"
            job.echo("tfo", f"the script's BackupAndRestore keeps its backup in the chief's "
                     f"{script} alone, and tfo cannot copy it to the host of {', '.join(far)}: "
                     f"{shared} a restart will fail (the workers would restore different "
                     "epochs); ctx.callbacks()'s backup, kept by every task, needs no copy")


# ---- a rerun (`tfo rerun`, `tfo run runs/<id>/plan.json`) --------------------------------

def told_before(plan: Plan, events: Iterable[Mapping[str, Any]]) -> str | None:
    """A run's script BackupAndRestore directory as its workers told it (its `task_backup`
    events; backups.told's form), None: tfo's own (ctx.callbacks()) or none told."""
    tasks = {t.name: t for t in plan.tasks}
    found = None
    for e in events:
        t = tasks.get(e.get("task", ""))
        if e.get("event") == "task_backup" and t is not None \
                and t.role in (Role.WORKER, Role.CHIEF) \
                and isinstance(e.get("dir"), str):
            found = backups.told(e["dir"], t.cwd, t.env.get(BACKUP_DIR_ENV, "/nonexistent"))
    return found


def carry(old: Plan, new: Plan, store: BackupStore) -> list[str]:
    """A rerun resumes where `old` stopped: each task's TFO_BACKUP_DIR of `old` copied into
    the same task's of `new` (on the same host; a task whose host changed starts without).
    The tasks that got one."""
    before = {t.name: t for t in old.tasks}
    got = []
    for t in new.tasks:
        o = before.get(t.name)
        if o is None or o.host != t.host or BACKUP_DIR_ENV not in t.env \
                or BACKUP_DIR_ENV not in o.env or not store.reaches(t.host):
            continue
        try:
            if store.carry(t.host, o.env[BACKUP_DIR_ENV], t.env[BACKUP_DIR_ENV]):
                got.append(t.name)
        except Exception:  # noqa: BLE001 - a host that does not answer: its task starts over
            continue
    return got


def rerun(old: Plan, refill: Refill, say: Callable[[str], None]) -> None:
    """Before a rerun of `old` starts (its Supervisor made, nothing started): its backups
    carried into the new run directory, the chief's copied where a script's BackupAndRestore
    needs it, and what training resumes from said (and a `job_rerun` event)."""
    job = refill.job
    carried = carry(old, job.plan, refill.store)
    try:
        events, _ = RunDir(old.run_dir).read_events()
    except OSError:
        events = []
    job.script_backup = told_before(old, events)
    if job.script_backup is not None:
        refill.restarting(list(job.records.values()))
    chief = next((t for t in job.plan.tasks if t.env.get("TFO_IS_CHIEF") == "1"), None)
    where = None if chief is None else (chief.host, backups.script_dir(
        job.script_backup, chief.cwd, chief.env[BACKUP_DIR_ENV]) if job.script_backup
        else chief.env[BACKUP_DIR_ENV])
    try:
        save = max(refill.store.held(where), default=None) \
            if where is not None and refill.store.reaches(where[0]) else None
    except Exception:  # noqa: BLE001 - a host that does not answer: not known
        save = None
    job.events.write("job_rerun", of=old.run_id, carried=carried, save=save)
    if save is None:
        say(f"rerun of {old.run_id}: it left no backup (its training finished, or never got "
            "to one): training starts over")
    elif job.script_backup is None or job.script_backup.startswith(backups.TASK_DIR):
        say(f"rerun of {old.run_id}: training resumes from its backup {save} (copied into "
            "this run's backup directories)")
    else:
        say(f"rerun of {old.run_id}: training resumes from backup {save} in the script's "
            f"own backup directory {job.script_backup}")
