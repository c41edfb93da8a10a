"""Signals to `tfo run` itself, sent as a user's terminal or a script would: SIGQUIT (Ctrl-\\)
tears down like SIGTERM, with the summary and `job_finished`; Ctrl-Z is refused aloud, once,
and training goes on. A real job: one worker training a Keras model for long enough."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import (
    PYTHON,
    REPO,
    events,
    kill_tree,
    run_processes,
    run_tfo,
    tfo_cmd,
    wait_until,
)

# Long enough to be running when the signal comes; the test stops it.
JOB = ["--workers", "1", "--", "python", "tests/scripts/slow_keras.py", "--epochs", "200",
       "--first_seconds", "0.5", "--step_seconds", "0.3"]


def trained_steps(run_dir: Path) -> int:
    return max((e.get("step") or 0 for e in events(run_dir) if e["event"] == "task_progress"),
               default=0)


def training(run_dir: Path) -> bool:
    return trained_steps(run_dir) > 0


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_sigquit_tears_down_like_sigterm_with_the_summary(run_dir: Path):
    proc = subprocess.Popen(tfo_cmd("run", "--run-dir", str(run_dir), *JOB), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert wait_until(lambda: training(run_dir) or proc.poll() is not None, 150), \
            "the job never trained"
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGQUIT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    assert proc.returncode == 131, err[-3000:]
    last = events(run_dir)[-1]
    assert last["event"] == "job_finished" and last["exit_code"] == 131, last
    assert last["state"] == "interrupted" and "SIGQUIT" in last["reason"]
    assert "job interrupted: interrupted by SIGQUIT" in err  # the summary
    assert f"run directory: {run_dir}" in " ".join(err.split())
    assert "Traceback" not in err
    assert run_processes(json.loads((run_dir / "plan.json").read_text())["run_id"]) == []
    status = run_tfo("status", str(run_dir), timeout=30)
    assert "interrupted: interrupted by SIGQUIT" in status.stdout


def _read(terminal: int, seen: bytearray, seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if select.select([terminal], [], [], 0.2)[0]:
            try:
                seen += os.read(terminal, 65536)
            except OSError:
                return


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_ctrl_z_is_refused_once_aloud_and_training_goes_on(run_dir: Path):
    """tfo on a terminal (a pty, its session's foreground): Ctrl-Z typed twice. tfo is not
    stopped, says why once, the job trains on; Ctrl-C then ends it as usual."""
    pid, terminal = pty.fork()
    if pid == 0:
        try:
            os.chdir(REPO)
            os.execv(PYTHON, tfo_cmd("run", "--run-dir", str(run_dir), *JOB))
        finally:
            os._exit(127)
    status = None
    seen = bytearray()
    try:
        until = time.monotonic() + 150
        while time.monotonic() < until and not training(run_dir):
            _read(terminal, seen, 0.5)
        assert training(run_dir), f"the job never trained: {bytes(seen[-2000:])!r}"
        os.write(terminal, b"\x1a")  # Ctrl-Z: the terminal sends SIGTSTP to tfo's group
        _read(terminal, seen, 3)
        os.write(terminal, b"\x1a")
        before = trained_steps(run_dir)
        _read(terminal, seen, 6)
        assert psutil.Process(pid).status() != psutil.STATUS_STOPPED
        assert trained_steps(run_dir) > before, "training did not go on after Ctrl-Z"
        text = b" ".join(bytes(seen).split()).decode(errors="replace")
        assert text.count("tfo cannot be suspended") == 1, text[-3000:]
        assert f"To stop the job: Ctrl-C (or kill -TERM {pid})" in text
        assert [e["event"] for e in events(run_dir)].count("suspend_refused") == 1
        os.write(terminal, b"\x03")  # Ctrl-C
        until = time.monotonic() + 60
        while status is None and time.monotonic() < until:
            _read(terminal, seen, 0.2)
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            status = wait_status if done else None
    finally:
        if status is None:
            kill_tree(pid)
            os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            os.close(terminal)
    assert status is not None, "tfo still ran 60 s after Ctrl-C"
    assert os.waitstatus_to_exitcode(status) == 130
    assert events(run_dir)[-1]["event"] == "job_finished"
