"""A job runs from Python, not only from the command line (orchestrator/pipeline.py): a spec
(a path, a dict or a ClusterSpec) in, its RunResult out; its errors are exceptions, never an
exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.pipeline import run
from orchestrator.planning.spec import parse_spec
from tests.conftest import REPO
from tests.conftest import events as run_events
from tests.helpers import shown_in_output

JOB = {"name": "py", "job": {"script": "tests/scripts/show_env.py", "args": ["--x"]},
       "tasks": {"worker": ["localhost:auto", "localhost:auto"]}}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["path", "dict", "spec"])
def test_a_job_runs_from_python(run_dir: Path, tmp_path: Path, monkeypatch, capsys, kind):
    monkeypatch.chdir(REPO)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(JOB))
    source = {"path": str(path), "dict": JOB, "spec": parse_spec(JOB)}[kind]
    said: list[str] = []

    result = run(source, run_dir, say=said.append)

    assert (result.state.value, result.exit_code) == ("succeeded", 0)
    assert [t.name for t in result.tasks] == ["worker:0", "worker:1"]
    assert result.run_dir == str(run_dir.resolve())
    # The tasks' lines went to stdout (no display given), each one its own TF_CONFIG.
    tasks = sorted(s["env"]["TFO_TASK"] for s in shown_in_output(capsys.readouterr().out))
    assert tasks == ["worker:0", "worker:1"]
    events = run_events(run_dir)
    assert events[-1]["event"] == "job_finished" and events[-1]["exit_code"] == 0
    # A dict is a cluster file made here: written beside the run, as the command line's is.
    assert (run_dir / "cluster.yaml").exists() == (kind == "dict")
    assert any("to repeat: tfo run" in line for line in said) == (kind == "dict")


def test_a_bad_spec_is_an_error_naming_the_field(run_dir: Path):
    with pytest.raises(SpecError, match="tasks"):
        run({**JOB, "tasks": {"worker": ["localhost:0"]}}, run_dir)
    assert not run_dir.exists()  # nothing was made, nothing started
