"""The tf.data service as tfo's roles (issue 43): a real 2-worker MultiWorkerMirrored job
whose input pipeline runs on data workers tfo starts and supervises
(tests/scripts/data_service.py, TensorFlow's `distribute(processing_mode=...)`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, events, run_processes, run_tfo, write_spec
from tests.helpers import Tfo, first, kill_task, stop

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


def _longest_wait(evs: list[dict], task: str, since: float, until: float) -> float:
    """The task's longest time without a progress report between `since` and `until`."""
    times = [since] + [t for t, _ in _progress(evs, task) if since < t < until] + [
        next((t for t, _ in _progress(evs, task) if t >= until), until)]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


@pytest.mark.timeout(1200)
def test_killed_service_tasks_restart_alone_while_training_goes_on(tmp_path, run_dir):
    """One job, two SIGKILLs: data_worker:0 mid-epoch, then (once it serves again) the
    dispatcher. Each is restarted alone (the trainers keep their first attempt), the
    dispatcher from its journal at the same address, the trainers train after each, the job
    succeeds and nothing of it is left running. What the trainers saw (worker:0's longest
    time without a progress report after each kill) is printed."""
    spec = _spec(tmp_path, ["--elements", "400", "--epochs", "8", "--delay_ms", "20",
                            "--mode", "parallel_epochs"])
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_progress", "worker:0", timeout=300)
        worker_killed = kill_task(tfo, "data_worker:0")
        worker_back = tfo.wait_event("task_ready", "data_worker:0", timeout=300, attempt=1)
        dispatcher_killed = kill_task(tfo, "dispatcher:0")
        dispatcher_back = tfo.wait_event("task_ready", "dispatcher:0", timeout=300, attempt=1)
        rc, err = tfo.finish(timeout=600)
    finally:
        stop(tfo)
    evs = events(run_dir)
    assert rc == 0, err[-4000:]
    restarted = sorted(e["task"] for e in evs if e["event"] == "task_restarted")
    assert restarted == ["data_worker:0", "dispatcher:0"]
    assert {e["attempt"] for e in evs if e["event"] == "task_started"
            and e["task"].startswith("worker:")} == {0}
    assert [s for t, s in _progress(evs, "worker:0") if t > dispatcher_back["time"]], \
        "no training after the dispatcher came back"
    journal = run_dir / "dataservice"
    assert journal.is_dir() and any(journal.iterdir()), "the dispatcher kept no journal"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert not run_processes(plan["run_id"]), "something of the run is left running"
    end = first(evs, "job_finished")["time"] if first(evs, "job_finished") else time.time()
    for what, killed, back, until in (
            ("data_worker:0", worker_killed, worker_back, dispatcher_killed),
            ("dispatcher:0", dispatcher_killed, dispatcher_back, end)):
        print(f"{what} back {back['time'] - killed:.1f} s after its SIGKILL; worker:0's "
              f"longest wait since: {_longest_wait(evs, 'worker:0', killed, until):.1f} s")
