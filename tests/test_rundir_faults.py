"""The run directory's own faults: deleted while the job runs (made again, the events go
on, the summary says what was lost), its file system full (a message naming the file, the
job stopped cleanly, events.jsonl ending at its last whole event), and an emptied,
truncated or corrupt events.jsonl as `tfo status` reads it (never "running")."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    events,
    kill_tree,
    run_processes,
    run_tfo,
    small_tmpfs,
    tfo_cmd,
    wait_until,
)

JOB = ["--", "python", "tests/scripts/slow_keras.py", "--first_seconds", "0.5",
       "--step_seconds", "0.3"]


def last_epoch(run_dir: Path) -> int:
    return max((e.get("epoch") or 0 for e in events(run_dir) if e["event"] == "task_progress"),
               default=0)


def squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


class Tfo:
    """`tfo run` in the background, as a user's shell would start it."""

    def __init__(self, run_dir: Path, *args: str) -> None:
        self.proc = subprocess.Popen(tfo_cmd("run", "--run-dir", str(run_dir), *args),
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)

    def finish(self, timeout: float) -> tuple[str, str]:
        try:
            return self.proc.communicate(timeout=timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.wait()


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_run_directory_deleted_mid_run_is_made_again_and_said(run_dir: Path):
    tfo = Tfo(run_dir, "--workers", "1", *JOB, "--epochs", "12")
    try:
        assert wait_until(lambda: last_epoch(run_dir) >= 3 or tfo.proc.poll() is not None,
                          200), "never reached epoch 3"
        run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
        modes = {p: (run_dir / p).stat().st_mode for p in (".", "plan.json")}
        shutil.rmtree(run_dir)  # rm -rf at epoch 3 of 12
        t0 = time.monotonic()
        assert wait_until(lambda: (run_dir / "events.jsonl").exists(), 15), \
            "the run directory was not made again"
        noticed = time.monotonic() - t0
        out, err = tfo.finish(200)
    finally:
        tfo.close()
    assert noticed < 10, noticed
    assert tfo.proc.returncode == 0, err[-3000:]
    ev = events(run_dir)
    kinds = [e["event"] for e in ev]
    # The whole story, before and after the deletion, in one file.
    assert kinds[0] == "run_started" and kinds[-1] == "job_finished", kinds
    assert kinds.count("run_dir_restored") == 1
    restored = next(e for e in ev if e["event"] == "run_dir_restored")
    assert "tmp" in restored["lost"], restored
    epochs = {e.get("epoch") for e in ev if e["event"] == "task_progress"}
    assert {1, 2, 3, 11} <= epochs, sorted(e for e in epochs if e is not None)
    assert json.loads((run_dir / "plan.json").read_text())["run_id"] == run_id
    assert {p: (run_dir / p).stat().st_mode for p in modes} == modes  # private stays private
    log = (run_dir / "logs" / "worker-0.log").read_text()
    assert "Epoch 1/12" in log and "Epoch 12/12" in log, log[-2000:]
    said = " ".join(err.split())
    assert f"run directory: run directory {run_dir} was deleted during the run; made again" \
        in said, said
    assert "lost: " in said and "tmp/ (the tasks' temp files)" in said
    assert f"[tfo] run directory {run_dir} was deleted during the run" in out
    status = run_tfo("status", str(run_dir), timeout=30)
    assert "succeeded: " in status.stdout, status.output


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs of its own, unmounted afterwards."""
    with small_tmpfs(tmp_path / "small", "24m") as mnt:
        yield mnt


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_full_file_system_stops_the_job_naming_the_file(small_fs: Path):
    run_dir = small_fs / "run"
    tfo = Tfo(run_dir, "--workers", "1", *JOB, "--epochs", "200")
    try:
        assert wait_until(lambda: last_epoch(run_dir) >= 2 or tfo.proc.poll() is not None,
                          200), "never reached epoch 2"
        run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
        with open(small_fs / "filler", "wb") as f, contextlib.suppress(OSError):
            while True:  # the disk fills up, as another program's output would fill it
                f.write(b"\0" * 65536)
                f.flush()
        out, err = tfo.finish(120)
    finally:
        tfo.close()
    said = " ".join(err.split())
    assert tfo.proc.returncode == 1, said[-3000:]
    # The table's title wraps anywhere, a path too.
    assert squeezed(f"cannot write {run_dir}/events.jsonl: No space left on device: the file "
                    "system holding the run directory is full") in squeezed(said), said
    assert "job failed" in said and f"run directory: {run_dir}" in said  # the summary
    assert "Traceback" not in err
    assert wait_until(lambda: not run_processes(run_id), 10)
    text = (run_dir / "events.jsonl").read_text()
    assert text.endswith("\n"), text[-500:]  # cut back to its last whole event
    assert all(json.loads(line) for line in text.splitlines())
    status = run_tfo("status", str(run_dir), timeout=30)
    assert status.returncode == 0, status.output
    title = " ".join(status.stdout.split())
    assert "ended abnormally: coordinator lost" in title, title
    assert "its last event: " in title
    assert not re.search(r"\brunning\b", status.stdout), status.stdout


# ---- tfo status on a damaged events.jsonl ----------------------------------------------

GONE_PID = 2 ** 22 - 3  # above pid_max here: no such process


def damaged_run(tmp_path: Path, text: str) -> Path:
    rd = tmp_path / "run"
    (rd / "logs").mkdir(parents=True)
    (rd / "plan.json").write_text(json.dumps({"run_id": "r", "name": "t"}))
    (rd / "events.jsonl").write_text(text)
    (rd / "lock").write_text(f"{GONE_PID}\n")
    return rd


def record(event: str, task: str | None = None, **fields: object) -> str:
    return json.dumps({"time": 1700000000.0, "event": event, "task": task, **fields}) + "\n"


STARTED = record("run_started", run_id="r", coordinator_pid=GONE_PID, coordinator_created=1.0,
                 coordinator_host=os.uname().nodename) + \
    record("task_started", "worker:0", pid=11, attempt=0) + \
    record("task_ready", "worker:0") + record("task_started", "worker:1", pid=12, attempt=0) + \
    record("task_ready", "worker:1") + record("task_progress", "worker:1", epoch=3, step=40)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("text", "said"), [
    ("", "no events: events.jsonl is empty"),
    ("\x00\x00\x00\n{garbage\n", "unreadable: events.jsonl holds 2 line(s), none of them an "
                                "event (corrupt)"),
    (STARTED + '{"time": 1700000001.0, "event": "task_pro',  # cut by a full disk
     "ended abnormally: coordinator lost: pid 4194301 is gone; the run did not finish cleanly; "
     "its last event: task_progress (worker:1) at "),
    (record("task_progress", "worker:1", epoch=4), "ended abnormally: events.jsonl has neither "
     "run_started nor job_finished; its last event: task_progress (worker:1)"),
])
def test_status_reads_a_damaged_events_file_as_such_never_running(tmp_path: Path, text: str,
                                                                   said: str):
    res = run_tfo("status", str(damaged_run(tmp_path, text)), timeout=30)
    assert res.returncode == 0, res.output
    shown = " ".join(res.stdout.split())
    assert said in shown, shown
    assert "running" not in shown, shown
    if "worker:1" in text:
        assert re.search(r"worker:1\s+-\s+unfinished\b", res.stdout), res.stdout


@pytest.mark.timeout(60)
def test_status_of_a_live_run_whose_events_were_emptied_says_running(tmp_path: Path):
    """Emptied while its tfo runs (which holds the lock and writes on): running, and why the
    start is missing."""
    rd = damaged_run(tmp_path, record("task_progress", "worker:1", epoch=4))
    with open(rd / "lock", "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        res = run_tfo("status", str(rd), timeout=30)
    assert "running (events.jsonl lost its run_started" in " ".join(res.stdout.split())
