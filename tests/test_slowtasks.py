"""The slow task shown (issue 41 item 3): `task_slow` marked in the live table, written in the
summary, `tfo status` and its JSON, read from events.jsonl. One scripted job on a fake clock
(the supervisor's own SlowWatch names its slow worker, which then restarts) serves the views
end to end; the rest are tables of events, rendered at fixed widths."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import struct
import termios
import time
from pathlib import Path

import jsonschema
import pytest

from orchestrator.cli.liveview import (
    LIVE,
    STATUS,
    LiveView,
    Row,
    Trained,
    render,
    rows_from_events,
    table,
)
from orchestrator.loop.supervise import Supervisor
from orchestrator.planning.plan import TaskPlan
from tests.conftest import events as run_events
from tests.conftest import run_tfo
from tests.fakes import FakeClock, FakeHandle, FakeWaiter, Script, events_on, planned, spec
from tests.helpers import ANSI, tfo_env, user_dir


def marker(step: int, at: float) -> str:
    return json.dumps({"event": "progress", "step": step, "at": at}).join(("@tfo ", ""))


def stepping(until: float, every: float) -> list[tuple[float, str]]:
    """Progress markers, with the task's own time, a step every `every` s until `until`."""
    return [(i * every, marker(i, i * every)) for i in range(1, int(until / every) + 1)]


class Frames:
    """The live view's writer: each footer it is handed, rendered at once, with the loop's
    time (the fake clock's)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.frames = clock, []

    def set_footer(self, render_footer) -> None:  # noqa: ANN001
        if render_footer is not None:
            self.frames.append((self.clock.now, render_footer()))


def pty_of(columns: int) -> tuple[int, int]:
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return leader, follower


def row_of(frame: str, task: str) -> str:
    return next(line for line in ANSI.sub("", frame).splitlines() if line.startswith(task + " "))


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory: pytest.TempPathFactory):
    """A ParameterServer job on a fake clock: the chief and workers 0-1 step 10 times a
    second, worker:2 twice; worker:2 fails at 60 s and is restarted alone (as slow), the
    chief ends the job at 80 s. The live view watches it on an 80-column terminal."""
    tmp_path = tmp_path_factory.mktemp("slow")
    clock = FakeClock()
    fast = Script([(None, 0, True)], output={0: stepping(85, 0.1)})
    scripts = {"chief:0": Script([(0, 80.0, True)], output={0: stepping(80, 0.1)}),
               "worker:0": fast, "worker:1": fast,
               "worker:2": Script([(1, 60.0, True), (None, 0, True)],
                                  output={0: stepping(60, 0.5), 1: stepping(40, 0.5)}),
               "ps:0": Script([(None, 0, True)])}
    plan = planned(tmp_path, spec("parameter_server", chief=["localhost:1"],
                                  worker=["localhost:2", "localhost:3", "localhost:4"],
                                  ps=["localhost:5"]))
    frames = Frames(clock)
    leader, follower = pty_of(80)
    try:
        def start(task: TaskPlan, attempt: int) -> FakeHandle:
            return FakeHandle(task, attempt, scripts[task.name], clock)

        with events_on(clock):
            result = Supervisor(plan, start=start, echo=lambda task, line: None, clock=clock,
                                waiter=FakeWaiter(clock),
                                watch=LiveView(frames, follower)).run()
    finally:
        os.close(leader)
        os.close(follower)
    return result, run_events(tmp_path / "run"), frames.frames, tmp_path / "run", clock


def test_the_slow_worker_is_marked_in_the_live_table_until_it_restarts(slow_run):
    """Fails before the change: the table had no mark. From the verdict on, worker:2's state
    reads `slow`, at 80 columns with its steps/s and step still shown; its restart (a new
    process) drops the mark, and tfo says nothing more of it."""
    result, events, frames, _, clock = slow_run
    assert result.state.value == "succeeded", result.reason
    (said,) = [e for e in events if e["event"] == "task_slow"]
    assert (said["task"], said["attempt"], said["cause"]) == ("worker:2", 0, "steps")
    at = clock.now - (clock.wall() - said["time"])  # the verdict, on the loop's clock
    restarted = next(e for e in events if e["event"] == "task_started"
                     and e["task"] == "worker:2" and e["attempt"] == 1)
    again = clock.now - (clock.wall() - restarted["time"])
    before = [f for t, f in frames if t < at]
    marked = [f for t, f in frames if at < t < again - 1]
    after = [f for t, f in frames if t > again + 1]
    assert before and marked and after
    assert all(re.match(r"worker:2\s+running\s", row_of(f, "worker:2")) for f in before)
    for f in marked:
        assert re.match(r"worker:2\s+slow\s", row_of(f, "worker:2")), f
        assert re.match(r"worker:1\s+running\s", row_of(f, "worker:1")), f
        plain = ANSI.sub("", f)
        assert all(len(line) < 80 for line in plain.splitlines()), plain
        assert {"step", "steps/s", "last"} <= set(plain.splitlines()[1].split()), plain
        assert re.match(r"worker:2\s+slow\s+-\s+\d+\s+2.0\s", row_of(f, "worker:2")), plain
    assert all(re.match(r"worker:2\s+(pending|starting|running)\s", row_of(f, "worker:2"))
               for f in after)


def test_the_summary_names_the_slow_worker_with_its_cause_and_why(slow_run, monkeypatch):
    from rich.console import Console

    from orchestrator.cli import report

    result, events, _, _, _ = slow_run
    said = next(e for e in events if e["event"] == "task_slow")
    console = Console(width=80, record=True, file=io.StringIO(), highlight=False,
                      markup=False, emoji=False)
    monkeypatch.setattr(report, "err", console)
    report.print_summary(result, elapsed=80.0)
    text = console.export_text(styles=False)
    when = time.strftime("%H:%M:%S", time.localtime(said["time"]))
    line = f"slow: worker:2, cause steps ({when}): {said['why']}"
    assert " ".join(line.split()) in " ".join(text.split()), text


def test_tfo_status_and_its_json_give_the_verdict(slow_run, tmp_path: Path):
    """The real `tfo status` on the run directory: the verdict's line under the table (the
    restarted worker no longer marked), and the JSON's `slow_tasks`."""
    _, events, _, run_dir, _ = slow_run
    said = next(e for e in events if e["event"] == "task_slow")
    cwd = user_dir(tmp_path / "user")
    env = {**tfo_env(cwd), "COLUMNS": "80"}
    res = run_tfo("status", str(run_dir), cwd=cwd, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    when = time.strftime("%H:%M:%S", time.localtime(said["time"]))
    assert f"slow: worker:2, cause steps ({when}): {said['why']}\n" in res.stdout, res.stdout
    assert re.search(r"worker:2\s+localhost\s+stopped\s+1\s", res.stdout), res.stdout
    res = run_tfo("status", "--json", str(run_dir), cwd=cwd, env=env, timeout=60)
    doc = json.loads(res.stdout)
    (slow,) = doc["slow_tasks"]
    assert (slow["task"], slow["attempt"], slow["cause"], slow["why"], slow["time"]) == (
        "worker:2", 0, "steps", said["why"], said["time"])
    assert slow["figures"]["steps_per_second"] == said["steps_per_second"]
    assert not any(t["slow"] for t in doc["tasks"])  # worker:2 restarted since


# ---- tables of events -------------------------------------------------------------------
def slow(task: str = "worker:1", attempt: object = 0, **extra: object) -> dict:
    return {"event": "task_slow", "time": 1_800_000_100.0, "task": task, "attempt": attempt,
            "cause": "input", "why": f"{task} waits for its input 80% of its step",
            "input_share": 0.8, **extra}


def started(task: str, attempt: int) -> dict:
    return {"event": "task_started", "task": task, "attempt": attempt, "pid": 10 + attempt,
            "host": "h"}


@pytest.mark.parametrize(("evs", "marked"), [
    ([started("worker:1", 0), slow()], True),
    ([started("worker:1", 0), {"event": "task_ready", "task": "worker:1"}, slow()], True),
    ([started("worker:1", 0), slow(), {"event": "task_restarted", "task": "worker:1",
                                       "restarts": 1}], False),  # its next attempt
    ([started("worker:1", 0), slow(), started("worker:1", 1)], False),
    ([started("worker:1", 1), slow(attempt=0)], False),  # said of an earlier attempt
    ([started("worker:1", 0), slow(attempt="0")], False),  # not the contract's
    ([started("worker:1", 0), slow(task="worker:0")], False),
], ids=["said", "ready", "restarted", "started-again", "stale", "garbage", "another"])
def test_status_marks_a_task_while_its_verdict_s_attempt_is_current(evs: list, marked: bool):
    row = next(r for r in rows_from_events(evs) if r.task == "worker:1")
    assert row.slow is marked


def test_a_marked_row_at_80_columns_keeps_what_a_trainer_watches():
    """`slow` takes `running`'s place, no wider: the 80-column live table keeps step, steps/s
    and the last line, and `tfo status`'s its essentials."""
    trained = Trained(epoch=2, epochs=100, step=3900, step_in_epoch=150, steps=1875, loss=0.09432)
    rows = [Row(task=f"worker:{i}", host="localhost", pid=1234567 + i, state="running",
                uptime=3725.0, cpu=187.3, rss=2_400_000_000, trained=trained,
                steps_per_second=3.1 if i == 1 else 12.3, slow=i == 1,
                last="150/1875 [>.............] - ETA: 2:31 - loss: 0.0943 - accuracy: 0.97")
            for i in range(3)]
    for width in (79, 80):  # the live view draws one column short of the terminal
        text = render(table(rows, LIVE, width=width), width=width)
        lines = text.splitlines()
        assert all(len(line) <= width for line in lines), text
        assert lines[0].split() == ["task", "state", "epoch", "step", "steps/s", "loss",
                                    "last", "line"], text
        assert re.match(r"worker:1\s+slow\s+3/100\s+150/1875\s+3.1\s+0.0943\s+150/1875",
                        lines[3]), text
        assert re.match(r"worker:0\s+running\s+3/100", lines[2]), text
    stopped = Row(task="worker:1", state="running (stopped)", slow=True)
    assert "slow (stopped)" in render(table([stopped], STATUS, width=80), width=80)
    colored = render(table(rows, LIVE, width=80), width=80, color=True)
    assert "\x1b[1;33mslow" in colored  # bold yellow, as a mark


def test_verdicts_are_read_as_the_contract_says(tmp_path: Path):
    from orchestrator.cli import slowtasks

    path = tmp_path / "events.jsonl"
    lines = [json.dumps(e) for e in (
        started("worker:1", 0), slow(), slow(task=None), slow("worker:2", attempt=True,
                                                              why=None, cause=None, lag=True))]
    path.write_text("\n".join(lines) + "\nnot json task_slow\n")
    (one, two) = slowtasks.read(path)
    assert (one.task, one.attempt, one.cause, one.figures) == ("worker:1", 0, "input",
                                                              {"input_share": 0.8})
    assert (two.attempt, two.cause, two.why, two.figures) == (None, "?", "", {"input_share": 0.8})
    when = time.strftime("%H:%M:%S", time.localtime(1_800_000_100.0))
    assert slowtasks.words(one) == f"worker:1, cause input ({when}): worker:1 waits for its " \
        "input 80% of its step"
    assert slowtasks.words(slowtasks.verdict(slow(attempt=2, why="\x1b[2J"))) == \
        f"worker:1, cause input ({when}, attempt 2): \\x1b[2J"
    assert slowtasks.read(tmp_path / "none.jsonl") == []


def test_the_live_table_reads_only_what_events_jsonl_gained(tmp_path: Path):
    from orchestrator.cli.slowtasks import Tail

    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(started("worker:1", 0)) + "\n")
    tail = Tail(path)
    assert tail() == {}
    whole = json.dumps(slow()) + "\n"
    with open(path, "a") as f:
        f.write(whole[:30])  # a record being written: not yet read
    assert tail() == {}
    with open(path, "a") as f:
        f.write(whole[30:])
    assert tail()["worker:1"].cause == "input"
    offset = tail.offset
    assert tail()["worker:1"].cause == "input" and tail.offset == offset
    path.write_text(json.dumps(slow("worker:0")) + "\n")  # shorter: written back, read again
    assert set(tail()) == {"worker:0"}
    path.unlink()
    assert set(tail()) == {"worker:0"}  # gone a moment: the last known


def test_a_line_longer_than_a_read_is_passed_not_waited_on(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    from orchestrator.cli import slowtasks

    monkeypatch.setattr(slowtasks, "READ_AT_MOST", 256)
    path = tmp_path / "events.jsonl"
    path.write_text("x" * 600 + "\n" + json.dumps(slow()) + "\n")
    assert [v.task for v in slowtasks.read(path)] == ["worker:1"]


def test_the_status_document_holds_the_verdicts(tmp_path: Path):
    from orchestrator.cli import statejson
    from orchestrator.runs.rundir import RunDir

    run = tmp_path / "r"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({"name": "j", "run_id": "j-1"}))
    evs = [{"event": "run_started", "time": 100.0, "coordinator_pid": 1,
            "coordinator_created": 0.0, "coordinator_host": "elsewhere"},
           started("worker:1", 0), slow()]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    rd = RunDir(str(run))
    doc = json.loads(statejson.text(statejson.status(rd, *rd.read_events())))
    jsonschema.validate(doc, statejson.schema())
    assert doc["slow_tasks"] == [{"task": "worker:1", "attempt": 0, "cause": "input",
                                  "why": "worker:1 waits for its input 80% of its step",
                                  "time": 1_800_000_100.0, "figures": {"input_share": 0.8}}]
    assert doc["tasks"][0]["slow"] is True
