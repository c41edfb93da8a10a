"""The backend seam: a new backend is one class (tests/fake_backend.py) and one line in the
registry; `tfo run` does the rest (allocate, plan, check, sync, supervise)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer

from orchestrator import cli
from orchestrator.launch.backends import BACKENDS
from orchestrator.launch.preflight import HostCheck
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


# Lab hosts and this machine: the evaluator is the one role a lab job may keep here.
MIXED = SPEC.replace("worker: [sim:auto, sim:auto]", "worker: [sim:auto]\n  evaluator: [localhost]")


@pytest.mark.timeout(30)
def test_this_machines_tensorflow_version_is_looked_up_where_compared_or_shown(
        tmp_path: Path, monkeypatch):
    """importlib.metadata costs `tfo run` 0.01-0.02 s before its first task starts: a
    localhost job has no other host to compare versions with, and only `tfo check` shows
    them. Whether TensorFlow is installed is checked either way."""
    from importlib import metadata

    monkeypatch.setitem(BACKENDS, "fake", fake_backend.FakeBackend)
    monkeypatch.chdir(REPO)
    installed = {name: metadata.version(name) for name in ("tensorflow", "tf_keras")}

    def rows(text: str, **kw: bool) -> dict[str, object]:
        plan, backends = cli.prepare(write_spec(tmp_path / "c.yaml", text), None, dry_run=True)
        try:
            return {r.host: r for r in backends.check(plan, **kw)}
        finally:
            backends.close()

    alone = SPEC.replace("sim:auto, sim:auto", "localhost:auto, localhost:auto")
    assert rows(alone)["localhost"].versions == {}
    assert rows(alone)["localhost"].problems == []
    assert rows(alone, versions=True)["localhost"].versions == installed  # tfo check's table

    # Beside a host with another TensorFlow, this machine's is looked up and compared.
    def older(self, tasks):  # noqa: ANN001, ANN202
        return [HostCheck(t.host, t.address, reachable=True, ports=[t.port],
                          versions={"tensorflow": "2.0.0", "tf_keras": installed["tf_keras"]})
                for t in tasks]

    monkeypatch.setattr(fake_backend.FakeBackend, "check", older)
    mixed = rows(MIXED)
    assert mixed["localhost"].versions == installed
    assert any(f"tensorflow {installed['tensorflow']} differs" in p
               for p in mixed["localhost"].problems), mixed["localhost"].problems
    assert any("tensorflow 2.0.0 differs" in p for p in mixed["sim"].problems)

    # Not installed: said without package metadata.
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tf_keras" else real(name, *a))
    assert rows(alone)["localhost"].problems == [
        f"localhost: tf_keras is not installed for {sys.executable}"]


def test_a_batch_started_one_by_one_takes_each_task_once_the_last_is_answered():
    """launch.one_by_one (every backend's batch today): a failed start is answered, not
    raised, and a caller that stops there starts nothing more, nor takes the next item."""
    from orchestrator.launch import one_by_one

    taken, started = [], []

    def items():
        for name in ("a", "b", "c"):
            taken.append(name)
            yield name, 0

    def start(task, attempt):  # noqa: ANN001, ANN202
        started.append(task)
        if task == "b":
            raise OSError("lab2 unreachable")
        return f"handle {task}"

    answers = one_by_one(start, items())
    assert next(answers) == "handle a"
    failed = next(answers)
    assert isinstance(failed, OSError) and str(failed) == "lab2 unreachable"
    answers.close()
    assert (taken, started) == (["a", "b"], ["a", "b"])
