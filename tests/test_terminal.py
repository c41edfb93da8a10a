"""The terminal as people read it (issue 40): what a user sees at the end of a run, at the
widths people work in. Tables render at fixed widths (rich's Console(width=N)) from
recorded rows; two real runs check the endings a table test cannot: Ctrl-C pressed again
and again, and a failing worker's final screen."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.cli.console import ConsoleEcho, ConsoleWriter, repeat_note
from orchestrator.cli.liveview import (
    CELLS,
    FINAL,
    LIVE,
    STATUS,
    LiveView,
    Row,
    Trained,
    render,
    table,
    without_restarts,
)
from orchestrator.loop.decide import JobState, TaskState
from orchestrator.loop.records import RunResult, TaskOutcome
from tests.conftest import REPO, kill_tree, run_processes, run_tfo, tfo_cmd, wait_until
from tests.helpers import ANSI, run_in_pty, tfo_env, user_dir

SCRIPTS = REPO / "tests" / "scripts"


def last_text_line(text: str) -> str:
    return next(line for line in reversed(text.splitlines()) if line.strip())


# ---- real runs ----------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_ctrl_c_pressed_again_and_again_still_ends_with_the_verdict(tmp_path: Path):
    """Ctrl-C, then Ctrl-C again every 0.1 s until tfo exits (a user who wants out): the
    second lands while the first's teardown ends, or after. tfo still prints the table, the
    run directory and the verdict, and leaves nothing running. Before the fix a late one was
    a KeyboardInterrupt out of the pipeline: "interrupted by SIGINT while supervising;
    nothing was started", and no table."""
    cwd = user_dir(tmp_path / "user")
    out, err = (tmp_path / "stdout").open("w+"), (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(tfo_cmd("run", "--workers", "2", "--", "python",
                                    str(SCRIPTS / "save_on_term.py")),
                            cwd=cwd, stdout=out, stderr=err, start_new_session=True,
                            env=tfo_env(cwd))
    try:
        assert wait_until(lambda: all(f"[worker:{i}] step 2" in
                                      (tmp_path / "stdout").read_text() for i in (0, 1)), 60), \
            (tmp_path / "stderr").read_text()[-2000:]
        until = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < until:
            proc.send_signal(signal.SIGINT)
            time.sleep(0.1)
        assert proc.wait(timeout=5) == 130
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    text = (tmp_path / "stderr").read_text()
    assert "nothing was started" not in text, text
    assert "worker:0" in text and "worker:1" in text and "stopped" in text, text
    (run_dir,) = (cwd / "runs").iterdir()
    assert f"run directory: runs/{run_dir.name}" in text or str(run_dir) in text, text
    assert last_text_line(text).startswith("job interrupted: interrupted by SIGINT"), text
    run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
    assert not run_processes(run_id)



@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_failing_worker_s_final_screen_ends_with_the_verdict(tmp_path: Path):
    """A Keras worker whose third epoch's data file is missing, on an 80x24 terminal: its
    traceback shows once (as it printed it, without tfo's wrapper frames), and the run ends
    with the table, where its log is, and last the verdict with the error it raised."""
    cwd = user_dir(tmp_path / "user")
    raw, code = run_in_pty(["run", "--workers", "1", "--", "python",
                            str(SCRIPTS / "missing_shard.py"), "--data_dir",
                            str(tmp_path / "data")], cwd, timeout=240, columns=80, lines=24)
    text = ANSI.sub("", raw).replace("\r", "")
    assert code == 1, text[-3000:]
    lines = shown(text)
    missing = f"No such file or directory: '{tmp_path / 'data' / 'shard-2.npz'}'"
    assert lines[-1].startswith("job failed: worker:0 exited with exit code 1"), text[-3000:]
    assert lines[-1].endswith(f"FileNotFoundError: [Errno 2] {missing}" +
                              lines[-1][lines[-1].rindex(" ("):]), lines[-1]
    (run_dir,) = (cwd / "runs").iterdir()
    assert lines[-2].endswith(f"its log: tfo logs {run_dir.name} worker:0"), lines[-2]
    assert text.count("Traceback (most recent call last)") == 1, text[-3000:]
    assert "worker_entry" not in text  # the log keeps tfo's frames; the console does not
    assert "worker_entry" in (run_dir / "logs" / "worker-0.log").read_text()
    summary = text[text.rindex(f"{run_dir.name}: job failed after"):]
    assert re.search(r"worker:0 +(localhost +)?failed +exit code 1 +2/5", summary), summary


# ---- tables at 60, 80 and 200 columns ---------------------------------------------------
WIDTHS = (60, 80, 200)
RUN_ID = "train-20261127-034405-971c"
TRAINING = Trained(epoch=2, epochs=100, step=3900, step_in_epoch=150, steps=1875, loss=0.09432)


def running(hosts: tuple[str, ...] = ("localhost",) * 3, restarts: int = 0) -> list[Row]:
    """A 3-worker job in its third epoch, as the live table has it."""
    return [Row(task=f"worker:{i}", host=host, pid=1234567 + i, state="running",
                restarts=restarts, uptime=3725.0, cpu=187.3, rss=2_400_000_000,
                trained=TRAINING, steps_per_second=12.3,
                last="150/1875 [>.............] - ETA: 2:31 - loss: 0.0943 - accuracy: 0.97")
            for i, host in enumerate(hosts)]


def failed() -> list[Row]:
    return [Row(task="worker:0", host="localhost", state="stopped", exit=-9, trained=TRAINING),
            Row(task="worker:1", host="localhost", state="failed", exit=1, trained=TRAINING),
            Row(task="worker:2", host="localhost", state="stopped", exit=-15, trained=TRAINING)]


def shown(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def assert_whole(text: str, rows: list[Row], width: int, values: tuple[str, ...]) -> None:
    """What a reader must find whole on each task's row at this width."""
    lines = shown(text)
    assert all(len(line) <= width for line in lines), text
    for r in rows:
        (line,) = [line for line in lines if line.startswith(r.task + " ")]
        for col in values:
            assert CELLS[col](r) in line, (col, text)
        assert "…" not in line.replace(CELLS["last line"](r)[:10], "") or \
            "last line" in text, text


@pytest.mark.parametrize("width", WIDTHS)
def test_the_live_table_keeps_tasks_states_epochs_and_losses_whole(width: int):
    rows = running()
    text = render(table(rows, LIVE, width=width), width=width)
    assert_whole(text, rows, width, ("task", "state", "epoch", "loss"))
    header = shown(text)[0].split()
    if width >= 80:  # the essentials and what a trainer watches fit at 80
        assert {"step", "steps/s", "last"} <= set(header), text
        assert_whole(text, rows, width, ("step", "steps/s"))
    if width == 200:  # room for every column
        assert " ".join(header) == " ".join(LIVE), text
    if width == 60:  # one host: its column went first
        assert "host" not in header and "localhost" not in text
    assert "0.0943" in text and "0.09…" not in text


@pytest.mark.parametrize("width", WIDTHS)
def test_a_job_on_several_hosts_keeps_its_host_column_longer(width: int):
    rows = running(("gpu-node-01", "gpu-node-02", "gpu-node-02"))
    text = render(table(rows, LIVE, width=width), width=width)
    assert_whole(text, rows, width, ("task", "state", "epoch", "loss"))
    if width >= 80:
        assert_whole(text, rows, width, ("host",))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_summary_and_status_keep_exits_and_losses_whole(width: int):
    rows = failed()
    for columns in (FINAL, STATUS):
        text = render(table(rows, without_restarts(rows, columns), width=width), width=width)
        assert_whole(text, rows, width, ("task", "state", "exit", "epoch", "loss"))
        assert "signal SIGKILL" in text and "restarts" not in text  # none: no column


def test_restarts_show_where_a_task_restarted():
    rows = running(restarts=2)
    text = render(table(rows, without_restarts(rows, FINAL), width=80), width=80)
    assert "restarts" in shown(text)[0]


@pytest.mark.parametrize("width", WIDTHS)
def test_tfo_runs_shows_each_run_id_whole(width: int):
    from orchestrator.cli.report import runs_table
    from orchestrator.runs.rundir import Outcome, RunInfo

    found = [RunInfo(run_id=f"{RUN_ID[:-4]}{i:04x}", name="train", started=1.8e9 + i,
                     duration=65.0 * i, outcome=Outcome.SUCCEEDED, reason="", restarts=i)
             for i in range(3)]
    text = render(runs_table(found, width=width), width=width)
    assert all(len(line) <= width for line in shown(text)), text
    for r in found:
        assert r.run_id in text and "succeeded" in text, text
    assert "…" not in text


# ---- the end of a run, as it stays on screen ----------------------------------------------
def summary_at(width: int, result: RunResult, monkeypatch: pytest.MonkeyPatch,
               **kwargs: object) -> str:
    """print_summary's text on a console `width` columns wide (rich's own width handling)."""
    from rich.console import Console

    from orchestrator.cli import report

    console = Console(width=width, record=True, file=io.StringIO(), highlight=False,
                      markup=False, emoji=False)
    monkeypatch.setattr(report, "err", console)
    report.print_summary(result, **kwargs)
    return console.export_text()


TRACEBACK = """\
Epoch 3/5
Traceback (most recent call last):
  File "/home/ana/train.py", line 40, in <module>
    model.fit(dataset, epochs=5)
  File "/home/ana/project/worker_entry/autoprogress.py", line 202, in run
    return fit(*args, **kwargs)
  File "/home/ana/.venv/lib/python3.12/site-packages/tf_keras/src/utils/traceback_utils.py", line 70, in error_handler
    raise e.with_traceback(filtered_tb) from None
  File "/home/ana/train.py", line 22, in load
    with open(path) as f:
FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-3.npz'
"""  # noqa: E501


def failed_result(tmp_path: Path) -> RunResult:
    run_dir = tmp_path / "runs" / RUN_ID
    (run_dir / "logs").mkdir(parents=True)
    log = run_dir / "logs" / "worker-1.log"
    log.write_text(TRACEBACK)
    outcome = {"worker:0": (TaskState.STOPPED, -15), "worker:1": (TaskState.FAILED, 1),
               "worker:2": (TaskState.STOPPED, -9)}
    return RunResult(
        state=JobState.FAILED, exit_code=1, run_dir=str(run_dir), failed_task="worker:1",
        reason="worker:1 exited with exit code 1 (restart policy never)",
        tasks=[TaskOutcome(name, state, rc, 0, str(log), "localhost")
               for name, (state, rc) in outcome.items()])


@pytest.mark.parametrize("width", WIDTHS)
def test_a_failed_run_ends_with_its_verdict(width: int, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch):
    """The last line says what failed and what it raised, and how long the run took; the
    line before it, where the run is and the command to see the failing task's log."""
    text = summary_at(width, failed_result(tmp_path), monkeypatch, elapsed=125.0, shown=True)
    lines = shown(text)
    assert lines[-1] == ("job failed: worker:1 exited with exit code 1 (restart policy never): "
                         "FileNotFoundError: [Errno 2] No such file or directory: "
                         "'/data/shard-3.npz' (2m05s)"), text
    assert lines[-2].startswith("run directory: ") and \
        lines[-2].endswith(f"its log: tfo logs {RUN_ID} worker:1"), text
    assert "Traceback" not in text  # the console showed it: not twice
    assert f"{RUN_ID}: job failed after 2m05s" in text


def test_without_the_console_the_summary_shows_the_traceback_once_without_tfo_s_frames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`--no-logs` (the console did not show the tasks' lines): the failing task's last lines,
    the user's frames and TensorFlow's, not tfo's wrapper."""
    text = summary_at(80, failed_result(tmp_path), monkeypatch, elapsed=3.0, shown=False)
    assert text.count("Traceback (most recent call last)") == 1, text
    assert 'File "/home/ana/train.py", line 40' in text and "traceback_utils.py" in text
    assert "worker_entry" not in text and "autoprogress" not in text, text
    assert shown(text)[-1].startswith("job failed: worker:1 exited with exit code 1"), text


@pytest.mark.parametrize(("state", "reason"), [
    (JobState.SUCCEEDED, "all training tasks finished"),
    (JobState.INTERRUPTED, "interrupted by SIGINT")])
def test_every_run_ends_with_its_verdict_and_total_time(state: JobState, reason: str,
                                                        tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    result = RunResult(state=state, exit_code=0, reason=reason, run_dir=str(tmp_path / RUN_ID),
                       tasks=[TaskOutcome("worker:0", TaskState.SUCCEEDED, 0, 0, "", "h")])
    text = summary_at(80, result, monkeypatch, elapsed=3725.0)
    assert shown(text)[-1] == f"job {state.value}: {reason} (1h02m)", text


# ---- the live table across refreshes and a resize ------------------------------------------
def sized_pty(columns: int, lines: int = 24) -> tuple[int, int]:
    leader, follower = os.openpty()
    resize(follower, columns, lines)
    return leader, follower


def resize(fd: int, columns: int, lines: int = 24) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))


def test_the_live_table_keeps_its_columns_between_refreshes_until_the_width_changes():
    """Frames a second apart: the loss 0.13, then 0.1088, then 0.09432; a cpu not measured
    yet, then 187%; last lines short and long. Same columns, same places, each frame (an
    80-column table once showed cpu in some frames and not others)."""
    leader, follower = sized_pty(80)
    try:
        view = LiveView(ConsoleWriter(os.open(os.devnull, os.O_WRONLY)), follower)
        frames = []
        for loss, cpu, last in ((0.13, None, "Epoch 3/100"), (0.1088, 187.3, "x" * 200),
                                (0.09432, 99.0, "")):
            rows = [replace(r, cpu=cpu, last=last, trained=replace(TRAINING, loss=loss))
                    for r in running()]
            frames.append(ANSI.sub("", view.frame(rows, "t", LIVE, 0.03, 600.0)))
        heads = [shown(f)[2].rstrip() for f in frames]  # title, bar, header
        assert heads[0] == heads[1] == heads[2], frames
        assert all(len(line) < 80 for f in frames for line in shown(f)), frames
        assert "3%  eta 10m00s" in frames[0]
        resize(follower, 60)
        narrow = ANSI.sub("", view.frame(running(), "t", LIVE, 0.03, 600.0))
        assert all(len(line) < 60 for line in shown(narrow)), narrow
        assert "worker:2" in narrow and "0.0943" in narrow
    finally:
        os.close(leader)
        os.close(follower)


def test_a_footer_drawn_wide_is_erased_whole_after_the_terminal_narrows():
    """Drawn at 100 columns, its 3 lines 90 wide; the terminal narrows to 45: each line now
    takes 2 rows, so the next redraw goes up 6 rows, not 3 (3 stale halves stayed)."""
    leader, follower = sized_pty(100)
    try:
        writer = ConsoleWriter(follower)
        writer.set_footer(lambda: ("x" * 90 + "\n") * 3)
        time.sleep(0.3)
        resize(follower, 45)
        writer.write("line")
        time.sleep(0.3)
        writer.close()
        data = b""
        while select.select([leader], [], [], 0.2)[0]:
            data += os.read(leader, 65536)
        assert b"\x1b[6A\x1b[J" in data and b"\x1b[3A" not in data, data
    finally:
        os.close(leader)
        os.close(follower)


# ---- console lines as records -----------------------------------------------------------
E_REGISTER = ("E0000 00:00:17953816{:02d}.499447    1114 eager_service_impl.cc:42] Failed to "
              "register function remotely due to Connection refused")
I_LINE = "I0000 00:00:1795381621.499447    1114 cudart_stub.cc:31] Could not find cuda drivers"
E_PYFUNC = ("E0000 00:00:1795381621.5    1114 op_kernel.cc:1800] OpKernel ('op: \"PyFunc\"') "
            "failed: ValueError: bad batch")


@pytest.mark.parametrize(("lines", "shown_lines", "last"), [
    # A shown C++ error's tab-indented lines stay with it; the task's last line is its first.
    ([E_PYFUNC, "\t [[{{node PyFunc}}]]", "\t [[IteratorGetNext]]"],
     [E_PYFUNC, "\t [[{{node PyFunc}}]]", "\t [[IteratorGetNext]]"], E_PYFUNC),
    # A hidden INFO record's further lines are hidden with it.
    (["Epoch 1/3", I_LINE, "\t more of the info"], ["Epoch 1/3"], "Epoch 1/3"),
    # Python's traceback: the user's frames and TensorFlow's; tfo's wrapper's left out.
    (["Traceback (most recent call last):",
      '  File "/home/ana/train.py", line 40, in <module>', "    model.fit(x, y)",
      '  File "/srv/tfo/worker_entry/autoprogress.py", line 202, in run',
      "    return fit(*args, **kwargs)", "           ^^^^^^^^^^^^^^^^^^^^",
      '  File "/usr/lib/python3/site-packages/tf_keras/src/engine/training.py", line 9, in fit',
      "    raise e", "ValueError: bad"],
     ["Traceback (most recent call last):",
      '  File "/home/ana/train.py", line 40, in <module>', "    model.fit(x, y)",
      '  File "/usr/lib/python3/site-packages/tf_keras/src/engine/training.py", line 9, in fit',
      "    raise e", "ValueError: bad"], "ValueError: bad"),
])
def test_console_lines_are_read_as_records(lines: list[str], shown_lines: list[str], last: str):
    out: list[str] = []
    seen: dict[str, str] = {}
    echo = ConsoleEcho(out.append, verbose=False, seen=seen.__setitem__)
    for line in lines:
        echo("worker:1", line)
    assert out == [f"[worker:1] {line}" for line in shown_lines]
    assert seen["worker:1"] == last


@pytest.mark.parametrize(("script", "shown_lines"), [
    # 21 of one C++ error a second apart, its time aside: the first, then one line for 20.
    ([(t, E_REGISTER.format(t)) for t in range(21)] + [(21, "Epoch 2/3")],
     [E_REGISTER.format(0), repeat_note(20, 20), "Epoch 2/3"]),
    # Beyond the window the line shows again (and starts a window of its own).
    ([(0, "waiting"), (10, "waiting"), (31, "waiting"), (32, "done")],
     ["waiting", repeat_note(1, 10), "waiting", "done"]),
    # Empty lines are never counted; a repeat's further lines go with it.
    ([(0, ""), (1, ""), (2, E_PYFUNC), (2, "\t [[{{node PyFunc}}]]"), (3, E_PYFUNC),
      (3, "\t [[{{node PyFunc}}]]")],
     ["", "", E_PYFUNC, "\t [[{{node PyFunc}}]]", repeat_note(1, 1)]),
])
def test_a_line_repeated_shows_once_with_a_count(script: list[tuple[float, str]],
                                                 shown_lines: list[str]):
    now = [0.0]
    out: list[str] = []
    echo = ConsoleEcho(out.append, verbose=False, clock=lambda: now[0])
    for at, line in script:
        now[0] = at
        echo("chief:0", line)
    echo.flush()  # the run's end: a count not said yet is said
    assert out == [f"[chief:0] {line}" for line in shown_lines]


def test_a_job_on_several_hosts_names_the_host_and_show_keeps_to_the_tasks_asked():
    """`[worker:1@gpu2]` where a job spans hosts; `--show worker:0`: worker:1's lines go to
    its log (and the live view's last line), tfo's own lines still show."""
    out: list[str] = []
    seen: dict[str, str] = {}
    echo = ConsoleEcho(out.append, verbose=False, seen=seen.__setitem__, only={"worker:0"},
                       prefixes={"worker:0": "worker:0@gpu1", "worker:1": "worker:1@gpu2"})
    echo("worker:0", "Epoch 1/3")
    echo("worker:1", "Epoch 1/3 on the other one")
    echo("tfo", "worker:1 restarted")
    assert out == ["[worker:0@gpu1] Epoch 1/3", "[tfo] worker:1 restarted"]
    assert seen == {"worker:0": "Epoch 1/3", "worker:1": "Epoch 1/3 on the other one"}


# ---- help, version, NO_COLOR -------------------------------------------------------------
def test_help_and_version_as_other_tools_have_them(tmp_path: Path):
    """`-h` is `--help`; `--version` answers; at 80 columns no command's line is cut."""
    cwd = user_dir(tmp_path / "user")
    env = {**tfo_env(cwd), "COLUMNS": "80"}
    short, long = (run_tfo(flag, cwd=cwd, env=env, timeout=30) for flag in ("-h", "--help"))
    assert short.returncode == long.returncode == 0 and short.stdout == long.stdout
    commands = short.stdout[short.stdout.index("Commands:"):].split("\n\n")[0].splitlines()[1:]
    assert len(commands) >= 8 and not any(line.endswith("...") for line in commands), commands
    assert run_tfo("runs", "-h", cwd=cwd, env=env, timeout=30).stdout.startswith("Usage:")
    version = run_tfo("--version", cwd=cwd, env=env, timeout=30)
    assert version.returncode == 0 and re.fullmatch(r"tfo \d+\.\d+\.\d+\n", version.stdout)


def test_no_color_means_no_escape_codes_on_a_terminal(tmp_path: Path):
    """NO_COLOR=1 on a terminal: `tfo runs` and `tfo status` print no escape code at all
    (rich dropped colors but kept bold: 1,230 codes in one run)."""
    cwd = user_dir(tmp_path / "user")
    run_dir = cwd / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"run_id": RUN_ID, "name": "train"}))
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        {"event": "run_started", "time": 1.8e9, "run_id": RUN_ID, "coordinator_pid": 1},
        {"event": "task_started", "task": "worker:0", "pid": 7, "host": "localhost"},
        {"event": "task_exited", "task": "worker:0", "returncode": 1, "time": 1.8e9 + 5},
        {"event": "job_finished", "state": "failed", "reason": "worker:0 exited", "time":
         1.8e9 + 5, "restarts": 0, "exit_code": 1}]))
    for args in (["runs"], ["status", RUN_ID]):
        colored, rc = run_in_pty(args, cwd, timeout=30, columns=80)
        assert rc == 0 and "\x1b[" in colored, colored  # a terminal: bold headers
        plain, rc = run_in_pty(args, cwd, timeout=30, columns=80, env={"NO_COLOR": "1"})
        assert rc == 0 and "\x1b" not in plain and RUN_ID in plain, plain


def test_the_repeat_note_says_its_time_where_there_was_some():
    assert repeat_note(20, 12.4) == "… 20 more like this in 12 s"
    assert repeat_note(1, 0.2) == "… 1 more like this"


def test_run_s_help_is_in_sections_with_human_types(tmp_path: Path):
    """`tfo run --help`: the run's own options, then the cluster without a file, then Slurm,
    each a section; values named for what they are (N, HOST,..., POLICY), not `<str>`."""
    cwd = user_dir(tmp_path / "user")
    text = run_tfo("run", "--help", cwd=cwd, env={**tfo_env(cwd), "COLUMNS": "80"},
                   timeout=30).stdout
    sections = [line for line in text.splitlines() if line and not line[0].isspace()]
    assert sections[-3:] == ["Options:", "Cluster without a file (with a command after --):",
                             "On Slurm (`--on slurm`: one allocation, each task a job step):"]
    assert text.index("--partition NAME") > text.index("On Slurm") > text.index("--workers")
    assert "--workers N|MIN:MAX" in text and "--restart POLICY" in text
    assert "<str>" not in text and "<int>" not in text and "<list[str]>" not in text
    assert "Examples:" in text and "Exit codes: 0 the job succeeded" in " ".join(text.split())


def test_a_usage_error_reads_as_tfo_s_other_errors(tmp_path: Path):
    """`tfo run --bogus`: `error: …` and where help is, exit 2, as tfo's own errors read
    (typer's was `Usage: … Try … Error: No such option`)."""
    cwd = user_dir(tmp_path / "user")
    res = run_tfo("run", "--bogus", cwd=cwd, env=tfo_env(cwd), timeout=30)
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert lines[0].startswith("error: No such option: --bogus"), res.stderr
    assert lines[1].startswith("see: ") and lines[1].endswith(" run --help"), res.stderr
    assert "Usage:" not in res.stderr and "Error:" not in res.stderr
