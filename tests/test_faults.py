"""Faults with real processes and real signals: restarts, resume, fast detection,
timeouts, a killed coordinator, ports in use."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestrator.loop.supervise import restart_allowed
from orchestrator.planning.spec import RestartPolicy
from tests import golden
from tests.conftest import (
    FIXED_PORTS,
    events,
    port_is_free,
    run_processes,
    run_tfo,
    task_pids,
    wait_until,
    write_spec,
)
from tests.helpers import Tfo, first, kill_task
from tests.procs import alive

# FIXED_PORTS (tests/conftest.py) on each test whose job uses localhost:20000-20001, alone:
# the others run beside any test under xdist.


@pytest.fixture(autouse=True)
def golden_events(request, tmp_path):
    """What the supervisor decided in each scenario (its starts, exits, stops, restarts, the
    job's end; not the epochs a real job prints, which depend on the load) stays as recorded
    in tests/data/golden/faults/ (tests/golden.py). Checked after the test's own assertions."""
    yield
    golden.check_runs("faults", request.node.nodeid, tmp_path, decisions_only=True)

MWMS = """\
name: faults
job:
  entry: tests.jobs.faulty:train
  args: {{epochs: 5, epoch_sleep: {sleep}}}
tasks:
  worker: [{w0}, {w1}]
restart: {{policy: {policy}, max_restarts: {budget}, backoff_seconds: 0.5, warm_spares: {spares}}}
timeouts: {{grace_seconds: 5{timeouts}}}
env: {{FAULTY_HANG_TASK: "{hang}"}}
"""


def mwms(policy="on-failure", sleep=2, timeouts="", hang="", w0="localhost:20000",
         w1="localhost:20001", spares="auto", max_restarts=2) -> str:
    """The job; `spares` false where nothing restarts (each warm spare imports TensorFlow);
    `max_restarts` 1 where one restart is the scenario: with none left after it, tfo makes
    no standbys for a second one that never comes (two imports saved)."""
    return MWMS.format(policy=policy, sleep=sleep, timeouts=timeouts, hang=hang, w0=w0, w1=w1,
                       spares=spares, budget=max_restarts)


@pytest.mark.parametrize(("policy", "rc", "restart"), [
    (RestartPolicy.NEVER, -9, False), (RestartPolicy.ALWAYS, 0, True),
    (RestartPolicy.ON_FAILURE, 0, False), (RestartPolicy.ON_FAILURE, 3, True),
    (RestartPolicy.ON_FAILURE, -9, True), (RestartPolicy.EXIT_CODE, 3, False),
    (RestartPolicy.EXIT_CODE, 127, False), (RestartPolicy.EXIT_CODE, 137, True),
    (RestartPolicy.EXIT_CODE, -9, True), (RestartPolicy.EXIT_CODE, 255, True),
    (RestartPolicy.ON_FAILURE, None, True),
])
def test_restart_policy_rules(policy, rc, restart):
    assert restart_allowed(policy, rc) is restart


def latest_backup(run_dir: Path, worker: int) -> str | None:
    """The checkpoint a worker's last backup names (`ckpt-2`), from its `checkpoint` file."""
    index = run_dir / "backup" / f"worker-{worker}" / "chief" / "checkpoint"
    found = re.search(r'^model_checkpoint_path: "([^"]+)"', index.read_text(), re.M) \
        if index.exists() else None
    return found.group(1) if found else None


@FIXED_PORTS
@pytest.mark.tf
@pytest.mark.timeout(240)
def test_sigkill_worker_restarts_group_and_resumes(run_dir: Path, tmp_path: Path):
    tfo = Tfo(write_spec(tmp_path / "c.yaml", mwms(max_restarts=1)), run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:1", epoch=1)
        # Inside epoch 2 of 5, in its pause: both workers backed it up (ckpt-2). A fixed
        # sleep once landed between the two writes, and the workers rightly started over.
        assert wait_until(lambda: all(latest_backup(run_dir, w) == "ckpt-2" for w in (0, 1)),
                          60), [latest_backup(run_dir, w) for w in (0, 1)]
        killed_at = kill_task(tfo, "worker:1")
        code, err = tfo.finish()
        assert code == 0, err[-3000:]
    finally:
        tfo.close()
    ev = events(run_dir)
    exited = first(ev, "task_exited", "worker:1", attempt=0)
    assert exited["returncode"] == -signal.SIGKILL
    detection = exited["time"] - killed_at
    assert 0 <= detection <= 0.2, f"detected {detection:.3f} s after the kill"
    stopped = first(ev, "task_stopped", "worker:0")
    assert stopped["time"] - killed_at <= 2.0
    # One group restart: both workers restarted once, with the attempt number.
    restarted = [e for e in ev if e["event"] == "task_restarted"]
    assert sorted((e["task"], e["attempt"]) for e in restarted) == [
        ("worker:0", 1), ("worker:1", 1)]
    assert ev[-1]["event"] == "job_finished" and ev[-1]["restarts"] == 1
    # The resumed run starts at epoch >= 2 (1-based), not at the beginning.
    resumed = [e["epoch"] for e in ev if e["event"] == "task_epoch" and e["attempt"] == 1]
    assert resumed and min(resumed) >= 1, resumed
    assert "restarts: 1" in err
    assert (run_dir / "model" / "saved_model" / "saved_model.pb").exists()


@FIXED_PORTS
@pytest.mark.tf
@pytest.mark.timeout(240)
def test_never_policy_fails_and_names_the_signal(run_dir: Path, tmp_path: Path):
    tfo = Tfo(write_spec(tmp_path / "c.yaml", mwms(policy="never", sleep=5)), run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:1", epoch=0)
        kill_task(tfo, "worker:1")
        code, err = tfo.finish()
    finally:
        tfo.close()
    assert code == 1
    assert "job failed: worker:1 exited with signal SIGKILL" in err
    assert first(events(run_dir), "task_restarted") is None
    assert port_is_free(20000) and port_is_free(20001)


@FIXED_PORTS
@pytest.mark.tf
@pytest.mark.timeout(180)
def test_startup_timeout_names_the_task(run_dir: Path, tmp_path: Path):
    # worker:0 must have imported TensorFlow (connecting) by then, even on a loaded machine.
    spec = mwms(policy="never", timeouts=", startup_seconds: 30", hang="worker:1")
    res = run_tfo("run", str(write_spec(tmp_path / "c.yaml", spec)), "--run-dir", str(run_dir),
                  timeout=120)
    assert res.returncode == 1, res.output[-3000:]
    assert "startup timeout" in res.stderr and "never came up" in res.stderr
    assert "worker:1 (last: up)" in res.stderr  # hung before building its strategy
    assert "worker:0 (last: connecting)" in res.stderr  # waiting for worker:1
    assert "Traceback" not in res.stderr
    assert port_is_free(20000) and port_is_free(20001)


@pytest.mark.tf
@pytest.mark.timeout(180)
def test_deadline_stops_the_job_with_auto_ports(run_dir: Path, tmp_path: Path):
    spec = mwms(sleep=60, timeouts=", deadline_seconds: 25", w0="localhost", w1="localhost:auto",
                spares="false")
    res = run_tfo("run", str(write_spec(tmp_path / "c.yaml", spec)), "--run-dir", str(run_dir),
                  timeout=120)
    assert res.returncode == 1, res.output[-3000:]
    assert "deadline of 25 s reached" in res.stderr
    plan = json.loads((run_dir / "plan.json").read_text())
    ports = [t["port"] for t in plan["tasks"]]
    assert len(set(ports)) == 2 and all(p > 0 for p in ports)
    # Both built their strategy, i.e. met each other on those ports (not an epoch: on a loaded
    # 2-core machine the first epoch can come after the 25 s).
    evs = events(run_dir)
    assert first(evs, "task_ready", "worker:0") and first(evs, "task_ready", "worker:1")


@FIXED_PORTS
@pytest.mark.tf
@pytest.mark.timeout(180)
def test_sigkill_of_the_coordinator_leaves_no_task(run_dir: Path, tmp_path: Path):
    tfo = Tfo(write_spec(tmp_path / "c.yaml", mwms(sleep=30)), run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:1", epoch=0)
        run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
        # the tasks, and their watchdogs beside them
        assert set(task_pids(run_dir).values()) <= {p.pid for p in run_processes(run_id)}
        tfo.proc.kill()
        t0 = time.monotonic()
        tfo.proc.wait()
        gone = wait_until(lambda: not run_processes(run_id), 5)
        assert gone, f"still running 5 s after: {run_processes(run_id)}"
        print(f"tasks gone {time.monotonic() - t0:.2f} s after SIGKILL of tfo")
        assert wait_until(lambda: not (run_dir / "tmp").exists()
                          or not any((run_dir / "tmp").iterdir()), 5)
        assert wait_until(lambda: port_is_free(20000) and port_is_free(20001), 5)
    finally:
        tfo.close()


def restart_changing_backups(run_dir: Path, tmp_path: Path, epochs: int, fail_epoch: int,
                             change: Callable[[], None]) -> list[dict]:
    """worker:1 exits 3 after `fail_epoch` on its first attempt; during the restart's 4 s
    backoff `change()` acts on the backups. The job must then succeed with one restart; its
    events are returned."""
    spec = write_spec(tmp_path / "c.yaml", mwms(sleep=0, max_restarts=1).replace(
        "epochs: 5", f"epochs: {epochs}, fail_task: 'worker:1', fail_epoch: {fail_epoch}, "
        "exit_code: 3").replace("backoff_seconds: 0.5", "backoff_seconds: 4"))
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_restarted", "worker:1")
        change()
        code, err = tfo.finish()
        assert code == 0, err[-3000:]
    finally:
        tfo.close()
    ev = events(run_dir)
    assert ev[-1]["restarts"] == 1
    return ev


@FIXED_PORTS
@pytest.mark.tf
@pytest.mark.timeout(240)
def test_a_lost_backup_makes_the_group_start_over_together(run_dir: Path, tmp_path: Path):
    """worker:1's backup vanishes between attempts (a host's disk wiped): stock tf-keras
    would restore epoch 2 on worker:0 only and fail every restart on mismatched
    collectives; the workers notice before restoring and start over together."""
    def lose_worker_1s_backups() -> None:
        assert (run_dir / "backup" / "worker-0" / "chief" / "checkpoint").exists()
        shutil.rmtree(run_dir / "backup" / "worker-1")

    ev = restart_changing_backups(run_dir, tmp_path, 4, 1, lose_worker_1s_backups)
    assert min(e["epoch"] for e in ev if e["event"] == "task_epoch" and e["attempt"] == 1) == 0
    for i in (0, 1):
        assert "no backup every worker has" in (run_dir / "logs" / f"worker-{i}.log").read_text()


@FIXED_PORTS
@pytest.mark.tf
@pytest.mark.timeout(240)
def test_a_worker_one_backup_behind_makes_the_group_resume_from_the_one_before(
        run_dir: Path, tmp_path: Path):
    """worker:1 lacks the newest backup the others have (killed between the workers' writes
    of it): the group resumes from the backup before, which every worker keeps, not from
    epoch 0."""
    def lose_worker_1s_newest_backup() -> None:
        backup = run_dir / "backup" / "worker-1" / "chief"
        kept = re.findall(r'^all_model_checkpoint_paths: "([^"]+)"',
                          (backup / "checkpoint").read_text(), re.M)
        assert len(kept) == 2, kept  # epochs 1 and 2: two backups kept, not one
        for path in backup.glob(f"{kept[-1]}.*"):  # as if killed before writing epoch 2's
            path.unlink()
        (backup / "checkpoint").write_text(f'model_checkpoint_path: "{kept[0]}"\n'
                                           f'all_model_checkpoint_paths: "{kept[0]}"\n')

    ev = restart_changing_backups(run_dir, tmp_path, 5, 2, lose_worker_1s_newest_backup)
    for task in ("worker:0", "worker:1"):  # epochs 0 and 1 were not trained again
        resumed = [e["epoch"] for e in ev if e["event"] == "task_epoch" and e["task"] == task
                   and e["attempt"] == 1]
        assert resumed and min(resumed) == 2, (task, resumed)
    logs = [(run_dir / "logs" / f"worker-{i}.log").read_text() for i in (0, 1)]
    assert not any("starts over" in log for log in logs)


@FIXED_PORTS
@pytest.mark.tf
@pytest.mark.timeout(180)
def test_a_straggler_that_left_the_group_is_killed(run_dir: Path, tmp_path: Path):
    spec = write_spec(tmp_path / "c.yaml", mwms(sleep=1.5, spares="false").replace(
        "epochs: 5", "epochs: 2, orphan_task: 'worker:1'"))
    res = run_tfo("run", str(spec), "--run-dir", str(run_dir), timeout=150)
    assert res.returncode == 0, res.output[-3000:]
    log = (run_dir / "logs" / "worker-1.log").read_text()
    pid = int(re.search(r"started a straggler pid=(\d+)", log).group(1))
    assert wait_until(lambda: not alive(pid), 3)


@FIXED_PORTS
@pytest.mark.timeout(60)
def test_port_in_use_fails_before_anything_starts(run_dir: Path, tmp_path: Path):
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT from earlier tests
    holder.bind(("127.0.0.1", 20001))
    holder.listen()
    try:
        res = run_tfo("run", str(write_spec(tmp_path / "c.yaml", mwms())), "--run-dir",
                      str(run_dir), timeout=30)
    finally:
        holder.close()
    assert res.returncode == 2, res.output
    assert "worker:1 (localhost:20001): port 20001 is in use" in res.stderr
    assert f"pid {os.getpid()} ({psutil.Process().name()})" in res.stderr
    assert not run_dir.exists()
    assert "Traceback" not in res.output
