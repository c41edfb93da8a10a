"""The run directory: finding a run (`last`, an id, a prefix), and running a plan.json again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from orchestrator.rundir import RunDir, RunDirError
from tests.conftest import REPO, events, run_processes, run_tfo, write_spec


def _run(root: Path, name: str, mtime: float) -> Path:
    rd = root / "runs" / name
    rd.mkdir(parents=True)
    (rd / "events.jsonl").write_text("{}\n")
    os.utime(rd / "events.jsonl", (mtime, mtime))
    return rd


def test_find_last_an_id_a_prefix_or_a_path(tmp_path: Path):
    root = tmp_path / "runs"
    with pytest.raises(RunDirError, match="no run found under"):
        RunDir.find("last", root)
    a = _run(tmp_path, "mwms-20250101-120000-aaaa", 2_000_000)
    b = _run(tmp_path, "mwms-20250102-120000-bbbb", 1_000_000)
    c = _run(tmp_path, "ps-20250103-120000-cccc", 1_500_000)
    assert RunDir.find("last", root).path == str(a)  # the latest written, not the last name
    assert RunDir.find(None, root).path == str(a)
    assert RunDir.find("mwms-20250102-120000-bbbb", root).path == str(b)
    assert RunDir.find("ps", root).path == str(c)
    assert RunDir.find(str(b), root).path == str(b)
    with pytest.raises(RunDirError) as err:
        RunDir.find("mwms-2025", root)
    assert str(err.value) == (f"'mwms-2025' names 2 runs under {root}/: "
                              "mwms-20250101-120000-aaaa, mwms-20250102-120000-bbbb; "
                              "give more of the id")
    with pytest.raises(RunDirError, match="no run 'nope' under"):
        RunDir.find("nope", root)


def test_an_ambiguous_prefix_is_exit_2_naming_the_candidates(tmp_path: Path, monkeypatch):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    _run(tmp_path, "job-1", 1_000_000)
    _run(tmp_path, "job-2", 2_000_000)
    monkeypatch.chdir(tmp_path)
    for command in ("status", "logs", "rerun"):
        res = CliRunner().invoke(app, [command, "job-"])
        assert res.exit_code == 2, res.output
        assert "'job-' names 2 runs under runs/: job-1, job-2" in res.output
        assert "Traceback" not in res.output


SPEC = """\
name: rerun-test
job:
  entry: tests.jobs.noisy:main
  args: {lines: 1}
tasks:
  worker: [localhost:auto, localhost:auto]
timeouts: {grace_seconds: 3}
"""


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_rerun_last_starts_the_same_tasks_in_a_new_run_directory(tmp_path: Path):
    """`tfo rerun last` after a real run: same tasks and TF_CONFIGs (the `auto` ports it had),
    a new run id and directory, and the paths in it re-derived for the new run."""
    spec = write_spec(tmp_path / "rerun.yaml", SPEC)
    made: list[Path] = []
    try:
        first = run_tfo("run", str(spec), timeout=140)
        made += sorted((REPO / "runs").glob("rerun-test-*"))
        assert first.returncode == 0, first.output[-3000:]
        second = run_tfo("rerun", "last", timeout=140)
        made = sorted((REPO / "runs").glob("rerun-test-*"))
        assert second.returncode == 0, second.output[-3000:]
        assert len(made) == 2
        old, new = (json.loads((rd / "plan.json").read_text()) for rd in made)
        assert new["run_id"] != old["run_id"] and new["run_dir"] == str(made[1])
        assert [t["name"] for t in new["tasks"]] == ["worker:0", "worker:1"]
        assert new["cluster"] == old["cluster"]  # the same TF_CONFIGs
        for o, n in zip(old["tasks"], new["tasks"], strict=True):
            assert n["tf_config"] == o["tf_config"] and n["port"] == o["port"]
            assert n["log_path"] == o["log_path"].replace(old["run_dir"], new["run_dir"])
            assert json.loads(n["env"]["TFO_JOB"])["run_dir"] == new["run_dir"]
        for rd, plan in zip(made, (old, new), strict=True):
            evs = events(rd)
            assert evs[-1]["event"] == "job_finished" and evs[-1]["exit_code"] == 0
            assert {e["task"] for e in evs if e["event"] == "task_exited"} == {"worker:0",
                                                                               "worker:1"}
            assert run_processes(plan["run_id"]) == []
        # The same again, from the plan file itself.
        third = run_tfo("run", str(made[1] / "plan.json"), "--run-dir", str(tmp_path / "r3"),
                        timeout=140)
        assert third.returncode == 0, third.output[-3000:]
        again = json.loads((tmp_path / "r3" / "plan.json").read_text())
        assert again["cluster"] == old["cluster"]
        assert [t["tf_config"] for t in again["tasks"]] == [t["tf_config"] for t in old["tasks"]]
    finally:
        for rd in made:
            shutil.rmtree(rd, ignore_errors=True)


def test_an_ambiguous_prefix_lists_a_few_runs_and_counts_the_rest(tmp_path: Path):
    root = tmp_path / "runs"
    for i in range(5000):
        (root / f"job-{i:05d}").mkdir(parents=True)
    with pytest.raises(RunDirError) as err:
        RunDir.find("job-", root)
    message = str(err.value)
    assert message.startswith(f"'job-' names 5000 runs under {root}/: job-00000, job-00001, ")
    assert message.endswith("job-00009 and 4990 more; give more of the id")
    assert len(message) < 400
