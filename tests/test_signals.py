"""Signals to `tfo run` itself, sent as a user's terminal would: Ctrl-Z is refused aloud,
once, and training goes on; then SIGQUIT (Ctrl-\\) tears down like SIGTERM, with the summary
and `job_finished`. A real job: one worker training a Keras model for long enough, one job
for both."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
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
)
from tests.helpers import ANSI

# Long enough to be running when the signal comes; the test stops it.
JOB = ["--workers", "1", "--", "python", "tests/scripts/slow_keras.py", "--epochs", "200",
       "--first_seconds", "0.5", "--step_seconds", "0.3"]


def squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def trained_steps(run_dir: Path) -> int:
    return max((e.get("step") or 0 for e in events(run_dir) if e["event"] == "task_progress"),
               default=0)


def training(run_dir: Path) -> bool:
    return trained_steps(run_dir) > 0


def _read(terminal: int, seen: bytearray, seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if select.select([terminal], [], [], 0.2)[0]:
            try:
                seen += os.read(terminal, 65536)
            except OSError:
                return


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_ctrl_z_is_refused_aloud_and_ctrl_backslash_tears_down_with_the_summary(run_dir: Path):
    """tfo on a terminal (a pty, its session's foreground), one job for both keys. Ctrl-Z
    typed twice: tfo is not stopped, says why once, the job trains on. Then Ctrl-\\
    (SIGQUIT; the tasks, in sessions of their own, get it from tfo only) tears down like
    SIGTERM: exit 131, `job_finished` interrupted, the summary, nothing left running.
    (Ctrl-C's SIGINT: test_mwms's signal test.)"""
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
        quit_at = len(seen)
        os.write(terminal, b"\x1c")  # Ctrl-\\: the terminal sends SIGQUIT
        until = time.monotonic() + 60
        while status is None and time.monotonic() < until:
            _read(terminal, seen, 0.2)
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            status = wait_status if done else None
        _read(terminal, seen, 0.5)  # what is left in the terminal after tfo's exit
    finally:
        if status is None:
            kill_tree(pid)
            os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            os.close(terminal)
    assert status is not None, "tfo still ran 60 s after Ctrl-\\"
    said = ANSI.sub("", bytes(seen[quit_at:]).decode(errors="replace"))
    assert os.waitstatus_to_exitcode(status) == 131, said[-3000:]
    last = events(run_dir)[-1]
    assert last["event"] == "job_finished" and last["exit_code"] == 131, last
    assert last["state"] == "interrupted" and "SIGQUIT" in last["reason"]
    # The summary, as the terminal shows it (its lines wrap anywhere, a path too).
    assert squeezed("job interrupted: interrupted by SIGQUIT") in squeezed(said), said[-3000:]
    assert squeezed(f"run directory: {run_dir}") in squeezed(said)
    assert "Traceback" not in said
    assert run_processes(json.loads((run_dir / "plan.json").read_text())["run_id"]) == []
    status = run_tfo("status", str(run_dir), timeout=30)
    assert "interrupted: interrupted by SIGQUIT" in status.stdout
