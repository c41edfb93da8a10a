"""The slow worker named without being asked (issue 41, item 3): a training task whose steps
lag its peers' for a while gets one `task_slow` event and a console line.

    watch = SlowWatch(job)        # in the loop
    watch.tick(now)               # each round: reads each task's steps per second

The signal is the one tfo has anyway: each task's steps per second from its own progress
markers (loop/rate.py, the live table's figure). `judge` decides, pure, on a table of
(task, role, rate) and what it remembered (tests/test_slowness.py, on a fake clock):

- Only the tasks that step: workers, and a chief, of a job that reports steps. A ps, a
  data_worker or dispatcher, an evaluator never are (they serve, or evaluate at their own
  pace), and a task whose rate tfo does not know now (starting, between fits, stopped) is
  left out, as are its peers' when fewer than two rates are known.
- A task lags when its rate is under RATIO of its peers' median (the others' rates). In a
  synchronous job (MultiWorkerMirrored) every worker runs at the slowest's pace, so its
  rates never part: no verdict there from this signal (`tfo profile` tells who holds the
  others back). Workers that step on their own (a ParameterServer job's, or independent
  loops) do part.
- It lags for HOLD_SECONDS on end (a checkpoint, an epoch's end, a restart of a peer
  swing one rate for a few seconds: no false alarm for those), judged at most every
  CHECK_SECONDS.
- The chief is never named: it does the job's extra work (checkpoints, summaries, the
  evaluation a script runs on it) and is slower by design; it still counts among its
  peers.
- Once per task per run: the verdict is news, not a state.

In a synchronous job the rates never part; there the watch also compares how long each task
waits for its input (loop/starved.py: `cause: "input"`), the CPU each wants
(loop/demand.py: `cause: "compute"`) and its connections' round trips to other hosts
(loop/netslow.py: `cause: "network"`); in a ParameterServer job it looks for a ps that holds
every worker back (loop/slowps.py: `cause: "compute"`). The same once-per-task rule holds:
one `task_slow` per task per run, whichever signal fired first (input's, in the same round).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from orchestrator.loop import closures, decide, demand, netslow, slowps, starved
from orchestrator.loop.job import Job
from orchestrator.loop.markers import Usage
from orchestrator.loop.rate import shown
from orchestrator.loop.records import TaskRecord
from worker_entry.markers import USAGE_SECONDS, Role, Strategy, is_chief

RATIO = 0.6  # steps per second under this share of the peers' median: lagging
# A usage older than this is no measure of now: two intervals missed, and some slack
USAGE_FRESH_SECONDS = 2 * USAGE_SECONDS + 1.0
HOLD_SECONDS = 30.0  # lagging this long on end: said
CHECK_SECONDS = 1.0  # judged at most this often
STEPPING = (Role.WORKER, Role.CHIEF)


@dataclass(frozen=True)
class Slow:
    """A verdict: the task, its rate, its peers' median rate, since when it lags."""

    task: str
    rate: float
    peers: float
    since: float

    def words(self) -> str:
        return (f"{self.task} is slow: {self.rate:.2f} steps/s while its peers run "
                f"{self.peers:.2f} ({self.rate / self.peers:.0%}) for "
                f"{HOLD_SECONDS:.0f} s and more")


@dataclass
class Memory:
    """What `judge` remembers between rounds."""

    lagging_since: dict[str, float] = field(default_factory=dict)
    said: set[str] = field(default_factory=set)


def judge(tasks: list[tuple[str, Role, float | None]], memory: Memory, now: float
          ) -> list[Slow]:
    """The tasks to name now (module doc); `memory` is updated in place."""
    rates = {name: rate for name, role, rate in tasks
             if role in STEPPING and rate is not None and rate >= 0}
    roles = {name: role for name, role, _ in tasks}
    named = []
    for name, rate in rates.items():
        peers = [r for n, r in rates.items() if n != name]
        ref = statistics.median(peers) if peers else 0.0
        if roles[name] is Role.CHIEF or ref <= 0 or rate >= RATIO * ref:
            memory.lagging_since.pop(name, None)
            continue
        since = memory.lagging_since.setdefault(name, now)
        if now - since >= HOLD_SECONDS and name not in memory.said:
            memory.said.add(name)
            named.append(Slow(name, rate, ref, since))
    for name in set(memory.lagging_since) - set(rates):  # unknown now: starts over
        del memory.lagging_since[name]
    return named


class SlowWatch:
    """`judge` in the loop: each task's rate now in, `task_slow` and a console line out."""

    def __init__(self, job: Job) -> None:
        self.job, self.memory, self.at = job, Memory(), float("-inf")
        self.closures = Memory(said=self.memory.said)  # a PS job's workers (loop/closures.py)
        self.demand = demand.Memory()
        self.starved = starved.Memory()
        self.netslow = netslow.Memory()
        self.synchronous = job.plan.strategy is Strategy.MULTI_WORKER_MIRRORED
        self.ps = slowps.Memory() if job.plan.strategy is Strategy.PARAMETER_SERVER else None

    def tick(self, now: float) -> None:
        if now < self.at + CHECK_SECONDS:
            return
        self.at = now
        job = self.job
        tasks = [(r.name, r.role, shown(r.current.work.rate, now) if r.state.live else None)
                 for r in job.records.values()]
        for slow in judge(tasks, self.memory, now):
            self._say(slow.task, "steps", {
                "steps_per_second": round(slow.rate, 3),
                "peers_steps_per_second": round(slow.peers, 3),
                "lagging_seconds": round(now - slow.since, 1)}, slow.words())
        for slow in judge(closures.rates(job, now), self.closures, now):
            self._say(slow.task, "steps",
                      *closures.said(slow.task, slow.rate, slow.peers, now - slow.since))
        if self.synchronous:  # input first: a CPU-bound pipeline also wants more CPU
            self._starved(now)
            self._demand(now)
            self._netslow(now)
        if self.ps is not None:  # a slow ps: every worker waits on it (loop/slowps.py)
            for held in slowps.judge(*slowps.observed(job, now), self.ps, self.memory.said, now):
                self._say(held.task, "compute", held.figures(now), held.words())

    def _say(self, task: str, cause: str, figures: dict[str, float], why: str) -> None:
        """One verdict: the `task_slow` event, the console's line, and the task's attempt
        marked (the live table reads `slow` for `running` while that attempt runs)."""
        r = self.job.records[task]
        self.job.events.write("task_slow", task, attempt=r.attempt, cause=cause, **figures,
                              why=why)
        self.job.echo("tfo", why)
        r.current.work.slow = True

    def _training(self) -> list[TaskRecord]:
        job = self.job
        return [r for r in job.records.values() if decide.training(r.role, job.rules)]

    def _starved(self, now: float) -> None:
        samples = [starved.Sample(r.name, r.attempt, self._stepping(r, now),
                                  r.current.work.waits.share(now) if r.state.live else None)
                   for r in self._training()]
        for s in starved.judge(samples, self.starved, self.memory.said, now):
            self._say(s.task, "input",
                      {**s.figures(), "lagging_seconds": round(now - s.since, 1)}, s.words())

    @staticmethod
    def _stepping(r: TaskRecord, now: float) -> bool:
        """Live, and its steps/s known now (the synchronous judges' `stepping`)."""
        return r.state.live and bool(shown(r.current.work.rate, now))

    @staticmethod
    def _usage(r: TaskRecord, now: float) -> Usage | None:
        """The task's last usage, if it is of now."""
        work = r.current.work
        fresh = (r.state.live and work.usage is not None and work.usage_at is not None
                 and now - work.usage_at <= USAGE_FRESH_SECONDS)
        return work.usage if fresh else None

    def _netslow(self, now: float) -> None:
        samples = []
        for r in self._training():
            usage = self._usage(r, now)
            samples.append(netslow.Sample(r.name, r.attempt, self._stepping(r, now),
                                          usage.rtt if usage else None,
                                          r.current.work.usage_at))
        for s in netslow.judge(samples, self.netslow, self.memory.said, now):
            self._say(s.task, "network",
                      {**s.figures(), "lagging_seconds": round(now - s.since, 1)}, s.words())

    def _demand(self, now: float) -> None:
        job = self.job
        samples = []
        for r in self._training():
            usage = self._usage(r, now)
            samples.append(demand.Sample(
                r.name, r.attempt, is_chief(r.role, r.task.index, job.plan.cluster),
                stepping=self._stepping(r, now),
                cpu=usage.cpu if usage else None, wait=usage.wait if usage else None,
                cpus=usage.cpus if usage else None))
        for w in demand.judge(samples, self.demand, self.memory.said, now):
            self._say(w.task, "compute",
                      {**w.figures(), "lagging_seconds": round(now - w.since, 1)}, w.words())
