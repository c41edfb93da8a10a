"""The input-starved worker of a synchronous job (orchestrator/loop/starved.py) and the task
side that measures it (worker_entry/progress/inputwait.py): pure, on a fake clock."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.loop import starved
from orchestrator.loop.markers import BadMarker, Input, read_marker
from tests.conftest import REPO, events, tfo_cmd, wait_until, write_spec
from tests.helpers import interrupted
from worker_entry.markers import MARK
from worker_entry.progress import inputwait

HOLD = starved.HOLD_SECONDS
WINDOW = starved.WINDOW_SECONDS


# --- the task side: the time waited, from tf.data's model --------------------------------

@pytest.mark.parametrize("seconds, elements, gaps, expected", [
    (2.0, 4, [20_000] * 10, 1.92),  # a starved consumer: 4 calls, 20 ms between them
    (2.0, 4, [500_000] * 10, 0.0),  # a fed one: its gaps fill the interval
    (2.0, 3, [10_000, 500_000, 500_000, 500_000], 0.5),  # only the last 3 gaps are its
    (2.0, 8, [100_000] * 4, 1.2),  # more elements than gaps kept: their mean stands for all
    (2.0, 4, [900_000] * 4, 0.0),  # gaps longer than the interval (its edges): no less than 0
    (2.0, 0, [20_000], 0.0),  # nothing taken: nothing waited (the loop sends no marker)
    (2.0, 4, [], 0.0),  # no gaps known: no figure
])
def test_waited(seconds, elements, gaps, expected):
    assert inputwait.waited(seconds, elements, gaps) == pytest.approx(expected)


def proto(elements: int, gaps: list[int]) -> SimpleNamespace:
    return SimpleNamespace(output=1, nodes={1: SimpleNamespace(num_elements=elements)},
                           gap_times=gaps)


def test_the_watch_sends_the_longest_wait_of_its_iterators():
    """Each interval: the iterator that waited longest counts; an iterator without a model is
    dropped for good; no marker for an interval in which no iterator gave elements."""

    class It:
        pass

    clock = {"now": 0.0}
    sent: list[dict] = []
    watch = inputwait.Watch(lambda: clock["now"], lambda event, **f: sent.append({event: f}))
    fed, starving, broken = It(), It(), It()
    for it in (fed, starving, broken):
        watch.add(it)
    models = {fed: [0, 0, 4, 4], starving: [0, 0, 4, 8]}  # elements given by each read

    def proto_of(it):
        if it is broken:
            raise RuntimeError("no model")
        gaps = [500_000] * 8 if it is fed else [20_000] * 8
        return proto(models[it][int(clock["now"] / 2)], gaps)

    for t in (0.0, 2.0, 4.0, 6.0):
        clock["now"] = t
        watch.read(proto_of)
    assert broken not in watch.iterators
    # 2 s: none gave (no marker); 4 s: both gave 4, the starving one waited 1.92 s;
    # 6 s: only the starving one gave
    assert sent == [{"input": {"waited": 1.92, "at": 4.0}},
                    {"input": {"waited": 3.84, "at": 6.0}}]


def test_the_marker_is_checked():
    good = read_marker(MARK + '{"event": "input", "waited": 3.5, "at": 120.0}')
    assert isinstance(good, Input) and good.waited == 3.5
    for bad in ('{"event": "input", "waited": -1, "at": 1}',
                '{"event": "input", "waited": "lots", "at": 1}',
                '{"event": "input", "waited": 1}'):
        with pytest.raises(BadMarker, match="waited|at"):
            read_marker(MARK + bad)


# --- the coordinator: the share over a window, and the verdict -----------------------------

def test_waits_share_over_the_window():
    w = starved.Waits()
    assert w.share(0.0) is None
    for i in range(20):  # a marker every 2 s, waiting 1.9 s of each 2
        w.take(100.0 + 2 * i, 1.9 * i, now=float(2 * i))
    assert w.share(38.0) == pytest.approx(0.95)
    assert w.points[-1][0] - w.points[0][0] <= WINDOW + 2  # only the last window's kept
    assert w.share(38.0 + starved.FRESH_SECONDS + 1) is None  # no marker lately: unknown
    w.take(90.0, 100.0, now=40.0)  # earlier on the task's clock: not this count, ignored
    w.take(140.0, 1.0, now=40.0)  # less waited than before: ignored
    assert w.share(40.0) == pytest.approx(0.95)
    short = starved.Waits()
    short.take(0.0, 0.0, 0.0)
    short.take(2.0, 2.0, 2.0)
    assert short.share(2.0) is None  # under half a window: no figure yet


def rounds(table: dict[str, list[float | None]], count: int = 40, attempts=None,
           stepping=None) -> list[tuple[float, str]]:
    """Rounds 2 s apart: each task's share from the round's column (the last value holds)."""
    memory, said, out = starved.Memory(), set(), []
    for i in range(count):
        samples = [starved.Sample(task, (attempts or {}).get(task, lambda i: 0)(i),
                                  (stepping or {}).get(task, lambda i: True)(i),
                                  shares[min(i, len(shares) - 1)])
                   for task, shares in table.items()]
        out += [(i * 2.0, s.task) for s in starved.judge(samples, memory, said, i * 2.0)]
    return out


H = int(HOLD / 2)  # rounds to hold


@pytest.mark.parametrize("table, extra, expected", [
    # worker:1's pipeline slow from the start: named once, after the hold
    ({"worker:0": [0.0], "worker:1": [0.96], "worker:2": [0.02]}, {}, [(HOLD, "worker:1")]),
    # a balanced job: nobody
    ({"worker:0": [0.05], "worker:1": [0.1], "worker:2": [0.0]}, {}, []),
    # every worker's input slow: no outlier, nobody (no one worker holds the others back)
    ({"worker:0": [0.9], "worker:1": [0.95], "worker:2": [0.92]}, {}, []),
    # over the margin but under half its time: nobody
    ({"worker:0": [0.0], "worker:1": [0.45], "worker:2": [0.0]}, {}, []),
    # half its time, but its peers wait nearly as much: nobody
    ({"worker:0": [0.3], "worker:1": [0.55], "worker:2": [0.3]}, {}, []),
    # a hold broken by one round under: starts over
    ({"worker:0": [0.0], "worker:1": [0.9] * 10 + [0.2] + [0.9], "worker:2": [0.0]}, {},
     [(HOLD + 11 * 2.0, "worker:1")]),
    # the chief may be named: its extra work shows between its calls, not in them
    ({"chief:0": [0.9], "worker:0": [0.0], "worker:1": [0.0]}, {}, [(HOLD, "chief:0")]),
    # a share unknown (a task whose input tfo cannot read): nothing judged
    ({"worker:0": [None], "worker:1": [0.96], "worker:2": [0.0]}, {}, []),
    # one task alone: no peers
    ({"worker:0": [0.96]}, {}, []),
    # worker:2 restarts at round 6: every hold starts over then
    ({"worker:0": [0.0], "worker:1": [0.96], "worker:2": [0.0]},
     {"attempts": {"worker:2": lambda i: int(i >= 6)}}, [(HOLD + 12.0, "worker:1")]),
    # worker:0 not stepping for rounds 3-5 (an evaluation): starts over after it
    ({"worker:0": [0.0], "worker:1": [0.96], "worker:2": [0.0]},
     {"stepping": {"worker:0": lambda i: not 3 <= i <= 5}}, [(HOLD + 12.0, "worker:1")]),
])
def test_starved_worker(table, extra, expected):
    assert rounds(table, **extra) == expected


def test_named_once_whatever_the_signal():
    """A task already named (by its rate or its CPU) is not named again."""
    memory, said = starved.Memory(), {"worker:1"}
    samples = [starved.Sample("worker:0", 0, True, 0.0), starved.Sample("worker:1", 0, True, 0.96)]
    assert [starved.judge(samples, memory, said, t) for t in range(0, 100, 2)] == [[]] * 50


def test_the_words_and_figures():
    s = starved.Starved("worker:1", 0.964, 0.012, since=4.0)
    assert s.figures() == {"input_wait_share": 0.96, "peers_input_wait_share": 0.01}
    assert s.words() == ("worker:1 is slow: it waits for its input 96% of the time while its "
                         "peers, waiting for it in the collective, wait 1%: its input "
                         "pipeline, for 30 s and more")



def replay(name: str) -> list[tuple[float, str]]:
    """A recorded run's `input` markers (tests/data/input/NAME.json: each worker's (at,
    waited), its clock from the first marker) fed to Waits as they came, judged every
    second as SlowWatch does (every task stepping: they trained throughout)."""
    data = json.loads((Path(__file__).parent / "data" / "input" / f"{name}.json").read_text())
    waits = {task: starved.Waits() for task in data}
    memory, said, out = starved.Memory(), set(), []
    end = max(points[-1][0] for points in data.values())
    for t in range(int(end) + 1):
        for task, points in data.items():
            for at, waited in points:
                if t - 1 < at <= t:
                    waits[task].take(at, waited, now=float(t))
        samples = [starved.Sample(task, 0, True, w.share(float(t))) for task, w in waits.items()]
        out += [(float(t), v.task) for v in starved.judge(samples, memory, said, float(t))]
    return out


def test_recorded_runs():
    """Real runs' markers (3-worker MultiWorkerMirrored, 2 cores, load 10-20): worker:1's map
    sleeping 5 ms an element, named 37 s after its first marker (its share known from half a
    window of markers on, then the 30 s hold);
    balanced jobs and a job slowed by a busy thread (cause compute, not input): nobody."""
    assert replay("slow_input_worker1") == [(37.0, "worker:1")]
    # busy_worker.py: balanced 60 s, then worker:2's busy thread (bench/slow.py's compute
    # run, named cause compute 32 s after): every worker waited 0-5 % for its input
    assert replay("busy_worker2") == []
    assert replay("busy_worker2_run2") == []
    # busy_worker.py with no busy thread, 60 s of training (bench/slow.py's balanced runs)
    for name in ("balanced", "balanced_bench1", "balanced_bench2"):
        assert replay(name) == [], name

# --- a real job --------------------------------------------------------------------------

SLOW_INPUT_JOB = """\
name: starved
job:
  script: tests/scripts/slow_input.py
  args: ["--slow_task", "worker:1", "--sleep_ms", "5", "--steps", "100000"]
tasks:
  worker: [localhost:auto, localhost:auto, localhost:auto]
restart: {policy: on-failure, max_restarts: 2}
"""
NAMED_WITHIN = 60.0  # of training (worker:1's first step): the 30 s hold, the window, slack


@pytest.mark.tf
@pytest.mark.timeout(360)
def test_a_synchronous_job_names_its_input_starved_worker(tmp_path: Path, run_dir: Path):
    """A real 3-worker MultiWorkerMirrored job (tests/scripts/slow_input.py, as TensorFlow's
    tutorial writes it) whose worker:1 decodes slowly (its `map` sleeps 5 ms an element):
    `task_slow` names worker:1, cause input, within NAMED_WITHIN s of its training, once,
    with its figures, in the events and the console; no other task is named."""
    spec = write_spec(tmp_path / "starved.yaml", SLOW_INPUT_JOB)
    tfo = subprocess.Popen(tfo_cmd("run", str(spec), "--run-dir", str(run_dir), "--no-logs"),
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)

    def first_step() -> float | None:
        steps = [e["time"] for e in events(run_dir)
                 if e["event"] == "task_first_step" and e["task"] == "worker:1"]
        return steps[-1] if steps else None

    def named() -> list[dict]:
        return [e for e in events(run_dir) if e["event"] == "task_slow"]

    try:
        assert wait_until(first_step, 240, interval=0.5), "worker:1 never trained"
        slow = wait_until(named, NAMED_WITHIN + 60, interval=0.5)
        time.sleep(4)  # a second verdict, were there one, would come with the first
        slow = named()
    finally:
        out = interrupted(tfo)
    assert slow, f"worker:1 never named\n{out[-3000:]}"
    assert [(e["task"], e["cause"]) for e in slow] == [("worker:1", "input")], slow
    event = slow[0]
    took = event["time"] - first_step()
    assert took <= NAMED_WITHIN, f"named {took:.0f} s after worker:1's first step"
    assert event["input_wait_share"] >= 0.5, event
    assert event["input_wait_share"] >= event["peers_input_wait_share"] + 0.3, event
    assert event["lagging_seconds"] >= 30 and event["why"].startswith("worker:1 is slow: "), event
    assert f"[tfo] {event['why']}" in out, out[-3000:]
    print(f"named {took:.1f} s after worker:1's first step: {event['why']}")
