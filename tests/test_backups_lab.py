"""The tutorial's script on lab hosts without a shared filesystem (issue 37 item 1): its own
`BackupAndRestore(backup_dir="bk")`, relative, so each host keeps `bk` under its own
workdir, and tf-keras writes the chief's backup on the chief's host alone. A host's link
down mid-training under the restart policy (no elastic): once it answers again, every
worker restores the chief's backup (copied to the other hosts before the start), not
epoch 1 beside the chief's epoch N. On the lab3 fixture's network (10.220.0.0/24): run
under `flock /tmp/sshlab3.lock`."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests import sshlab
from tests.conftest import SSH_LAB3, events, run_processes, run_tfo, wait_until, write_spec
from tests.helpers import Tfo, host_yaml, last_attempt_epochs, stop

pytestmark = [pytest.mark.ssh, SSH_LAB3]


def two_lab_hosts(lab3, tmp_path: Path, args: list[str]) -> Path:  # noqa: F811
    """The tutorial on lab1 and lab2, a worker each (lifeline 5 s), 12 epochs of 5 steps; no
    warm spares (about the backups; test_ssh.py restarts from spares on lab hosts)."""
    hosts = "".join(host_yaml(f"lab{i}", h, tmp_path / f"lab{i}", lifeline_seconds=5)
                    for i, h in enumerate(lab3[:2], start=1))
    return write_spec(tmp_path / "lab.yaml", f"""\
name: lab-backups
job:
  script: tests/scripts/mwms_keras.py
  args: [--epochs, "12", --steps_per_epoch, "5", --model_path, out/model{
      "".join(f", {a}" for a in args)}]
hosts:
{hosts}\
tasks:
  worker: [lab1:20000, lab2:20000]
restart: {{policy: on-failure, max_restarts: 10, backoff_seconds: 0, warm_spares: false}}
""")


@pytest.mark.tf
@pytest.mark.timeout(500)
def test_a_relative_backup_dir_resumes_after_a_lab_host_s_link_was_down(
        lab3, run_dir: Path, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    """Two lab hosts, a worker each (lifeline 5 s); lab2's link down for 23 s after the
    chief's epoch 2 began: the group restarts (its starts on lab2 failing while it is
    down), then both workers start at the same epoch, past the first, and finish; lab2's
    copy of the chief's backup is removed once they train. Before the fix: lab2's worker
    restored nothing, and every restart failed on mismatched collectives."""
    spec = two_lab_hosts(lab3, tmp_path, ["--backup_dir", "bk"])
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:0", epoch=2, timeout=240)
        with sshlab.partition(lab3[1].netns):
            time.sleep(23)
        code, err = tfo.finish(timeout=400)
        assert code == 0, err[-4000:]
    finally:
        stop(tfo)
    firsts = {t: last_attempt_epochs(run_dir, t) for t in ("worker:0", "worker:1")}
    assert firsts["worker:0"][0] == firsts["worker:1"][0] >= 2, firsts
    assert firsts["worker:0"][-1] == firsts["worker:1"][-1] == 12, firsts
    evs = events(run_dir)
    filled = [e for e in evs if e["event"] == "job_backups_filled"]
    assert filled and filled[-1]["tasks"] == ["worker:1"], filled
    assert (tmp_path / "lab1" / "out" / "model" / "saved_model.pb").exists()
    assert not list(tmp_path.glob("lab*/bk/chief")), list(tmp_path.glob("lab*/bk/*"))
    plan = json.loads((run_dir / "plan.json").read_text())
    assert run_processes(plan["run_id"]) == []


@pytest.mark.tf
@pytest.mark.timeout(600)
def test_a_rerun_on_lab_hosts_resumes_from_tfo_backup_dir(
        lab3, run_dir: Path, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    """The tutorial with BackupAndRestore on TFO_BACKUP_DIR (its default here) on two lab
    hosts; tfo SIGKILLed after the chief's epoch 2 began (the tasks end with their
    lifelines): `tfo rerun` copies each host's backup directory into the new run's there
    and the chief's backup to lab2's, and both workers start at the same epoch, past the
    first."""
    tfo = Tfo(two_lab_hosts(lab3, tmp_path, []), run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:0", epoch=2, timeout=240)
        os.kill(tfo.proc.pid, signal.SIGKILL)
        tfo.proc.wait(timeout=30)
    finally:
        stop(tfo)
    run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
    assert wait_until(lambda: not run_processes(run_id), 60), "the old run's tasks live on"
    again = tmp_path / "again"
    r = run_tfo("rerun", str(run_dir), "--run-dir", str(again), timeout=450)
    assert r.returncode == 0, r.output[-4000:]
    firsts = {t: last_attempt_epochs(again, t) for t in ("worker:0", "worker:1")}
    assert firsts["worker:0"][0] == firsts["worker:1"][0] >= 2, firsts
    assert firsts["worker:0"][-1] == 12, firsts
    assert f"rerun of {run_id}: training resumes from its backup" in r.output, r.output[-3000:]
    new_id = json.loads((again / "plan.json").read_text())["run_id"]
    assert run_processes(new_id) == []
