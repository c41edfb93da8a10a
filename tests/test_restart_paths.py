"""Issue 39: the path a restart takes (`task_started`'s `path`: warm, cold) changes how fast
it is back, never what it trains; a standby made for another startup is not used."""

from __future__ import annotations

import json
import re
from pathlib import Path

import psutil
import pytest

from orchestrator.planning.plan import make_plan
from orchestrator.planning.spec import parse_spec
from tests.conftest import events, run_processes, run_tfo, wait_until, write_spec
from tests.procs import gone

JOB = """\
name: paths
job:
  entry: tests.jobs.faulty:train
  args: {{epochs: 3, fail_task: "worker:1", fail_epoch: 1, exit_code: 3}}
tasks:
  worker: [localhost:auto, localhost:auto]
restart: {{policy: on-failure, max_restarts: 1, warm_spares: {warm}}}
timeouts: {{grace_seconds: 5}}
"""
EPOCH = re.compile(r"^Epoch (\d+)/\d+$")
LOSS = re.compile(r" - loss: ([\d.]+)")


def losses(log: Path, attempt: int) -> dict[int, str]:
    """Each epoch's loss as Keras printed it (verbose=2) in the task's given attempt."""
    found, epoch, current = {}, None, None
    for line in log.read_text(errors="replace").splitlines():
        if m := re.match(r"^===== tfo: \S+ attempt (\d+) =====$", line):
            current = int(m[1])
        elif current == attempt and (m := EPOCH.match(line)):
            epoch = int(m[1])
        elif current == attempt and epoch is not None and (m := LOSS.search(line)):
            found[epoch] = m[1]
    return found


def run(tmp_path: Path, run_dir: Path, warm: bool) -> dict:
    """The job with worker:1 exiting 3 after epoch 1 (its first attempt), with or without
    warm spares: what its restart trained, and from where."""
    spec = write_spec(tmp_path / f"paths-{warm}.yaml", JOB.format(warm=str(warm).lower()))
    r = run_tfo("run", str(spec), "--run-dir", str(run_dir), timeout=360)
    assert r.returncode == 0, r.stderr[-3000:]
    ev = events(run_dir)
    plan = json.loads((run_dir / "plan.json").read_text())
    logs = {t["name"]: Path(t["log_path"]) for t in plan["tasks"]}
    pids = [e["pid"] for e in ev if e["event"] in ("task_started", "task_standby_started")]
    return {
        "paths": sorted(e["path"] for e in ev if e["event"] == "task_started"
                        and e["attempt"] == 1),
        "restarted": [(e["task"], e["backoff"]) for e in ev if e["event"] == "task_restarted"],
        "resumed": sorted((e["task"], e.get("epoch"), e.get("step")) for e in ev
                          if e["event"] == "task_resumed" and e["attempt"] == 1),
        "losses": {name: losses(log, 1) for name, log in logs.items()},
        "left": [pid for pid in pids if not gone(pid)],
    }


@pytest.mark.tf
@pytest.mark.timeout(800)
def test_a_warm_restart_trains_as_a_cold_one(tmp_path: Path, run_dir: Path):
    """The same job, its worker:1 failing after epoch 1, restarted warm (standbys) and cold:
    both restart at once (no backoff), both resume from the same backup and train the
    same losses at the same epochs after it, and nothing of either run is left, by pid."""
    warm = run(tmp_path, run_dir, warm=True)
    cold = run(tmp_path, tmp_path / "cold-run", warm=False)
    assert warm["paths"] == ["warm", "warm"] and cold["paths"] == ["cold", "cold"]
    assert warm["restarted"] and {b for _, b in warm["restarted"] + cold["restarted"]} == {0}
    assert warm["resumed"] == cold["resumed"] and warm["resumed"], warm["resumed"]
    for task in ("worker:0", "worker:1"):
        assert warm["losses"][task], f"{task}: no epoch trained after the restart"
        assert warm["losses"][task] == cold["losses"][task], (task, warm["losses"],
                                                              cold["losses"])
    assert not warm["left"] and not cold["left"], (warm["left"], cold["left"])


def nices(pid: int) -> set[int]:
    """The nice value of each of a process's threads (Linux's nice is a thread's)."""
    found = set()
    for tid in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (tid / "stat").read_text()
        except OSError:
            continue
        found.add(int(stat.rpartition(")")[2].split()[16]))
    return found


@pytest.mark.tf
@pytest.mark.timeout(180)
def test_a_standby_made_for_another_environment_is_not_used(tmp_path, monkeypatch):
    """A standby started, then the environment a start would give the task changes (here
    the coordinator's own): the start is cold and the standby is gone; with the
    environment unchanged the standby is handed over (path warm), at its normal priority
    again. Nothing left, by pid."""
    from orchestrator.launch.local import LocalBackend

    spec = parse_spec({"name": "t", "job": {"entry": "tests.jobs.faulty:train"},
                       "tasks": {"worker": ["localhost:21300"]},
                       "restart": {"policy": "on-failure", "warm_spares": True}})
    task = make_plan(spec, run_id="paths-env", run_dir=tmp_path / "run",
                     workdir=Path.cwd()).tasks[0]
    Path(task.log_path).parent.mkdir(parents=True, exist_ok=True)
    backend = LocalBackend({})
    handles, pids = [], []
    try:
        pids.append(backend.standby(task, 1))
        monkeypatch.setenv("TFO_TEST_CHANGED", "1")
        handles.append(backend.start(task, 1))
        assert handles[-1].path == "cold" and handles[-1].pid != pids[-1]
        assert wait_until(lambda: gone(pids[-1]), 10), "the unused standby is still there"
        handles[-1].kill()
        pids.append(backend.standby(task, 2))
        # Its import runs at nice 19 (it takes no core from training), every thread back at
        # 0 once its turn comes, even mid-import.
        wrapper = psutil.Process(pids[-1])
        waiting = wait_until(lambda: [p for p in wrapper.children() if nices(p.pid) == {19}],
                             60)
        assert waiting, "the standby's task never ran at nice 19"
        handles.append(backend.start(task, 2))
        assert handles[-1].path == "warm" and handles[-1].pid == pids[-1]
        assert wait_until(lambda: nices(waiting[0].pid) == {0}, 20), nices(waiting[0].pid)
        handles[-1].kill()
    finally:
        for h in handles:
            h.kill()
            h.close()
        backend.close()
    for pid in [*pids, *(h.pid for h in handles)]:
        assert pid is None or wait_until(lambda p=pid: gone(p), 10), pid
    assert not run_processes("paths-env")
