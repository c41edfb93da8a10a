"""A ParameterServer job's workers judged by the closures each finishes (issue 41, item 4):
the chief's count of them, per worker, as rates the slow watch compares (loop/slowness.py).

    take(chief.current.closures, marker, attempts(job), now)   # each `closures` marker
    rates(job, now)                                            # what SlowWatch judges

A PS job's workers are servers: they run the closures the chief schedules and report no step
of their own, so their steps per second are never known. The chief knows which worker
finished each closure (worker_entry/progress/closures.py) and tells the counts, by worker
index, at most every 2 s on its own clock (`at`). Each worker's closures per second is taken
over that clock as a task's steps are (loop/rate.py's window), and `slowness.judge` compares
them as it does steps: a worker under RATIO of its peers' median for HOLD_SECONDS is named
once, `cause: "steps"` (the contract's word; `closures_per_second` and the words say which).
Work-stealing makes the rates part: every worker takes the next closure as soon as it is
free, so a slow one simply finishes fewer.

The marker is the chief's word, checked (loop/markers.py `Closures`): a worker index not in
the plan is ignored. The counts live on the chief's attempt, so a chief restart starts them
over. A worker's own restart starts its rate over, from its first closure finished in its new
attempt (the chief's coordinator takes a while to reconnect, and those still seconds are not
its pace); while it is not live its rate is unknown, and `judge` leaves it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.loop.markers import Closures
from orchestrator.loop.rate import Rate, rated, shown
from worker_entry.markers import Role

if TYPE_CHECKING:
    from orchestrator.loop.job import Job


@dataclass
class Counted:
    """One worker's closures as the chief counted them, in the worker's `attempt`."""

    attempt: int
    base: int  # the chief's count when this attempt was first seen: not rated until passed
    rate: Rate = field(default_factory=Rate)


Finished = dict[str, Counted]  # by worker task ("worker:1"), on the chief's attempt


def take(finished: Finished, marker: Closures, attempts: dict[str, int | None],
         arrived: float) -> None:
    """`finished` after a `closures` marker. `attempts`: each planned worker's attempt now
    (None: not live); a worker not in it (not in the plan) is ignored."""
    for index, count in marker.by_worker.items():
        name = f"{Role.WORKER}:{int(index)}"
        if name not in attempts:
            continue
        attempt, old = attempts[name], finished.get(name)
        if attempt is None:
            finished.pop(name, None)
        elif old is None or old.attempt != attempt:
            finished[name] = Counted(attempt, count)
        elif count > old.base:
            old.rate = rated(old.rate, marker.at, count, arrived)


def attempts(job: Job) -> dict[str, int | None]:
    """Each planned worker's attempt, None while it is not live."""
    return {r.name: r.attempt if r.state.live else None for r in job.records.values()
            if r.role is Role.WORKER}


def rates(job: Job, now: float) -> list[tuple[str, Role, float | None]]:
    """Each worker's closures per second now, from the live chief's count (none without
    one: not a PS job, or its chief not running); unknown for a worker not live or whose
    attempt changed since last counted."""
    chief = next((r for r in job.records.values() if r.role is Role.CHIEF and r.state.live),
                 None)
    if chief is None or not chief.current.closures:
        return []
    now_attempts = attempts(job)
    return [(name, Role.WORKER, shown(c.rate, now) if now_attempts.get(name) == c.attempt
             else None) for name, c in chief.current.closures.items()]


def per_second(finished: Finished, now: float) -> dict[str, float]:
    """The rates known now, as the `task_closures` event records them."""
    return {name: float(f"{rate:.4g}") for name, c in sorted(finished.items())
            if (rate := shown(c.rate, now)) is not None}


def said(task: str, rate: float, peers: float, seconds: float) -> tuple[dict[str, Any], str]:
    """A `task_slow` verdict's figures and words, for a worker's closures."""
    words = (f"{task} is slow: it finished {rate:.2f} closures/s while its peers finish "
             f"{peers:.2f} ({rate / peers:.0%}) for {seconds:.0f} s")
    return {"closures_per_second": round(rate, 3), "peers_closures_per_second": round(peers, 3),
            "lagging_seconds": round(seconds, 1)}, words
