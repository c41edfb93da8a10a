"""Supervising idle tasks costs the coordinator next to nothing, and a task's death is
learnt from the kernel at once. Light tasks: bench/job.py --fake (listens on its port and
sleeps), no TensorFlow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from bench.run import cpu_seconds
from tests.conftest import REPO, events, kill_tree, tfo_cmd, wait_until, write_spec

TASKS = 32


@pytest.mark.timeout(240)
def test_idle_tasks_cost_the_coordinator_almost_nothing(run_dir: Path, tmp_path: Path):
    spec = write_spec(tmp_path / "light.json", json.dumps({
        "name": "light", "job": {"script": "bench/job.py", "args": [
            "--fake", "--epochs", "1", "--steps_per_epoch", "1", "--step_seconds", "600"]},
        "tasks": {"worker": ["localhost:auto"] * TASKS}, "restart": {"policy": "never"}}))
    proc = subprocess.Popen(tfo_cmd("run", str(spec), "--run-dir", str(run_dir)), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        ready = wait_until(lambda: sum(e["event"] == "task_ready"
                                       for e in events(run_dir)) == TASKS, 180, 0.2)
        assert ready, "the light tasks did not all come up"
        time.sleep(0.5)
        coord = psutil.Process(proc.pid)
        c0, t0 = cpu_seconds(coord), time.monotonic()
        time.sleep(3)
        per_second = (cpu_seconds(coord) - c0) / (time.monotonic() - t0)
        # Sampling each task's process tree every second cost 0.10 of a core at 32 tasks.
        assert per_second < 0.03, f"the coordinator used {per_second:.3f} of a core"

        victim = next(e["pid"] for e in events(run_dir) if e["event"] == "task_started"
                      and e["task"] == "worker:1")
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    ev = events(run_dir)
    exited = next(e["time"] for e in ev if e["event"] == "task_exited")
    assert exited - killed < 0.5, f"the SIGKILL was noticed {exited - killed:.3f} s later"
    assert sum(e["event"] == "task_stopped" for e in ev) == TASKS - 1
