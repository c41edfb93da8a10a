"""The tf.data service as tfo's roles (issue 43): a real 2-worker MultiWorkerMirrored job
whose input pipeline runs on data workers tfo starts and supervises
(tests/scripts/data_service.py, TensorFlow's `distribute(processing_mode=...)`). Two real
jobs: on localhost, its data worker and then its dispatcher SIGKILLed; on the SSH lab
(`flock /tmp/sshlab.lock`), the service on a third host, one pass over the data per epoch.
On Slurm: tests/test_slurm.py; through an elastic resize: tests/test_resizing.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    SSH_LAB3,
    events,
    kill_tree,
    run_processes,
    run_tfo,
    wait_until,
    write_spec,
)
from tests.helpers import Tfo, first, host_yaml, kill_task, stop

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


def _one_pass_each_epoch(seen: Path, elements: int, epochs: int) -> None:
    """Every element of each epoch trained on exactly once across the two trainers (with
    few elements the first trainer to ask may be handed all of them: not asserted)."""
    per_task = [json.loads((seen / f"worker:{i}.json").read_text()) for i in (0, 1)]
    for epoch in range(epochs):
        ids = per_task[0][epoch] + per_task[1][epoch]
        assert sorted(ids) == list(range(elements)), f"epoch {epoch}: {len(ids)} ids"


def _progress(evs: list[dict], task: str) -> list[tuple[float, int]]:
    return [(e["time"], e["step"]) for e in evs
            if e["event"] == "task_progress" and e["task"] == task]


def _longest_wait(evs: list[dict], task: str, since: float, until: float) -> float:
    """The task's longest time without a progress report between `since` and `until`."""
    times = [since] + [t for t, _ in _progress(evs, task) if since < t < until] + [until]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


@pytest.mark.timeout(1200)
def test_killed_service_tasks_restart_alone_while_training_goes_on(tmp_path, run_dir):
    """One job, two SIGKILLs: data_worker:0 mid-epoch, then (once it serves again and the
    trainers train again) the dispatcher. The service serves before the trainers start,
    every task is given the dispatcher's address, and it is stopped with the job. Each kill
    is restarted alone (the trainers keep their first attempt), the dispatcher from its
    journal at the same address; the trainers train after each, the job succeeds, nothing
    of it is left running. What the trainers saw after each kill (worker:0's next progress
    report, its longest time without one until the next kill or the end) is printed."""
    # Both kills land in epoch 0 (the trainers wait for the killed data worker's share of
    # it), so epochs 1 and 2 need the restarted dispatcher: training after it is certain.
    spec = _spec(tmp_path, ["--elements", "200", "--epochs", "3", "--delay_ms", "20",
                            "--mode", "parallel_epochs"])
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_progress", "worker:0", timeout=300)
        worker_killed = kill_task(tfo, "data_worker:0")
        worker_back = tfo.wait_event("task_ready", "data_worker:0", timeout=300, attempt=1)
        # Training again before the next kill: each wait is the one kill's.
        assert wait_until(lambda: _progress(events(run_dir), "worker:0")[-1][0] >
                          worker_back["time"], 300), "no training after the data worker's return"
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
    service = ("dispatcher:0", "data_worker:0", "data_worker:1")
    ready = max(first(evs, "task_ready", t)["time"] for t in service)
    assert all(first(evs, "task_started", w)["time"] >= ready for w in ("worker:0", "worker:1"))
    for t in service:
        assert first(evs, "task_stopped", t), f"{t} not stopped with the job"
    plan = json.loads((run_dir / "plan.json").read_text())
    dispatcher = next(t for t in plan["tasks"] if t["name"] == "dispatcher:0")
    assert {t["env"]["TFO_DATA_SERVICE"] for t in plan["tasks"]} == {
        f"grpc://localhost:{dispatcher['port']}"}
    assert not run_processes(plan["run_id"]), "something of the run is left running"
    end = first(evs, "job_finished")["time"] if first(evs, "job_finished") else time.time()
    for what, killed, back, until in (
            ("data_worker:0", worker_killed, worker_back, dispatcher_killed),
            ("dispatcher:0", dispatcher_killed, dispatcher_back, end)):
        again = next(t for t, _ in _progress(evs, "worker:0") if t > killed)
        print(f"{what} back {back['time'] - killed:.1f} s after its SIGKILL; worker:0's next "
              f"progress {again - killed:.1f} s after it, its longest wait until "
              f"{'the next kill' if until != end else 'the end'} "
              f"{_longest_wait(evs, 'worker:0', killed, until):.1f} s")


@pytest.mark.ssh
@SSH_LAB3
@pytest.mark.timeout(900)
def test_the_service_on_a_third_lab_host_feeds_the_trainers_on_two_others(lab3, run_dir,
                                                                          tmp_path):
    """Over SSH: the trainers on lab1 and lab2, the dispatcher and both data workers on lab3.
    The address every task is given is lab3's (what the trainers reach across the lab's
    network), the trainers share one pass over the data each epoch, the dispatcher keeps its
    journal on lab3, and nothing of the run is left on any host."""
    hosts = "".join(host_yaml(f"lab{i}", h, tmp_path / f"lab{i}")
                    for i, h in enumerate(lab3, start=1))
    seen = tmp_path / "seen"  # the lab hosts share this machine's files
    spec = write_spec(tmp_path / "ds-lab.yaml", f"""\
name: ds-lab
job: {{script: tests/scripts/data_service.py, args: {json.dumps(
        ["--elements", "120", "--epochs", "2", "--seen_dir", str(seen)])}}}
hosts:
{hosts}\
tasks:
  worker: [lab1:auto, lab2:auto]
  dispatcher: lab3:auto
  data_worker: [lab3:auto, lab3:auto]
timeouts: {{startup_seconds: 300}}
""")
    try:
        res = run_tfo("run", str(spec), "--run-dir", str(run_dir), timeout=600)
    finally:
        plan = json.loads((run_dir / "plan.json").read_text()) \
            if (run_dir / "plan.json").exists() else None
        left = run_processes(plan["run_id"]) if plan else []
        for p in left:
            kill_tree(p.pid)
    assert res.returncode == 0, res.output[-4000:]
    _one_pass_each_epoch(seen, elements=120, epochs=2)
    assert not any(e["event"] == "task_restarted" for e in events(run_dir))
    lab3_address = lab3[2].address
    dispatcher = next(t for t in plan["tasks"] if t["name"] == "dispatcher:0")
    assert {t["env"]["TFO_DATA_SERVICE"] for t in plan["tasks"]} == {
        f"grpc://{lab3_address}:{dispatcher['port']}"}
    journal = tmp_path / "lab3" / "runs" / plan["run_id"] / "dataservice"
    assert journal.is_dir() and any(journal.iterdir()), journal
    assert not left, f"left running: {[p.pid for p in left]}"
