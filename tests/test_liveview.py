"""What a user watches: the live table on a terminal, the plain table when piped, and the
run's history afterwards (`tfo runs`, `tfo status`, `tfo logs`). One short real run in a
pseudo-terminal serves every TF assertion here; the rest are fast."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.cli.console import ConsoleWriter, console_echo, printable
from orchestrator.cli.liveview import (
    FINAL,
    LIVE,
    Row,
    Trained,
    begun,
    render,
    rows_from_events,
    table,
)
from tests.conftest import ENDED, REPO, kill_tree, run_processes, run_tfo, tfo_cmd
from tests.helpers import ANSI, COLUMNS, run_in_pty, tfo_env, user_dir

SCRIPT = REPO / "tests" / "scripts" / "live_progress.py"


@dataclass
class PtyRun:
    cwd: Path  # the run is under cwd/runs/, as a user's would be
    run_dir: Path
    raw: str  # everything tfo wrote to its terminal
    returncode: int

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw)



@pytest.fixture(scope="module")
def pty_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PtyRun]:
    """Two workers train 3 epochs of 20 steps (about 5 s) under `tfo run` on a terminal."""
    cwd = user_dir(tmp_path_factory.mktemp("user"))
    (cwd / "live.yaml").write_text(f"""\
name: live
job:
  script: {SCRIPT}
  args: [--epochs, "3", --steps, "20", --sleep, "0.1"]
tasks:
  worker: [localhost:auto, localhost:auto]
timeouts: {{startup_seconds: 120, grace_seconds: 5}}
""")
    raw, code = run_in_pty(["run", "live.yaml"], cwd, timeout=180)
    run_dirs = list((cwd / "runs").glob("live-*"))
    assert len(run_dirs) == 1, ANSI.sub("", raw)[-3000:]
    try:
        yield PtyRun(cwd, run_dirs[0], raw, code)
    finally:
        run_id = json.loads((run_dirs[0] / "plan.json").read_text())["run_id"]
        left = run_processes(run_id)
        for p in left:
            kill_tree(p.pid)
        assert not left, f"processes of the run left behind: {[p.pid for p in left]}"


# ---- on a terminal ------------------------------------------------------------------------
@pytest.mark.tf
@pytest.mark.timeout(240)
def test_the_live_table_shows_each_task_training(pty_run: PtyRun):
    assert pty_run.returncode == 0, pty_run.text[-4000:]
    text = pty_run.text
    # No restarts column: under the default policy (never) there are none to count.
    header = re.search(r"task\s+host\s+pid\s+state\s+up\s+cpu\s+rss\s+epoch\s+step"
                       r"\s+steps/s\s+loss\s+last line", text)
    assert header, text[-4000:]
    # A row of a running worker: its pid, its epoch of 3, its step of 20, its speed, its loss;
    # no usage reported (yet): "-".
    rows = re.findall(r"worker:1\s+localhost\s+(\d+)\s+running\s+(?:\d+m)?\d+s\s+(\S+)\s+(\S+)\s+"
                      r"(\d)/3\s+(\d+)/20\s+([\d.]+)\s+([\d.e+-]+)\s", text)
    assert rows, text[-4000:]
    epochs = {int(r[3]) for r in rows}
    steps = [int(r[4]) for r in rows]
    assert len(epochs) >= 2 or len(set(steps)) >= 2, rows  # it moved while we watched
    pids = {int(r[0]) for r in rows}
    started = [json.loads(line) for line in (pty_run.run_dir / "events.jsonl").read_text()
               .splitlines() if '"task_started"' in line]
    assert pids == {e["pid"] for e in started if e["task"] == "worker:1"}
    # It is redrawn in place (cursor up, erase), not printed again below.
    assert re.search(r"\r\x1b\[\d+A\x1b\[J", pty_run.raw)
    # The tasks' lines still stream above it, prefixed.
    assert "[worker:0] trained" in text and "[worker:1] trained" in text


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_no_escape_sequence_or_markup_of_a_task_reaches_the_terminal(pty_run: PtyRun):
    assert "\x1b[31mRED" not in pty_run.raw and "\x07" not in pty_run.raw
    assert "[worker:1] \\x1b[31mRED\\x1b[0m [bold red]markup[/] \\x07" in pty_run.text
    # The task's log keeps what it printed.
    assert "\x1b[31mRED" in (pty_run.run_dir / "logs" / "worker-1.log").read_text()


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_the_summary_has_a_row_per_task_and_where_tensorboard_is(pty_run: PtyRun):
    text = pty_run.text
    assert re.search(r"job succeeded: all training tasks finished", text)
    for task in ("worker:0", "worker:1"):
        assert re.search(rf"{task}\s+localhost\s+succeeded\s+{ENDED}\s+3/3\s+20/20\s+"
                         r"[\d.]", text), text[-3000:]
    board = pty_run.run_dir / "tensorboard"
    assert f"tensorboard: {board} (to view: tensorboard --logdir {board})" in text


@pytest.mark.timeout(60)
def test_tables_fit_the_terminal_written_to_not_stdins(tmp_path: Path):
    """rich measures stdin's terminal first and takes 80 columns where it reports 0: the
    plan's table was cut to 80 on a 200-column terminal."""
    text, rc = run_in_pty(["plan", str(REPO / "clusters" / "localhost.yaml")], tmp_path, 30,
                          unsized_stdin=True)
    assert rc == 0, text
    widest = max(len(ANSI.sub("", line).rstrip()) for line in text.splitlines())
    assert 80 < widest <= COLUMNS, text
    assert "…" not in text  # nothing cut


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_the_chief_writes_training_scalars_for_tensorboard(pty_run: PtyRun):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    board = pty_run.run_dir / "tensorboard"
    assert [p.name for p in board.iterdir()] == ["train"]  # the chief's alone
    summaries = EventAccumulator(str(board / "train"), size_guidance={"tensors": 0}).Reload()
    tags = summaries.Tags()["tensors"]  # TF2 writes scalars as tensors
    assert {"epoch_loss", "epoch_mae", "batch_loss"} <= set(tags), tags
    assert [e.step for e in summaries.Tensors("epoch_loss")] == [0, 1, 2]
    batches = summaries.Tensors("batch_loss")
    steps = [e.step for e in batches]
    assert steps == sorted(steps) and steps[-1] == 60 and len(steps) >= 3
    # The last step's loss is what the last progress marker said.
    last = [json.loads(line) for line in (pty_run.run_dir / "events.jsonl").read_text()
            .splitlines() if '"task_progress"' in line and '"worker:0"' in line][-1]
    assert make_ndarray(batches[-1].tensor_proto).item() == pytest.approx(last["loss"],
                                                                           rel=1e-5)


# ---- history ------------------------------------------------------------------------------
@pytest.mark.tf
@pytest.mark.timeout(240)
def test_runs_status_and_logs_show_the_run(pty_run: PtyRun):
    cwd, run_id = pty_run.cwd, pty_run.run_dir.name
    (cwd / "runs" / "broken").mkdir()  # a directory that is no run: skipped, counted
    runs = run_tfo("runs", cwd=cwd, env=tfo_env(cwd), timeout=30)
    assert runs.returncode == 0, runs.output
    assert re.search(rf"{run_id}\s+live\s+\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\s+[\dhms]+\s+succeeded"
                     r"\s+0", runs.stdout), runs.output
    assert "skipped 1 directory" in runs.stderr

    status = run_tfo("status", "last", cwd=cwd, env=tfo_env(cwd), timeout=30)
    assert status.returncode == 0, status.output
    assert f"{run_id}: succeeded: all training tasks finished" in status.stdout
    for task in ("worker:0", "worker:1"):
        assert re.search(rf"{task}\s+localhost\s+succeeded\s+3/3\s+20/20\s+[\d.]+\s+"
                         rf"[\d.]+\s+task_exited\s+\d+\s+{ENDED}", status.stdout), status.stdout

    logs = run_tfo("logs", "last", "worker:1", cwd=cwd, env=tfo_env(cwd), timeout=30)
    assert logs.returncode == 0, logs.output
    assert "trained" in logs.stdout.splitlines()
    assert "@tfo" not in logs.stdout and "[worker:0]" not in logs.stdout
    # Following a finished run prints it and returns at once; every task, prefixed.
    follow = run_tfo("logs", run_id[:8], "-f", cwd=cwd, env=tfo_env(cwd), timeout=30)
    assert follow.returncode == 0, follow.output
    assert "[worker:0] trained" in follow.stdout and "[worker:1] trained" in follow.stdout


@pytest.mark.timeout(60)
def test_logs_follow_prints_lines_as_they_come_and_ends_with_the_run(tmp_path: Path):
    """A run made by hand: `tfo logs -f` shows what is appended, and returns when
    job_finished is written."""
    cwd = user_dir(tmp_path / "user")
    rd = cwd / "runs" / "hand-1"
    (rd / "logs").mkdir(parents=True)
    (rd / "plan.json").write_text(json.dumps({"name": "hand"}))
    events = rd / "events.jsonl"
    events.write_text(json.dumps({"time": time.time(), "event": "run_started",
                                  "coordinator_pid": os.getpid(),
                                  "coordinator_created": __import__("psutil").Process()
                                  .create_time(), "coordinator_host": os.uname().nodename})
                      + "\n")
    log = rd / "logs" / "worker-1.log"
    log.write_text("one\n")
    proc = subprocess.Popen(tfo_cmd("logs", "last", "worker:1", "-f"), cwd=cwd,
                            env=tfo_env(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout.readline() == "one\n"
        with log.open("a") as f:
            f.write("two, half")
            f.flush()
            time.sleep(0.5)
            f.write(" and whole\n")
        assert proc.stdout.readline() == "two, half and whole\n"
        with events.open("a") as f:
            f.write(json.dumps({"time": time.time(), "event": "job_finished",
                                "state": "succeeded", "restarts": 0}) + "\n")
        assert proc.wait(timeout=10) == 0
        assert proc.stdout.read() == ""
        # It says how the run ended, rather than return to the prompt without a word.
        assert proc.stderr.read() == "tfo: run hand-1 ended: succeeded: \n"
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()


# ---- fast: the pieces ---------------------------------------------------------------------
def test_rows_from_events_take_each_task_s_last_attempt():
    ev = [
        {"event": "run_started", "task": None},
        {"event": "task_started", "task": "worker:0", "pid": 10, "host": "lab1", "attempt": 0},
        {"event": "task_progress", "task": "worker:0", "step": 5, "epoch": 1, "epochs": 3,
         "step_in_epoch": 2, "steps": 4, "loss": 0.5},
        {"event": "task_exited", "task": "worker:0", "returncode": -9},
        {"event": "task_restarted", "task": "worker:0", "restarts": 1},
        {"event": "task_started", "task": "worker:0", "pid": 11, "host": "lab1", "attempt": 1},
        {"event": "task_ready", "task": "worker:0"},
        {"event": "task_progress", "task": "worker:0", "step": "x", "loss": [1]},  # garbage
        {"event": "task_standby_started", "task": "worker:0", "pid": 12, "attempt": 2},
    ]
    (row,) = rows_from_events(ev)
    assert row == Row(task="worker:0", host="lab1", pid=11, state="running", restarts=1,
                      last="task_progress")
    text = render(table([row], FINAL), width=120)
    assert re.search(r"worker:0\s+lab1\s+running\s+-\s+1\s+-\s+-\s+-", text)


def test_cells_are_text_never_markup_or_escapes():
    row = Row(task="worker:0", state="running", cpu=153.4, rss=3 << 30,
              trained=Trained(epoch=0, epochs=2, step=7, step_in_epoch=3, steps=10,
                              loss=0.123456), steps_per_second=12.345, uptime=3725,
              last="\x1b]52;c;aGk=\x07 [red]x[/] \x1b[2J")
    text = render(table([row], LIVE), width=200)
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]52;c;aGk=\\x07 [red]x[/] \\x1b[2J" in text
    assert re.search(r"worker:0\s+-\s+-\s+running\s+0\s+1h02m\s+153%\s+3.0G\s+1/2\s+3/10\s+"
                     r"12.3\s+0.1235", text), text
    assert printable("tab\tok") == "tab\tok"


def test_console_echo_escapes_and_no_logs_keeps_tfo_s_own_lines():
    out: list[str] = []
    echo = console_echo(out.append, verbose=False, logs=False)
    echo("worker:0", "hidden")
    echo("tfo", "worker:0 finished")
    assert out == ["[tfo] worker:0 finished"]
    echo = console_echo(out.append, verbose=False)
    echo("worker:0", "\x1b[1mbold")
    assert out[-1] == "[worker:0] \\x1b[1mbold"


def test_the_footer_stays_below_the_lines_and_is_erased_at_the_end():
    r, w = os.pipe()
    writer = ConsoleWriter(w)
    writer.set_footer(lambda: "T1\nT2\n")
    time.sleep(0.3)
    writer.write("line")
    time.sleep(0.3)
    writer.set_footer(None)
    writer.close()
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read().decode()
    assert data == "T1\nT2\n" + "\r\x1b[2A\x1b[J" + "line\nT1\nT2\n" + "\r\x1b[2A\x1b[J"


def test_plain_output_has_no_escape_sequences(tmp_path: Path):
    """Piped (CI): no ANSI from tfo itself either; `tfo runs` with no runs says so."""
    cwd = user_dir(tmp_path / "user")
    (cwd / "runs").mkdir()
    res = run_tfo("runs", cwd=cwd, env=tfo_env(cwd), timeout=30)
    assert res.returncode == 0 and "0 run(s) under runs/" in res.stdout
    assert "\x1b" not in res.output


def test_the_failure_summary_shows_the_log_s_end_as_the_console_did(tmp_path: Path):
    from orchestrator.cli.report import _last_lines
    from worker_entry import markers

    log = tmp_path / "worker-1.log"
    log.write_text("".join([
        "Epoch 2/3\n",
        markers.line(markers.PROGRESS, step=3, loss=0.5),
        "I0000 00:00:1795381621.499447    1114 cudart_stub.cc:31] Could not find cuda\n",
        "\x1b[2J[bold]boom[/]\n",
    ]))
    assert _last_lines("worker:1", str(log), 20) == ["Epoch 2/3", "\\x1b[2J[bold]boom[/]"]


def test_the_epoch_column_is_the_epoch_begun_not_the_one_before():
    """Keras prints "Epoch 5/200" as epoch 4 (0-based) begins; the last progress marker
    still tells epoch 3's last step until a step of epoch 4 is done (a second, at the
    markers' rate). The `epoch` marker says it began: 5/200, 0 of its steps."""
    before = Trained(epoch=3, epochs=200, step=40, step_in_epoch=10, steps=10, loss=0.5)
    assert begun(before, 4) == Trained(epoch=4, epochs=200, step=40, step_in_epoch=0,
                                       steps=10, loss=0.5)
    assert begun(before, 3) == before and begun(before, None) == before
    assert begun(Trained(), 0) == Trained(epoch=0)  # ParameterServer: epochs alone
    ev = [{"event": "task_started", "task": "worker:0", "pid": 1, "host": "h"},
          {"event": "task_progress", "task": "worker:0", "step": 40, "epoch": 3,
           "epochs": 200, "step_in_epoch": 10, "steps": 10, "steps_per_second": 61.5},
          {"event": "task_epoch", "task": "worker:0", "epoch": 4}]
    (row,) = rows_from_events(ev)
    assert row.steps_per_second == 61.5
    text = render(table([row], LIVE), width=200)
    assert re.search(r"5/200\s+0/10\s+61.5", text), text


def test_status_shows_a_running_task_s_rate_only_while_its_steps_come():
    """`tfo status` of a live run: a task whose progress events stopped (stuck, or the
    coordinator gone) shows its steps/s as unknown, not the last one; a finished task keeps
    the rate it ended at."""
    def run(state_events: list[dict]) -> list[dict]:
        return [{"event": "task_started", "task": "worker:0", "pid": 1, "host": "h"},
                {"event": "task_ready", "task": "worker:0"},
                {"event": "task_progress", "task": "worker:0", "step": 10, "time": 100.0,
                 "steps_per_second": 9.9},
                {"event": "task_progress", "task": "worker:0", "step": 20, "time": 101.0,
                 "steps_per_second": 10.0}, *state_events]

    def rate(state_events: list[dict], now: float) -> float | None:
        (row,) = rows_from_events(run(state_events), now=now)
        return row.steps_per_second

    assert rate([], now=102.5) == 10.0
    assert rate([], now=104.5) is None  # 3.5 s since its last: stale
    assert rate([{"event": "task_exited", "task": "worker:0", "returncode": 0}],
                now=1000.0) == 10.0
    assert rows_from_events(run([]))[0].steps_per_second == 10.0  # no clock given
