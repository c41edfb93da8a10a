"""A task's exit, and a loss (an exit that is one, a failed start, the startup limit, a
stall): `decide` says what follows, and this carries it out: the state the exit leaves,
a preemption, the job's end, or the restart of the task or its unit after its teardown and
the backoff."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.loop import decide, exitwords
from orchestrator.loop.decide import EndJob, JobState, Restart, TaskState
from orchestrator.loop.intake import Intake
from orchestrator.loop.job import Job
from orchestrator.loop.records import TaskRecord
from orchestrator.loop.stopping import lost_contact, stop
from worker_entry import markers


class Exits:
    def __init__(self, job: Job, intake: Intake) -> None:
        self.job, self.intake = job, intake
        # An elastic job's (resizing.Resizing.lost): True when a loss resized the group.
        self.resize: Callable[[TaskRecord, int | None, str], bool] | None = None
        # An elastic parameter_server job's (Resizing.replan), before a restart of its
        # chief: True when the plan (and the records) changed.
        self.replan: Callable[[list[TaskRecord]], bool] | None = None
        # Before a stopped unit starts again (backupfill.Refill.restarting): the chief's
        # backup copied where a script's BackupAndRestore needs it.
        self.refill: Callable[[list[TaskRecord]], None] | None = None

    def exited(self, rec: TaskRecord, rc: int) -> None:
        """Every task's exit, the sidecars' too, and while finishing."""
        job = self.job
        if rec.current.torn_down and not decide.stopped_in_teardown(rc):
            rec.current.torn_down = False  # it ended on its own meanwhile: the kernel's status
        # Stopped in its teardown after its code had ended with a status of its own (42:
        # preempted, saved; 1: an error): that is how it exited (exitwords).
        told = exitwords.exited(rc, lost_contact(rec), rec.current.torn_down,
                                rec.current.exiting_code)
        rc, how = told.returncode, told.how
        # The state decided, recorded: readers (tfo status) never work it out again. A
        # preemption (exit 42) is FAILED too, and restarts.
        state = decide.exit_state(rc, rec.torn_down_ok, rec.role, job.rules)
        job.events.write("task_exited", rec.name, pid=rec.pid, returncode=rc,
                         attempt=rec.attempt, how=how, state=state.value,
                         **({"teardown": True} if rec.torn_down_ok else {}))
        self.intake.collect(rec, rc)
        rec.current.ended_at = job.clock()
        if rc == markers.EXIT_PREEMPTED and job.state is not JobState.FINISHING:
            self.intake.pump()  # a peer's `sigterm` marker may still be on its way
            if self._preempted(rec):
                return
        lost = state is TaskState.FAILED
        job.set(rec, state)
        if job.state is JobState.FINISHING:
            return  # training is done: nothing restarts, nothing changes the outcome
        if not lost:
            if decide.training(rec.role, job.rules):
                job.echo("tfo", f"{rec.name} finished")
            return
        self.lost(rec, rc, exitwords.lost_why(rec.name, rc, lost_contact(rec),
                                              job.not_preempted(rec, rc)))

    def _preempted(self, rec: TaskRecord) -> bool:
        """`rec` exited EXIT_PREEMPTED: if a SIGTERM reached it or its restart unit this
        attempt, restart the unit without counting it (unless the restart policy is never)."""
        job = self.job
        unit = job.unit(rec)
        termed = [r.name for r in unit if r.current.sigterm]
        if not decide.preempted(rec.role, markers.EXIT_PREEMPTED, job.policy, bool(termed)):
            return False
        job.set(rec, TaskState.FAILED)
        why = (f"{rec.name} preempted (exit code {markers.EXIT_PREEMPTED} after SIGTERM to "
               f"{', '.join(termed)})")
        job.events.write("task_preempted", rec.name, attempt=rec.attempt, pid=rec.pid,
                         sigterm=termed)
        job.preemptions += 1
        self.restart(unit, why, counted=False)
        return True

    def lost(self, rec: TaskRecord, rc: int | None, why: str) -> None:
        """Carries out what decide.on_loss says: end the job, restart, or say so."""
        job = self.job
        if self.resize is not None and self.resize(rec, rc, why):
            return
        action = decide.on_loss(rec.name, rec.role, rc, why, job.plan.job, job.policy,
                                job.rules, rec.restarts, job.restarts)
        if isinstance(action, EndJob):
            job.end(JobState.FAILED, action.reason, action.task)
        elif isinstance(action, Restart):
            job.restarts += action.counted
            self.restart([rec] if action.alone else job.unit(rec), action.reason,
                         peer_lost=True)
        else:
            job.echo("tfo", action.text)

    def restart(self, unit: list[TaskRecord], why: str, counted: bool = True,
                peer_lost: bool = False) -> None:
        """Stop `unit` and start it again after the backoff. Not `counted`: a preemption,
        which no task's restarts count either. `peer_lost`: a member of the unit is gone,
        and the rest are stopped with the short grace. A task of the unit that finished
        stays finished: its work is done, and it could only do it again."""
        job = self.job
        unit = [r for r in unit if not r.finished]
        job.set(None, JobState.RESTARTING)
        # At once, unless a crash loop or a host that could not be reached: then longer
        # each time.
        failures = max(r.start_failures for r in unit)
        ran = job.clock() - max(r.current.started_at for r in unit)
        streak = decide.crash_streak(max(r.crash_streak for r in unit), ran, counted)
        for r in unit:
            r.crash_streak = streak
        backoff = decide.restart_wait(job.policy, streak, failures)
        job.echo("tfo", f"{why}; restarting {', '.join(r.name for r in unit)}"
                 + (f" in {backoff:g} s" if backoff else ""))

        def stopped() -> None:
            due = job.clock() + backoff
            again = unit
            if self.replan is not None and self.replan(unit):
                # The records follow a new plan; a unit with the chief is every training task.
                again = [r for r in job.records.values()
                         if decide.training(r.role, job.rules) and not r.finished]
            if self.refill is not None:
                self.refill(again)
            for r in again:
                job.restart(r, why, due, backoff, counted)

        stop(job, self.intake, unit, "restart", then=stopped, peer_lost=peer_lost)
