"""Stopping tasks (supervisord's STOPPING): SIGTERM to each task's group, SIGKILL to any still
running at the kill deadline (`grace_seconds` later; at once on a second signal), then
each exit collected, `task_stopped` written, and what was to follow (a restart, the
sidecars' wait) carried out. The loop wakes for the deadlines; nothing here sleeps.

    stop(job, intake, recs, why, then)   # `then()` once every one is stopped

A task whose code is over (its `exiting` marker) and that waits in its teardown for a peer
that is gone is stopped by `teardown_waits` (module doc of orchestrator.loop.supervise)."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.launch import TaskHandle
from orchestrator.loop import decide, exitwords
from orchestrator.loop.decide import TaskState
from orchestrator.loop.intake import Intake
from orchestrator.loop.job import Job
from orchestrator.loop.records import TaskRecord

# After SIGKILL, how long its exit is waited for (a lab host's may take a round trip).
KILLED_EXIT_SECONDS = 5.0


def lost_contact(rec: TaskRecord) -> str:
    """What its handle says of how it ended where its exit code says less (`lost contact with
    lab2: ...`), else ""."""
    return getattr(rec.handle, "exit_reason", None) or ""


def stop(job: Job, intake: Intake, recs: list[TaskRecord], why: str,
         then: Callable[[], None] | None = None, peer_lost: bool = False) -> None:
    """Stop `recs` (those live), then `then()`: at once where none is live or all exit at
    their SIGTERM, else once the loop finds them gone (`job.hold` until then). `peer_lost`:
    they are stopped because a member of their group is gone, and get its short grace
    (decide.grace)."""
    live = [r for r in recs if (r.state.live or r.state is TaskState.STOPPING)
            and r.handle is not None]  # STOPPING: a stop the run's end cut short
    stopping = Stopping(job, intake, live, why, then, decide.grace(job.policy, peer_lost))
    if live:
        job.hold = stopping
        intake.pump()
    stopping.step(job.clock())


class Stopping:
    def __init__(self, job: Job, intake: Intake, recs: list[TaskRecord], why: str,
                 then: Callable[[], None] | None, grace: float) -> None:
        self.job, self.intake, self.recs, self.then = job, intake, recs, then
        # A task whose code ended 42 before this SIGTERM: why that was no preemption. Only a
        # task whose code said its status can have one (64 tasks: a restart unit each, 64²).
        self.notes = {r.name: job.not_preempted(r, r.current.exiting_code) for r in recs
                      if r.current.exiting_code is not None}
        for r in recs:
            assert r.handle is not None
            if r.state is TaskState.STOPPING:
                continue
            job.events.write("task_stopping", r.name, pid=r.pid, reason=why)
            r.handle.terminate()
            job.set(r, TaskState.STOPPING)
        self.grace = grace
        self.kill_at = job.clock() + self.grace
        self.killed: list[TaskRecord] | None = None  # at the kill deadline, those still running
        self.gone_by = 0.0  # then: their exits are waited for until this time
        # Those not seen exited yet: each step asks only these, and the loop watches them.
        self.running = list(recs)

    def handles(self) -> list[TaskHandle]:
        return [r.handle for r in self.running if r.handle is not None]

    def wake_in(self, now: float) -> float:
        return (self.kill_at if self.killed is None else self.gone_by) - now

    def step(self, now: float) -> None:
        self.running = [r for r in self.running if r.handle is not None
                        and r.handle.poll() is None]
        if self.killed is None:
            if self.running and now < self.kill_at and self.job.signal_count < 2:
                return
            self.killed, self.gone_by = list(self.running), now + KILLED_EXIT_SECONDS
            for r in self.killed:
                r.handle.kill()  # type: ignore[union-attr]
            self.running = [r for r in self.killed if r.handle.poll() is None]  # type: ignore
        if now < self.gone_by and self.running:
            return
        if self.job.hold is self:
            self.job.hold = None
        killed = {r.name for r in self.killed}
        for r in self.recs:
            self._stopped(r, r.name in killed)
        if self.then is not None:
            self.then()

    def _stopped(self, r: TaskRecord, killed: bool) -> None:
        job, handle = self.job, r.handle
        assert handle is not None
        if killed:
            job.events.write("task_killed", r.name, pid=r.pid,
                             reason=f"still running {self.grace:g} s after SIGTERM")
        self.intake.collect(r, handle.poll())
        job.set(r, TaskState.STOPPED)
        # Its code had ended with a status of its own (the `exiting` marker) and it waited in
        # its teardown until our signal ended it: that status is how it ended (exitwords).
        told = exitwords.stopped(r.current.returncode, lost_contact(r), r.current.exiting_code,
                                 self.notes.get(r.name, ""))
        r.current.returncode = told.returncode
        job.events.write("task_stopped", r.name, pid=r.pid, returncode=told.returncode,
                         how=told.how)


def teardown_waits(job: Job, now: float) -> None:
    """Stop a task left waiting in its teardown for a peer that is gone: its code and
    atexit handlers are done, so there is nothing to lose (module doc of supervise)."""
    for rec in job.records.values():
        # Its `exiting` marker first: none for most tasks most of the time (every round).
        if rec.current.exiting_at is None or not rec.state.live or rec.current.torn_down \
                or rec.handle is None or decide.serving(rec.role, job.rules):
            continue
        since = decide.teardown_since(rec.current.exiting_at, [
            (r.finished, r.state.live, r.current.exiting_at, r.current.ended_at)
            for r in job.unit(rec) if r is not rec])
        if since is not None and now - since >= job.timing.teardown_grace:
            rec.current.torn_down = True
            job.events.write("task_teardown_stopped", rec.name, pid=rec.pid,
                             attempt=rec.attempt, waited=round(now - since, 2))
            rec.handle.kill()
