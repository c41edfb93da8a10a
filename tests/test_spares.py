"""Warm spares (restart.warm_spares): a restart hands the task's standby, TensorFlow already
imported, its attempt; `auto` turns them on only where the machine has room; no standby
outlives the run."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.launch.spares import SPARE_RSS, Spares, spares_pay_off, spares_wanted
from orchestrator.planning.plan import make_plan
from orchestrator.planning.spec import cluster_schema, parse_spec
from tests.conftest import events, wait_until, write_spec
from tests.helpers import Tfo, assert_restart_served_by_spares, kill_task, standbys
from tests.procs import gone

GIB = 2**30


# ---- the `auto` rule ---------------------------------------------------------------------

@pytest.mark.parametrize(("available", "tasks", "on"), [
    (20 * GIB, 2, True),  # this 2-core machine: cores no longer count (issue 39)
    (4 * SPARE_RSS - 1, 2, False),  # memory for the spares twice over: one byte short
    (4 * SPARE_RSS, 2, True),
    (2 * SPARE_RSS, 1, True),
    (2 * SPARE_RSS, 2, False),
    (200 * GIB, 0, False),  # no local training task: nothing to keep warm
])
def test_auto_turns_spares_on_where_the_host_has_the_memory(available, tasks, on):
    assert spares_pay_off(available, tasks) is on


def plan(tmp_path: Path, workers: tuple[str, ...] = ("localhost:1", "localhost:2"),
         **restart):
    spec = parse_spec({"name": "t", "job": {"entry": "a.b:c"},
                       "hosts": {"me": {"address": "10.0.0.1", "backend": "local"},
                                 "lab1": {"address": "10.0.0.2"}},
                       "tasks": {"worker": list(workers)},
                       "restart": {"policy": "on-failure", **restart}})
    return make_plan(spec, run_id="t", run_dir=tmp_path / "run", workdir=tmp_path)


def test_warm_spares_setting(tmp_path):
    from orchestrator.launch.preflight import HostCheck

    def checks(local: int | None, lab: int | None) -> list[HostCheck]:
        """Each host's available memory, in standbys (SPARE_RSS); 2 cores each."""
        def free(n: int | None) -> int | None:
            return None if n is None else n * SPARE_RSS

        return [HostCheck("localhost", "127.0.0.1", cpus=2, mem_available=free(local)),
                HostCheck("lab1", "10.0.0.2", cpus=2, mem_available=free(lab))]

    both = frozenset({"worker:0", "worker:1"})
    mixed = ("me:1", "lab1:2")  # this machine under an address the lab can reach, and lab1
    assert spares_wanted(plan(tmp_path, warm_spares=True), []) == both  # asked: no checks
    assert spares_wanted(plan(tmp_path, mixed, warm_spares=True), []) == both
    assert not spares_wanted(plan(tmp_path, warm_spares=False), checks(64, 64))
    assert not spares_wanted(plan(tmp_path, warm_spares=True, max_restarts=0), checks(64, 64))
    # auto, the default: each host by its own memory (twice its tasks' standbys), 2 cores
    assert spares_wanted(plan(tmp_path), checks(4, None)) == both
    assert not spares_wanted(plan(tmp_path), checks(3, 64))
    assert spares_wanted(plan(tmp_path, mixed), checks(2, 1)) == {"worker:0"}
    assert spares_wanted(plan(tmp_path, mixed), checks(1, 2)) == {"worker:1"}
    assert spares_wanted(plan(tmp_path, mixed), checks(64, None)) == {"worker:0"}  # lab1: ?
    assert not spares_wanted(plan(tmp_path, ("lab1:1", "lab1:2")), checks(64, 3))
    assert spares_wanted(plan(tmp_path, ("lab1:1", "lab1:2")), checks(0, 4)) == both
    # Slurm: each node by the job's share of it (SlurmBackend's row per node)
    spec = parse_spec({"name": "t", "job": {"entry": "a.b:c"}, "tasks": {"worker": 3},
                       "backend": {"slurm": {"tasks_per_node": 2}}})
    on_nodes = make_plan(spec, run_id="t", run_dir=tmp_path / "run", workdir=tmp_path,
                         nodes={"worker:0": "n1", "worker:1": "n2", "worker:2": "n1"},
                         ports={"worker:0": 1, "worker:1": 1, "worker:2": 2})
    assert spares_wanted(on_nodes, [HostCheck("n1", "", cpus=1, mem_available=3 * SPARE_RSS),
                                     HostCheck("n2", "", cpus=1, mem_available=3 * SPARE_RSS)]) \
        == {"worker:1"}  # n1: 2 tasks want 4 standbys' memory
    assert not spares_wanted(on_nodes, [HostCheck("slurm:lab", "", cpus=64)])  # no node rows
    restart = cluster_schema()["$defs"]["RestartSpec"]["properties"]
    assert "warm_spares" in restart  # `tfo schema`, for editors


def test_the_check_says_which_tasks_keep_a_spare_and_standby_makes_none_for_another(tmp_path):
    """The preflight's rows stay in the backends (Backends.spares, the check's), not handed
    out and back by the caller."""
    from orchestrator.launch.backends import Backends

    workers = ["localhost:auto", "localhost:auto"]
    spec = parse_spec({"name": "t", "job": {"entry": "a.b:c"}, "tasks": {"worker": workers},
                       "restart": {"policy": "on-failure", "warm_spares": False}})
    backends = Backends(spec.hosts)
    try:
        off = make_plan(spec, run_id="t", run_dir=tmp_path / "run", workdir=tmp_path,
                        ports=backends.allocate(spec))
        assert backends.spares == frozenset()  # none before a check
        backends.check(off)
        assert backends.spares == frozenset()
        assert backends.standby(off.tasks[0], 1) is None  # not one of them: none made
        on = make_plan(spec.model_copy(update={"restart": spec.restart.model_copy(
            update={"warm_spares": True})}), run_id="t", run_dir=tmp_path / "run",
            workdir=tmp_path, ports=off.ports())
        backends.check(on)
        assert backends.spares == {"worker:0", "worker:1"}
    finally:
        backends.close()


# ---- the bookkeeping ---------------------------------------------------------------------

class FakeStandby:
    def __init__(self, attempt: int, pid: int) -> None:
        self.attempt, self.pid = attempt, pid
        self.rc: int | None = None
        self.went = self.discarded = False

    def poll(self) -> int | None:
        return self.rc

    def go(self) -> None:
        self.went = True

    def discard(self) -> None:
        self.discarded = True


def test_one_standby_per_task_handed_over_only_to_its_attempt(tmp_path):
    made: list[FakeStandby] = []

    def start(task, attempt):
        made.append(FakeStandby(attempt, 100 + len(made)))
        return made[-1]

    spares = Spares(start)
    w0, w1 = plan(tmp_path).tasks
    assert spares.make(w0, 1) == 100
    assert spares.make(w0, 1) is None  # one waits already
    assert spares.take(w0, 2) is None and made[0].discarded  # stale: another attempt's
    assert spares.make(w0, 2) == 101
    made[1].rc = 1  # it died
    assert spares.take(w0, 2) is None and made[1].discarded
    spares.make(w0, 3)
    spares.make(w1, 3)
    got = spares.take(w0, 3)
    assert got is made[2] and got.went and not got.discarded
    spares.close()
    assert made[3].discarded and not made[2].discarded  # the one handed over is a task now
    # An elastic resize gives the name another plan (TF_CONFIG of its size): not its spare.
    spares.make(w1, 4)
    resized = dataclasses.replace(w1, env={**w1.env, "TFO_NUM_WORKERS": "1"})
    assert spares.take(resized, 4) is None and made[4].discarded


# ---- real processes ----------------------------------------------------------------------

SPARES = """\
name: spares
job:
  entry: tests.jobs.faulty:train
  args: {{epochs: {epochs}, epoch_sleep: {sleep}}}
tasks:
  worker: [localhost:auto, localhost:auto]
restart: {{policy: on-failure, max_restarts: {max_restarts}, backoff_seconds: 0,
           warm_spares: true}}
timeouts: {{grace_seconds: 5}}
"""


def run_with_spares(run_dir: Path, tmp_path: Path, epochs: int, sleep: float,
                    act: Callable[[Tfo], Any]) -> Any:
    """`tfo run` of the 2-worker job with warm spares (one restart): once worker:1's standby
    started, `act`; then the run must succeed. What `act` returned."""
    text = SPARES.format(epochs=epochs, sleep=sleep, max_restarts=1)
    tfo = Tfo(write_spec(tmp_path / "c.yaml", text), run_dir)
    try:
        tfo.wait_event("task_standby_started", "worker:1", attempt=1, timeout=180)
        got = act(tfo)
        code, err = tfo.finish()
        assert code == 0, err[-3000:]
    finally:
        tfo.close()
    return got


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_sigkill_restart_is_served_by_the_warm_spare(run_dir: Path, tmp_path: Path):
    def kill(tfo: Tfo) -> float:
        tfo.wait_event("task_epoch", "worker:1", epoch=1, timeout=180)
        return kill_task(tfo, "worker:1")

    killed_at = run_with_spares(run_dir, tmp_path, 5, 2, kill)
    assert_restart_served_by_spares(run_dir, killed_at, -signal.SIGKILL)
    assert (run_dir / "model" / "saved_model" / "saved_model.pb").exists()


def zombie_or_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() is not None
    except psutil.NoSuchProcess:
        return False


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_sigkilled_standby_is_reaped_said_and_replaced(run_dir: Path, tmp_path: Path):
    """A standby's wrapper SIGKILLed while it waits: within seconds it is reaped (no
    <defunct> left), an event says so, another standby takes its place, and the restart that
    follows is still warm."""
    def kill_standby_then_task(tfo: Tfo) -> float:
        old = standbys(run_dir)[("worker:1", 1)]
        os.kill(old, signal.SIGKILL)
        lost = tfo.wait_event("task_standby_lost", "worker:1", timeout=30, pid=old)
        assert not zombie_or_alive(old), f"pid {old} left <defunct>"
        new = lost["replaced_by"]
        assert new != old and standbys(run_dir)[("worker:1", 1)] == new
        tfo.wait_event("task_epoch", "worker:1", epoch=1, timeout=180)
        return kill_task(tfo, "worker:1")

    killed_at = run_with_spares(run_dir, tmp_path, 8, 2, kill_standby_then_task)
    assert_restart_served_by_spares(run_dir, killed_at, -signal.SIGKILL, within=10.0)
    lost = [e for e in events(run_dir) if e["event"] == "task_standby_lost"]
    assert len(lost) == 1, lost


@pytest.mark.tf
@pytest.mark.timeout(120)
def test_closing_the_backend_kills_its_standbys_and_leaves_the_tasks_files(tmp_path):
    """While the coordinator (here: this test) lives on, so their lifeline cannot be what
    ends them. A standby never touches the task's temp dir: the running attempt's."""
    from orchestrator.launch.local import LocalBackend

    spec = parse_spec({"name": "t", "job": {"entry": "tests.jobs.faulty:train"},
                       "tasks": {"worker": ["localhost:21100"]},
                       "restart": {"policy": "on-failure", "warm_spares": True}})
    task = make_plan(spec, run_id="spare-close", run_dir=tmp_path / "run",
                     workdir=Path.cwd()).tasks[0]
    Path(task.tmp_dir).mkdir(parents=True)
    (Path(task.tmp_dir) / "the running attempt's").write_text("")
    backend = LocalBackend({})
    pid = backend.standby(task, 1)
    assert pid is not None and backend.standby(task, 1) is None  # one per task
    wrapper = psutil.Process(pid)
    tree = wait_until(lambda: [wrapper, *wrapper.children()] if wrapper.children() else None, 30)
    assert tree, "the standby's task never started"
    time.sleep(1.0)  # importing TensorFlow now
    backend.close()
    assert all(gone(p.pid) for p in tree), [p.pid for p in tree]
    assert (Path(task.tmp_dir) / "the running attempt's").exists()


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_standby_left_unused_is_gone_when_the_run_ends(run_dir: Path, tmp_path: Path):
    run_with_spares(run_dir, tmp_path, 3, 1, lambda tfo: None)
    spares = standbys(run_dir)
    assert spares and not [e for e in events(run_dir) if e["event"] == "task_restarted"]
    assert all(gone(pid) for pid in spares.values()), spares
    # ...and nothing of the run is left at all (their tasks neither): the run_dir fixture


def test_a_script_standby_imports_the_installed_libraries_the_script_imports(tmp_path,
                                                                            monkeypatch):
    from worker_entry.standby import _libraries

    monkeypatch.syspath_prepend(str(tmp_path))  # as the task's workdir is: importable

    (tmp_path / "mymodel.py").write_text("print('side effects')\n")
    script = tmp_path / "train.py"
    script.write_text("import json, mymodel\nfrom . import sibling\n"
                      "def main():\n    import numpy as np\n"
                      "    from sklearn.datasets import load_digits\n"
                      "    from nosuchlibrary import x\n")
    # The job's own module (mymodel) may expect what the script does first: left to it.
    assert _libraries(str(script)) == ["json", "numpy", "sklearn.datasets"]
