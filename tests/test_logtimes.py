"""`tfo logs RUN` interleaves the tasks by time (issue 40): each log's time index
(runs/logtimes.py), written by the coordinator's reader of a task's output, and the merge in
cli/logprint.py. Tables on a fake clock; the writer through a real TaskOutput."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.cli.logprint import LogPrinter
from orchestrator.launch.output import TaskOutput
from orchestrator.runs import rundir
from orchestrator.runs.logtimes import STEP, TimeIndex, stamped, times_of
from orchestrator.runs.rundir import RunDir
from worker_entry import channel


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_index_marks_at_most_every_step(tmp_path):
    clock = Clock()
    index = TimeIndex(tmp_path / "w.log", clock)
    for offset, advance in [(0, 0), (10, 0.01), (20, STEP), (30, STEP / 2), (40, STEP)]:
        clock.now += advance
        index.mark(offset)
    index.close()
    assert list(times_of(tmp_path / "w.log")) == [(0, 1000.0), (20, 1000.06), (40, 1000.135)]


def test_a_missing_or_damaged_index_reads_as_what_is_whole(tmp_path):
    assert list(times_of(tmp_path / "none.log")) == []
    (tmp_path / "w.log.t").write_text("0 5.0\ngarbage\n12 x\n30 7.5\n40")
    assert list(times_of(tmp_path / "w.log")) == [(0, 5.0), (30, 7.5)]


@pytest.mark.parametrize("start, times, lines, expected", [
    # each line takes the last entry at or before its first byte
    (0, [(0, 1.0), (6, 2.0)], [("a", True, 2), ("b", True, 4), ("c", True, 6), ("d", True, 8)],
     [1.0, 1.0, 1.0, 2.0]),
    # before any entry: 0.0 (an older run's log, or an index cut short)
    (0, [(4, 3.0)], [("a", True, 2), ("b", True, 4), ("c", True, 6)], [0.0, 0.0, 3.0]),
    # from an offset (tfo logs -f's next look): the entries before it still count
    (4, [(0, 1.0), (2, 2.0), (5, 3.0)], [("c", True, 6), ("d", True, 8)], [2.0, 3.0]),
    # a long line's pieces keep its time
    (0, [(0, 1.0), (3, 2.0)], [("ab", False, 2), ("cd", True, 5), ("e", True, 7)],
     [1.0, 1.0, 2.0]),
])
def test_each_line_has_the_time_of_its_first_byte(start, times, lines, expected):
    assert [t for t, *_ in stamped(lines, start, times)] == expected


def _run_dir(tmp_path: Path, logs: dict[str, tuple[str, str | None]]) -> RunDir:
    (tmp_path / "logs").mkdir()
    for name, (text, index) in logs.items():
        log = tmp_path / "logs" / f"{name.replace(':', '-')}.log"
        log.write_text(text)
        if index is not None:
            Path(f"{log}.t").write_text(index)
    return RunDir(str(tmp_path))


def test_every_tasks_log_is_interleaved_by_time(tmp_path, capsys):
    rd = _run_dir(tmp_path, {
        "worker:0": ("w0 first\nw0 second\nw0 third\n", "0 10.0\n18 12.0\n"),
        "worker:1": ("w1 first\nw1 second\n", "0 11.0\n9 13.0\n"),
        "chief:0": ("c0 only\n", "0 11.0\n")})
    LogPrinter(rd, None, False, str).show(0, whole=True)
    assert capsys.readouterr().out.splitlines() == [
        "[worker:0] w0 first", "[worker:0] w0 second",
        "[chief:0] c0 only", "[worker:1] w1 first",  # the same time: in task order
        "[worker:0] w0 third", "[worker:1] w1 second"]


def test_a_log_without_an_index_keeps_its_order_ahead_and_a_named_task_is_its_log_alone(
        tmp_path, capsys):
    rd = _run_dir(tmp_path, {"worker:0": ("a\nb\n", None), "worker:1": ("c\n", "0 1.0\n")})
    printer = LogPrinter(rd, None, False, str)
    printer.show(0, whole=True)
    assert capsys.readouterr().out.splitlines() == ["[worker:0] a", "[worker:0] b",
                                                    "[worker:1] c"]
    LogPrinter(rd, "worker:1", False, str).show(0, whole=True)
    assert capsys.readouterr().out.splitlines() == ["c"]
    # the next look (tfo logs -f) prints only what came since, still by time
    with open(tmp_path / "logs" / "worker-0.log", "a") as f:
        f.write("late\n")
    with open(tmp_path / "logs" / "worker-1.log", "a") as f:
        f.write("later\n")
    with open(tmp_path / "logs" / "worker-1.log.t", "a") as f:
        f.write("2 0.5\n")
    printer.show(0, whole=True)
    assert capsys.readouterr().out.splitlines() == ["[worker:0] late", "[worker:1] later"]


def test_a_long_lines_pieces_stay_together(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(rundir, "LOG_CHUNK", 4)
    rd = _run_dir(tmp_path, {"worker:0": ("abcdefghij\n", "0 1.0\n"),
                             "worker:1": ("xy\n", "0 1.0\n")})
    LogPrinter(rd, None, False, str).show(0, whole=True)
    assert capsys.readouterr().out == "[worker:0] abcdefghij\n[worker:1] xy\n"


def test_the_coordinator_writes_the_index_as_the_output_comes(tmp_path, capsys):
    """Two tasks' output through real TaskOutputs, alternating: `tfo logs RUN` prints it in
    the order it came, not a task at a time."""
    (tmp_path / "logs").mkdir()
    outs = {name: TaskOutput(str(tmp_path / "logs" / f"worker-{name}.log"), None, f"w{name}")
            for name in (0, 1)}
    for i in range(3):
        for name, out in outs.items():
            out.feed(channel.frame(channel.OUTPUT, f"w{name} line {i}\n".encode()))
            time.sleep(STEP * 1.5)
    for out in outs.values():
        out.end()
    LogPrinter(RunDir(str(tmp_path)), None, False, str).show(0, whole=True)
    assert capsys.readouterr().out.splitlines() == [
        f"[worker:{n}] w{n} line {i}" for i in range(3) for n in (0, 1)]
