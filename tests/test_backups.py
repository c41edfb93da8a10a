"""Every backup pattern the docs show resumes (issue 37 item 1): TensorFlow's tutorial
script with `BackupAndRestore(backup_dir=os.environ["TFO_BACKUP_DIR"])` (tf-keras keeps the
chief's backup alone, in the chief's directory; every worker restores from its own), a
worker SIGKILLed after epoch 1, under the restart policy and in an elastic job; and a rerun
of a run whose coordinator was killed. The epochs are the tasks' own output (Keras's
`Epoch N/M` lines in each attempt of their logs)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from orchestrator.elastic.backups import TASK_DIR
from orchestrator.elastic.groups import backup_dirs
from orchestrator.loop.backupfill import chief_dir, unfillable
from tests.conftest import REPO, events, run_processes, run_tfo, wait_until, write_spec
from tests.helpers import Tfo, kill_task, last_attempt_epochs


def tutorial(tmp_path: Path, workers: int, epochs: int, extra: str = "") -> Path:
    """The tutorial's script, its --backup_dir left to its default: TFO_BACKUP_DIR. No warm
    spares: these tests are about the backups (each spare imports TensorFlow, and most were
    never used: the last attempt's, a resize's; test_restart_paths.py has a warm restart
    resume from the same backup as a cold one)."""
    out = tmp_path / "out"
    return write_spec(tmp_path / "c.yaml", f"""\
name: backups
job:
  script: {REPO}/tests/scripts/mwms_keras.py
  args: [--epochs, "{epochs}", --steps_per_epoch, "10", --model_path, "{out}/model"]
tasks:
  worker: [{", ".join(["localhost:auto"] * workers)}]
restart: {{policy: on-failure, max_restarts: 2, backoff_seconds: 0, warm_spares: false}}
{extra}""")


def killed_in_epoch_3(spec: Path, run_dir: Path, task: str) -> None:
    """`tfo run`, `task` SIGKILLed once the chief's epoch 3 began (its backups of epochs 1
    and 2 written); the job must succeed."""
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:0", epoch=2, timeout=300)
        kill_task(tfo, task)
        code, err = tfo.finish(timeout=400)
    finally:
        tfo.close()
    assert code == 0, err[-4000:]


def test_the_chief_s_backup_alone_on_a_host_tfo_cannot_reach_is_said() -> None:
    """Before training: a scheduler's node whose directory cannot be filled from here."""
    from orchestrator.elastic.groups import Group, plan_for
    from tests.fakes import PLACES, plan0

    plan = plan_for(plan0(), PLACES, Group((1, 2)))
    wanted = backup_dirs(plan, "bk")
    assert unfillable(wanted, lambda host: False) == ["worker:1"]
    assert unfillable(wanted, {"lab3"}.__contains__) == []
    assert unfillable(backup_dirs(plan, "/shared/bk"), lambda host: False) == ["worker:1"]
    assert unfillable(backup_dirs(plan, TASK_DIR), lambda host: True) == []


def test_a_chief_task_s_backup_is_the_one_the_workers_get() -> None:
    """MWMS with a chief task: the chief keeps the backup (tf-keras's should_checkpoint), so
    its directory is among those read and is the source the workers are filled from."""
    from orchestrator.elastic.groups import resume_from
    from orchestrator.planning.plan import make_plan
    from orchestrator.planning.spec import parse_spec

    spec = parse_spec({"name": "c", "job": {"script": "train.py"},
                       "tasks": {"chief": ["localhost:1"],
                                 "worker": ["localhost:2", "localhost:3"]}})
    plan = make_plan(spec, run_id="r", run_dir="/runs/r", workdir="/w")
    wanted = backup_dirs(plan, TASK_DIR)
    assert sorted(wanted) == ["chief:0", "worker:0", "worker:1"]
    assert chief_dir(wanted) == wanted["chief:0"] == ("localhost", "/runs/r/backup/chief-0")
    r = resume_from(wanted, wanted, {wanted["chief:0"]: {3}}, chief_keeps=True)
    assert r.save == 3 and r.fills == {"worker:0": wanted["chief:0"],
                                       "worker:1": wanted["chief:0"]}


def two_workers(tmp_path: Path, name: str):  # noqa: ANN201 - (Plan, Job, said lines)
    """A plan of 2 workers on this machine in tmp_path/name, and its Job."""
    from orchestrator.loop.decide import Timing
    from orchestrator.loop.job import Job
    from orchestrator.planning.plan import make_plan
    from orchestrator.planning.spec import parse_spec
    from orchestrator.runs.rundir import RunDir

    spec = parse_spec({"name": "r", "job": {"script": "train.py"},
                       "tasks": {"worker": ["localhost:1", "localhost:2"]}})
    plan = make_plan(spec, run_id=name, run_dir=tmp_path / name, workdir=tmp_path)
    (tmp_path / name).mkdir()
    lines: list[str] = []
    job = Job(plan, RunDir(plan.run_dir).open_events(), lambda task, line: lines.append(line),
              Timing(), None)
    return plan, job, lines


def test_a_script_s_directory_tfo_cannot_fill_is_said_once_as_training_begins(
        tmp_path: Path) -> None:
    """Lab hosts the store cannot reach (here: none but this machine): the [tfo] line names
    the workers, once, when the directory is told; tfo's own backups need nothing said."""
    from orchestrator.loop.backupfill import Refill
    from orchestrator.loop.decide import Timing
    from orchestrator.loop.job import Job
    from orchestrator.planning.plan import make_plan
    from orchestrator.runs.rundir import RunDir
    from tests.fakes import ELASTIC, PORTS

    plan = make_plan(ELASTIC, run_id="r", run_dir=tmp_path, workdir="/w", ports=PORTS)
    lines: list[str] = []
    job = Job(plan, RunDir(plan.run_dir).open_events(), lambda task, line: lines.append(line),
              Timing(), None)
    refill = Refill(job)
    refill.tick()
    assert lines == []
    job.script_backup = "bk"
    refill.tick()
    refill.tick()
    assert len(lines) == 1 and "cannot copy it to the host of worker:1, worker:2, worker:3" in \
        lines[0] and "unless that path is on a filesystem every host shares" in lines[0], lines


@pytest.mark.parametrize("saves", [[2, 3], []], ids=["interrupted", "finished"])
def test_a_rerun_carries_the_backups_over_or_says_it_starts_over(tmp_path: Path,
                                                                  saves: list[int]) -> None:
    """The old run's TFO_BACKUP_DIRs (the script's BackupAndRestore on them, its
    task_backup events say) copied into the new run's, the chief's to worker:1, and said;
    a run that left none: 'starts over'."""
    from orchestrator.elastic.backups import held
    from orchestrator.loop.backupfill import Refill, rerun
    from tests.fakes import write_backup

    old, old_job, _ = two_workers(tmp_path, "old")
    old_dirs = {t.name: Path(t.env["TFO_BACKUP_DIR"]) for t in old.tasks}
    for t in old.tasks:
        old_job.events.write("task_backup", t.name, dir=t.env["TFO_BACKUP_DIR"])
    old_job.events.close()
    if saves:
        write_backup(old_dirs["worker:0"], saves)
    new, job, lines = two_workers(tmp_path, "new")
    said: list[str] = []
    rerun(old, Refill(job), said.append)
    dirs = {t.name: Path(t.env["TFO_BACKUP_DIR"]) for t in new.tasks}
    if saves:
        assert said == ["rerun of old: training resumes from its backup 3 (copied into this "
                        "run's backup directories)"]
        assert held(dirs["worker:0"]) == {2, 3} and held(dirs["worker:1"]) == {3}
        assert lines == ["the chief's backup 3 copied to worker:1: every worker resumes "
                         "from it"]
    else:
        assert said == ["rerun of old: it left no backup (its training finished, or never "
                        "got to one): training starts over"]
        assert not held(dirs["worker:0"]) and not held(dirs["worker:1"])
    assert held(old_dirs["worker:0"]) == set(saves)  # the old run's stay as they were


def test_a_restart_copies_the_chief_s_backup_and_the_copy_goes_once_the_group_trains(
        tmp_path: Path) -> None:
    """The loop's part, on real directories: before a restart worker:1's TFO_BACKUP_DIR gets
    the chief's newest backup (and a [tfo] line says so); once both train (or finished),
    the copy is removed and the chief's stays; ctx.callbacks()'s own backups (no script
    directory) are left alone."""
    from orchestrator.elastic.backups import held
    from orchestrator.loop.backupfill import Refill
    from orchestrator.loop.decide import TaskState
    from orchestrator.loop.markers import Progress
    from tests.fakes import write_backup

    plan, job, lines = two_workers(tmp_path, "run")
    dirs = {t.name: Path(t.env["TFO_BACKUP_DIR"]) for t in plan.tasks}
    write_backup(dirs["worker:0"], [2, 3])
    refill = Refill(job)
    refill.restarting(list(job.records.values()))  # tfo's own backups: nothing to do
    assert held(dirs["worker:1"]) == frozenset() and not lines
    job.script_backup = TASK_DIR
    refill.restarting(list(job.records.values()))
    assert held(dirs["worker:1"]) == {3} and held(dirs["worker:0"]) == {2, 3}
    assert lines == ["the chief's backup 3 copied to worker:1: every worker resumes from it"]
    refill.tick()  # not training yet: the copy stays
    assert held(dirs["worker:1"]) == {3}
    for rec in job.records.values():
        rec.state = TaskState.RUNNING
        rec.current.work.progress = Progress(event="progress", step=1)
    refill.tick()
    assert held(dirs["worker:1"]) == frozenset() and held(dirs["worker:0"]) == {2, 3}
    # A group that finished before the loop saw it train (a restart in the last epoch):
    # the copy goes too, or a rerun would resume a finished run from it.
    refill.restarting(list(job.records.values()))
    assert held(dirs["worker:1"]) == {3}
    for rec in job.records.values():
        rec.state = TaskState.SUCCEEDED
    refill.tick()
    assert held(dirs["worker:1"]) == frozenset()


@pytest.mark.tf
@pytest.mark.timeout(500)
def test_tfo_backup_dir_with_a_worker_killed_resumes_under_the_restart_policy(
        tmp_path: Path, run_dir: Path) -> None:
    """2 workers; worker:1 SIGKILLed after the chief's epoch 2 began (its backup of epoch 1
    written): one restart, both workers' next attempt starts at the same epoch, past the
    first, and every epoch is trained; no copy of the backup is left behind. Before the
    fix: worker:1 restored nothing beside the chief's epoch, and every restart failed on
    mismatched collectives."""
    killed_in_epoch_3(tutorial(tmp_path, 2, 8), run_dir, "worker:1")
    evs = events(run_dir)
    assert len([e for e in evs if e["event"] == "task_restarted"]) == 2  # once each
    firsts = {t: last_attempt_epochs(run_dir, t) for t in ("worker:0", "worker:1")}
    assert firsts["worker:0"][0] == firsts["worker:1"][0] >= 2, firsts
    assert firsts["worker:0"][-1] == firsts["worker:1"][-1] == 8, firsts
    assert (tmp_path / "out" / "model" / "saved_model.pb").exists()
    assert not list(run_dir.glob("backup/*/chief")), list(run_dir.glob("backup/*/*"))


@pytest.mark.tf
@pytest.mark.timeout(500)
def test_tfo_backup_dir_with_a_worker_killed_resumes_in_an_elastic_job(
        tmp_path: Path, run_dir: Path) -> None:
    """3 workers, elastic (lost_after_failures 1): worker:2 SIGKILLed after the chief's
    epoch 2 began → 3 → 2 from the chief's backup, both remaining workers start at the same
    epoch and finish. Before the fix the shrink found no backup in common (each worker's
    directory read as the one worker that told its path), and both places were lost."""
    spec = tutorial(tmp_path, 3, 8, "elastic: {min_workers: 2, lost_after_failures: 1, "
                                    "probe_seconds: 3600}\n")
    killed_in_epoch_3(spec, run_dir, "worker:2")
    resized = [e for e in events(run_dir) if e["event"] == "job_resized"]
    assert [(e["from"], e["to"]) for e in resized] == [(3, 2)], resized
    assert resized[0]["save"] is not None and resized[0]["save"] >= 2, resized
    firsts = {t: last_attempt_epochs(run_dir, t) for t in ("worker:0", "worker:1")}
    assert firsts["worker:0"][0] == firsts["worker:1"][0] == resized[0]["save"] + 1, firsts
    assert firsts["worker:0"][-1] == firsts["worker:1"][-1] == 8, firsts


@pytest.mark.tf
@pytest.mark.timeout(600)
def test_a_rerun_of_a_run_whose_coordinator_was_killed_resumes(
        tmp_path: Path, run_dir: Path) -> None:
    """tfo SIGKILLed after the chief's epoch 2 began (its tasks end with it); `tfo rerun`
    says it resumes, and both workers of the new run start at the same epoch, past the
    first, from the old run's backup. Before the fix the rerun's TFO_BACKUP_DIR was empty:
    epoch 1 again."""
    tfo = Tfo(tutorial(tmp_path, 2, 8), run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:0", epoch=2, timeout=300)
        os.kill(tfo.proc.pid, signal.SIGKILL)
        tfo.proc.wait(timeout=30)
    finally:
        tfo.close()
    run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
    assert wait_until(lambda: not run_processes(run_id), 30), "the old run's tasks live on"
    again = tmp_path / "again"
    t0 = time.monotonic()
    r = run_tfo("rerun", str(run_dir), "--run-dir", str(again), timeout=450)
    assert r.returncode == 0, (r.output[-4000:], time.monotonic() - t0)
    firsts = {t: last_attempt_epochs(again, t) for t in ("worker:0", "worker:1")}
    assert firsts["worker:0"][0] == firsts["worker:1"][0] >= 2, firsts
    assert f"rerun of {run_id}: training resumes from its backup" in r.output, r.output[-3000:]
    assert firsts["worker:0"][-1] == 8, firsts
    new_id = json.loads((again / "plan.json").read_text())["run_id"]
    assert not run_processes(new_id)
    rerun = [e for e in events(again) if e["event"] == "job_rerun"]
    assert rerun and rerun[0]["of"] == run_id and rerun[0]["save"] == firsts["worker:0"][0] - 1
