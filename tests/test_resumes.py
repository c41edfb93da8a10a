"""Where an attempt began and what a restart lost (orchestrator/loop/resumes.py): the rule as a
table, and the ledger fed markers as a job's tasks send them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.loop.resumes import Ledger, Restored, Save, lines, resumption
from tests.conftest import events, run_tfo
from worker_entry.faults import FAULTS_ENV

CKPT = "/runs/r/model/ckpt/ckpt-2"

# reached before, restored, the save tfo saw, the first marker's epoch → words (None: silent)
CASES = [
    (0, None, None, None, None),  # the first attempt: nothing to lose
    (210, None, None, None, "started over: 210 steps lost, nothing restored"),
    (210, None, None, 0, "started over: 210 steps lost, nothing restored"),
    (210, Restored(CKPT), Save(170, 3), 4, "resumed at epoch 4 (lost 40 steps)"),
    # the epoch the attempt trains in first; else the checkpoint's own; else the save's
    (47, Restored(CKPT, epoch=1), Save(40), None, "resumed at epoch 1 (lost 7 steps)"),
    (47, Restored(CKPT), Save(40, 1), None, "resumed at epoch 1 (lost 7 steps)"),
    (47, Restored(CKPT), Save(40), None, "resumed at step 40 (lost 7 steps)"),
    (40, Restored(CKPT), Save(40), None, "resumed at step 40 (lost 0 steps)"),
    # a save newer than what the markers told (they come at most once a second)
    (38, Restored(CKPT), Save(40), None, "resumed at step 40 (lost 0 steps)"),
    (47, Restored(CKPT), None, None,
     f"restored {CKPT} before training, a checkpoint not saved in this run: steps lost not "
     "known"),
    # a rerun's first attempt restoring the last run's checkpoint: said too
    (0, Restored(CKPT), None, 2,
     f"restored {CKPT} before training, a checkpoint not saved in this run: steps lost not "
     "known"),
]


@pytest.mark.parametrize(("reached", "restored", "save", "epoch", "words"), CASES)
def test_resumption(reached: int, restored: Restored | None, save: Save | None,
                    epoch: int | None, words: str | None) -> None:
    said = resumption(reached, restored, save, epoch)
    assert (said.words() if said is not None else None) == words


def test_the_ledger_across_two_restarts() -> None:
    """Two workers; a save at step 40 by worker:0; both killed at step 53; attempt 1 restores
    the save (lost 13); its steps count on from 40; killed at 40 + 30, attempt 2 restores
    nothing (lost 70)."""
    book = Ledger()
    for task in ("worker:0", "worker:1"):
        assert book.progressed(task, "training", 0, 2, None) is None
    book.checkpoint("worker:0", 0, "saved", CKPT, 40, None, last_epoch=1)
    book.checkpoint("worker:1", 0, "saved", "/tmp/workertemp_1/ckpt-2", 40, None, None)
    for task in ("worker:0", "worker:1"):
        book.progressed(task, "training", 0, 53, 2)
    for task in ("worker:0", "worker:1"):
        book.checkpoint(task, 1, "restored", CKPT, 0, epoch=1, last_epoch=None)
        said = book.progressed(task, "training", 1, 2, None)
        assert said is not None and said.words() == "resumed at epoch 1 (lost 13 steps)"
        assert (said.step, said.lost, said.reached) == (40, 13, 53)
    book.progressed("worker:0", "training", 1, 30, None)
    # a restore once the attempt trains (an evaluation's, a second fit's) is not its start
    book.checkpoint("worker:0", 1, "restored", CKPT, 30, epoch=1, last_epoch=None)
    said = book.progressed("worker:0", "training", 2, 1, 0)
    assert said is not None and said.words() == "started over: 70 steps lost, nothing restored"
    assert book.progressed("worker:0", "training", 2, 5, 0) is None  # said once an attempt


def test_a_worker_restoring_tfos_copy_of_the_chiefs_backup_resumes_at_its_save() -> None:
    """backupfill copies the chief's `backup/worker-0/chief/ckpt-3` to each worker's own
    directory before the restart: worker:1 restores `backup/worker-1/chief/ckpt-3`, a path
    no task wrote, which is the chief's save all the same (the chaos soak's finding: it said
    'a checkpoint not saved in this run')."""
    book = Ledger()
    for task in ("worker:0", "worker:1"):
        book.progressed(task, "training", 0, 2, None)
    book.checkpoint("worker:0", 0, "saved", "/r/backup/worker-0/chief/ckpt-2", 20, None, 0)
    book.checkpoint("worker:0", 0, "saved", "/r/backup/worker-0/chief/ckpt-3", 30, None, 1)
    book.checkpoint("worker:1", 0, "saved", "/r/backup/worker-1/workertemp_1/ckpt-3", 30,
                    None, 1)
    for task in ("worker:0", "worker:1"):
        book.progressed(task, "training", 0, 35, 2)
    for task in ("worker:0", "worker:1"):
        n = task[-1]
        book.checkpoint(task, 1, "restored", f"/r/backup/worker-{n}/chief/ckpt-3", 0, epoch=1,
                        last_epoch=None)
        said = book.progressed(task, "training", 1, 1, None)
        assert said is not None and said.words() == "resumed at epoch 1 (lost 5 steps)", task
    assert book.save_for("/elsewhere/ckpt-3") is None  # one part in common is not enough


def test_a_task_restarting_alone_has_its_own_reach() -> None:
    book = Ledger()
    book.progressed("chief:0", "training", 0, 100, None)
    book.progressed("worker:1", "worker:1", 0, 5, None)
    said = book.progressed("worker:1", "worker:1", 1, 1, None)
    assert said is not None and said.lost == 5


def test_lines_group_a_restart_of_the_group() -> None:
    said = [{"task": "worker:10", "attempt": 1, "words": "started over: 9 steps lost"},
            {"task": "worker:1", "attempt": 1, "words": "started over: 9 steps lost"},
            {"task": "worker:0", "attempt": 1, "words": "started over: 9 steps lost"},
            {"task": "worker:1", "attempt": 2, "words": "resumed at epoch 1 (lost 2 steps)"}]
    assert lines(said) == ["worker:0, worker:1, worker:10 attempt 1: started over: 9 steps lost",
                           "worker:1 attempt 2: resumed at epoch 1 (lost 2 steps)"]


# --- real TensorFlow: the custom-loop tutorial, a worker SIGKILLed in epoch 2 ---------------
CTL = ["tests/scripts/mwms_ctl.py", "--epochs", "5", "--steps_per_epoch", "20"]
KILL_AT = 50  # steps: worker:1 kills itself at its first progress marker past it


def resumed_events(run_dir: Path) -> list[dict]:
    return [e for e in events(run_dir) if e["event"] == "task_resumed"]


def reached_before(ev: list[dict]) -> int:
    """The most steps a worker's markers told in the first attempt (tfo's own count)."""
    return max(e["step"] for e in ev if e["event"] == "task_progress" and e["attempt"] == 0)


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_restart_with_checkpoints_in_a_temp_dir_says_it_started_over(run_dir: Path):
    """The tutorial as published: its checkpoints under multiprocessing's per-process temp
    dir. The restart finds none: the summary and the events say all the steps were lost."""
    env = {**os.environ, FAULTS_ENV: json.dumps({"worker:1": {"kill": {"step": KILL_AT}}})}
    res = run_tfo("run", "--workers", "2", "--restart", "on-failure", "--max-restarts", "1",
                  "--run-dir", str(run_dir), "--", "python", *CTL,
                  "--model_path", str(run_dir / "model" / "ctl-model"), env=env, timeout=280)
    assert res.returncode == 0, res.output[-4000:]
    ev = events(run_dir)
    said = resumed_events(run_dir)
    assert {e["task"] for e in said} == {"worker:0", "worker:1"}, said
    lost = reached_before(ev)
    assert lost >= KILL_AT
    for e in said:
        assert (e["attempt"], e["how"], e["restored"], e["step"]) == (1, "started over", None, 0)
        assert e["lost_steps"] == e["reached"] >= lost  # a worker's count: its last marker's
    words = said[0]["words"]
    assert words == f"started over: {said[0]['lost_steps']} steps lost, nothing restored"
    assert f"worker:0, worker:1 attempt 1: {words}" in res.stderr, res.stderr[-3000:]
    assert "[tfo] worker:" in res.output and words in res.output
    status = run_tfo("status", str(run_dir))
    assert words in status.stdout, status.stdout


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_restart_from_checkpoints_under_the_model_dir_says_where_it_resumed(run_dir: Path):
    """The same script with its checkpoints under TFO_MODEL_DIR: the restart restores the
    chief's last checkpoint, and tfo says at which epoch (the checkpoint's own `epoch`) and
    how many steps since it were lost, matched with the save it saw. Through the Python API:
    its Result says it too."""
    import orchestrator

    ckpt = run_dir / "model" / "ckpt"
    result = orchestrator.run(
        workers=2, script=CTL[0], args=[*CTL[1:], "--checkpoint_dir", str(ckpt),
                                        "--model_path", str(run_dir / "model" / "ctl-model")],
        restart="on-failure", max_restarts=1, kill={"worker:1": {"step": KILL_AT}},
        run_dir=run_dir, timeout=270)
    assert result.ok, result
    ev = events(run_dir)
    saves = [e for e in ev if e["event"] == "task_checkpoint" and e["op"] == "saved"
             and e["task"] == "worker:0" and e["attempt"] == 0]
    restores = [e for e in ev if e["event"] == "task_checkpoint" and e["op"] == "restored"]
    assert restores and {e["attempt"] for e in restores} == {1}
    last = next(s for s in reversed(saves) if s["path"] == restores[0]["path"])
    assert last["step"] % 20 == 0 and last["step"] >= 20  # at an epoch's end
    epoch = last["step"] // 20 - 1  # the tutorial saves the epoch it just finished
    said = resumed_events(run_dir)
    assert {e["task"] for e in said} == {"worker:0", "worker:1"}, said
    for e in said:
        assert (e["how"], e["restored"], e["step"], e["epoch"]) == \
            ("resumed", last["path"], last["step"], epoch)
        assert e["lost_steps"] == e["reached"] - last["step"] >= 0
        assert e["reached"] >= reached_before(ev)
    log = (run_dir / "logs" / "worker-0.log").read_text()
    assert f"Starting at epoch {epoch}." in log  # the script's own word
    words = f"resumed at epoch {epoch} (lost {said[0]['lost_steps']} steps)"
    assert result.resumes == [f"worker:0, worker:1 attempt 1: {words}"]


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_an_entry_with_tfos_backups_resumes_at_its_backup_s_step(run_dir: Path):
    """An entry with ctx.callbacks() (BackupAndRestore in TFO_BACKUP_DIR, tfo's own Progress
    callback): worker:1 exits 3 after epoch 1; the restart restores the newest backup, and
    tfo matches it with the save it saw at that step (the entry's callback's count, not 0)."""
    import orchestrator

    result = orchestrator.run(
        entry="tests.jobs.faulty:train", workers=2, restart="on-failure", max_restarts=1,
        args={"epochs": 4, "fail_task": "worker:1", "fail_epoch": 1, "exit_code": 3},
        run_dir=run_dir, timeout=270)
    assert result.ok, result
    ev = events(run_dir)
    saves = {e["path"]: e["step"] for e in ev if e["event"] == "task_checkpoint"
             and e["op"] == "saved" and e["attempt"] == 0}
    said = resumed_events(run_dir)
    assert {e["task"] for e in said} == {"worker:0", "worker:1"}, said
    for e in said:
        assert e["how"] == "resumed" and e["step"] == saves[e["restored"]] > 0, (e, saves)
        assert e["lost_steps"] == e["reached"] - e["step"] and e["epoch"] in (1, 2)
    assert result.resumes[0].startswith("worker:0, worker:1 attempt 1: resumed at epoch ")
