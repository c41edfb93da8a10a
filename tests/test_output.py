"""What a task prints is untrusted input: markers are validated, lines are capped in memory,
logs are complete, and the console never holds up supervision (a reader that does not read,
a reader that went away)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.cli.console import ConsoleWriter, printable
from orchestrator.launch import wakeup
from orchestrator.launch.output import LINE_CAP, TaskOutput
from orchestrator.loop.markers import BadMarker, Evaluated, Up, Usage, read_marker
from tests import sshlab
from tests.conftest import REPO, events, kill_tree, run_tfo, tfo_cmd, write_spec
from tests.helpers import host_yaml
from tests.jobs.noisy import BAD_MARKERS
from worker_entry import channel, markers

# ---- markers: (line, what the error names) -------------------------------------------------
BAD = [
    ('@tfo {"event": "hello", "task": "worker:9"}', "does not match any of the expected tags"),
    ('@tfo {"event": "evaluated", "metrics": "oops"}', "evaluated.metrics"),
    ('@tfo {"event": "evaluated", "epoch": 1, "metrics": {"loss": "oops"}}',
     "evaluated.metrics.loss"),
    ('@tfo {"event": "ready", "task": "worker:9"}', "task are tfo's own"),
    ('@tfo {"event": "epoch", "epoch": 2, "pid": 1, "time": 0}', "pid, time are tfo's own"),
    ('@tfo {"event": "up", "pid": "me"}', "up.pid"),
    ('@tfo {"event": "epoch", "epoch": "many"}', "epoch.epoch"),
    ('@tfo {"epoch": 1}', "event"),
    ('@tfo ["event", "ready"]', "valid dictionary"),
    ('@tfo "ready"', "valid dictionary"),
    ("@tfo {not json", "not JSON"),
    ("@tfo " + "[" * 5000, "not JSON"),  # deeper than json's recursion limit
]


@pytest.mark.parametrize(("line", "error"), BAD)
def test_bad_markers_are_refused_with_the_reason(line, error):
    """A marker line (START first: from a marker's frame) that is not a valid marker."""
    with pytest.raises(BadMarker, match=error.replace(".", r"\.")):
        read_marker(markers.START + line)


def test_markers_and_ordinary_lines():
    start = markers.START
    assert read_marker("Epoch 1/5") is None
    assert read_marker(f' {start}@tfo {{"event": "done"}}') is None
    # Without START, a line only looks like a marker: text a task printed.
    assert read_marker('@tfo {"event": "done"}') is None
    assert read_marker('@tfo {"event": "done"') is None  # not even a bad one
    up = read_marker(start + '@tfo {"event": "up", "pid": 12, "host": "vm"}')
    assert isinstance(up, Up) and up.record() == {"pid": 12, "host": "vm"}
    ev = read_marker(start + '@tfo {"event": "evaluated", "epoch": 3, "checkpoint": "c", '
                     '"metrics": {"loss": 0.5, "accuracy": NaN}}')
    assert isinstance(ev, Evaluated) and ev.metrics["loss"] == 0.5
    # A field a newer worker_entry may add is recorded as it is.
    ready = read_marker(start + '@tfo {"event": "ready", "what": "training", "gpus": 2}')
    assert ready is not None and ready.record() == {"what": "training", "gpus": 2}


# ---- TaskOutput: lines capped in memory, the log complete ---------------------------------
def _chunks(*parts: bytes):
    it = iter(parts)
    return lambda: next(it, b"")


def _collect(out: TaskOutput) -> list[str]:
    return out.close(timeout=5)


def test_an_overlong_line_is_cut_in_memory_and_whole_in_the_log(tmp_path):
    log = tmp_path / "t.log"
    big = 3 * LINE_CAP + 123
    chunk = b"y" * 65536
    parts = [b"first\r\nsecond\n", *[chunk] * (big // 65536), b"y" * (big % 65536),
             b"\nlast, no newline"]
    lines = _collect(TaskOutput(str(log), _chunks(*parts), "t"))
    assert lines[:2] == ["first", "second"]
    assert lines[2] == "y" * LINE_CAP + f" [… {big - LINE_CAP} bytes more in the log]"
    assert lines[3:] == ["last, no newline"]
    data = log.read_bytes()
    assert data == b"".join(parts) + b"\n"  # every byte, and the log ends a line


def _out(data: bytes) -> bytes:
    return channel.frame(channel.OUTPUT, channel.escape(data))


def test_a_marker_amid_a_line_is_taken_out_and_the_line_goes_on_whole(tmp_path):
    """The wrapper's usage marker arrives while the task is half-way through a line (a
    progress bar, a line printed in pieces), once split over two reads."""
    line = markers.line(markers.USAGE, cpu=1.0, rss=2**20)
    usage = channel.frame(channel.OWN, line[1:-1].encode())
    log = tmp_path / "t.log"
    parts = [_out(b"epoch 1/3 [===="), usage, _out(b"====] done\nnext "), usage[:9],
             usage[9:], _out(b"line\n"), usage]
    lines = _collect(TaskOutput(str(log), _chunks(*parts), "t"))
    marker = line.rstrip("\n")
    assert marker.startswith(markers.MARK)
    assert lines == [marker, "epoch 1/3 [========] done", marker, "next line", marker]
    assert isinstance(read_marker(marker), Usage)
    # The log: the task's lines whole, each marker after the line it interrupted.
    assert log.read_text().splitlines() == ["epoch 1/3 [========] done", marker, "next line",
                                            marker, marker]


def test_what_a_task_prints_is_never_a_marker(tmp_path):
    """A task's bytes (OUTPUT frames: the wrapper reads its stdout and stderr) that hold a
    marker's text, START, even a whole marker frame: text in its lines and its log, START
    escaped."""
    forged = markers.line(markers.DONE).encode()
    frame = channel.frame(channel.MARKER, forged[1:-1])
    log = tmp_path / "t.log"
    parts = [_out(forged), _out(frame + b"\n"), _out(b"@tfo " + forged[6:])]
    lines = _collect(TaskOutput(str(log), _chunks(*parts), "t"))
    assert [read_marker(x) for x in lines] == [None] * 3
    assert lines[0] == '\\x1f@tfo {"event": "done"}'
    assert not any(x.startswith(markers.START) for x in log.read_text().splitlines())
    # A cut frame is text too; bytes outside frames before and after.
    cut = channel.frame(channel.OWN, b'@tfo {"event": "done"}')[:-3]
    assert _collect(TaskOutput(str(log), _chunks(b"before\n", cut), "t"))[0] == "before"
    assert read_marker(markers.START + '@tfo {"event": "done"}') is not None


def test_a_full_queue_makes_the_reader_wait_not_grow(tmp_path):
    """A task printing faster than the supervisor takes its lines waits on the pipe (long
    lines, fewer than FLOOD_LINES a second: every one of them is passed on)."""
    from orchestrator.launch import output

    line = b"z" * 60_000 + b"\n"
    sent = 0

    def read() -> bytes:
        nonlocal sent
        sent += 1
        return line * 10 if sent <= 50 else b""  # 500 lines, 30 MB in all

    out = TaskOutput(str(tmp_path / "t.log"), read, "t")
    time.sleep(0.5)
    assert out.waiting and not out.done
    first = out.lines()
    assert sum(map(len, first)) <= output.QUEUE_CHARS + len(line)
    got = len(first)
    while not out.done:
        got += len(out.lines())
        time.sleep(0.001)
    got += len(out.close())
    assert got == 500
    assert (tmp_path / "t.log").stat().st_size == 500 * len(line)


# ---- the console: never waits ---------------------------------------------------------------
def test_console_into_a_pipe_nobody_reads_drops_lines_and_never_waits():
    r, w = os.pipe()
    try:
        console = ConsoleWriter(w, limit=100_000)
        t0 = time.monotonic()
        for i in range(50_000):  # 5 MB: far more than the pipe and the buffer hold
            console.write(f"line {i} " + "." * 90)
        assert time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        console.close(stall_seconds=0.5)
        assert time.monotonic() - t0 < 2.0
        assert console.dropped > 40_000 and not console.reader_gone
    finally:
        os.close(r)  # ends the write the thread is blocked in, before w's number is reused
        assert _wait(lambda: console.reader_gone, 5)
        os.close(w)


def test_console_whose_reader_went_away_stops_quietly():
    r, w = os.pipe()
    os.close(r)
    try:
        console = ConsoleWriter(w)
        console.write("nobody reads this")
        assert _wait(lambda: console.reader_gone, 5)
        console.write("nor this")
        console.close()
        os.write(w, b"and any later write goes nowhere, without EPIPE\n")
    finally:
        os.close(w)


def _wait(pred, timeout: float) -> bool:  # noqa: ANN001
    until = time.monotonic() + timeout
    while not pred() and time.monotonic() < until:
        time.sleep(0.02)
    return bool(pred())


# ---- real runs ------------------------------------------------------------------------------
NOISY = """\
name: noisy
job:
  entry: tests.jobs.noisy:main
  args: {args}
tasks:
  worker: [localhost:auto]
timeouts: {{grace_seconds: 3}}
"""
LINES = 20_000  # ~2 MB: far more than a pipe (64 KiB) and the console buffer hold


def _start(tmp_path: Path, run_dir: Path, stdout: Any, args: str = "",
           spec: Path | None = None) -> subprocess.Popen:
    """`tfo run` of the noisy job with these args (or of `spec`), stderr into a file."""
    spec = spec or write_spec(tmp_path / "noisy.yaml", NOISY.format(args=args))
    proc = subprocess.Popen(tfo_cmd("run", str(spec), "--run-dir", str(run_dir)), cwd=REPO,
                            stdout=stdout, stderr=(tmp_path / "stderr").open("w"),
                            start_new_session=True)
    if isinstance(stdout, int) and stdout >= 0:
        os.close(stdout)  # tfo has it now
    return proc


@contextlib.contextmanager
def _stdout_nobody_reads() -> Iterator[int]:
    """The write end of a pipe whose read end we hold and never read: `| sleep 600`."""
    r, w = os.pipe()
    try:
        yield w
    finally:
        os.close(r)


def _finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.wait()
        pytest.fail(f"tfo did not finish within {timeout} s")


def _log(run_dir: Path) -> str:
    path = run_dir / "logs" / "worker-0.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _noisy_lines(run_dir: Path) -> int:
    return sum(line.startswith("noisy line ") for line in _log(run_dir).splitlines())


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_stdout_nobody_reads_does_not_hold_up_the_job(run_dir: Path, tmp_path: Path):
    """`tfo run … | sleep 600`: the job finishes, the logs are complete, drops are counted.
    Lines of 1 KB: the flood gate passes up to FLOOD_LINES a second, counted in whole reads
    of the pipe (a 64 KiB read of 100-byte lines is 600 of them, and the next read is over
    the budget), so with short lines the console got about what the pipe to nobody holds,
    and a drop was not certain (seen once in make test). A thousand 1 KB lines are not."""
    with _stdout_nobody_reads() as stdout:
        proc = _start(tmp_path, run_dir, stdout, "{lines: 4000, width: 1000}")
        assert _finish(proc, 180) == 0, (tmp_path / "stderr").read_text()[-3000:]
    stderr = (tmp_path / "stderr").read_text()
    assert "console lines dropped (slow reader); logs are complete in" in stderr
    assert _noisy_lines(run_dir) == 4000


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_sigterm_ends_tfo_whose_stdout_nobody_reads(run_dir: Path, tmp_path: Path):
    with _stdout_nobody_reads() as stdout:
        proc = _start(tmp_path, run_dir, stdout, f"{{lines: {LINES}, sleep: 120}}")
        try:
            assert _wait(lambda: "noisy: printed" in _log(run_dir), 150), \
                "the task never got its lines out"
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = _finish(proc, 3 + 10)
        finally:
            kill_tree(proc.pid)
        assert code == 143
        assert time.monotonic() - t0 < 3 + 5  # grace_seconds + a few
    assert _noisy_lines(run_dir) == LINES
    assert any(e["event"] == "job_finished" and e["exit_code"] == 143 for e in events(run_dir))


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_stdout_closed_by_the_reader_does_not_fail_the_job(run_dir: Path, tmp_path: Path):
    """`tfo run … | head -1`: echo stops, the job goes on and exits 0; no traceback."""
    proc = _start(tmp_path, run_dir, subprocess.PIPE, f"{{lines: {LINES}}}")
    assert proc.stdout is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    code = _finish(proc, 180)
    stderr = (tmp_path / "stderr").read_text()
    assert first.startswith(b"[worker:0] ")
    assert code == 0, stderr[-3000:]
    assert "stdout was closed; console echo stopped" in stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert _noisy_lines(run_dir) == LINES


@pytest.mark.timeout(60)
def test_a_run_started_with_stdout_and_stderr_closed_succeeds(run_dir: Path, tmp_path: Path):
    """`tfo run … >&- 2>&-` (a daemon's child): what tfo would print is dropped; the job
    runs and exits 0 (it was a traceback, and a failed job once tasks had started)."""
    spec = write_spec(tmp_path / "c.yaml", f"""\
name: closed
job: {{script: {REPO / "bench" / "job.py"}, args: [--fake, --epochs, "2"]}}
tasks: {{worker: ["localhost:auto", "localhost:auto"]}}
""")
    cmd = " ".join(tfo_cmd("run", str(spec), "--run-dir", str(run_dir)))
    res = subprocess.run(["bash", "-c", f"exec {cmd} >&- 2>&-"], cwd=REPO, timeout=50)
    assert res.returncode == 0
    finished = [e for e in events(run_dir) if e["event"] == "job_finished"]
    assert finished and finished[0]["state"] == "succeeded"
    assert "BENCH done" in (run_dir / "logs" / "worker-1.log").read_text()


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_lines_that_only_look_like_markers_are_ordinary_output(run_dir: Path, tmp_path: Path):
    out = tmp_path / "stdout"
    proc = _start(tmp_path, run_dir, out.open("w"), "{bad_markers: true}")
    code = _finish(proc, 180)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 0, stderr[-3000:]
    assert "Traceback" not in stderr + out.read_text()
    log, shown = _log(run_dir).splitlines(), out.read_text().splitlines()
    for line in BAD_MARKERS:
        assert line in log
        assert f"[worker:0] {line}" in shown
    # Printed, they are the task's text: not markers at all, not even bad ones.
    assert not [e for e in events(run_dir) if e["event"] == "task_bad_marker"]
    assert "evaluator:" not in stderr  # no evaluation came from the bad `evaluated` lines


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_a_100mb_line_is_logged_whole_without_holding_it(run_dir: Path, tmp_path: Path):
    mb = 100
    out = tmp_path / "stdout"
    proc = _start(tmp_path, run_dir, out.open("w"), f"{{big_line_mb: {mb}}}")
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        me = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                peak = max(peak, me.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        code = _finish(proc, 180)
    finally:
        done.set()
        sampler.join()
    assert code == 0, (tmp_path / "stderr").read_text()[-3000:]
    print(f"coordinator peak RSS {peak / 2**20:.0f} MiB")
    assert peak < 250 * 2**20, f"coordinator peak RSS {peak / 2**20:.0f} MiB"
    log = run_dir / "logs" / "worker-0.log"
    assert log.stat().st_size > mb * 2**20
    with log.open("rb") as f:  # the line's end, then at most the markers that came meanwhile
        f.seek(-(2**20 + 4096), os.SEEK_END)
        tail = f.read()
    line_end = tail.rindex(b"x" * 2**20 + b"\n") + 2**20 + 1
    assert all(x.startswith(markers.MARK.encode()) for x in tail[line_end:].splitlines())
    shown = [line for line in out.read_text().splitlines() if line.startswith("[worker:0] xxx")]
    assert shown == ["[worker:0] " + "x" * LINE_CAP
                     + f" [… {mb * 2**20 - LINE_CAP} bytes more in the log]"]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    sshlab.ensure_openssh()
    with sshlab.start_sshd(tmp_path_factory.mktemp("sshd")) as host:
        yield host


@pytest.mark.ssh
@pytest.mark.tf
@pytest.mark.timeout(240)
def test_output_over_ssh_is_capped_in_memory_and_logged_whole(sshd, run_dir: Path,
                                                              tmp_path: Path):
    mb = 20
    spec = write_spec(tmp_path / "ssh.yaml", f"""\
name: noisy-ssh
job: {{entry: "tests.jobs.noisy:main", args: {{bad_markers: true, lines: 2000, big_line_mb: {mb}}}}}
hosts:
{host_yaml("lab", sshd, tmp_path / "lab")}
tasks:
  worker: ["lab:21100"]
timeouts: {{grace_seconds: 3}}
""")
    out = tmp_path / "stdout"
    code = _finish(_start(tmp_path, run_dir, out.open("w"), spec=spec), 180)
    assert code == 0, (tmp_path / "stderr").read_text()[-3000:]
    log = (run_dir / "logs" / "worker-0.log").read_bytes()
    assert b"@tfo-pid" not in log and markers.START.encode() + b"o" not in log
    # The line whole (a usage marker that came while it was printed follows it).
    end = log.index(b"noisy: printed\n")
    assert log[end:].split(b"\n")[1] == b"x" * (mb * 2**20)
    assert _noisy_lines(run_dir) == 2000
    assert all(line.encode() in log for line in BAD_MARKERS)
    evs = events(run_dir)
    assert isinstance(next(e["pid"] for e in evs if e["event"] == "task_started"), int)
    assert not any(e["event"] == "task_bad_marker" for e in evs)  # text, not markers
    assert f" [… {mb * 2**20 - LINE_CAP} bytes more in the log]" in out.read_text()


# ---- tfo logs -------------------------------------------------------------------------------
M = markers.MARK


def _fake_run(root: Path, name: str, mtime: float) -> Path:
    rd = root / "runs" / name
    (rd / "logs").mkdir(parents=True)
    for task in ("worker-0", "worker-1"):
        (rd / "logs" / f"{task}.log").write_text(
            f"===== tfo: {task} attempt 0 =====\n{M}{{\"event\": \"up\", \"pid\": 1}}\n"
            f"{name} {task} says hi\n{BAD_MARKERS[0]}\n{M}{{\"event\": \"done\"}}\n")
    (rd / "events.jsonl").write_text("{}\n")
    os.utime(rd / "events.jsonl", (mtime, mtime))
    return rd


def test_logs_hide_markers_and_take_a_task_name_alone(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from orchestrator.cli.commands import app

    old = _fake_run(tmp_path, "old", 1_000_000)
    _fake_run(tmp_path, "new", 2_000_000)
    monkeypatch.chdir(tmp_path)

    def logs(*args: str) -> tuple[int, list[str]]:
        res = CliRunner().invoke(app, ["logs", *args])
        return res.exit_code, res.output.splitlines()

    one = ["===== tfo: worker-1 attempt 0 =====", "new worker-1 says hi", BAD_MARKERS[0]]
    assert logs("worker:1") == (0, one)  # the latest run's
    assert logs("-n", "2", "worker:1") == (0, one[-2:])
    assert logs(str(old), "worker:1") == (0, [x.replace("new", "old") for x in one])
    code, shown = logs("--raw", "worker:1")
    assert code == 0 and M + '{"event": "done"}' in shown and len(shown) == 5
    code, shown = logs()
    assert code == 0 and len(shown) == 6 and shown[4] == "[worker:1] new worker-1 says hi"
    code, shown = logs("worker:7")
    assert code == 2 and "no task 'worker:7'" in " ".join(shown) and "worker:0, worker:1" \
        in " ".join(shown)
    code, shown = logs(str(tmp_path / "nowhere"))
    assert code == 2 and "no task logs there" in " ".join(shown)


@pytest.mark.parametrize(("raw", "shown"), [
    ("plain", "plain"),
    ("abc\rX", "Xbc"),  # \r: back to the start, the rest of the line stays
    ("abc\b\bZ", "aZc"),
    ("\b\bstart", "start"),  # nothing to back over
    ("done\r", "done"),
    ("a\tb\rX", "X\tb"),
    ("1/5 [=>......] - loss: 0.9" + "\b" * 26 + "\r" + "5/5 [========] - loss: 0.1",
     "5/5 [========] - loss: 0.1"),  # tf-keras's Progbar
    ("x\r\x1b[2K", "\\x1b[2K"),  # what is left is escaped
    ("\x1b[31m\b\b", "\\x1b[31m"),  # an escape cannot be backed into a live sequence
])
def test_carriage_returns_and_backspaces_apply_before_escaping(raw, shown):
    assert printable(raw) == shown


def test_a_progress_bar_over_the_cap_is_held_as_last_drawn(tmp_path):
    log = tmp_path / "t.log"
    draws = [b"\r%5d/9999 [" % i + b"=" * (i % 30) + b">" + b"." * (29 - i % 30) + b"]"
             + b"\b" * 46 for i in range(1, 10000)]
    parts = [b"".join(draws[i:i + 500]) for i in range(0, len(draws), 500)] + [b"\n"]
    lines = _collect(TaskOutput(str(log), _chunks(*parts), "t"))
    assert [printable(line) for line in lines] == [
        " 9999/9999 [" + "=" * 9 + ">" + "." * 20 + "]"]
    assert log.read_bytes() == b"".join(parts)  # the log keeps the bytes


@pytest.mark.tf
@pytest.mark.timeout(150)
def test_keras_progress_bars_show_as_a_terminal_leaves_them(tmp_path: Path, run_dir: Path):
    cluster = write_spec(tmp_path / "cluster.yaml", PROGBAR_SPEC)
    res = run_tfo("run", str(cluster), "--run-dir", str(run_dir), timeout=130)
    assert res.returncode == 0, res.output[-3000:]
    assert "\\x08" not in res.stdout and "\\r" not in res.stdout, res.stdout[-3000:]
    bars = re.findall(r"^\[worker:0\] 5/5 \[=+\] - .*loss: [\d.]+$", res.stdout, re.M)
    assert len(bars) == 12, res.stdout[-3000:]
    assert b"\x08" in (run_dir / "logs" / "worker-0.log").read_bytes()  # the log: as printed


PROGBAR_SPEC = """\
name: progbar
strategy: multi_worker_mirrored
job: {script: tests/scripts/progbar_fit.py}
tasks:
  worker: [localhost:auto]
restart: {policy: never}
timeouts: {startup_seconds: 120}
"""


FLOOD_SPEC = """\
name: flood
strategy: multi_worker_mirrored
job: {script: tests/scripts/flood.py, args: [--lines, "2000000"]}
tasks:
  worker: [localhost:auto]
restart: {policy: never}
"""


@pytest.mark.timeout(120)
def test_a_flooding_task_costs_the_coordinator_little_and_the_log_keeps_every_line(
        tmp_path: Path, run_dir: Path):
    """2,000,000 lines in a burst: the console shows at most FLOOD_LINES a second and says
    how many it did not; the log has every one. Before: 5.9 s of the coordinator's CPU
    (a full core while it lasted), every line through the supervisor; after: 0.5 s."""
    from orchestrator.launch.output import FLOOD_LINES

    cluster = write_spec(tmp_path / "cluster.yaml", FLOOD_SPEC)
    proc = subprocess.Popen(tfo_cmd("run", str(cluster), "--run-dir", str(run_dir)),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    coordinator, cpu = psutil.Process(proc.pid), 0.0
    reader = threading.Thread(target=lambda: setattr(proc, "got", proc.communicate(timeout=100)))
    reader.start()
    started = time.monotonic()
    while reader.is_alive():
        with contextlib.suppress(psutil.Error):
            times = coordinator.cpu_times()
            cpu = times.user + times.system
        reader.join(0.05)
    wall = time.monotonic() - started
    out = proc.got[0].decode()
    assert proc.returncode == 0, proc.got[1].decode()[-2000:]
    shown = len(re.findall(r"^\[worker:0\] flood(?: x+|ed 2000000 lines)$", out, re.M))
    hidden = sum(map(int, re.findall(r"^\[worker:0\] \[tfo\] (\d+) lines not shown", out, re.M)))
    # the same line again within 30 s is counted, not shown (the console's repeat rule)
    hidden += sum(map(int, re.findall(r"^\[worker:0\] … (\d+) more like this", out, re.M)))
    assert shown + hidden == 2_000_001, (shown, hidden, out[-2000:])  # and its last line
    assert shown <= FLOOD_LINES * (wall + 1)
    print(f"the coordinator spent {cpu:.2f} s of CPU in {wall:.1f} s")
    assert cpu < 2.5, f"the coordinator spent {cpu:.2f} s of CPU in {wall:.1f} s"
    with open(run_dir / "logs" / "worker-0.log", "rb") as log:
        assert sum(line.startswith(b"flood x") for line in log) == 2_000_000


def test_a_usage_marker_waits_for_the_loop_s_next_round_and_a_line_wakes_it(tmp_path):
    """Every task's wrapper reports its usage every USAGE_SECONDS: 64 tasks' woke the loop
    10 times a second, each round over every task. A usage marker is state: the loop takes
    it at its next round (IDLE_SECONDS at most); a line or another marker still wakes it,
    even one queued behind a usage marker."""
    waiter = wakeup.Waiter()
    out = TaskOutput(str(tmp_path / "log"), None, "t")  # fed, no reader thread
    waiter.wait(0)  # what other tests notified
    usage = markers.line(markers.USAGE, cpu=0.0, rss=1, processes=1, stopped=False)
    out.feed(channel.frame(channel.OWN, usage[1:-1].encode()))
    assert waiter.wait(0) == (set(), False), "a usage marker woke the loop"
    out.feed(_out(b"epoch 1\n"))
    assert waiter.wait(0) == (set(), True), "a line behind a usage marker did not wake it"
    assert [read_marker(line) is not None for line in out.lines()] == [True, False]
    out.feed(channel.frame(channel.MARKER, markers.line(markers.READY)[1:-1].encode()))
    assert waiter.wait(0) == (set(), True), "a ready marker did not wake the loop"
    out.end()
