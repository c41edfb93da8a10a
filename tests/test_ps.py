"""ParameterServer jobs and the evaluator sidecar, with real TensorFlow processes."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.conftest import (
    FIXED_PORTS,
    events,
    port_is_free,
    run_processes,
    run_tfo,
    wait_until,
    write_spec,
)
from tests.helpers import Tfo, evaluate_saved_model, first, kill_task

pytestmark = [pytest.mark.tf]  # FIXED_PORTS on the tests that use them (conftest.py)

PS_PORTS = (20010, 20011, 20012, 20013, 20014)


def evaluated(run_dir: Path) -> dict[int, dict]:
    return {e["epoch"]: e["metrics"] for e in events(run_dir) if e["event"] == "task_evaluated"}


@FIXED_PORTS
@pytest.mark.timeout(300)
def test_ps_cluster_runs_and_the_evaluator_sees_every_checkpoint(run_dir: Path):
    res = run_tfo("run", "clusters/localhost-ps.yaml", "--run-dir", str(run_dir))
    assert res.returncode == 0, res.output[-4000:]
    ev = events(run_dir)
    # Start order: ps, then workers, then chief and evaluator once the servers serve.
    started = [e["task"] for e in ev if e["event"] == "task_started"]
    assert started[:3] == ["ps:0", "worker:0", "worker:1"]
    serving = [e["time"] for e in ev if e["event"] == "task_ready" and e["what"] == "serving"]
    chief_start = first(ev, "task_started", "chief:0")["time"]
    assert len(serving) == 3 and max(serving) <= chief_start

    # The optimizer's iteration count is exactly what the chief scheduled.
    log = (run_dir / "logs" / "chief-0.log").read_text()
    steps, scheduled = map(int, re.search(r"trained steps=(\d+) scheduled=(\d+)", log).groups())
    assert steps == scheduled == 5 * (1437 // 32)

    # The chief's model is saved (by it alone) and reloads.
    saved = sorted(p.parent for p in run_dir.rglob("saved_model.pb"))
    assert saved == [run_dir / "model" / "saved_model"]
    assert evaluate_saved_model(saved[0]) >= 0.9

    # The evaluator evaluated every checkpoint once, with TensorBoard summaries.
    assert sorted(evaluated(run_dir)) == [1, 2, 3, 4, 5]
    assert len([e for e in ev if e["event"] == "task_evaluated"]) == 5
    assert list((run_dir / "tensorboard" / "eval").glob("events.out.tfevents.*"))
    acc = evaluated(run_dir)[5]["accuracy"]
    assert "evaluator: epoch 5: loss=" in res.stderr and f"accuracy={acc:.4f}" in res.stderr
    assert first(ev, "task_exited", "evaluator:0")["returncode"] == 0

    # The servers were stopped by the supervisor after the chief, and nothing is left.
    chief_exit = first(ev, "task_exited", "chief:0")
    assert chief_exit["returncode"] == 0
    for server in ("ps:0", "worker:0", "worker:1"):
        assert first(ev, "task_stopping", server)["time"] >= chief_exit["time"]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert run_processes(plan["run_id"]) == []
    assert all(port_is_free(p) for p in PS_PORTS)


@FIXED_PORTS
@pytest.mark.timeout(300)
def test_mwms_evaluator_matches_the_saved_model(run_dir: Path, tmp_path: Path):
    spec = write_spec(tmp_path / "c.yaml", """\
name: mwms-eval
job:
  entry: worker_entry.examples.digits:train
  args: {epochs: 3}
tasks:
  worker: [localhost:20000, localhost:20001]
  evaluator: [localhost:20002]
""")
    res = run_tfo("run", str(spec), "--run-dir", str(run_dir))
    assert res.returncode == 0, res.output[-4000:]
    results = evaluated(run_dir)
    assert sorted(results) == [1, 2, 3]
    final_acc = evaluate_saved_model(run_dir / "model" / "saved_model")
    assert abs(results[3]["accuracy"] - final_acc) < 1e-6
    assert "evaluator" not in json.loads((run_dir / "plan.json").read_text())["cluster"]


@FIXED_PORTS
@pytest.mark.timeout(300)
def test_lost_ps_worker_restarts_alone(run_dir: Path, tmp_path: Path):
    spec = write_spec(tmp_path / "c.yaml", """\
name: ps-kill
strategy: parameter_server
job:
  entry: tests.jobs.faulty:train
  args: {epochs: 5, epoch_sleep: 1.5}
tasks:
  chief: [localhost:20010]
  worker: [localhost:20011, localhost:20012]
  ps: [localhost:20013]
restart: {policy: on-failure, max_restarts: 2, backoff_seconds: 0.5, warm_spares: false}
timeouts: {grace_seconds: 5}
""")  # no spares: the worker server restarts from none (a server keeps none), the chief never
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_epoch", "chief:0", epoch=1)
        killed_at = kill_task(tfo, "worker:1")
        code, err = tfo.finish()
        assert code == 0, err[-4000:]
    finally:
        tfo.close()
    ev = events(run_dir)
    assert first(ev, "task_exited", "worker:1")["time"] - killed_at <= 0.2
    restarted = [e["task"] for e in ev if e["event"] == "task_restarted"]
    assert restarted == ["worker:1"]  # alone: the chief, ps and worker:0 went on
    assert [e["attempt"] for e in ev if e["event"] == "task_started"
            and e["task"] == "chief:0"] == [0]
    assert first(ev, "task_ready", "worker:1", attempt=1)
    assert ev[-1]["restarts"] == 1
    time.sleep(0.1)
    assert all(port_is_free(p) for p in PS_PORTS[:4])


@pytest.mark.timeout(300)
def test_a_lost_worker_server_comes_back_alone_by_default(run_dir: Path, tmp_path: Path):
    """Issue 31: under the default policy a lost worker server failed the job: tfo stopped the
    chief, which was training on. A parameter_server job's servers now come back by default
    (strategy.RULES), alone, and the tutorial's ClusterCoordinator rides it out. The
    tutorial's script runs unmodified: the servers are ours, ready once serving, the chief
    ready once its port listened; only the chief's model is saved, and it scores; no task
    left a temp file. The chief's steps are its coordinator's closures
    (test_autoprogress' own run of this script is this one now)."""
    spec = write_spec(tmp_path / "c.yaml", f"""\
name: ps-default
strategy: parameter_server
job:
  script: tests/scripts/ps_coordinator.py
  args: [--epochs, "16", --steps_per_epoch, "150", --model_path, "{run_dir}/model/ps-model"]
tasks:
  chief: [localhost:auto]
  worker: [localhost:auto, localhost:auto]
  ps: [localhost:auto]
""")
    chief_log = run_dir / "logs" / "chief-0.log"
    tfo = Tfo(spec, run_dir)
    try:
        assert wait_until(lambda: chief_log.exists() and "Finished epoch 0" in
                          chief_log.read_text(), 180), "the chief never finished an epoch"
        # 15 epochs left, not 7: under the full suite's load the chief once finished all
        # of them before the restarted worker server reported ready (no task_ready).
        kill_task(tfo, "worker:1")
        code, err = tfo.finish()
        assert code == 0, err[-4000:]
    finally:
        tfo.close()
    ev = events(run_dir)
    assert [e["task"] for e in ev if e["event"] == "task_restarted"] == ["worker:1"]
    assert first(ev, "task_ready", "worker:1", attempt=1)  # back, serving
    assert [e["attempt"] for e in ev if e["event"] == "task_started"
            and e["task"] == "chief:0"] == [0]  # the chief trained on
    assert first(ev, "task_exited", "chief:0")["returncode"] == 0
    assert "Finished epoch 15, accuracy is" in chief_log.read_text()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["policy"]["restart"] == {"ps": "on-failure", "worker": "on-failure",
                                         "chief": "never"}
    assert run_processes(plan["run_id"]) == []
    # What test_scripts checked of the tutorial's run on its own (its clean run, removed:
    # this one is the same script on the same cluster, a worker server lost on the way).
    assert first(ev, "task_ready", "ps:0", what="serving")
    assert first(ev, "task_ready", "chief:0", by="port")
    model = run_dir / "model" / "ps-model"
    assert sorted(p.parent for p in (run_dir / "model").rglob("saved_model.pb")) == [model]
    assert evaluate_saved_model(model) > 0.8
    tmp = run_dir / "tmp"
    assert not tmp.exists() or not any(tmp.iterdir()), list(tmp.iterdir())
    # The coordinator's loop counts its closures as steps (autoprogress): every scheduled
    # step once it completed, the lost worker's retried ones too; and which worker finished
    # them (issue 41 item 4: loop/closures.py), by worker index, at most every 2 s.
    steps = [e for e in ev if e["event"] == "task_progress" and e["task"] == "chief:0"]
    assert {e["source"] for e in steps} == {"coordinator"}
    assert steps[-1]["step"] == 16 * 150
    told = [e["by_worker"] for e in ev if e["event"] == "task_closures"]
    assert told and set().union(*told) <= {"0", "1"}
    assert 0 < sum(told[-1].values()) <= 16 * 150
