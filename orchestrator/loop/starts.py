"""Starting what is due: the tasks whose turn came (serve first, the backoff) reach the
backend as one batch, each answer carried out as it comes; and the warm spares for the
next attempts. A signal abandons a backend's start at once (`Interrupted`): a host that
does not answer may hold it up to its connect timeout."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

from orchestrator.launch import BatchLauncher, TaskHandle
from orchestrator.loop import decide
from orchestrator.loop.decide import JobState, TaskState
from orchestrator.loop.exits import Exits
from orchestrator.loop.job import Interrupted, Job
from orchestrator.loop.records import Attempt, TaskRecord
from orchestrator.planning.plan import TaskPlan

T = TypeVar("T")
Standby = Callable[[TaskPlan, int], "int | None"]
# A spare that died waiting (SIGKILLed, the OOM killer) is noticed this often: asked for
# again, the backend reaps the dead one (no <defunct> wrapper left) and starts another.
STANDBY_CHECK_SECONDS = 2.0
STANDBY_REPLACEMENTS = 3  # per attempt: one that keeps dying (memory?) is not made for ever


class Starts:
    def __init__(self, job: Job, exits: Exits, start_many: BatchLauncher,
                 standby: Standby | None) -> None:
        self.job, self.exits, self.start_many, self.standby = job, exits, start_many, standby
        self._standbys_checked_at = float("-inf")

    def ready(self, rec: TaskRecord) -> bool:
        """The roles that serve first (PS: ps and workers) are up before the others start."""
        first = decide.waits_for(rec.role, self.job.rules)
        return not first or all(r.state is TaskState.RUNNING
                                for r in self.job.records.values() if r.role in first)

    def due(self, now: float) -> list[TaskRecord]:
        # A task whose last start failed goes first: if its host still cannot be reached,
        # its healthy peers are not started only to be stopped again. (Sorted once found due:
        # most rounds none is, and the round costs nothing per running task.)
        due = [rec for rec in self.job.records.values() if rec.state is TaskState.PENDING
               and now >= rec.start_after and self.ready(rec)]
        return sorted(due, key=lambda r: -min(r.start_failures, 1))

    def start_due(self, now: float) -> None:
        """Start what is due as one batch (the backend may start a host's tasks together).
        After a failed start what is due is looked at again: the failure may have
        scheduled a restart, or ended the job."""
        job = self.job
        while due := self.due(now):
            if not self._start_batch(due):
                break
            if job.busy or job.signal is not None:
                return
        if job.busy or job.signal is not None:
            return
        if job.state is JobState.RESTARTING and not any(
                r.state is TaskState.PENDING for r in job.records.values()):
            job.set(None, JobState.RUNNING)

    def _start_batch(self, due: list[TaskRecord]) -> bool:
        """Start `due`, in order, as one batch, each answer carried out as it comes; stops at
        the first failed start (True: look again), or when the run ends or a signal came.
        The batch is built first, as data: each task's next attempt begun (its log's header
        written before its output can arrive), since the backend may start them all at once
        (SSH, Slurm); a task whose answer was not taken (after a failed start, a signal)
        keeps its attempt number for its next start."""
        job = self.job
        for rec in due:
            self._begin(rec)
        answers = self.start_many([(rec.task, rec.attempt) for rec in due])

        def not_taken(rest: list[TaskRecord]) -> None:  # before what follows is carried out
            answers.close()
            for r in rest:
                r.attempt -= 1

        try:
            for i, rec in enumerate(due):
                try:
                    if job.signal is not None:
                        raise Interrupted
                    job.in_start = True  # a signal now abandons the start (a host may not answer)
                    answer = next(answers)
                except Interrupted:  # the signal ends the run; this attempt never started
                    rec.handle = None
                    not_taken(due[i:])
                    return False
                finally:
                    job.in_start = False
                if isinstance(answer, Exception):  # e.g. a lab host dropped off the network
                    not_taken(due[i + 1:])
                    self._start_failed(rec, answer)
                    return True
                self._started(rec, answer)
                if job.ending is not None or job.signal is not None:
                    not_taken(due[i + 1:])
                    return False
            return False
        finally:
            answers.close()  # a bug of ours too: what the backend started is discarded

    def _begin(self, rec: TaskRecord) -> None:
        """The task's next attempt: its number, and its log's header."""
        rec.attempt += 1
        if rec.log is None:
            rec.log = open(rec.task.log_path, "a", buffering=1)  # noqa: SIM115 (kept)
        if rec.headed == rec.attempt:  # this attempt's start was not taken: headed already
            return
        rec.headed = rec.attempt
        with contextlib.suppress(OSError):  # a full disk: RunDirWatch stops the job
            rec.log.write(f"===== tfo: {rec.name} attempt {rec.attempt} =====\n")

    def _start_failed(self, rec: TaskRecord, error: Exception) -> None:
        rec.handle = None
        rec.start_failures += 1
        self.job.set(rec, TaskState.FAILED)
        self.job.events.write("task_start_failed", rec.name, attempt=rec.attempt,
                              error=str(error))
        self.exits.lost(rec, None, f"{rec.name} could not start: {error}")

    def _started(self, rec: TaskRecord, handle: TaskHandle) -> None:
        rec.handle = handle
        rec.start_failures = 0
        rec.started += 1
        self.job.set(rec, TaskState.STARTING)
        rec.current = Attempt(self.job.clock())  # fresh: nothing of the last one carries over
        warm = getattr(handle, "warm", False)
        # How it started: warm (a standby's, the kit's pool's too), cold (a new process).
        path = getattr(handle, "path", None) or ("warm" if warm else "cold")
        self.job.events.write("task_started", rec.name, pid=handle.pid, attempt=rec.attempt,
                              host=rec.task.host, port=rec.task.port, warm=warm, path=path)

    def standbys(self, now: float) -> None:
        """A warm spare for each running task's next attempt, once its start-up is over (so
        the spare's import does not slow it): at its first progress marker, or
        Timing.standby_after_ready after its ready marker for a task that reports none.
        Only while a restart may still need one."""
        job = self.job
        if self.standby is None:
            return
        for rec in job.records.values():
            if rec.state is not TaskState.RUNNING or rec.current.spare.asked \
                    or rec.current.done or decide.serving(rec.role, job.rules) \
                    or rec.current.running_at is None:
                continue
            if rec.current.work.progress is None \
                    and now - rec.current.running_at < job.timing.standby_after_ready:
                continue
            rec.current.spare.asked = True
            if decide.standby_wanted(rec.role, job.policy, job.rules, rec.restarts,
                                     job.restarts):
                self._make_standby(rec)
        if now - self._standbys_checked_at >= STANDBY_CHECK_SECONDS:
            self._standbys_checked_at = now
            for rec in job.records.values():
                if rec.state is TaskState.RUNNING and rec.current.spare.pid is not None \
                        and not rec.current.done \
                        and rec.current.spare.lost < STANDBY_REPLACEMENTS \
                        and decide.standby_wanted(rec.role, job.policy, job.rules,
                                                  rec.restarts, job.restarts):
                    self._make_standby(rec)

    def _make_standby(self, rec: TaskRecord) -> None:
        """A spare for the task's next attempt; asked again while one is held, the backend
        answers None while it lives, or reaps it and starts another (a new pid): the one
        before died waiting."""
        assert self.standby is not None
        before = rec.current.spare.pid
        try:
            pid = self.starting(self.standby, rec.task, rec.attempt + 1)
        except Interrupted:
            return
        except Exception as e:  # noqa: BLE001 - no spare is no failure: a restart starts cold
            rec.current.spare.pid = None
            self.job.events.write("task_standby_failed", rec.name, attempt=rec.attempt + 1,
                                  error=str(e))
            return
        if pid is None:
            return
        if before is not None:
            rec.current.spare.lost += 1
            self.job.events.write("task_standby_lost", rec.name, pid=before,
                                  attempt=rec.attempt + 1, replaced_by=pid)
            self.job.echo("tfo", f"{rec.name}'s warm spare (pid {before}) died waiting; "
                          f"started another (pid {pid})")
        rec.current.spare.pid = pid
        self.job.events.write("task_standby_started", rec.name, pid=pid,
                              attempt=rec.attempt + 1)

    def starting(self, start: Callable[[TaskPlan, int], T], task: TaskPlan, attempt: int) -> T:
        """A backend's start, which a signal interrupts: it may wait on a host for its
        connect timeout, and a signal is answered at once at every moment of a run."""
        if self.job.signal is not None:
            raise Interrupted
        self.job.in_start = True
        try:
            return start(task, attempt)
        finally:
            self.job.in_start = False
