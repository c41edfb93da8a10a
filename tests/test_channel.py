"""tfo's markers travel on a channel of their own (worker_entry.channel): what a task prints,
on stdout or stderr, is its text, however much it looks like a marker, and what tfo decides
of an exit is the kernel's status. Real processes: a 2-worker MultiWorkerMirrored job whose
worker prints a forged `exiting`, and a script that prints an old run's raw log."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.loop import decide
from tests.conftest import REPO, events, run_task, run_tfo
from tests.helpers import (
    TWO_WORKERS,
    assert_printed_as_text,
    first,
    host_yaml,
    old_log_spec,
    script_spec,
)
from worker_entry import channel, markers

# ---- the wire ------------------------------------------------------------------------------


def test_frames_come_out_whole_from_pieces_of_any_size():
    stream = (b"python: starting\n" + channel.frame(channel.OUTPUT, b"a line\n")
              + channel.frame(channel.MARKER, b'@tfo {"event": "done"}')
              + channel.frame(channel.BEAT) + channel.frame(channel.OWN, b"x" * 70_000))
    want = [(channel.RAW, b"python: starting\n"), (channel.OUTPUT, b"a line\n"),
            (channel.MARKER, b'@tfo {"event": "done"}'), (channel.BEAT, b""),
            (channel.OWN, b"x" * 70_000)]
    for size in (1, 5, 6, 7, 1000, len(stream)):
        reader = channel.Reader()
        got = [f for at in range(0, len(stream), size) for f in reader.feed(stream[at:at + size])]
        raw = b"".join(p for k, p in got if k == channel.RAW)
        assert [f for f in got if f[0] != channel.RAW] == want[1:] and raw == want[0][1], size
        assert reader.end() == []


@pytest.mark.parametrize(("stream", "text"), [
    (b"\x1fz\x00\x00\x00\x01!", b"\\x1fz\x00\x00\x00\x01!"),  # no such kind: text
    (b"\x1fo\xff\xff\xff\xffabc", b"\\x1fo\xff\xff\xff\xffabc"),  # a payload over the limit
])
def test_what_is_not_a_frame_is_text(stream, text):
    reader = channel.Reader()
    got = reader.feed(stream) + reader.end()
    assert {k for k, _ in got} == {channel.RAW} and b"".join(p for _, p in got) == text


def test_a_frame_cut_short_at_the_end_is_text():
    reader = channel.Reader()
    assert reader.feed(channel.frame(channel.MARKER, b'@tfo {"event": "done"}')[:-2]) == []
    [(kind, text)] = reader.end()
    assert kind == channel.RAW and text.startswith(channel.ESCAPED) and b"\x1f" not in text


def test_the_tasks_bytes_never_hold_a_frame_start():
    forged = channel.frame(channel.MARKER, b'@tfo {"event": "done"}')
    payload = channel.escape(b"before " + forged + b" after")
    assert channel.MAGIC not in payload
    reader = channel.Reader()
    assert reader.feed(channel.frame(channel.OUTPUT, payload)) == [(channel.OUTPUT, payload)]


# ---- what an exit is -----------------------------------------------------------------------

@pytest.mark.parametrize(("rc", "stands"), [
    (-9, True),  # our SIGKILL ended it in its teardown: the status its code said stands
    (7, False),  # it exited on its own meanwhile: the kernel's 7
    (0, False),
    (-11, False),  # it crashed on its own (SIGSEGV)
    (-15, False),
])
def test_a_teardown_stop_counts_only_when_our_kill_ended_it(rc, stands):
    assert decide.stopped_in_teardown(rc) is stands


# ---- real processes ------------------------------------------------------------------------

@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_forged_exiting_line_does_not_make_a_failed_worker_succeed(tmp_path: Path,
                                                                     run_dir: Path):
    """Worker 1 prints `@tfo {"event": "exiting", "code": 0}` after its fit, then exits 7
    30 s later. Before the channel, tfo took the line for its own marker, stopped worker 1
    3 s after worker 0 exited ("succeeded, stopped in teardown") and the job succeeded."""
    cluster = script_spec(tmp_path, "forged_exit.py", ["--linger", "30"], tasks=TWO_WORKERS)
    res = run_tfo("run", str(cluster), "--run-dir", str(run_dir), timeout=280)
    assert res.returncode != 0, res.output[-4000:]
    ev = events(run_dir)
    exited = first(ev, "task_exited", "worker:1")
    assert exited and exited["returncode"] == 7 and exited["state"] == "failed", exited
    assert exited.get("teardown") is not True  # no success "stopped in teardown"
    # It lingered its 30 s: not stopped 3 s after worker 0's exit on the line's word (worker
    # 0 exits some seconds after its fit: its teardown).
    assert exited["time"] - first(ev, "task_exited", "worker:0")["time"] > 10, exited
    finished = first(ev, "job_finished")
    assert finished["state"] == "failed" and "worker:1 exited with exit code 7" in \
        finished["reason"], finished
    # The line is the task's text, in its log and on the console.
    log = (run_dir / "logs" / "worker-1.log").read_text()
    assert '\n@tfo {"event": "exiting", "code": 0}\n' in log
    assert '[worker:1] @tfo {"event": "exiting", "code": 0}' in res.stdout
    # tfo's own `exiting` marker came from its last atexit handler, with the real status
    # (TensorFlow's teardown may then be stopped: its exit stays 7).
    exiting = [e for e in ev if e["event"] == "task_exiting" and e["task"] == "worker:1"]
    assert [e.get("code") for e in exiting] == [7], exiting


@pytest.mark.timeout(120)
def test_an_old_runs_raw_log_printed_by_a_task_is_text(tmp_path: Path, run_dir: Path):
    """A script that `cat`s an old run's log (markers in it, old and new forms) and prints
    a forged `saved` and `done` on stderr. Before the channel, the log's `progress` (step
    99999) and the rest were recorded as tfo's events."""
    res = run_tfo("run", str(old_log_spec(tmp_path)), "--run-dir", str(run_dir), timeout=100)
    assert_printed_as_text(res, run_dir)


@pytest.mark.timeout(60)
def test_without_a_coordinator_the_wrappers_stdout_is_plain_text(tmp_path: Path):
    """No lifeline (a Kubernetes pod of `tfo export`, `python -m worker_entry` by hand):
    nobody reads frames, so none are written: the task's output as it printed it, and the
    markers as text lines among it, as `kubectl logs` shows them."""
    old = tmp_path / "old.log"
    old.write_text("hello\n")
    res = run_task({"script": str(REPO / "tests" / "scripts" / "old_log.py"),
                    "args": [str(old)]}, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "\nhello\ndone printing\n" in res.stdout
    assert "/etc/passwd" in res.stderr
    assert markers.MARK + '{"event": "done"}\n' in res.stdout  # the runner's, as text
    assert markers.MARK + 'o' not in res.stdout  # no frame


@pytest.mark.ssh
@pytest.mark.timeout(180)
def test_over_ssh_printed_markers_are_text_too(
        loopback_sshd, tmp_path: Path, run_dir: Path):  # noqa: F811 (the fixture)
    """The same script on a host over SSH: its wrapper forked by the host's agent, whose
    OUTPUT frames carry the wrapper's frames."""
    hosts = "hosts:\n" + host_yaml("lab", loopback_sshd, tmp_path / "lab")
    cluster = old_log_spec(tmp_path, hosts, tasks="  worker: [lab:auto]")
    res = run_tfo("run", str(cluster), "--run-dir", str(run_dir), timeout=160)
    assert_printed_as_text(res, run_dir)
