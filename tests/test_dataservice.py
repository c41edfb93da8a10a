"""The tf.data service as tfo's roles (issue 43): a real 2-worker MultiWorkerMirrored job
whose input pipeline runs on data workers tfo starts and supervises
(tests/scripts/data_service.py, TensorFlow's `distribute(processing_mode=...)`)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, events, run_tfo, write_spec
from tests.helpers import Tfo, first

SCRIPT = REPO / "tests/scripts/data_service.py"


def _spec(tmp_path: Path, args: list[str], data_workers: int = 2, extra: str = "") -> Path:
    workers = ", ".join(["localhost"] * data_workers)
    return write_spec(tmp_path / "ds.yaml", f"""
name: ds
job: {{script: {SCRIPT}, args: {json.dumps(args)}}}
tasks:
  worker: [localhost, localhost]
  dispatcher: localhost
  data_worker: [{workers}]
timeouts: {{startup_seconds: 300}}
{extra}""")


@pytest.mark.timeout(600)
def test_trainers_share_one_pass_over_the_data_served_by_tfo(tmp_path, run_dir):
    """distributed_epoch: every element of each epoch trained on exactly once across the two
    trainers; the service serves before the trainers start and is stopped with the job."""
    seen = tmp_path / "seen"
    spec = _spec(tmp_path, ["--elements", "200", "--epochs", "2", "--seen_dir", str(seen)])
    res = run_tfo("run", str(spec), "--run-dir", str(run_dir), timeout=420)
    assert res.returncode == 0, res.output[-4000:]
    per_task = [json.loads((seen / f"worker:{i}.json").read_text()) for i in (0, 1)]
    for epoch in (0, 1):
        ids = per_task[0][epoch] + per_task[1][epoch]
        assert sorted(ids) == list(range(200)), f"epoch {epoch}: {len(ids)} ids"
        assert per_task[0][epoch] and per_task[1][epoch]  # both trainers were fed

    evs = events(run_dir)
    service = ("dispatcher:0", "data_worker:0", "data_worker:1")
    ready = max(first(evs, "task_ready", t)["time"] for t in service)
    assert all(first(evs, "task_started", w)["time"] >= ready for w in ("worker:0", "worker:1"))
    plan = json.loads((run_dir / "plan.json").read_text())
    dispatcher = next(t for t in plan["tasks"] if t["name"] == "dispatcher:0")
    address = f"grpc://localhost:{dispatcher['port']}"
    assert {t["env"]["TFO_DATA_SERVICE"] for t in plan["tasks"]} == {address}
    assert (run_dir / "dataservice").is_dir()  # the dispatcher's journal (fault tolerant)
    for t in service:
        assert first(evs, "task_stopped", t), f"{t} not stopped with the job"
    assert not any(e["event"] == "task_restarted" for e in evs)


def _progress(evs: list[dict], task: str) -> list[tuple[float, int]]:
    return [(e["time"], e["step"]) for e in evs
            if e["event"] == "task_progress" and e["task"] == task]


@pytest.mark.timeout(900)
def test_a_killed_data_worker_restarts_alone_while_training_goes_on(tmp_path, run_dir):
    """SIGKILL data_worker:0 mid-epoch: it alone is restarted (the trainers keep their first
    attempt) and the job finishes; what the trainers saw (their longest wait between two
    progress reports around the kill) is printed."""
    spec = _spec(tmp_path, ["--elements", "400", "--epochs", "4", "--delay_ms", "20",
                            "--mode", "parallel_epochs"])
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_progress", "worker:0", timeout=300)
        pid = tfo.wait_event("task_started", "data_worker:0", attempt=0)["pid"]
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        back = tfo.wait_event("task_ready", "data_worker:0", timeout=240, attempt=1)
        rc, err = tfo.finish(timeout=400)
    finally:
        tfo.close()
    evs = events(run_dir)
    assert rc == 0, err[-4000:]
    restarted = [e["task"] for e in evs if e["event"] == "task_restarted"]
    assert restarted == ["data_worker:0"]
    assert {e["attempt"] for e in evs if e["event"] == "task_started"
            and e["task"].startswith("worker:")} == {0}
    steps_after = [s for t, s in _progress(evs, "worker:0") if t > back["time"]]
    assert steps_after, "no training after the data worker came back"
    times = [t for t, _ in _progress(evs, "worker:0")]
    gap = max((b - a for a, b in zip(times, times[1:], strict=False) if b > killed_at),
              default=0.0)
    print(f"data_worker:0 back {back['time'] - killed_at:.1f} s after its SIGKILL; "
          f"worker:0's longest wait between progress reports since: {gap:.1f} s")
