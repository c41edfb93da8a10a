"""Real MultiWorkerMirrored jobs on localhost:20000/20001, run through `tfo run`."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import (
    ENDED,
    FIXED_PORTS,
    REPO,
    events,
    kill_tree,
    port_is_free,
    run_processes,
    run_tfo,
    tfo_cmd,
    wait_until,
    write_spec,
)
from tests.helpers import evaluate_saved_model
from tests.procs import alive

pytestmark = [pytest.mark.tf]  # FIXED_PORTS on the tests that use them (conftest.py)

FAULTY = """\
name: faulty
job:
  entry: tests.jobs.faulty:train
  args: {{epochs: 5, {args}}}
tasks:
  worker: [localhost:20000, localhost:20001]
timeouts: {{grace_seconds: 5}}
{extra}
"""


@FIXED_PORTS
@pytest.mark.timeout(300)
def test_localhost_cluster_trains_and_chief_saves(run_dir: Path):
    res = run_tfo("run", "clusters/localhost.yaml", "--run-dir", str(run_dir))
    assert res.returncode == 0, res.output[-4000:]
    assert "[worker:0]" in res.stdout and "[worker:1]" in res.stdout  # prefixed console lines
    # Piped: plain lines, no live table, no escape sequence; at the end a row per task with
    # how it ended and its last epoch, step and loss, then the summary.
    assert "\x1b" not in res.output
    assert "job succeeded: all training tasks finished" in res.stderr
    for task in ("worker:0", "worker:1"):
        assert re.search(rf"{task}\s+localhost\s+succeeded\s+{ENDED}\s+5/5\s+22/22\s+"
                         r"\d+\.\d+", res.stderr), res.stderr
    assert f"run directory: {run_dir} (restarts: 0)" in res.stderr

    # Both workers ran the same number of steps (5 epochs x 22 steps).
    steps = {}
    for i in (0, 1):
        log = (run_dir / "logs" / f"worker-{i}.log").read_text()
        steps[i] = int(re.search(rf"worker:{i} trained steps=(\d+)", log).group(1))
    assert steps[0] == steps[1] == 5 * (1437 // 64)

    # The model exists only under the chief's model_dir, and is good.
    saved = sorted(p.parent for p in run_dir.rglob("saved_model.pb"))
    assert saved == [run_dir / "model" / "saved_model"]
    assert evaluate_saved_model(saved[0]) >= 0.9

    # No temporary directory of worker 1 is left.
    assert not (run_dir / "tmp").exists()
    ev = events(run_dir)
    worker1_tmp = [e["path"] for e in ev if e["event"] == "task_saved" and e["task"] == "worker:1"]
    assert worker1_tmp and not any(Path(p).exists() for p in worker1_tmp)

    # The run's record: plan, events with time/event/task/pid/returncode.
    plan = json.loads((run_dir / "plan.json").read_text())
    assert [t["name"] for t in plan["tasks"]] == ["worker:0", "worker:1"]
    exits = {e["task"]: e for e in ev if e["event"] == "task_exited"}
    # 0, or stopped in TensorFlow's teardown after its peer left (supervise.py): a success.
    assert all(e["returncode"] == 0 or e.get("teardown") for e in exits.values()), exits
    assert set(exits) == {"worker:0", "worker:1"}
    assert all(isinstance(e["time"], float) and e["pid"] > 0 for e in exits.values())
    assert ev[-1]["event"] == "job_finished" and ev[-1]["exit_code"] == 0

    # Nothing of the run is left, and the ports are free again.
    assert run_processes(plan["run_id"]) == []
    assert not any(alive(e["pid"]) for e in exits.values())
    assert port_is_free(20000) and port_is_free(20001)

    # status and logs read the run back.
    status = run_tfo("status", str(run_dir), timeout=30)
    assert status.returncode == 0 and "succeeded" in status.stdout
    assert re.search(rf"worker:1\s.*task_exited.*{ENDED}", status.stdout)
    logs = run_tfo("logs", str(run_dir), "worker:1", "-n", "3", timeout=30)
    assert logs.returncode == 0 and len(logs.stdout.splitlines()) == 3


@pytest.mark.timeout(240)
def test_failing_worker_fails_the_job_fast(tf_cluster):
    # Through the test kit (tests/test_kit.py): auto ports, the result as data.
    result = tf_cluster.run("tests.jobs.faulty:train", workers=2, timeouts={"grace_seconds": 5},
                            args={"epochs": 5, "fail_task": "worker:1", "fail_epoch": 0,
                                  "exit_code": 3})
    ended_at = time.time()
    assert not result.ok and result.exit_code == 1, result
    w0, w1 = result.tasks["worker:0"], result.tasks["worker:1"]
    exited = next(e for e in w1.events if e["event"] == "task_exited")
    assert exited["returncode"] == 3 and w1.exit_code == 3
    assert ended_at - exited["time"] < 15
    # worker:0 is gone.
    pid = next(e["pid"] for e in w0.events if e["event"] == "task_started")
    assert not alive(pid)
    # What a failed assertion shows names the task, its exit code and the end of its log.
    assert result.failed_task == "worker:1" and "exit code 3" in result.reason
    assert "[faulty] exiting with 3 after epoch 0" in repr(result)
    plan = json.loads((Path(result.run_dir) / "plan.json").read_text())
    assert all(port_is_free(t["port"]) for t in plan["tasks"])


@FIXED_PORTS
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_tears_everything_down(sig, code, run_dir: Path, tmp_path: Path):
    spec = write_spec(tmp_path / "c.yaml", FAULTY.format(args="epoch_sleep: 30", extra=""))
    proc = subprocess.Popen(tfo_cmd("run", str(spec), "--run-dir", str(run_dir)), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        ready = wait_until(lambda: [e for e in events(run_dir) if e["event"] == "task_epoch"], 120)
        assert ready, "training never started"
        run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
        assert len(run_processes(run_id)) >= 2
        t0 = time.time()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == code, err[-3000:]
        assert time.time() - t0 < 15
        assert run_processes(run_id) == []
        assert events(run_dir)[-1]["state"] == "interrupted"
        assert "Traceback" not in err
        assert port_is_free(20000) and port_is_free(20001)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()


