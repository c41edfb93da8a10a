"""The worker of a synchronous job that waits on its own input pipeline, named (issue 41,
item 3: `cause: "input"`): it waits for its next element most of its time, while its peers,
waiting for it in the collective, find theirs ready.

    waits.take(marker.at, marker.waited, now)    # each `input` marker (loop/intake.py)
    named = judge(samples, memory, said, now)     # pure; SlowWatch calls it each round

Each task tells how long its training waited for its input so far (its `input` marker every
2 s: worker_entry/progress/inputwait.py reads tf.data's own model of each iterator); `Waits`
keeps the last WINDOW_SECONDS of them and gives the share of that time spent waiting. A
slow pipeline on one worker of a MultiWorkerMirrored job shows as that worker waiting
95-97 % of its time and its peers 0 % (figures in inputwait.py); a job whose input is slow
on every worker has no outlier, and no verdict: no one worker holds the others back.

- Only a synchronous job (multi_worker_mirrored), and only while it trains: every training
  task live, stepping, its share known from a marker of the last FRESH_SECONDS (a task
  whose input tfo cannot read, autotune off, a pipeline that is no tf.data: nothing judged),
  two tasks at least. Otherwise every hold starts over, as it does at any restart in the
  group.
- A task is starved when its share is at least SHARE and above its peers' median by
  MARGIN, for HOLD_SECONDS on end. The chief may be named: its extra work (checkpoints,
  summaries) shows between its calls for input, not in them.
- Once per task per run, whatever the signal (`said` is SlowWatch's).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

WINDOW_SECONDS = 10.0  # the share is taken over about this much of the task's clock
SHARE = 0.5  # waiting for its input at least half its time ...
MARGIN = 0.3  # ... and this much more than its peers' median share
HOLD_SECONDS = 30.0  # that long on end: named
FRESH_SECONDS = 5.0  # a share whose last marker is older says nothing of now


@dataclass
class Waits:
    """One attempt's `input` markers: (task clock, seconds waited so far), the last window's."""

    points: deque[tuple[float, float]] = field(default_factory=deque)
    seen_at: float | None = None  # the coordinator's clock at the last marker

    def take(self, at: float, waited: float, now: float) -> None:
        if self.points and (at <= self.points[-1][0] or waited < self.points[-1][1]):
            return  # not later, or less than before: not this attempt's count going on
        self.points.append((at, waited))
        self.seen_at = now
        while len(self.points) > 2 and self.points[1][0] <= at - WINDOW_SECONDS:
            self.points.popleft()

    def share(self, now: float) -> float | None:
        """The share of the window spent waiting for input; None until the markers span
        half a window, or when the last is older than FRESH_SECONDS."""
        if self.seen_at is None or now - self.seen_at > FRESH_SECONDS or len(self.points) < 2:
            return None
        (at0, w0), (at1, w1) = self.points[0], self.points[-1]
        if at1 - at0 < WINDOW_SECONDS / 2:
            return None
        return min(1.0, (w1 - w0) / (at1 - at0))


@dataclass(frozen=True)
class Sample:
    """One training task now: whether it trains, and its share waited (None: not known)."""

    task: str
    attempt: int
    stepping: bool
    share: float | None


@dataclass(frozen=True)
class Starved:
    """A verdict: the task's share waited for its input, its peers' median, since when."""

    task: str
    share: float
    peers: float
    since: float

    def figures(self) -> dict[str, float]:
        return {"input_wait_share": round(self.share, 2),
                "peers_input_wait_share": round(self.peers, 2)}

    def words(self) -> str:
        return (f"{self.task} is slow: it waits for its input {self.share:.0%} of the time "
                f"while its peers, waiting for it in the collective, wait {self.peers:.0%}: "
                f"its input pipeline, for {HOLD_SECONDS:.0f} s and more")


@dataclass
class Memory:
    """What `judge` remembers between rounds."""

    since: dict[str, float] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)


def judge(samples: list[Sample], memory: Memory, said: set[str], now: float) -> list[Starved]:
    """The tasks to name now (module doc); `memory` and `said` are updated in place."""
    attempts = {s.task: s.attempt for s in samples}
    if attempts != memory.attempts:  # a task restarted (or the group changed)
        memory.since.clear()
        memory.attempts = attempts
    if len(samples) < 2 or not all(s.stepping and s.share is not None for s in samples):
        memory.since.clear()
        return []
    shares = {s.task: s.share or 0.0 for s in samples}
    named = []
    for task, share in shares.items():
        peers = statistics.median(v for t, v in shares.items() if t != task)
        if share < SHARE or share < peers + MARGIN:
            memory.since.pop(task, None)
            continue
        since = memory.since.setdefault(task, now)
        if now - since >= HOLD_SECONDS and task not in said:
            said.add(task)
            named.append(Starved(task, share, peers, since))
    return named
