"""`tfo submit`'s run before it starts: the job's id beside the run directory, squeue's word
on it, and `tfo status [--wait]` on it (a fake squeue: the real one is test_slurm's)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.cli.submit import JOB_SUFFIX, START_POLL_SECONDS, pending, wait_started
from orchestrator.errors import SpecError
from tests.conftest import run_tfo

pytestmark = pytest.mark.timeout(60)


def squeue_says(monkeypatch: pytest.MonkeyPatch, answers: list[str]) -> list[list[str]]:
    """squeue's answers in turn ('' once the job left the queue); the calls made."""
    calls: list[list[str]] = []

    def run_slurm(*argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        calls.append(list(argv))
        out = answers.pop(0) if answers else ""
        return subprocess.CompletedProcess(list(argv), 0 if out else 1, out + "\n", "")

    monkeypatch.setattr("orchestrator.launch.slurm.run_slurm", run_slurm)
    return calls


def submitted(tmp_path: Path, job_id: str = "42") -> Path:
    rd = tmp_path / "train-sbatch-20261127-0700-ab12"
    Path(f"{rd}{JOB_SUFFIX}").write_text(job_id + "\n")
    return rd


@pytest.mark.parametrize(("squeue", "said"), [
    ("PENDING Resources", ("42", "PENDING (Resources)")),
    ("CONFIGURING None", ("42", "CONFIGURING")),
    ("", ("42", None)),  # left the queue without starting tfo
])
def test_a_submitted_run_not_started_is_pending_with_squeue_s_word(
        monkeypatch, tmp_path, squeue, said):
    calls = squeue_says(monkeypatch, [squeue])
    assert pending(submitted(tmp_path)) == said
    assert calls == [["squeue", "-h", "-j", "42", "-o", "%T %r"]]


def test_a_started_or_unsubmitted_run_is_not_pending(monkeypatch, tmp_path):
    calls = squeue_says(monkeypatch, ["RUNNING None"])
    rd = submitted(tmp_path)
    rd.mkdir()
    (rd / "events.jsonl").write_text("")
    assert pending(rd) is None
    assert pending(tmp_path / "other") is None
    assert calls == []


def test_wait_started_waits_out_the_queue_then_returns(monkeypatch, tmp_path):
    rd = submitted(tmp_path)
    squeue_says(monkeypatch, ["PENDING Priority", "PENDING Resources", "RUNNING None"])
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:  # tfo started inside the job
            rd.mkdir()
            (rd / "events.jsonl").write_text("")

    wait_started(rd, sleep)
    assert slept == [START_POLL_SECONDS] * 3


def test_wait_started_names_slurm_s_output_when_the_job_ended_unstarted(monkeypatch,
                                                                         tmp_path):
    rd = submitted(tmp_path, "7")
    squeue_says(monkeypatch, ["PENDING Resources", ""])
    with pytest.raises(SpecError, match=rf"slurm job 7 ended without starting the run; "
                                        rf"Slurm's output: {rd}.out"):
        wait_started(rd, lambda s: None)


def test_tfo_status_of_a_run_cancelled_while_pending_says_so(tmp_path):
    """No squeue here (or it no longer knows the job): the real command, no traceback."""
    rd = submitted(tmp_path, "9")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "squeue").write_text("#!/bin/sh\nexit 1\n")
    (fake / "squeue").chmod(0o755)
    import os

    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    for args in (["status"], ["status", "--wait"]):
        res = run_tfo(*args, str(rd), env=env, timeout=30)
        said = " ".join(res.output.split())
        assert res.returncode == 2, res.output
        assert f"slurm job 9 ended without starting the run; Slurm's output: {rd}.out" \
            in said, res.output
        assert "Traceback" not in res.output
