"""The slow worker of a synchronous job named from the CPU each task wants (issue 41, item 3):
the workers that wait for the slowest wait off CPU in the collective; the slowest runs, or
waits for a CPU, all along.

In MultiWorkerMirrored every worker steps at the slowest's pace, so steps per second never
part (loop/slowness.py); what parts is how the step's time is spent. The workers that wait
for the slowest spend the wait blocked in the collective, off CPU and wanting none; the
slowest wants CPU all along, for its own work (heavy compute, a CPU-bound input pipeline, a
thread of the script's own: it *runs* more) or because it cannot get it (a capped CPU share,
a crowded host: it *waits* on a runqueue more).

    named = judge(samples, memory, said, now)   # pure; SlowWatch calls it each round

Each task's last `usage` (worker_entry/usage.py) gives the CPU its process tree ran (`cpu`)
and the time its threads were runnable but waited on a runqueue (`wait`), over the wrapper's
last 2 s, in cores; their sum is its demand, the CPU it wanted. The two are judged each on
its own, not summed: on a host its tasks share, the runqueue wait is mostly the host's
crowding, the same for all of them, and summed it drowns the difference in CPU run (measured
below). A kernel without schedstat sends no `wait`: then only the CPU run is judged.

- Only a synchronous job (multi_worker_mirrored), and only while it trains: every training
  task (worker, chief) live, stepping (its steps/s known now) and measured lately, two of
  them at least. Otherwise (starting, an epoch's evaluation that stops the steps, a task
  restarting or finished) nothing is judged and every hold starts over.
- A task wants too much when its CPU run, or its runqueue wait, is above both RATIO x its
  peers' median of it and that median + MARGIN cores, for HOLD_SECONDS on end (a checkpoint
  save, an epoch's end, a burst of the host's other work swing an interval or two: they do
  not last).
- A restart of any task of the group (a new attempt) starts every hold over: a group
  restart's first intervals are its import and start, not its training.
- The chief (the chief, or worker 0 without one: markers.is_chief) is never named: it does
  the job's extra work (checkpoints, summaries, the model's save), but it counts among the
  peers.
- Tasks on hosts with different CPU counts are not compared (TensorFlow sizes its thread
  pools to the host, so the same work costs a big host's task more CPU time): no verdict.
  CPU quotas (cgroups) are not seen in that count; a worker capped so shows as waiting.
- Once per task per run, whatever the signal (`said` is SlowWatch's, shared with the rate's).

Measured on 2 cores at load 10-34, 3-worker jobs of tests/scripts/busy_worker.py, every
task on one host (tests/data/usage/ holds three of the runs; docs/guide/slow.md the
figures), as multiples of the peers' median per 2 s interval: the worker with a busy Python
thread ran 2.1-5.9 times their CPU (0.5-0.8 cores against 0.1-0.2), a balanced job's
workers 0.7-1.2; runqueue waits parted 0.8-5.6 times for the busy worker and 0.4-1.5 in
balanced jobs; their sum 1.4-5.3 and 0.5-1.4: at RATIO, a hold on the sum broke off before
30 s in a busy run. A worker capped at 0.1 core by a cgroup quota ran what its peers ran
(0.10 cores, 0.11) and waited 2.98 cores' worth against their 0.38: only the wait names it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

RATIO = 1.5  # a CPU run (or runqueue wait) above this many times the peers' median ...
MARGIN = 0.3  # ... and above the median + this many cores
HOLD_SECONDS = 30.0  # that long on end: named


@dataclass(frozen=True)
class Sample:
    """One training task now: whether it trains, and its last usage (percent of one core, as
    the marker says; None: not measured lately)."""

    task: str
    attempt: int
    chief: bool
    stepping: bool  # live, and its steps/s known now
    cpu: float | None
    wait: float | None = None  # None: no schedstat on its host (or an older wrapper)
    cpus: int | None = None  # the CPUs its host lets it use


@dataclass(frozen=True)
class Wanting:
    """A verdict: the task and its peers' medians, in cores: what it ran (`cpu`), what its
    threads waited for a CPU (`wait`; None: not measured), both (`demand`); since when it
    wants more."""

    task: str
    cpu: float
    peers_cpu: float
    wait: float | None
    peers_wait: float | None
    peers_demand: float
    since: float

    @property
    def demand(self) -> float:
        return self.cpu + (self.wait or 0.0)

    @property
    def wait_share(self) -> float | None:
        """The share of its demand spent waiting for a CPU."""
        return None if self.wait is None or self.demand <= 0 else self.wait / self.demand

    @property
    def starved(self) -> bool:
        """It wants more because it waits for a CPU, not because it runs more."""
        return not above(self.cpu, self.peers_cpu)

    def figures(self) -> dict[str, float]:
        """The event's figures, in cores (wait's only where measured)."""
        got = {"cpu_cores": self.cpu, "peers_cpu_cores": self.peers_cpu,
               "demand_cores": self.demand, "peers_demand_cores": self.peers_demand}
        if self.wait is not None and self.peers_wait is not None:
            got |= {"wait_cores": self.wait, "peers_wait_cores": self.peers_wait,
                    "wait_share": self.wait_share or 0.0}
        return {k: round(v, 2) for k, v in got.items()}

    def words(self) -> str:
        if self.starved:
            what = (f"its threads wait for a CPU {self.wait or 0:.2f} cores' worth while "
                    f"its peers' wait {self.peers_wait or 0:.2f}: it cannot get the CPU it "
                    f"wants (a busy thread of its own, a capped CPU share, a crowded host)")
        else:
            what = (f"it runs {self.cpu:.2f} cores of CPU while its peers, waiting for it "
                    f"in the collective, run {self.peers_cpu:.2f}: its own compute, input "
                    f"pipeline or other work")
        return f"{self.task} is slow: {what}, for {HOLD_SECONDS:.0f} s and more"


def above(mine: float, peers: float) -> bool:
    """More than RATIO x the peers' median, and more than it + MARGIN (cores)."""
    return mine > max(RATIO * peers, peers + MARGIN)


@dataclass
class Memory:
    """What `judge` remembers between rounds."""

    since: dict[str, float] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)


def judge(samples: list[Sample], memory: Memory, said: set[str], now: float
          ) -> list[Wanting]:
    """The tasks to name now (module doc); `memory` and `said` are updated in place."""
    attempts = {s.task: s.attempt for s in samples}
    if attempts != memory.attempts:  # a task restarted (or the group changed)
        memory.since.clear()
        memory.attempts = attempts
    cpus = {s.cpus for s in samples if s.cpus is not None}
    if (len(samples) < 2 or len(cpus) > 1
            or not all(s.stepping and s.cpu is not None for s in samples)):
        memory.since.clear()
        return []
    waits = all(s.wait is not None for s in samples)
    cpu = {s.task: (s.cpu or 0.0) / 100 for s in samples}
    wait = {s.task: (s.wait or 0.0) / 100 for s in samples} if waits else None
    named = []
    for s in samples:
        ref_cpu = statistics.median(c for t, c in cpu.items() if t != s.task)
        ref_wait = (statistics.median(w for t, w in wait.items() if t != s.task)
                    if wait is not None else None)
        wants = above(cpu[s.task], ref_cpu) or (
            wait is not None and ref_wait is not None and above(wait[s.task], ref_wait))
        if s.chief or not wants:
            memory.since.pop(s.task, None)
            continue
        since = memory.since.setdefault(s.task, now)
        if now - since >= HOLD_SECONDS and s.task not in said:
            said.add(s.task)
            mine = wait[s.task] if wait is not None else None
            ref = statistics.median(c + (wait[t] if wait is not None else 0.0)
                                    for t, c in cpu.items() if t != s.task)
            named.append(Wanting(s.task, cpu[s.task], ref_cpu, mine, ref_wait, ref, since))
    return named
