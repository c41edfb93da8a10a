"""Issue 41 item 4: a ParameterServer job's slow ps named when every worker waits on it
(orchestrator/loop/slowps.py), on a fake clock, and from recorded runs (tests/data/slowps/).
The real job is tests/test_closures.py's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.loop import slowps
from orchestrator.loop.slowps import Held, Memory, Sample, judge
from worker_entry.markers import Role

TASKS = {"chief:0": Role.CHIEF, "worker:0": Role.WORKER, "worker:1": Role.WORKER,
         "ps:0": Role.PS, "ps:1": Role.PS}
BALANCED = dict.fromkeys(TASKS, 100.0)  # every task's runqueue wait, percent of a core
Usage = dict[str, tuple[float, bool]]  # task -> (wait, stopped)


def steady(waits: dict[str, float], stopped: str | None = None) -> Usage:
    return {t: (w, t == stopped) for t, w in waits.items()}


def play(pace: Callable[[float], float | None], usage: Callable[[float], Usage],
         seconds: float = 120, attempts: Callable[[float], dict[str, int]] | None = None
         ) -> list[tuple[float, str]]:
    """A round a second: the job's closures/s and each task's usage at t; (t, ps) named."""
    memory, said, out, t = Memory(), set(), [], 0.0
    while t <= seconds:
        got = (attempts or (lambda _: {}))(t)
        samples = [Sample(task, role, got.get(task, 0), wait, stopped, 2)
                   for task, role in TASKS.items() for wait, stopped in [usage(t)[task]]]
        out += [(t, h.task) for h in judge(pace(t), samples, memory, said, t)]
        t += 1.0
    return out


def slowed_at(at: float, before: float, after: float) -> Callable[[float], float]:
    return lambda t: before if t < at else after


def from_(at: float, before: Usage, after: Usage) -> Callable[[float], Usage]:
    return lambda t: before if t < at else after


STOPPED_PS0 = steady({**BALANCED, "ps:0": 40.0}, stopped="ps:0")
WAITING_PS0 = steady({**dict.fromkeys(TASKS, 40.0), "ps:0": 340.0})
CASES = [
    # (name, pace, usage, named)
    ("balanced", lambda t: 130.0, lambda t: steady(BALANCED), []),
    ("a ps stopped most of the time, the job at an eighth of its pace: named 30 s after",
     slowed_at(50, 130, 16), from_(50, steady(BALANCED), STOPPED_PS0), [(80.0, "ps:0")]),
    ("a ps waiting for a CPU 8 times the others' (a CPU quota)",
     slowed_at(50, 130, 50), from_(50, steady(BALANCED), WAITING_PS0), [(80.0, "ps:0")]),
    ("the job slowed but no ps singled out (the host crowded, a slow network): none",
     slowed_at(50, 130, 16), from_(50, steady(BALANCED), steady(dict.fromkeys(TASKS, 300.0))),
     []),
    ("both ps wait (a crowded host hits the ps hardest): none", slowed_at(50, 130, 16),
     from_(50, steady(BALANCED), steady({**dict.fromkeys(TASKS, 40.0), "ps:0": 340.0,
                                         "ps:1": 300.0})), []),
    ("a ps waiting, but the job keeps its pace (0.6 of it): none",
     slowed_at(50, 130, 78), from_(50, steady(BALANCED), WAITING_PS0), []),
    ("the chief waits as much as the ps: a slow chief starves every worker, none",
     slowed_at(50, 130, 16),
     from_(50, steady(BALANCED), steady({**dict.fromkeys(TASKS, 40.0), "ps:0": 340.0,
                                         "chief:0": 340.0})), []),
    ("the chief stopped: none", slowed_at(50, 130, 16),
     from_(50, steady(BALANCED), steady(dict.fromkeys(TASKS, 40.0), stopped="chief:0")), []),
    ("a worker stopped (loop/closures.py's to name): no ps named", slowed_at(50, 130, 16),
     from_(50, steady(BALANCED), steady(dict.fromkeys(TASKS, 40.0), stopped="worker:1")), []),
    ("slowed from the start: no earlier pace to fall from", lambda t: 16.0,
     lambda t: STOPPED_PS0, []),
    ("slowed for 25 s only", lambda t: 16.0 if 50 <= t < 75 else 130.0,
     lambda t: STOPPED_PS0 if 50 <= t < 75 else steady(BALANCED), []),
    ("the pace unknown a moment (a marker late): the window starts over",
     lambda t: None if t == 70 else (130.0 if t < 50 else 16.0),
     from_(50, steady(BALANCED), STOPPED_PS0), [(99.0, "ps:0")]),  # 28 s: a round late
]


@pytest.mark.parametrize(("pace", "usage", "named"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_judge(pace, usage, named):
    assert play(pace, usage) == named


def test_a_restart_starts_the_earlier_pace_over():
    """ps:0 restarted at 50 s (a new attempt): the job's pace before it is not its pace now,
    so a slow ps after a restart is not compared with it."""
    assert play(slowed_at(50, 130, 16), from_(50, steady(BALANCED), STOPPED_PS0),
                attempts=lambda t: {"ps:0": 0 if t < 50 else 1}) == []


def test_the_pace_unknown_a_while_keeps_the_earlier_pace():
    """No rates for 10 s (the chief's markers late, or every worker's rate not yet known
    again: observed() gives no samples then): the window starts over, the earlier pace
    stays, and the ps is named 30 s after the rates came back."""
    memory, said, named = Memory(), set(), []
    for t in range(0, 140):
        slow, gap = t >= 50, 60 <= t < 70
        samples = [] if gap else [Sample(task, role, 0, 40.0 if slow else 100.0,
                                         slow and task == "ps:0", 2)
                                  for task, role in TASKS.items()]
        named += [(t, h.task) for h in judge(None if gap else (16.0 if slow else 130.0),
                                             samples, memory, said, t)]
    assert named == [(98, "ps:0")]


def test_tasks_on_unlike_hosts_or_unmeasured_are_not_judged():
    memory, said = Memory(), set()
    for t in range(0, 120):
        slow = t >= 50
        samples = [Sample(task, role, 0, 40.0 if slow else 100.0,
                          slow and task == "ps:0", 2 if task != "ps:1" else 8)
                   for task, role in TASKS.items()]
        assert judge(16.0 if slow else 130.0, samples, memory, said, t) == []
    memory = Memory()
    for t in range(0, 120):  # ps:1's usage stale (None) every 10 s: never a full window
        slow = t >= 50
        samples = [Sample(task, role, 0, None if task == "ps:1" and t % 10 == 0 else
                          (40.0 if slow else 100.0), slow and task == "ps:0", 2)
                   for task, role in TASKS.items()]
        assert judge(16.0 if slow else 130.0, samples, memory, said, t) == []


def test_the_verdict_says_what_it_saw():
    held = Held("ps:0", pace=16.2, earlier=131.5, wait=0.9, others_wait=0.36, stopped=0.7,
                since=1000.0)
    assert held.words() == ("ps:0 is slow: every worker waits on it: the job finishes 16.20 "
                            "closures/s against 131.50 before (12%), and it was stopped 70% "
                            "of the time, for 30 s")
    assert held.figures(1031.0) == {
        "closures_per_second": 16.2, "earlier_closures_per_second": 131.5, "wait_cores": 0.9,
        "others_wait_cores": 0.36, "stopped_share": 0.7, "lagging_seconds": 31.0}
    waiting = Held("ps:0", 50.0, 105.0, 3.4, 0.45, 0.0, 1000.0)
    assert "its threads wait for a CPU 3.40 cores' worth while the other tasks' wait 0.45" \
        in waiting.words()


# --- recorded runs --------------------------------------------------------------------------

def replay(name: str) -> tuple[dict, list[tuple[float, str]]]:
    """A real run (tests/data/slowps/: every 2 s, each worker's closures/s from the chief's
    `task_closures` events and each task's last `usage` marker) through `judge`."""
    recorded = json.loads((Path(__file__).parent / "data" / "slowps" / f"{name}.json")
                          .read_text())
    memory, said, out = Memory(), set(), []
    for r in recorded["rounds"]:
        rates = r["closures"]
        pace = sum(rates.values()) if len(rates) == 2 else None
        samples = [Sample(task, TASKS[task], 0, u and u[1], bool(u and u[2]))
                   for task, u in r["usage"].items()]  # u: cpu, wait, stopped
        out += [(r["t"], h.task) for h in judge(pace, samples, memory, said, r["t"])]
    return recorded, out


@pytest.mark.parametrize("name", ["balanced", "balanced_one_ps", "stopped_ps0", "capped_ps0"])
def test_recorded_runs(name):
    """Balanced: nobody. ps:0 slowed (stopped 0.3 s of every 0.4 s; capped at 0.1 core by a
    cgroup's quota): ps:0, within WINDOW_SECONDS + 15 s of the slowdown's start."""
    recorded, named = replay(name)
    if recorded["slowed_at"] is None:
        assert named == []
    else:
        [(t, task)] = named
        assert task == "ps:0"
        assert slowps.WINDOW_SECONDS <= t - recorded["slowed_at"] <= slowps.WINDOW_SECONDS + 15


def test_the_watch_names_the_ps_in_the_events_the_console_and_the_table():
    """SlowWatch on a fake PS job: the chief's closures markers and every task's usage in,
    one `task_slow` for ps:0 (cause compute, its figures), one console line, ps:0's attempt
    marked; no worker named."""
    from types import SimpleNamespace

    from orchestrator.loop import closures, slowness
    from orchestrator.loop.markers import read_marker
    from orchestrator.loop.rate import Rate
    from worker_entry import markers as m
    from worker_entry.markers import Strategy

    def record(name: str, role: Role) -> SimpleNamespace:
        return SimpleNamespace(name=name, role=role, attempt=0, state=SimpleNamespace(live=True),
                               current=SimpleNamespace(work=SimpleNamespace(
                                   rate=Rate(), usage=None, usage_at=None, slow=False),
                                   closures={}))

    records = {name: record(name, role) for name, role in TASKS.items()}
    written, echoed = [], []
    job = SimpleNamespace(records=records, plan=SimpleNamespace(
        strategy=Strategy.PARAMETER_SERVER), echo=lambda who, text: echoed.append(text),
        events=SimpleNamespace(write=lambda event, task, **f: written.append((task, f))))
    watch, count = slowness.SlowWatch(job), 0
    for t in range(0, 120):
        now, slow = 1000.0 + t, t >= 40
        count += 8 if slow else 60  # each worker's closures this second
        if t % 2 == 0:
            marker = read_marker(m.line(m.CLOSURES, at=float(t), by_worker={"0": count,
                                                                            "1": count}))
            closures.take(records["chief:0"].current.closures, marker,
                          closures.attempts(job), now)
            for name, r in records.items():
                r.current.work.usage = read_marker(m.line(  # ps:0 stopped in 2 of 3
                    m.USAGE, cpu=10.0, wait=40.0 if slow else 100.0, cpus=2, rss=1,
                    stopped=slow and name == "ps:0" and t % 6 != 0))
                r.current.work.usage_at = now
        watch.tick(now)
    [(task, fields)] = written
    assert (task, fields["cause"], fields["attempt"]) == ("ps:0", "compute", 0)
    assert fields["earlier_closures_per_second"] == 120.0  # 2 workers, 60 a second each
    assert fields["closures_per_second"] < slowps.DROP * 120.0  # a window from the drop on
    assert fields["stopped_share"] >= slowps.STOPPED_SHARE
    assert echoed == [fields["why"]]
    assert fields["why"].startswith("ps:0 is slow: every worker waits on it: the job finishes")
    assert f"and it was stopped {fields['stopped_share']:.0%} of the time, for 30 s" in \
        fields["why"]
    assert [n for n, r in records.items() if r.current.work.slow] == ["ps:0"]
