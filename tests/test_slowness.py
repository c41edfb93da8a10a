"""Issue 41 item 3: the slow worker named from the tasks' own step rates (loop/slowness.py),
on a fake clock: a table of rounds (time, each task's steps per second) and what is said."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.loop import demand, starved
from orchestrator.loop.slowness import HOLD_SECONDS, Memory, judge
from tests.conftest import REPO, events, tfo_cmd, wait_until, write_spec
from tests.helpers import interrupted
from worker_entry.markers import Role, Strategy

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
                          plan=SimpleNamespace(strategy=Strategy.PARAMETER_SERVER),
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


# Synchronous jobs: the CPU each task wants (loop/demand.py). A round every 2 s (the wrapper's
# usage interval); each task's usage as (cpu, wait) in percent of one core, None: not stepping.
D_HOLD = int(demand.HOLD_SECONDS / 2)  # rounds of 2 s to hold


def demand_rounds(table: dict[str, list[tuple[float, float | None] | None]], count: int = 40,
                  attempts: dict[str, list[int]] | None = None,
                  cpus: dict[str, int] | None = None) -> list[tuple[float, str, bool]]:
    """The verdicts said: (seconds since the first round, task, starved)."""
    memory, said, out = demand.Memory(), set(), []
    for i in range(count):
        samples = []
        for name, usage in table.items():
            u = usage[min(i, len(usage) - 1)]
            tries = (attempts or {}).get(name, [0])
            samples.append(demand.Sample(
                name, tries[min(i, len(tries) - 1)], chief=name == "worker:0",
                stepping=u is not None, cpu=u[0] if u else None, wait=u[1] if u else None,
                cpus=(cpus or {}).get(name, 2)))
        out += [(i * 2.0, w.task, w.starved) for w in demand.judge(samples, memory, said,
                                                                   1000.0 + i * 2.0)]
    return out


BALANCED = [(45.0, 100.0)]
DEMAND_CASES = [
    ("a worker that runs its own work besides training: named once, after the hold",
     {"worker:0": BALANCED, "worker:1": [(20.0, 90.0)], "worker:2": [(75.0, 95.0)]}, {},
     [(demand.HOLD_SECONDS, "worker:2", False)]),
    ("a worker starved of CPU (its share capped): it runs as much, but waits", {
        "worker:0": [(30.0, 20.0)], "worker:1": [(30.0, 25.0)], "worker:2": [(30.0, 90.0)]},
     {}, [(demand.HOLD_SECONDS, "worker:2", True)]),
    ("a balanced job: none", {"worker:0": BALANCED, "worker:1": [(42.0, 120.0)],
                              "worker:2": [(48.0, 85.0)]}, {}, []),
    ("the chief's extra work (checkpoints, the model's save): never named",
     {"worker:0": [(95.0, 100.0)], "worker:1": [(20.0, 90.0)], "worker:2": [(20.0, 90.0)]},
     {}, []),
    ("more than 1.5 times its peers, but by under 0.3 cores: none", {
        "worker:0": [(10.0, 10.0)], "worker:1": [(10.0, 10.0)], "worker:2": [(35.0, 35.0)]},
     {}, []),
    ("a burst shorter than the hold (an epoch's end, the host's other work): none", {
        "worker:0": BALANCED, "worker:1": BALANCED,
        "worker:2": [(45.0, 100.0)] * 3 + [(100.0, 300.0)] * (D_HOLD - 1) + BALANCED}, {}, []),
    ("a burst that came back starts its hold over", {
        "worker:0": BALANCED, "worker:1": BALANCED,
        "worker:2": [(100.0, 90.0)] * (D_HOLD - 1) + BALANCED + [(100.0, 90.0)]}, {},
     [(demand.HOLD_SECONDS + D_HOLD * 2.0, "worker:2", False)]),
    ("the group not all stepping (an evaluation, a worker starting): not judged, hold over",
     {"worker:0": BALANCED, "worker:1": [(5.0, 5.0)] * 5 + [None] + [(5.0, 5.0)],
      "worker:2": [(90.0, 100.0)]}, {},
     [(demand.HOLD_SECONDS + 6 * 2.0, "worker:2", False)]),
    ("a restart of any task of the group starts every hold over",
     {"worker:0": BALANCED, "worker:1": BALANCED, "worker:2": [(100.0, 90.0)]},
     {"attempts": {"worker:1": [0] * 10 + [1]}},
     [(demand.HOLD_SECONDS + 10 * 2.0, "worker:2", False)]),
    ("tasks on hosts with different CPU counts: not compared",
     {"worker:0": BALANCED, "worker:1": BALANCED, "worker:2": [(200.0, 90.0)]},
     {"cpus": {"worker:0": 8, "worker:1": 8, "worker:2": 32}}, []),
    ("two workers: the other is the only peer",
     {"worker:0": [(20.0, 90.0)], "worker:1": [(75.0, 95.0)]}, {},
     [(demand.HOLD_SECONDS, "worker:1", False)]),
    ("one worker alone: nothing to compare", {"worker:1": [(300.0, 300.0)]}, {}, []),
]


@pytest.mark.parametrize(("table", "extra", "expected"), [c[1:] for c in DEMAND_CASES],
                         ids=[c[0] for c in DEMAND_CASES])
def test_wanting_worker(table, extra, expected):
    assert demand_rounds(table, **extra) == expected


def test_without_schedstat_only_the_cpu_counts():
    """A kernel without schedstat (no `wait` in any usage): the starved worker goes unseen,
    the busy one is still named; one task without it turns the wait off for all."""
    no_wait = {"worker:0": [(30.0, None)], "worker:1": [(30.0, None)],
               "worker:2": [(30.0, None)]}
    assert demand_rounds(no_wait) == []
    mixed = {"worker:0": [(30.0, 20.0)], "worker:1": [(30.0, None)],
             "worker:2": [(30.0, 90.0)]}
    assert demand_rounds(mixed) == []
    busy = {"worker:0": [(20.0, None)], "worker:1": [(20.0, None)], "worker:2": [(80.0, None)]}
    assert demand_rounds(busy) == [(demand.HOLD_SECONDS, "worker:2", False)]


def test_a_task_not_measured_lately_stops_the_comparison():
    """A stepping task whose wrapper has not reported lately (cpu None): nobody is judged,
    and the holds start over."""
    memory, said = demand.Memory(), set()

    def at(t: float, cpu1: float | None) -> list[demand.Wanting]:
        return demand.judge([demand.Sample("worker:0", 0, True, True, 20.0, 90.0),
                             demand.Sample("worker:1", 0, False, True, cpu1, 90.0),
                             demand.Sample("worker:2", 0, False, True, 90.0, 90.0)],
                            memory, said, t)
    assert [at(t, 20.0) for t in range(0, 28, 2)] == [[]] * 14
    assert at(28.0, None) == [] and memory.since == {}
    assert [at(t, 20.0) for t in range(30, 60, 2)] == [[]] * 15
    assert [w.task for w in at(60.0, 20.0)] == ["worker:2"]


def test_named_once_whatever_the_signal():
    """A task the steps/s named already (SlowWatch's `said`, shared) is not named again."""
    memory, said = demand.Memory(), {"worker:2"}
    samples = [demand.Sample("worker:0", 0, True, True, 20.0, 90.0),
               demand.Sample("worker:1", 0, False, True, 20.0, 90.0),
               demand.Sample("worker:2", 0, False, True, 90.0, 90.0)]
    assert [demand.judge(samples, memory, said, t) for t in range(0, 100, 2)] == [[]] * 50


def replay(name: str, chief: str | None = "worker:0") -> list[tuple[float, str, bool]]:
    """A real run's usage samples (tests/data/usage/: each task's `usage` markers, as its
    log holds them, and whether it stepped then) through `judge`, a round per sample."""
    recorded = json.loads((Path(__file__).parent / "data" / "usage" / f"{name}.json")
                          .read_text())
    tasks, every = recorded["tasks"], recorded["interval_seconds"]
    memory, said, out = demand.Memory(), set(), []
    for i in range(min(len(v) for v in tasks.values())):
        samples = [demand.Sample(t, 0, t == chief, v[i][2], v[i][0], v[i][1], 2)
                   for t, v in tasks.items()]
        out += [(i * every, w.task, w.starved)
                for w in demand.judge(samples, memory, said, i * every)]
    return out


def test_recorded_runs():
    """Recorded on this 2-core machine at load 10-34: worker:2 of tests/scripts/busy_worker.py
    (a Python thread computing besides training) is named 30 s after its lead began (it ran
    0.81 cores against its peers' 0.21); a worker capped by a CPU quota is named, starved;
    the balanced run names nobody, even with no task spared as the chief."""
    assert replay("busy_worker2") == [(48.0, "worker:2", False)]
    # worker:2 capped at 0.1 core (a cgroup's CPU quota) from 10 s into training: it runs
    # as much as its peers (0.10 cores against 0.11) but waits for a CPU 8 times as much
    assert replay("capped_worker2") == [(90.0, "worker:2", True)]
    assert replay("balanced") == []
    assert replay("balanced", chief=None) == []


@pytest.mark.parametrize("name", ["balanced", "balanced_bench0", "balanced_bench1",
                                  "balanced_bench2", "balanced_phase"])
def test_five_balanced_runs_name_nobody(name):
    """Issue 41's "a balanced job, 5 runs: no task_slow", for the CPU signal: five real
    balanced runs of tests/scripts/busy_worker.py (3 workers, 2 cores, load 10-18; the last
    four from bench/slow.py, which judged them live too: 0 verdicts), replayed whole, with
    the chief spared and with no task spared."""
    assert replay(name) == []
    assert replay(name, chief=None) == []


def test_the_watch_names_the_wanting_worker_of_a_synchronous_job(monkeypatch):
    """SlowWatch in a MultiWorkerMirrored job: each task's last usage in; one `task_slow`
    (cause compute, its figures) and one console line out; an evaluator is no peer."""
    from types import SimpleNamespace

    from orchestrator.loop import slowness
    from orchestrator.loop.markers import Usage
    from orchestrator.planning.strategy import RULES

    monkeypatch.setattr(slowness, "shown", lambda rate, now: rate)
    clock = {"now": 0.0}
    usage = {"worker:0": (40.0, 60.0), "worker:1": (20.0, 60.0), "worker:2": (80.0, 70.0),
             "evaluator:0": (5.0, 0.0)}

    def record(name: str) -> SimpleNamespace:
        role, index = name.split(":")
        cpu, wait = usage[name]
        work = SimpleNamespace(rate=3.0, usage_at=None, usage=Usage(
            event="usage", cpu=cpu, wait=wait, cpus=2, rss=1), waits=starved.Waits())
        return SimpleNamespace(name=name, role=Role(role), attempt=0, task=SimpleNamespace(
            index=int(index)), state=SimpleNamespace(live=True),
            current=SimpleNamespace(work=work))

    records = {name: record(name) for name in usage}
    written, echoed = [], []
    job = SimpleNamespace(
        records=records, rules=RULES[Strategy.MULTI_WORKER_MIRRORED],
        plan=SimpleNamespace(strategy=Strategy.MULTI_WORKER_MIRRORED,
                             cluster={"worker": ["a:1", "a:2", "a:3"]}),
        echo=lambda who, text: echoed.append((who, text)),
        events=SimpleNamespace(write=lambda event, task, **f: written.append((event, task, f))))
    watch = slowness.SlowWatch(job)
    for t in range(0, 60):
        clock["now"] = float(t)
        for r in records.values():
            r.current.work.usage_at = t - t % 2  # a usage every 2 s
        watch.tick(float(t))
    assert [(e, task) for e, task, _ in written] == [("task_slow", "worker:2")]
    fields = written[0][2]
    assert (fields["cause"], fields["cpu_cores"], fields["peers_cpu_cores"],
            fields["demand_cores"], fields["peers_demand_cores"], fields["wait_share"],
            fields["lagging_seconds"]) == ("compute", 0.8, 0.3, 1.5, 0.9, 0.47, 30.0)
    assert echoed == [("tfo", "worker:2 is slow: it runs 0.80 cores of CPU while its peers, "
                              "waiting for it in the collective, run 0.30: its own compute, "
                              "input pipeline or other work, for 30 s and more")]
    assert fields["why"] == echoed[0][1]


def test_read_waits_of_a_real_process():
    """Each thread's runqueue wait, from /proc/PID/task/TID/schedstat (this kernel has it);
    a process gone reads None."""
    from worker_entry.usage import read_waits

    proc = subprocess.Popen([sys.executable, "-c", "import threading, time; "
                             "threading.Thread(target=time.sleep, args=(30,)).start(); "
                             "time.sleep(30)"])
    try:
        assert wait_until(lambda: len(read_waits(proc.pid) or {}) == 2, 10)
        assert proc.pid in read_waits(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert read_waits(proc.pid) is None


BUSY_JOB = """\
name: busy
job:
  script: tests/scripts/busy_worker.py
  args: ["--busy_task", "worker:2", "--busy_after", "{after}", "--steps", "100000"]
tasks:
  worker: [localhost:auto, localhost:auto, localhost:auto]
restart: {{policy: on-failure, max_restarts: 2}}
"""
BALANCED_SECONDS = 40.0  # trained this long balanced: more than the hold, nobody named
NAMED_WITHIN = 90.0  # from the busy thread's start to task_slow: the 30 s hold, and slack


@pytest.mark.tf
@pytest.mark.timeout(480)
def test_a_synchronous_job_names_its_busy_worker(tmp_path: Path, run_dir: Path):
    """A real 3-worker MultiWorkerMirrored job, balanced for its first BALANCED_SECONDS of
    training: nobody is named; then worker:2 starts a Python thread that computes besides
    training (tests/scripts/busy_worker.py): `task_slow` names worker:2, cause compute,
    within NAMED_WITHIN s, once, with its figures, in the events and the console."""
    spec = write_spec(tmp_path / "busy.yaml", BUSY_JOB.format(after=BALANCED_SECONDS))
    tfo = subprocess.Popen(tfo_cmd("run", str(spec), "--run-dir", str(run_dir), "--no-logs"),
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    log = run_dir / "logs" / "worker-2.log"
    started: list[float] = []  # when each attempt's thread was seen to start

    def named() -> list[dict]:
        got = log.read_text(errors="replace").count("background job started") \
            if log.exists() else 0
        if got > len(started):
            started.append(time.monotonic())
        return [e for e in events(run_dir) if e["event"] == "task_slow"]

    try:
        assert wait_until(lambda: named() or started, 240, interval=0.5), "never trained"
        slow = named()
        assert slow == [], f"named while balanced: {slow}"
        slow = wait_until(named, NAMED_WITHIN + 60, interval=0.5)
        took = time.monotonic() - started[-1]
    finally:
        out = interrupted(tfo)
    assert slow, f"worker:2 never named\n{out[-3000:]}"
    assert [(e["task"], e["cause"]) for e in slow] == [("worker:2", "compute")], slow
    assert took <= NAMED_WITHIN, f"named {took:.0f} s after the thread started"
    event = slow[0]
    assert event["cpu_cores"] > event["peers_cpu_cores"] + 0.3, event
    assert event["lagging_seconds"] >= 30 and event["why"].startswith("worker:2 is slow: "), event
    assert f"[tfo] {event['why']}" in out, out[-3000:]
