"""Issue 41 item 3: the slow worker named from the tasks' own step rates (loop/slowness.py),
on a fake clock: a table of rounds (time, each task's steps per second) and what is said."""

from __future__ import annotations

import pytest

from orchestrator.loop.slowness import HOLD_SECONDS, Memory, judge
from worker_entry.markers import Role

W, C, PS, DW, EV = Role.WORKER, Role.CHIEF, Role.PS, Role.DATA_WORKER, Role.EVALUATOR


def rounds(table: dict[str, tuple[Role, list[float | None]]], seconds: float = 5.0,
           count: int = 0) -> list[tuple[float, str]]:
    """Each task's rate per round, a round every `seconds` of the fake clock; the verdicts
    said, with when."""
    memory, said = Memory(), []
    n = count or max(len(rates) for _, rates in table.values())
    for i in range(n):
        now = 1000.0 + i * seconds
        tasks = [(name, role, rates[min(i, len(rates) - 1)])
                 for name, (role, rates) in table.items()]
        said += [(now - 1000.0, s.task) for s in judge(tasks, memory, now)]
    return said


HOLD = int(HOLD_SECONDS / 5)  # rounds of 5 s to hold
CASES = [
    ("a PS-style worker at a third of its peers': named once, after the hold",
     {"worker:0": (W, [4.0]), "worker:1": (W, [1.3]), "worker:2": (W, [4.2])}, 20,
     [(HOLD_SECONDS, "worker:1")]),
    ("a balanced job: none", {"worker:0": (W, [4.0]), "worker:1": (W, [3.6]),
                              "worker:2": (W, [4.1])}, 20, []),
    ("synchronous workers share the slowest's pace: none",
     {"worker:0": (W, [1.1]), "worker:1": (W, [1.1])}, 20, []),
    ("a dip shorter than the hold (a checkpoint, an epoch's end): none",
     {"worker:0": (W, [4.0]), "worker:1": (W, [4.0] * 3 + [0.5] * (HOLD - 1) + [4.0] * 10)},
     0, []),
    ("a dip that came back starts its hold over",
     {"worker:0": (W, [4.0]), "worker:1": (W, [0.5] * (HOLD - 1) + [4.0] + [0.5] * 20)}, 0,
     [(HOLD_SECONDS + HOLD * 5.0, "worker:1")]),
    ("the chief's extra work: never named",
     {"chief:0": (C, [1.0]), "worker:0": (W, [4.0]), "worker:1": (W, [4.0])}, 20, []),
    ("a ps, a data_worker, an evaluator never step: neither named nor peers",
     {"worker:0": (W, [4.0]), "worker:1": (W, [4.1]), "ps:0": (PS, [0.0]),
      "data_worker:0": (DW, [0.1]), "evaluator:0": (EV, [0.01])}, 20, []),
    ("a task whose rate is unknown (starting, restarted) is left out",
     {"worker:0": (W, [4.0]), "worker:1": (W, [None] * 10 + [4.0])}, 20, []),
    ("unknown for a while: its hold starts over",
     {"worker:0": (W, [4.0]), "worker:1": (W, [0.5] * (HOLD - 1) + [None] + [0.5] * 20)}, 0,
     [(HOLD_SECONDS + HOLD * 5.0, "worker:1")]),
    ("one worker alone: nothing to compare", {"worker:0": (W, [0.1])}, 20, []),
]


@pytest.mark.parametrize(("table", "count", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_slow_worker(table, count, expected):
    assert rounds(table, count=count) == expected


def test_the_watch_writes_one_event_and_one_line(monkeypatch):
    """SlowWatch in the loop: each task's rate now in; `task_slow` in the events and a line
    in the console, once."""
    from types import SimpleNamespace

    from orchestrator.loop import slowness

    rates = {"worker:0": 4.0, "worker:1": 1.0, "ps:0": None}
    monkeypatch.setattr(slowness, "shown", lambda rate, now: rate)
    records = {name: SimpleNamespace(
        name=name, role=Role.PS if name.startswith("ps") else Role.WORKER, attempt=0,
        state=SimpleNamespace(live=True), current=SimpleNamespace(
            work=SimpleNamespace(rate=rate))) for name, rate in rates.items()}
    written, echoed = [], []
    job = SimpleNamespace(records=records, echo=lambda who, text: echoed.append((who, text)),
                          events=SimpleNamespace(
                              write=lambda event, task, **f: written.append((event, task, f))))
    watch = slowness.SlowWatch(job)
    for t in range(0, 60):
        watch.tick(float(t))
    assert [(e, task) for e, task, _ in written] == [("task_slow", "worker:1")]
    fields = written[0][2]
    assert (fields["steps_per_second"], fields["peers_steps_per_second"], fields["cause"]) == \
        (1.0, 4.0, "steps")
    assert echoed == [("tfo", "worker:1 is slow: 1.00 steps/s while its peers run 4.00 (25%) "
                              "for 30 s and more")]
