"""A ParameterServer job's slow ps named (issue 41, item 4): every worker waits on it, so the
whole job's closures slow down together, while that ps alone is held back.

    pace, tasks = observed(job, now)                 # the job's closures/s, each task's usage
    named = judge(pace, tasks, memory, said, now)    # pure; SlowWatch calls it each round

A slow worker shows as fewer closures finished than its peers' (loop/closures.py); a slow ps
does not: every closure reads the variables off every ps and writes its gradients back, so
all workers wait on it alike and no worker lags the others. What changes is the job's pace,
the closures all workers finish per second (the chief's counts, loop/closures.py), against
the job's own earlier pace; and the ps that holds them back shows it in its `usage` marker
(worker_entry/usage.py): its threads wait for a CPU (a runqueue wait: a crowded host, a
capped CPU share; a cgroup's throttling counts as waiting) or it is stopped, while the
others, waiting on it off CPU, want little. The rule, over a window of WINDOW_SECONDS:

- Only while the whole job runs: the chief, every worker and every ps live and measured
  lately (their usage fresh), every worker's closures/s known, all on hosts with the same
  CPU count (waits on unlike hosts do not compare). Otherwise the window starts over; a new
  attempt of any of them starts the job's earlier pace over too (a restart's first seconds
  are its reconnection, not its pace).
- The job's earlier pace is its best mean over a full window since then; every round of the
  window now is under DROP of it.
- A ps is held back when, over the window, it was stopped in at least STOPPED_SHARE of
  the rounds, or its mean runqueue wait is above both RATIO x the median of the other
  tasks' (chief, workers, the other ps) and that median + MARGIN cores, and so above its
  ps peers' median where it has peers: the host's crowding is the same for all of them
  (and hits every ps hardest, below), so only a ps singled out by it counts.
- Named: a ps held back more than the chief and every worker: stopped more often than each,
  or waiting more than each while none of them is stopped half the time. A slow chief
  starves every worker too: a chief stopped, or waiting more than the ps, gets no ps named
  (nor does a stopped worker). `cause: "compute"` (it cannot get the CPU it wants). A ps
  slowed by the network shows none of this: nothing is said (not measured here).
- Once per task per run (`said` is SlowWatch's, shared with the other signals).
- A job slowed from its start has no earlier pace to fall from: nothing is said.

Measured on this project's 2-core machine at load 3-21 (other helpers' TensorFlow tests),
tests/scripts/ps_coordinator.py on a chief and 2 workers (tests/data/slowps/ holds the runs,
tests/test_slowps.py replays them; ratios are of 30-s window means, as judged):

run (its closures/s; a ps's runqueue wait / the other tasks' median)       verdict
balanced, 2 ps, a burst of the host's work 30-42 s in (20-135/s, windows    none
  0.87-1 of the best; ps:0 0.9-1.9 and ps:1 0.9-1.8, both at once)
balanced, 1 ps, other jobs start at its end (41-189/s, then 0.25 of the      none
  best; ps:0 0.9-1.5)
2 ps, ps:0 stopped 0.3 s of every 0.4 s (115-145/s, then 15-30: 0.13-0.19;  ps:0, 36 s after
  ps:0 2.2-2.8, stopped in 56-81 % of the rounds)
2 ps, ps:0 capped at 0.1 core by a cgroup quota (~100/s, then 30-50:        ps:0, 38 s after
  0.45-0.51; ps:0 3.1-4.6, never stopped; the chief 1-2.4)

In the burst each ps waited 1.5-4 cores at once while the workers waited 0.2-2: a crowded
host makes a ps (its many RPC threads, all woken at once) wait most, hence the peer rule and
RATIO 3 (the burst's ps:0 against the others without ps:1 would have been 2.15). A
SIGCONT wakes the stopped ps's threads all at once, so a duty cycle shows as both stopped
and waiting. The capped ps was never stopped: its throttling counts as runqueue wait. The
chief of that run waited 1.5-2 times the others all along, balanced too: a chief is judged
against the ps, not against the others. With one ps a burst of the host's work that halves
the pace for 30 s and singles the ps out 3 times is the false alarm left; not seen.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.loop import closures
from worker_entry.markers import USAGE_SECONDS, Role

if TYPE_CHECKING:
    from orchestrator.loop.job import Job

WINDOW_SECONDS = 30.0  # judged over this long; named once it holds so long
DROP = 0.6  # the job's closures/s under this share of its earlier best: slowed
RATIO = 3.0  # a task's runqueue wait above this many times the other tasks' median ...
MARGIN = 0.3  # ... and above that median + this many cores
STOPPED_SHARE = 0.5  # stopped in this share of the window's rounds: held back
USAGE_FRESH_SECONDS = 2 * USAGE_SECONDS + 1.0  # two intervals missed, and some slack
JOB_ROLES = (Role.CHIEF, Role.WORKER, Role.PS)


@dataclass(frozen=True)
class Sample:
    """One task of the job now: its last usage (percent of one core, as the marker says;
    wait None: not measured lately, or no schedstat)."""

    task: str
    role: Role
    attempt: int
    wait: float | None
    stopped: bool = False
    cpus: int | None = None


@dataclass(frozen=True)
class Held:
    """A verdict: the ps, the job's pace now and before (closures/s), its mean runqueue wait
    and the other tasks' median (cores), the share of rounds it was stopped, since when."""

    task: str
    pace: float
    earlier: float
    wait: float
    others_wait: float
    stopped: float
    since: float

    def figures(self, now: float) -> dict[str, float]:
        return {"closures_per_second": round(self.pace, 2),
                "earlier_closures_per_second": round(self.earlier, 2),
                "wait_cores": round(self.wait, 2), "others_wait_cores": round(self.others_wait, 2),
                "stopped_share": round(self.stopped, 2),
                "lagging_seconds": round(now - self.since, 1)}

    def words(self) -> str:
        how = (f"it was stopped {self.stopped:.0%} of the time" if self.stopped >= STOPPED_SHARE
               else f"its threads wait for a CPU {self.wait:.2f} cores' worth while the other "
                    f"tasks' wait {self.others_wait:.2f}")
        return (f"{self.task} is slow: every worker waits on it: the job finishes "
                f"{self.pace:.2f} closures/s against {self.earlier:.2f} before "
                f"({self.pace / self.earlier:.0%}), and {how}, for {WINDOW_SECONDS:.0f} s")


@dataclass
class Memory:
    """What `judge` remembers between rounds: the window's rounds (time, pace, each task's
    wait in cores and stopped), the best mean pace since the attempts last changed."""

    rounds: deque[tuple[float, float, dict[str, tuple[float, bool]]]] = field(
        default_factory=deque)
    best: float = 0.0
    attempts: dict[str, int] = field(default_factory=dict)


def judge(pace: float | None, samples: list[Sample], memory: Memory, said: set[str],
          now: float) -> list[Held]:
    """The ps to name now (module doc); `memory` and `said` are updated in place."""
    if (pace is None or not any(s.role is Role.PS for s in samples)
            or any(s.wait is None for s in samples)
            or len({s.cpus for s in samples if s.cpus is not None}) > 1):
        memory.rounds.clear()  # the earlier pace stays: a task's restart is seen below
        return []
    attempts = {s.task: s.attempt for s in samples}
    if attempts != memory.attempts:
        memory.rounds.clear()
        memory.best, memory.attempts = 0.0, attempts
    memory.rounds.append((now, pace, {s.task: ((s.wait or 0.0) / 100, s.stopped)
                                      for s in samples}))
    while memory.rounds[0][0] < now - WINDOW_SECONDS:
        memory.rounds.popleft()
    if memory.rounds[0][0] > now - WINDOW_SECONDS + USAGE_SECONDS:  # not a full window yet
        return []
    paces = [p for _, p, _ in memory.rounds]
    memory.best = max(memory.best, statistics.fmean(paces))
    if not all(p < DROP * memory.best for p in paces):
        return []
    n = len(memory.rounds)
    wait = {s.task: sum(r[2][s.task][0] for r in memory.rounds) / n for s in samples}
    stopped = {s.task: sum(r[2][s.task][1] for r in memory.rounds) / n for s in samples}

    roles = {s.task: s.role for s in samples}

    def others(task: str, role: Role | None = None) -> float:
        return statistics.median([w for t, w in wait.items()
                                  if t != task and role in (None, roles[t])] or [0.0])

    def waits(task: str) -> bool:
        """Above the other tasks' median, and above its ps peers' (where it has any: a
        host's crowding makes every ps wait more than the other tasks)."""
        peers = [t for t in wait if t != task and roles[t] is roles[task] is Role.PS]
        return wait[task] > above(others(task)) and (
            not peers or wait[task] > above(others(task, Role.PS)))

    def holds(ps: str) -> bool:
        """`ps` is held back, and more than the chief or any worker: stopped more often, or
        waiting more while none of them is stopped."""
        rest = [t for t in wait if roles[t] is not Role.PS]
        if stopped[ps] >= STOPPED_SHARE:
            return all(stopped[t] < stopped[ps] for t in rest)
        return waits(ps) and all(stopped[t] < STOPPED_SHARE and wait[t] < wait[ps]
                                 for t in rest)

    held = [s.task for s in samples if s.role is Role.PS and holds(s.task)]
    named = [Held(task, statistics.fmean(paces), memory.best, wait[task], others(task),
                  stopped[task], memory.rounds[0][0]) for task in held if task not in said]
    said.update(h.task for h in named)
    return named


def above(median: float) -> float:
    """The wait (cores) a task's must pass to stand out from a median of others'."""
    return max(RATIO * median, median + MARGIN)


def observed(job: Job, now: float) -> tuple[float | None, list[Sample]]:
    """The job's closures/s now (every worker's, summed; None unless each is known) and each
    chief, worker and ps's last usage (wait None for a stale one)."""
    rates = [rate for _, _, rate in closures.rates(job, now)]
    workers = sum(r.role is Role.WORKER for r in job.records.values())
    if not rates or len(rates) < workers or None in rates:
        return None, []  # judged only with every worker's pace
    samples = []
    for r in job.records.values():
        if r.role not in JOB_ROLES:
            continue
        work = r.current.work
        usage = work.usage if (r.state.live and work.usage is not None and work.usage_at
                               is not None and now - work.usage_at <= USAGE_FRESH_SECONDS) \
            else None
        samples.append(Sample(r.name, r.role, r.attempt, usage.wait if usage else None,
                              bool(usage and usage.stopped), usage.cpus if usage else None))
    return sum(r for r in rates if r is not None), samples
