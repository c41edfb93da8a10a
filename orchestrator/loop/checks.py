"""What the clock decides, each round: the startup limit, stalls, training done and the
sidecars' wait (FINISHING). `decide` judges; this gathers the records' state for it and
carries the answer out."""

from __future__ import annotations

from orchestrator.loop import decide
from orchestrator.loop.decide import JobState, TaskState
from orchestrator.loop.exits import Exits
from orchestrator.loop.intake import Intake
from orchestrator.loop.job import Job
from orchestrator.loop.slowness import SlowWatch
from orchestrator.loop.stacks import Stacks, ask_stacks
from orchestrator.loop.stall import Stall, blame_order, find_stalls, stuck_thread, where
from orchestrator.loop.stopping import stop

# Stalls are looked for at most this often (each look builds a Watched per task); they are
# found within their limit + 1 s.
STALL_CHECK_SECONDS = 0.25


class Checks:
    def __init__(self, job: Job, intake: Intake, exits: Exits) -> None:
        self.job, self.intake, self.exits = job, intake, exits
        self.stalls_at = 0.0  # time of the last stall check (STALL_CHECK_SECONDS)
        self.finishing_at = 0.0  # time training finished (FINISHING began)
        self.slow = SlowWatch(job)  # the slow worker named (loop/slowness.py)

    def startup(self, now: float) -> None:
        """A task not up by the startup limit fails the attempt, unless it is working
        (orchestrator.loop.stall.startup_over)."""
        job = self.job
        starting = [r for r in job.records.values() if r.state is TaskState.STARTING]
        why = decide.startup_failed(job.policy, [
            (r.name, r.current.last_marker, job.watched(r)) for r in starting], now)
        if why is None:
            return
        for r in starting:
            job.events.write("task_startup_timeout", r.name, attempt=r.attempt, pid=r.pid,
                             last=r.current.last_marker)
        self.exits.lost(starting[0], None, why)

    def stalls(self, now: float) -> None:
        """A stalled training task fails its attempt (orchestrator.loop.stall); its stacks, and
        those of every task stuck with it that can answer, are asked for first."""
        job = self.job
        if now < self.stalls_at + STALL_CHECK_SECONDS:
            return
        rule = decide.stall_rule(job.policy)
        if rule is None:
            return
        self.stalls_at = now
        rules = job.rules
        watched = [job.watched(r) for r in job.records.values()
                   if r.state.live and r.handle is not None and not r.current.done
                   and decide.training(r.role, rules)]
        outage = decide.input_outage(now, [
            (r.state is TaskState.RUNNING, r.current.running_at)
            for r in job.records.values() if decide.service(r.role, rules)])
        if outage is not None:  # a trainer waiting for its input while the service was down
            watched = [decide.excused(w, outage) for w in watched]
        stalls = find_stalls(watched, now, rule)
        if not stalls:
            return
        for s in stalls:
            r = job.records[s.task]
            job.events.write("task_stalled", s.task, attempt=r.attempt, pid=r.pid,
                             reason=s.reason, stopped=s.stopped, stall_seconds=s.limit)
        ask_stacks(job, stalls, lambda stacks: self._stalled(stalls, stacks))

    def _stalled(self, stalls: list[Stall], stacks: Stacks) -> None:
        job = self.job
        for s in stalls:
            s.where = where(stuck_thread(stacks.get(s.task, [])))
            if s.where:
                r = job.records[s.task]
                job.events.write("task_stacks", s.task, attempt=r.attempt, pid=r.pid,
                                 where=s.where)
        stalls = blame_order(stalls, stacks)
        job.stalls += stalls
        why = f"stalled ({stalls[0].limit}): " + "; ".join(s.describe() for s in stalls)
        self.exits.lost(job.records[stalls[0].task], None, why)

    def alone(self) -> None:
        """A task trained outside the plan's cluster (Intake._judge told it): the job fails,
        however its processes end."""
        job = self.job
        if job.alone:
            others = [a.task for a in job.alone[1:]]
            also = f" (also {', '.join(others)})" if others else ""
            job.end(JobState.FAILED, job.alone[0].reason() + also, job.alone[0].task)

    def success(self) -> None:
        """Training done: the servers are stopped (they never exit on their own), then the
        sidecars are waited for (FINISHING)."""
        job = self.job
        recs = job.records.values()
        # A generator: the answer is known at the first task not finished (every round).
        if not decide.training_done(job.rules, ((r.role, r.finished) for r in recs)):
            return
        servers = [r for r in recs if decide.serving(r.role, job.rules) and r.state.live]
        stop(job, self.intake, servers, "the chief finished", then=self._finishing)

    def _finishing(self) -> None:
        job = self.job
        job.set(None, JobState.FINISHING)
        self.finishing_at = job.clock()
        waiting = job.sidecars_running()
        if waiting:
            job.events.write("job_finishing", waiting=[r.name for r in waiting],
                             **decide.finishing_fields("wait", job.policy))
            job.echo("tfo", decide.finishing_words("wait", job.policy,
                                                   ", ".join(r.name for r in waiting)))
        self.finished()

    def finished(self) -> None:
        """FINISHING: the sidecars (the evaluator) may finish their last work, for a while:
        until they exit, `evaluator_seconds` passed, or (`evaluator_idle_seconds`) each has
        shown no sign of work that long since training finished (a SidecarEvaluator never
        exits: it evaluated the last checkpoint and waits for the next)."""
        job = self.job
        waiting = job.sidecars_running()
        verdict = decide.finishing(job.clock(), self.finishing_at, job.policy,
                                   [r.current.work.busy_at for r in waiting])
        if verdict == "wait":
            return
        if verdict == "idle":
            job.events.write("job_evaluators_idle", waiting=[r.name for r in waiting],
                             **decide.finishing_fields("idle", job.policy))
        if verdict != "done":
            job.echo("tfo", decide.finishing_words(verdict, job.policy,
                                                   ", ".join(r.name for r in waiting)))
        job.end(JobState.SUCCEEDED, "all training tasks finished")
