"""The backend seam: a new backend is one class (tests/fake_backend.py) and one line in the
registry; `tfo run` does the rest (allocate, plan, check, sync, supervise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from orchestrator import cli
from orchestrator.launch.backends import BACKENDS
from tests import fake_backend
from tests.conftest import REPO, events, write_spec

SPEC = """\
name: fake
job: {entry: worker_entry.examples.digits:train}
hosts:
  sim: {address: 10.9.9.9, backend: fake}
tasks:
  worker: [sim:auto, sim:auto]
"""


@pytest.mark.timeout(30)
def test_a_backend_is_one_class_and_one_registry_line(tmp_path: Path, monkeypatch, capfd):
    monkeypatch.setitem(BACKENDS, "fake", fake_backend.FakeBackend)
    monkeypatch.chdir(REPO)
    fake_backend.STARTED.clear()
    spec = write_spec(tmp_path / "fake.yaml", SPEC)
    with pytest.raises(typer.Exit) as done:
        cli.run(spec, tmp_path / "run", verbose=False)
    assert done.value.exit_code == 0, capfd.readouterr()
    out = capfd.readouterr()
    assert "[worker:1] worker:1 trained" in out.out
    assert "fake: nothing to copy for 2 task(s)" in out.err
    assert [(name, attempt) for name, attempt, _ in fake_backend.STARTED] == [
        ("worker:0", 0), ("worker:1", 0)]
    cluster = json.loads(fake_backend.STARTED[0][2])["cluster"]
    assert cluster == {"worker": ["10.9.9.9:41000", "10.9.9.9:41001"]}
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert {t["placement"]["kind"] for t in plan["tasks"]} == {"fake"}
    assert events(tmp_path / "run")[-1]["state"] == "succeeded"


def test_an_unknown_backend_is_a_spec_error(tmp_path: Path):
    from tests.conftest import run_tfo

    spec = write_spec(tmp_path / "x.yaml", SPEC.replace("backend: fake", "backend: pbs"))
    res = run_tfo("plan", str(spec), timeout=30)
    assert res.returncode == 2, res.output
    assert "hosts.sim.backend: unknown backend 'pbs'; backends are local, ssh" in res.stderr
    assert "Traceback" not in res.output
    # Slurm places tasks itself: it is never a host's backend.
    spec = write_spec(tmp_path / "x.yaml", SPEC.replace("backend: fake", "backend: slurm"))
    res = run_tfo("plan", str(spec), timeout=30)
    assert res.returncode == 2, res.output
    assert "hosts.sim.backend: slurm picks its own hosts; write backend: {slurm:" in res.stderr
