"""The backend seam: a new backend is one class (tests/fake_backend.py) and one line in the
registry (a scheduler: one more, its options model in planning.schedulers.OPTIONS); `tfo run`
does the rest (allocate, plan, check, sync, supervise)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer

from orchestrator.cli import commands as cli
from orchestrator.errors import SpecError
from orchestrator.launch.backends import BACKENDS
from orchestrator.launch.preflight import HostCheck
from orchestrator.planning.schedulers import OPTIONS
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


# A job a scheduler places: counts, no hosts. Made from a localhost job by `--on fakesched`.
LISTED = {"name": "sched", "job": {"script": "tests/scripts/show_env.py"},
          "tasks": {"worker": ["localhost:auto"] * 3}}


@pytest.mark.timeout(60)
def test_a_scheduler_is_one_class_and_one_registry_line(tmp_path: Path, monkeypatch, capsys):
    """tests/fake_backend.py's FakeScheduler decides where the tasks go, as Slurm does:
    registered in one line, `--on fakesched` hands it a job, and the pipeline places,
    allocates, checks, syncs and starts through it; the tasks run for real."""
    from orchestrator.pipeline import run
    from orchestrator.planning.quick import SlurmFlags, on_scheduler
    from tests.helpers import shown_in_output

    # the one line in each registry: its backend, and its options model for the spec
    monkeypatch.setitem(BACKENDS, "fakesched", fake_backend.FakeScheduler)
    monkeypatch.setitem(OPTIONS, "fakesched", lambda: fake_backend.FakeRequest)
    monkeypatch.chdir(REPO)
    fake_backend.STARTED.clear()
    job = on_scheduler(LISTED, SlurmFlags(on="fakesched"))
    assert (job["tasks"], job["backend"]) == ({"worker": 3}, {"fakesched": {}})
    said: list[str] = []

    result = run(job, tmp_path / "run", say=said.append)

    assert (result.state.value, result.exit_code) == ("succeeded", 0), result.reason
    assert "fakesched: 3 task(s) on 2 node(s)" in said  # its place(), with its default
    assert "fakesched: 3 task(s) share this file system" in said  # its sync()
    # Placement: the scheduler's nodes, in its own order, in the plan and in the result.
    placed = {"worker:0": "127.0.0.3", "worker:1": "127.0.0.2", "worker:2": "127.0.0.3"}
    assert placed == fake_backend.FakeScheduler.PLACED
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert {t["name"]: t["placement"] for t in plan["tasks"]} == {
        name: {"kind": "fakesched", "host": node, "address": node} for name, node in placed.items()}
    assert {t.name: t.host for t in result.tasks} == placed
    # Ports: the scheduler's allocation, in every task's TF_CONFIG.
    ports = fake_backend.FakeScheduler.PORTS
    # each task's port and, for its profiler service (issue 41), one more: "task/profiler"
    assert sorted(ports) == sorted([*placed, *(f"{name}/profiler" for name in placed)])
    assert {t["name"]: t["port"] for t in plan["tasks"]} == {
        name: port for name, port in ports.items() if "/" not in name}
    assert {t["name"]: t["profiler_port"] for t in plan["tasks"]} == {
        name: ports[f"{name}/profiler"] for name in placed}
    cluster = [f"{placed[f'worker:{i}']}:{ports[f'worker:{i}']}" for i in range(3)]
    # Results: each task ran once, as a real process, and saw its own TF_CONFIG.
    assert sorted(name for name, _, _ in fake_backend.STARTED) == sorted(placed)
    assert [(t.state.value, t.returncode) for t in result.tasks] == [("succeeded", 0)] * 3
    seen = {s["env"]["TFO_TASK"]: json.loads(s["env"]["TF_CONFIG"])
            for s in shown_in_output(capsys.readouterr().out)}
    assert sorted(seen) == sorted(placed)
    for name, tf_config in seen.items():
        assert tf_config["cluster"] == {"worker": cluster}
        assert tf_config["task"] == {"type": "worker", "index": int(name.split(":")[1])}


def test_a_backend_kind_the_registry_lacks_is_a_field_named_error(monkeypatch):
    """`backend:` names a scheduler by its kind; what is not one is named, the kinds listed,
    and a registered scheduler's request is checked by its own model, field by field."""
    from orchestrator.planning.quick import FlagError, SlurmFlags, on_scheduler
    from orchestrator.planning.spec import parse_spec

    job = {**LISTED, "tasks": {"worker": 2}}
    cases = {"pbs": "backend: unknown kind 'pbs'; the schedulers' kinds are slurm",
             "ssh": "backend: unknown kind 'ssh'; the schedulers' kinds are slurm (a host's "
                    "backend goes under hosts:"}
    for kind, needle in cases.items():
        with pytest.raises(SpecError) as err:
            parse_spec({**job, "backend": {kind: {}}})
        assert needle in str(err.value)
    for backend in ({}, "slurm", {"slurm": {}, "pbs": {}}):
        with pytest.raises(SpecError, match="backend: names one scheduler by its kind"):
            parse_spec({**job, "backend": backend})
    with pytest.raises(FlagError, match="--on fakesched: the one scheduler tfo can hand a "
                                        "job to is slurm"):
        on_scheduler(LISTED, SlurmFlags(on="fakesched"))

    monkeypatch.setitem(BACKENDS, "fakesched", fake_backend.FakeScheduler)
    monkeypatch.setitem(OPTIONS, "fakesched", lambda: fake_backend.FakeRequest)
    assert parse_spec({**job, "backend": {"fakesched": {"nodes": 3}}}).backend.fakesched.nodes == 3
    with pytest.raises(SpecError) as err:
        parse_spec({**job, "backend": {"fakesched": {"nodes": 0, "queue": "x"}}})
    assert str(err.value).splitlines()[1:] == [
        "backend.fakesched.nodes: Input should be greater than or equal to 1 (got 0)",
        "backend.fakesched: unknown key 'queue'"]
    with pytest.raises(SpecError, match="the schedulers' kinds are fakesched, slurm"):
        parse_spec({**job, "backend": {"pbs": {}}})
    with pytest.raises(SpecError, match=r"tasks.worker: Fakesched picks the hosts of a "
                                        r"backend.fakesched job: give a count"):
        parse_spec({**LISTED, "backend": {"fakesched": {}}})
    # A plan.json keeps `backend:` as the file wrote it.
    spec = parse_spec({**job, "backend": {"fakesched": {"nodes": 3}}})
    assert spec.model_dump(mode="json")["backend"] == {"fakesched": {"nodes": 3}}
