"""A cluster that never formed is never a success: real TensorFlow scripts, written as
TensorFlow's tutorials write them (tests/scripts/), that train alone in every process, and
the same trained together. The verdict's rules as tables: tests/test_joined.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, events, run_tfo, write_spec

SCRIPTS = REPO / "tests" / "scripts"
TWO_WORKERS = """\
name: {name}
job:
  script: tests/scripts/{script}
  args: {args}
tasks:
  worker: [localhost:auto, localhost:auto]
timeouts: {{startup_seconds: 120, grace_seconds: 5}}
"""


def alone_events(run_dir: Path) -> list[dict]:
    return [e for e in events(run_dir) if e["event"] == "task_alone"]


def finished(run_dir: Path) -> dict:
    return next(e for e in events(run_dir) if e["event"] == "job_finished")


@pytest.mark.tf
@pytest.mark.timeout(420)
def test_the_ps_tutorials_in_process_cluster_fails_and_tf_config_succeeds(run_dir: Path,
                                                                          tmp_path: Path):
    """TensorFlow's ParameterServer tutorial as published: its chief trains on servers of
    its own process, and tfo's ps and workers are never used."""
    res = run_tfo("run", "--run-dir", str(run_dir), "--strategy", "ps", "--workers", "2",
                  "--ps", "1", "--", "python", "tests/scripts/ps_tutorial.py", timeout=200)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    [alone] = alone_events(run_dir)
    assert alone["task"] == "chief:0"
    assert "in-process cluster" in alone["cause"]
    assert "TFConfigClusterResolver()" in alone["fix"]
    assert alone["unused"] == ["ps:0", "worker:0", "worker:1"]
    reason = finished(run_dir)["reason"]
    assert reason.startswith("chief:0 trained alone (an in-process cluster"), reason
    assert "TFConfigClusterResolver()" in reason
    said = res.stdout + res.stderr
    assert "[tfo] chief:0 trains alone: it joined an in-process cluster" in said
    assert "[tfo]   likely cause: the chief built its own in-process cluster" in said
    assert "[tfo]   fix: use `tf.distribute.cluster_resolver.TFConfigClusterResolver()`" in said
    assert "job failed: chief:0 trained alone" in res.stderr

    together = tmp_path / "together"
    res = run_tfo("run", "--run-dir", str(together), "--strategy", "ps", "--workers", "2",
                  "--ps", "1", "--", "python", "tests/scripts/ps_tutorial.py", "--cluster",
                  "tf_config", timeout=200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "job succeeded" in res.stderr
    assert not alone_events(together)
    [joined] = [e for e in events(together) if e["event"] == "task_joined"]
    assert joined["task"] == "chief:0" and joined["in_process"] == []
    assert {role: len(addresses) for role, addresses in joined["cluster"].items()} == {
        "chief": 1, "ps": 1, "worker": 2}


@pytest.mark.tf
@pytest.mark.timeout(420)
@pytest.mark.parametrize(("script", "cause", "fix", "allow"), [
    # TensorFlow's custom-training tutorial (it saves nothing: two independent copies of a
    # script that checkpoints to one directory would race there).
    ("mirrored_ctl.py", "the script built `MirroredStrategy`, which trains in one process",
     "use `tf.distribute.MultiWorkerMirroredStrategy()`", False),
    ("keras_quickstart.py", "the script built no distribution strategy",
     "build `tf.distribute.MultiWorkerMirroredStrategy()` before the model", True),
])
def test_two_workers_that_each_train_alone_fail_unless_allowed(script: str, cause: str,
                                                               fix: str, allow: bool,
                                                               run_dir: Path, tmp_path: Path):
    """Each script's cause and fix; `allow`: the same job run again with expect_cluster:
    false succeeds (once: the setting does not depend on why a worker trained alone, and a
    run costs two TensorFlow processes)."""
    spec = write_spec(tmp_path / "c.yaml", TWO_WORKERS.format(
        name="alone", script=script, args='["--epochs", "2"]'))
    res = run_tfo("run", str(spec), "--run-dir", str(run_dir), timeout=200)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    told = alone_events(run_dir)
    assert told and {e["task"] for e in told} <= {"worker:0", "worker:1"}
    assert cause in told[0]["cause"] and told[0]["fix"] == fix
    end = finished(run_dir)
    assert end["state"] == "failed" and end["exit_code"] == 1
    assert end["reason"].startswith(f"{told[0]['task']} trained alone") and fix in end["reason"]
    assert f"[tfo]   likely cause: {told[0]['cause']}" in res.stdout

    if not allow:
        return
    # On purpose: the cluster file's expect_cluster: false (and `tfo run --independent`).
    spec.write_text(spec.read_text() + "expect_cluster: false\n")
    allowed = tmp_path / "allowed"
    res = run_tfo("run", str(spec), "--run-dir", str(allowed), timeout=200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "job succeeded" in res.stderr
    assert not alone_events(allowed)


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_dtensor_script_forms_one_mesh_of_two_clients(run_dir: Path, tmp_path: Path):
    res = run_tfo("run", "--run-dir", str(run_dir), "--workers", "2", "--", "python",
                  "tests/scripts/dtensor_mlp.py", "--steps", "5", timeout=200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "job succeeded" in res.stderr
    for i in (0, 1):
        assert f"[worker:{i}] DTensor client {i} of 2, job worker" in res.stdout
        assert f"[worker:{i}] mesh of 1 local device(s), 2 in all" in res.stdout
    # One mesh: both clients computed the same global loss at every step.
    losses = {i: re.findall(rf"^\[worker:{i}\] step \d+: loss (\S+)$", res.stdout, re.M)
              for i in (0, 1)}
    assert len(losses[0]) == 5 and losses[0] == losses[1], losses
    joined = {e["task"]: e for e in events(run_dir) if e["event"] == "task_joined"}
    assert {t: (e["via"], e["clients"], e["client"]) for t, e in joined.items()} == {
        "worker:0": ("DTensor", 2, 0), "worker:1": ("DTensor", 2, 1)}
    assert not alone_events(run_dir)

    # Without tfo's DTENSOR_ variables (TF_CONFIG alone, as before) each process is a mesh
    # of one client of its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTENSOR_")}
    env["TF_CONFIG"] = '{"cluster": {"worker": ["localhost:1", "localhost:2"]}, ' \
        '"task": {"type": "worker", "index": 1}}'
    plain = subprocess.run([sys.executable, str(SCRIPTS / "dtensor_mlp.py"), "--steps", "2"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "DTensor client 0 of 1, job localhost" in plain.stdout
