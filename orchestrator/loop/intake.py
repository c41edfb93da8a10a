"""What the tasks print, taken in: each handle's lines (its reader already wrote them to
the log) are markers, which change the task's attempt and are written as events, or
ordinary lines, which go to the console. Output is untrusted: a line that only looks like
a marker is an ordinary line."""

from __future__ import annotations

from orchestrator.elastic.backups import told
from orchestrator.elastic.groups import BACKUP_DIR_ENV
from orchestrator.loop import closures, decide
from orchestrator.loop.decide import TaskState
from orchestrator.loop.job import Job
from orchestrator.loop.joined import Planned, judge
from orchestrator.loop.markers import (
    Backup,
    BadMarker,
    Checkpointed,
    Closures,
    Done,
    Epoch,
    Evaluated,
    Exiting,
    FirstStep,
    Input,
    Joined,
    Progress,
    SigTerm,
    Usage,
    read_marker,
)
from orchestrator.loop.rate import rated, shown
from orchestrator.loop.records import TaskRecord
from orchestrator.loop.stall import paced
from worker_entry import markers
from worker_entry.markers import Role


class Intake:
    def __init__(self, job: Job) -> None:
        self.job = job

    def pump(self) -> None:
        for rec in self.job.records.values():
            if rec.handle is not None and (lines := rec.handle.lines()):
                self.consume(rec, lines)

    def collect(self, rec: TaskRecord, rc: int | None) -> None:
        """An exit: the handle's last lines, then its code and what it says of how it ended."""
        assert rec.handle is not None
        self.consume(rec, rec.handle.close())  # the handle also removes the task's temp dir
        rec.current.returncode = rc
        rec.current.exit_reason = getattr(rec.handle, "exit_reason", None) or ""
        self._judge(rec, ended_well=rc == 0 or rec.torn_down_ok)

    def consume(self, rec: TaskRecord, lines: list[str]) -> None:
        job = self.job
        for line in lines:
            own = {"attempt": rec.attempt, "pid": rec.pid}
            try:
                marker = read_marker(line)
            except BadMarker as e:
                job.events.write("task_bad_marker", rec.name, **own, error=str(e))
                marker = None
            if isinstance(marker, Usage):  # every few seconds per task: state, not an event
                self._measured(rec, marker)
                continue
            if isinstance(marker, Input):  # as a usage: state, not an event
                rec.current.work.waits.take(marker.at, marker.waited, job.clock())
                continue
            rec.current.work.busy_at = job.clock()  # a sign of work (stalls, startup, sidecars)
            if marker is None:
                rec.last_line = line
                if rec.stack_lines is not None:
                    rec.stack_lines.append(line)
                job.echo(rec.name, line)
                continue
            rec.current.last_marker = marker.event
            if isinstance(marker, SigTerm):
                rec.current.sigterm = True
            rec.current.done = rec.current.done or marker.event == markers.DONE
            if isinstance(marker, Exiting):
                rec.current.exiting_at, rec.current.exiting_code = job.clock(), marker.code
            if isinstance(marker, Progress):
                self._resumed(rec, marker)
                self._progressed(rec, marker)
            elif isinstance(marker, Checkpointed):
                last = rec.current.work.progress
                job.resumes.checkpoint(rec.name, rec.attempt, marker.op, marker.path,
                                       marker.step, marker.epoch,
                                       last.epoch if last is not None else None)
            elif isinstance(marker, Epoch):
                rec.current.work.epoch_begun = marker.epoch
            if marker.event == markers.READY and rec.state is TaskState.STARTING:
                self._up(rec)
            elif isinstance(marker, Evaluated):
                job.evaluation = {"epoch": marker.epoch, "metrics": marker.metrics}
            elif isinstance(marker, Backup) and rec.role in (Role.WORKER, Role.CHIEF):
                job.script_backup = told(marker.dir, rec.task.cwd,
                                         rec.task.env.get(BACKUP_DIR_ENV, "/nonexistent"))
            elif isinstance(marker, Joined):
                rec.current.joins.append(marker)
            elif isinstance(marker, Done):
                rec.done = marker  # what its entry returned (orchestrator.run's value)
            ours = own
            if isinstance(marker, Closures) and rec.role is Role.CHIEF:
                finished = rec.current.closures
                closures.take(finished, marker, closures.attempts(job), job.clock())
                ours = {**own, "closures_per_second": closures.per_second(finished, job.clock())}
            if isinstance(marker, Progress) and \
                    (rate := shown(rec.current.work.rate, job.clock())) is not None:
                ours = {**own, "steps_per_second": float(f"{rate:.4g}")}  # as the table shows
            job.events.write(f"task_{marker.event}", rec.name, **{**marker.record(), **ours})
            if isinstance(marker, Progress | FirstStep):
                self._judge(rec)  # at its first step: did it join the plan's cluster?
            if isinstance(marker, Progress | FirstStep) and rec.state is TaskState.STARTING:
                # It trains, so it is up: a one-process script (MirroredStrategy, the
                # default strategy) opens no port for its wrapper to see.
                self._up(rec)
                job.events.write("task_ready", rec.name, **own, what="training", by="step")

    def _judge(self, rec: TaskRecord, ended_well: bool | None = None) -> None:
        """Once an attempt, at its first step (`ended_well` None) or its end: a training
        task that trains outside the plan's cluster is told at once (task_alone, the
        console) and fails the job (Checks.alone)."""
        job, attempt = self.job, rec.current
        if attempt.judged or not decide.judged_now(
                rec.role, job.policy, job.rules, stepped=ended_well is None,
                ended_well=bool(ended_well), built=bool(attempt.joins)):
            return
        attempt.judged = True
        alone = judge(Planned(rec.name, job.plan.strategy, rec.task.tf_config["cluster"]),
                      attempt.joins)
        if alone is None:
            return
        job.events.write("task_alone", rec.name, attempt=rec.attempt, pid=rec.pid,
                         **alone.fields())
        for line in alone.lines():
            job.echo("tfo", line)
        job.alone.append(alone)

    def _up(self, rec: TaskRecord) -> None:
        self.job.set(rec, TaskState.RUNNING)
        rec.current.running_at = self.job.clock()

    def _measured(self, rec: TaskRecord, marker: Usage) -> None:
        work = rec.current.work
        work.usage, work.usage_at = marker, self.job.clock()
        if marker.wanted >= decide.busy_cpu(rec.role, self.job.rules):
            work.busy_at = work.usage_at
        if not marker.stopped:
            work.stopped_since = None
        elif work.stopped_since is None:
            work.stopped_since = work.usage_at

    def _resumed(self, rec: TaskRecord, marker: Progress) -> None:
        """A training task's progress: on its attempt's first, how the attempt began against
        what its unit had reached (orchestrator/loop/resumes.py), said once per attempt and words
        (every worker of a group restart says the same)."""
        job = self.job
        if not decide.training(rec.role, job.rules):
            return
        unit = rec.name if decide.restarts_alone(rec.role, job.rules) else "training"
        said = job.resumes.progressed(rec.name, unit, rec.attempt, marker.step, marker.epoch)
        if said is None:
            return
        fields = said.event()
        job.events.write("task_resumed", rec.name, attempt=rec.attempt, pid=rec.pid, **fields)
        told = job.resumes.said
        if not any(t["attempt"] == rec.attempt and t["words"] == fields["words"] for t in told):
            job.echo("tfo", f"{rec.name} (attempt {rec.attempt}) {fields['words']}")
        told.append({"task": rec.name, "attempt": rec.attempt, **fields})

    def _progressed(self, rec: TaskRecord, marker: Progress) -> None:
        work = rec.current.work
        now = self.job.clock()
        work.rate = rated(work.rate, marker.at, marker.step, now)
        work.pace = paced(work.pace, now, marker.step, marker.epoch, marker.step_in_epoch,
                          marker.steps, marker.epochs)
        work.progress = marker
