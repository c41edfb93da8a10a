"""What tfo sees of a script that reports nothing itself (worker_entry/progress/auto.py):
Keras's fit and a tf.function loop report their steps; real TensorFlow processes running
the tutorials' scripts unmodified (tests/scripts/), and the counting rules on their own."""

from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import TUTORIALS, TutorialRun, events, run_tfo, wait_until
from tests.helpers import TWO_WORKERS, script_spec

ONE_WORKER = "  worker: [localhost:auto]"


def progress(ev: list[dict], task: str) -> list[dict]:
    return [e for e in ev if e["event"] == "task_progress" and e["task"] == task]


def told(ev: list[dict], event: str, task: str) -> list[dict]:
    return [e for e in ev if e["event"] == event and e["task"] == task]


def row(table: str, task: str) -> list[str]:
    """A task's row of a printed table, cell by cell."""
    line = next(line for line in table.splitlines() if line.startswith(task + " "))
    return re.split(r"\s{2,}", line.strip())


def scalars(board: Path) -> dict[str, list[int]]:
    """The steps of each scalar TensorBoard finds under `board`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summaries = EventAccumulator(str(board), size_guidance={"tensors": 0}).Reload()
    return {tag: [e.step for e in summaries.Tensors(tag)] for tag in summaries.Tags()["tensors"]}


@pytest.mark.tf
@pytest.mark.timeout(360)
@TUTORIALS
def test_the_keras_tutorial_script_shows_its_epochs_steps_and_loss(keras_tutorial: TutorialRun):
    """TensorFlow's multi-worker Keras tutorial, unmodified: in events, the summary and `tfo
    status`, as an entry's; TensorBoard scalars from the chief alone."""
    res, run_dir = keras_tutorial.res, keras_tutorial.run_dir
    assert res.returncode == 0, res.output[-4000:]
    ev = events(run_dir)
    for task in ("worker:0", "worker:1"):
        assert [e["epoch"] for e in told(ev, "task_epoch", task)] == [0, 1, 2]
        assert [e["batch"] for e in told(ev, "task_first_step", task)] == [0]
        assert [e["dir"] for e in told(ev, "task_backup", task)] == [
            str(keras_tutorial.root / "backup")]
        steps = progress(ev, task)
        assert [e["step"] for e in steps] == sorted({e["step"] for e in steps})  # once each
        last = steps[-1]
        assert (last["step"], last["epoch"], last["step_in_epoch"], last["steps"]) == \
            (180, 2, 60, 60)
        assert isinstance(last["loss"], float) and "source" not in last  # Keras told it
        # The loss Keras prints for the last epoch (verbose=2), not the replicas' sum of it
        # (twice it with 2 workers, as tf-keras hands it to callbacks).
        log = run_dir / "logs" / f"{task.replace(':', '-')}.log"
        printed = re.findall(r" - loss: ([0-9.]+)", log.read_text())
        assert last["loss"] == pytest.approx(float(printed[-1]), rel=2e-3), (last, printed)
    cells = row(res.output, "worker:0")  # columns by the width: found by their values
    assert cells[cells.index("3/3"):][:2] == ["3/3", "60/60"] and f"{last['loss']:.4f}" in cells
    status = run_tfo("status", str(run_dir), timeout=30)
    assert status.returncode == 0, status.output
    cells = row(status.stdout, "worker:1")
    assert cells[cells.index("3/3"):][:2] == ["3/3", "60/60"] and f"{last['loss']:.4f}" in cells
    steps_per_second = cells[row(status.stdout, "task").index("steps/s")]
    assert re.fullmatch(r"-|[\d.]+", steps_per_second)  # unknown where it ran under 1 s
    board = run_dir / "tensorboard"
    assert [p.name for p in board.iterdir()] == ["train"]
    found = scalars(board / "train")
    assert found["epoch_loss"] == [0, 1, 2] and found["batch_loss"][-1] == 180, found


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_the_live_table_shows_the_unmodified_tutorial_training(tmp_path: Path):
    """On a terminal, the live table's rows of the multi-worker Keras tutorial, unmodified:
    its epoch of N, step of M and loss while it trains."""
    from tests.helpers import ANSI, run_in_pty, user_dir

    cwd = user_dir(tmp_path / "user")
    script = Path(__file__).parent / "scripts" / "mwms_keras.py"
    (cwd / "live.yaml").write_text(f"""\
name: live
job:
  script: {script}
  args: [--epochs, "3", --steps_per_epoch, "100", --model_path, {tmp_path / "model"},
         --backup_dir, {tmp_path / "backup"}]
tasks:
  worker: [localhost:auto, localhost:auto]
timeouts: {{startup_seconds: 120, grace_seconds: 5}}
""")
    raw, code = run_in_pty(["run", "live.yaml"], cwd, timeout=200)
    text = ANSI.sub("", raw)
    assert code == 0, text[-4000:]
    rows = re.findall(r"worker:1\s+localhost\s+\d+\s+running\s+(?:\d+m)?\d+s\s+\S+\s+\S+\s+"
                      r"(\d)/3\s+(\d+)/100\s+[\d.]+\s+([\d.e+-]+)\s", text)
    assert rows, text[-4000:]
    assert all(float(loss) > 0 for _, _, loss in rows)


@pytest.mark.tf
@pytest.mark.timeout(120)
def test_a_script_that_adds_the_callback_itself_reports_once(tmp_path: Path, run_dir: Path):
    cluster = script_spec(tmp_path, "with_progress.py", [], tasks=ONE_WORKER)
    res = run_tfo("run", str(cluster), "--run-dir", str(run_dir), timeout=100)
    assert res.returncode == 0, res.output[-4000:]
    ev = events(run_dir)
    assert [e["epoch"] for e in told(ev, "task_epoch", "worker:0")] == [0, 1]
    assert len(told(ev, "task_first_step", "worker:0")) == 1
    steps = [e["step"] for e in progress(ev, "worker:0")]
    assert steps == sorted(set(steps)) and steps[-1] == 8


@pytest.mark.tf
@pytest.mark.timeout(120)
def test_tfo_auto_progress_0_turns_it_off(tmp_path: Path, run_dir: Path):
    cluster = script_spec(tmp_path, "mwms_keras.py", [
        "--epochs", "2", "--steps_per_epoch", "5", "--model_path", str(tmp_path / "model"),
        "--backup_dir", str(tmp_path / "backup")], tasks=ONE_WORKER,
        extra='env: {TFO_AUTO_PROGRESS: "0"}\n')
    res = run_tfo("run", str(cluster), "--run-dir", str(run_dir), timeout=100)
    assert res.returncode == 0, res.output[-4000:]
    assert "Epoch 2/2" in (run_dir / "logs" / "worker-0.log").read_text()  # it did train
    kinds = {e["event"] for e in events(run_dir)}
    assert not kinds & {"task_progress", "task_epoch", "task_first_step"}, kinds
    assert not (run_dir / "tensorboard").exists()


@pytest.mark.tf
@pytest.mark.timeout(360)
@TUTORIALS
def test_the_custom_loop_tutorial_scripts_steps_are_counted(ctl_tutorial: TutorialRun):
    """TensorFlow's multi-worker custom-loop tutorial, unmodified: each worker's steps are
    its completed calls of `train_step`, the last one told at exit."""
    res = ctl_tutorial.res
    assert res.returncode == 0, res.output[-4000:]
    ev = events(ctl_tutorial.run_dir)
    for task in ("worker:0", "worker:1"):
        first = told(ev, "task_first_step", task)
        assert len(first) == 1 and first[0]["source"] == "tf.function"
        steps = progress(ev, task)
        assert {e["source"] for e in steps} == {"tf.function"}
        assert [e["step"] for e in steps] == sorted({e["step"] for e in steps})
        assert steps[-1]["step"] == 180 and "loss" not in steps[-1]
    assert row(res.output, "worker:0")[-2] == "180"


# The one-process tutorials (MirroredStrategy: no TF_CONFIG, no port) show their epochs,
# one first step and every step: tests/test_ready.py's runs of the same scripts.


@pytest.mark.tf
@pytest.mark.timeout(180)
def test_a_sidecar_evaluators_evaluations_are_its_steps(tmp_path: Path, run_dir: Path):
    """The script's evaluator task (tf.keras.utils.SidecarEvaluator) beside two workers:
    each evaluation it completed is a step; the workers' fits report as ever."""
    cluster = script_spec(tmp_path, "mwms_sidecar.py", [
        "--epochs", "3", "--steps_per_epoch", "20", "--checkpoint_dir", str(tmp_path / "ckpt")],
        tasks=TWO_WORKERS + "\n  evaluator: [localhost:auto]")
    res = run_tfo("run", str(cluster), "--run-dir", str(run_dir), timeout=150)
    assert res.returncode == 0, res.output[-4000:]
    ev = events(run_dir)
    evaluated = progress(ev, "evaluator:0")
    assert evaluated and {e["source"] for e in evaluated} == {"evaluate"}
    assert 1 <= evaluated[-1]["step"] <= 3  # it skips to the newest checkpoint it finds
    assert [e["returncode"] for e in told(ev, "task_exited", "evaluator:0")] == [0]  # done
    assert [e["epoch"] for e in told(ev, "task_epoch", "worker:1")] == [0, 1, 2]


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_warm_spare_that_imported_tensorflow_early_still_reports(tmp_path: Path,
                                                                   run_dir: Path):
    """A standby imports TensorFlow and tf-keras before its attempt: the hooks were
    installed before, so the attempt it serves reports its fit as a fresh task would. And
    the tutorial's script, its worker SIGKILLed mid-run (epoch 3 of 4 begun, 2 backed up),
    resumes from its own BackupAndRestore, not epoch 1; the chief's model alone is saved
    (test_scripts' killed-worker test was this job without spares: one job for both)."""
    from tests.helpers import Tfo, epochs_by_attempt, kill_task, standbys

    model = run_dir / "model" / "keras-model"
    cluster = script_spec(tmp_path, "mwms_keras.py", [
        "--epochs", "4", "--steps_per_epoch", "100", "--model_path", str(model),
        "--backup_dir", str(tmp_path / "backup")], policy="on-failure", max_restarts=1)
    cluster.write_text(cluster.read_text().replace(
        "backoff_seconds: 0.5}", "backoff_seconds: 0, warm_spares: true}"))
    log = run_dir / "logs" / "worker-0.log"
    tfo = Tfo(cluster, run_dir)
    try:
        tfo.wait_event("task_standby_started", "worker:1", attempt=1, timeout=180)
        assert wait_until(lambda: log.exists() and "Epoch 3/4" in log.read_text(), 180)
        kill_task(tfo, "worker:1")
        code, err = tfo.finish(timeout=240)
    finally:
        tfo.close()
    assert code == 0, err[-3000:]
    ev = events(run_dir)
    spares = standbys(run_dir)
    for task in ("worker:0", "worker:1"):
        started = [e for e in told(ev, "task_started", task) if e["attempt"] == 1]
        assert started and started[0]["warm"] is True and started[0]["pid"] == spares[(task, 1)]
        again = [e for e in progress(ev, task) if e["attempt"] == 1]
        assert again and again[-1]["epoch"] == 3 and "loss" in again[-1], again[-1:]
        assert [e["attempt"] for e in told(ev, "task_first_step", task)] == [0, 1]
    epochs = epochs_by_attempt(log)  # Keras's own `Epoch N/4` lines, each attempt's
    assert sorted(epochs) == [0, 1] and epochs[0][0] == 1, epochs
    assert epochs[1][0] >= 3 and epochs[1][-1] == 4, epochs  # BackupAndRestore resumed it
    assert sorted(p.parent for p in (run_dir / "model").rglob("saved_model.pb")) == [model]


@pytest.mark.timeout(60)
def test_a_script_that_imports_no_tensorflow_gets_none_imported(tmp_path: Path):
    """The hooks wait for the script's own imports: a task whose script imports neither
    TensorFlow nor Keras never loads them (a real task process)."""
    from tests.conftest import run_task

    (tmp_path / "plain.py").write_text(
        "import sys\nprint('LOADED', sorted(m for m in ('tensorflow', 'tf_keras', 'keras')"
        " if m in sys.modules))\n")
    res = run_task({"script": "plain.py", "args": []}, tmp_path, timeout=50)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "LOADED []" in res.stdout


# ---- how tfo's callback counts a fit's steps ---------------------------------------------

# One task process runs every fit of tests/scripts/fit_counting.py, one after another with the
# one callback autoprogress adds to them all; the tests below read its cases. One xdist worker
# runs them all, so the process runs once.
FIT_COUNTING = pytest.mark.xdist_group("fit-counting")
STEPS = 20  # a fit: 2 epochs of 20 steps (15 with steps_per_execution 4)


@pytest.fixture(scope="module")
def fits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Each case of the script: `markers` (tfo's callback's, in order) and `seen` (what the
    script saw: its fit's loss, whether Keras called batch hooks ...)."""
    from tests.conftest import run_task
    from worker_entry import markers

    work = tmp_path_factory.mktemp("fits")
    script = Path(__file__).parent / "scripts" / "fit_counting.py"
    res = run_task({"script": str(script), "args": [str(work)]}, work, timeout=150)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    cases: dict[str, dict] = {}
    case: dict = {}
    # With no coordinator a marker is printed after START, in a progress bar's line too.
    for line in res.stdout.replace(markers.START, "\n").splitlines():
        if line.startswith("CASE "):
            case = cases[line[5:]] = {"markers": [], "seen": None}
        elif line.startswith("RESULT "):
            case["seen"] = json.loads(line[7:])
        elif line.startswith("@tfo ") and case:
            case["markers"].append(json.loads(line[5:]))
    assert all(c["seen"] is not None for c in cases.values()), res.stdout[-3000:]
    return cases


def marked(case: dict, event: str) -> list[dict]:
    return [m for m in case["markers"] if m["event"] == event]


def last_steps(case: dict) -> list[tuple[int, int, int, int]]:
    """(step, epoch, step_in_epoch, steps) of the last progress marker of each epoch."""
    ends: dict[int, dict] = {}
    for m in marked(case, "progress"):
        ends[m["epoch"]] = m
    return [(m["step"], m["epoch"], m["step_in_epoch"], m["steps"]) for m in ends.values()]


def assert_counted(case: dict, before: int, steps: int = STEPS) -> None:
    """Both epochs' markers, counted on from `before` steps (the task's earlier fits), the
    last one carrying the loss Keras reports for the epoch."""
    assert [m["epoch"] for m in marked(case, "epoch")] == [0, 1]
    progress = marked(case, "progress")
    assert [m["step"] for m in progress] == sorted({m["step"] for m in progress})
    assert last_steps(case) == [(before + steps, 0, steps, steps),
                                (before + 2 * steps, 1, steps, steps)], progress
    assert "source" not in progress[-1]  # Keras told it, not the tf.function counting
    assert progress[-1]["loss"] == pytest.approx(case["seen"]["loss"], rel=2e-3)


@pytest.mark.tf
@pytest.mark.timeout(180)
@FIT_COUNTING
def test_a_quiet_fit_runs_without_batch_hooks_and_still_tells_every_step(fits):
    """verbose=0 and no other callback: Keras skips its per-batch dispatch (what cost 4 % of
    a short step), yet the markers carry the first step, epochs, steps and loss."""
    case = fits["quiet"]
    assert case["seen"]["batch_hooks"] is False
    assert marked(case, "first_step") == [{"event": "first_step", "batch": 0}]
    assert_counted(case, before=0)
    assert case["seen"]["train_function"] == "Function"  # the fit's own back after it


@pytest.mark.tf
@pytest.mark.timeout(180)
@FIT_COUNTING
@pytest.mark.parametrize(("name", "before"), [("progress_bar", 2 * STEPS),
                                              ("own_batch_callback", 4 * STEPS)])
def test_a_fit_with_batch_hooks_tells_the_same_steps_once(fits, name, before):
    """A progress bar (verbose=1) or the script's own batch callback makes Keras call batch
    hooks: the steps are told once each, counted on from the task's earlier fits."""
    case = fits[name]
    assert case["seen"]["batch_hooks"] is True
    assert marked(case, "first_step") == []  # told once a task, in the first fit
    assert_counted(case, before=before)


@pytest.mark.tf
@pytest.mark.timeout(180)
@FIT_COUNTING
def test_the_scripts_batch_callback_and_train_function_work_as_before(fits):
    seen = fits["own_batch_callback"]["seen"]
    assert seen["batches"] == 2 * STEPS
    # model.train_function, looked at in each epoch: Keras's tf.function, traced before
    assert len(seen["tracings"]) == 2 and seen["tracings"][0] == seen["tracings"][1] >= 1


@pytest.mark.tf
@pytest.mark.timeout(180)
@FIT_COUNTING
def test_a_fit_after_one_that_raised_counts_on(fits):
    """A script's callback raised in epoch 1 (Keras then never ends the fit for its
    callbacks): its 20 steps stay counted, and the next fit counts on from them. The model
    saves and loads in between, with what that fit left in it."""
    assert fits["raised"]["seen"]["raised"] == "the script's callback failed"
    assert fits["raised"]["seen"]["predicts"] == 2
    assert last_steps(fits["raised"])[-1] == (7 * STEPS, 0, STEPS, STEPS)
    after = fits["after_raised"]
    assert after["seen"]["train_function"] == "Function"
    assert_counted(after, before=7 * STEPS)


@pytest.mark.tf
@pytest.mark.timeout(180)
@FIT_COUNTING
def test_the_model_saves_and_loads_after_its_fits(fits):
    seen = fits["save"]["seen"]
    assert seen == {"predicts": 2, "train_function": "Function"}


@pytest.mark.tf
@pytest.mark.timeout(180)
@FIT_COUNTING
def test_a_fit_resumed_mid_epoch_counts_the_steps_it_ran(fits):
    """BackupAndRestore every 5 steps: a fit failed in epoch 1 after 12 steps our callback
    saw (the 13th's hook raised before ours), the next resumed from the backup of step 10,
    mid-epoch: its markers go on at step 11 of 20, and count the 10 steps it ran."""
    raised, resumed = fits["backup_raised"], fits["backup_resumed"]
    assert raised["seen"]["raised"] == "the script's callback failed"
    assert last_steps(raised) == [(10 * STEPS, 0, STEPS, STEPS)]
    assert [m["epoch"] for m in marked(resumed, "epoch")] == [1]
    assert last_steps(resumed) == [(10 * STEPS + 12 + 10, 1, STEPS, STEPS)]
    loss = marked(resumed, "progress")[-1]["loss"]
    assert loss == pytest.approx(resumed["seen"]["loss"], rel=2e-3)


@pytest.mark.tf
@pytest.mark.timeout(180)
@FIT_COUNTING
def test_steps_per_execution_counts_every_step(fits):
    """compile(steps_per_execution=4), 15 steps an epoch: a call runs 4 steps, the epoch's
    last 3; the markers count steps, not calls."""
    case = fits["steps_per_execution"]
    assert case["seen"]["batch_hooks"] is True  # counted by the hook: its batch says where
    assert_counted(case, before=10 * STEPS + 12 + 10, steps=15)


# ---- the rules, without TensorFlow --------------------------------------------------------

class FakeFunction:
    """Stands in for tf.function's Function: calls itself, or another, or fails."""

    def __init__(self, inner: FakeFunction | None = None, fail: bool = False) -> None:
        self.inner, self.fail = inner, fail

    def __call__(self) -> int:
        if self.fail:
            raise ValueError("end of the data")
        if self.inner is not None:
            self.inner()  # a call while this one runs (or traces): not a step
        return 1


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """FakeFunction counted as autoprogress counts Function; the markers it would emit."""
    from worker_entry import markers, progress
    from worker_entry.progress import auto as autoprogress
    from worker_entry.progress import loops

    out: list[dict] = []
    monkeypatch.setattr(markers, "emit", lambda event, **f: out.append({"event": event, **f}))
    monkeypatch.setattr(autoprogress, "_state", loops.State())
    monkeypatch.setattr(loops.atexit, "register", lambda f: None)
    monkeypatch.setattr(progress, "_by_script", False)
    monkeypatch.setattr(FakeFunction, "__call__", autoprogress._counted(FakeFunction.__call__))
    return out


def test_the_most_called_function_is_the_step_from_its_second_call(counted: list[dict]):
    setup, inner = FakeFunction(), FakeFunction()
    step = FakeFunction(inner=inner)
    setup()
    assert counted == []  # once: set-up, not a loop
    for _ in range(3):
        step()
    setup()
    assert counted[0] == {"event": "first_step", "batch": None, "approximate": True,
                          "source": "tf.function"}
    assert counted[1] == {"event": "progress", "step": 2, "source": "tf.function",
                          "step_from": "calls", "at": counted[1]["at"]}  # no optimizer in it
    assert inner.__dict__.get("_tfo_calls") is None  # nested: never counted
    from worker_entry.progress import auto as autoprogress

    assert autoprogress._state.best == 3


def test_a_call_that_raises_is_no_step(counted: list[dict]):
    from worker_entry.progress import auto as autoprogress

    failing = FakeFunction(fail=True)
    for _ in range(3):
        with pytest.raises(ValueError):
            failing()
    assert counted == [] and autoprogress._state.best == 0


def test_counting_stands_down_for_keras_and_for_a_script_that_reports(counted: list[dict]):
    from worker_entry import progress
    from worker_entry.progress import auto as autoprogress

    step = FakeFunction()
    autoprogress._state.in_keras = 1  # fit's own train_function: its callback tells
    step(), step()
    autoprogress._state.in_keras = 0
    progress._by_script = True
    step(), step()
    assert counted == []


def test_a_call_in_another_thread_does_not_hide_this_threads_steps(counted: list[dict]):
    """The depth that marks a nested call is per thread: a call running in one thread (a
    tf.py_function's, a coordinator's) leaves another thread's calls counted."""
    from worker_entry.progress import auto as autoprogress

    entered, release = threading.Event(), threading.Event()

    class Blocking(FakeFunction):
        def __call__(self) -> int:
            entered.set()
            release.wait(10)
            return 1

    blocking = Blocking()
    blocking.__class__.__call__ = autoprogress._counted(Blocking.__call__)
    other = threading.Thread(target=blocking)
    other.start()
    try:
        assert entered.wait(10)
        step = FakeFunction()
        step(), step()
    finally:
        release.set()
        other.join()
    assert autoprogress._state.best == 2 and counted[1]["step"] == 2


# ---- the import hook ------------------------------------------------------------------

def test_a_hook_runs_after_the_import_and_a_look_up_does_not_disarm_it(tmp_path, monkeypatch):
    import importlib
    import importlib.util

    from worker_entry import tfimport

    (tmp_path / "fakelib.py").write_text("READY = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fakelib", raising=False)
    seen: list[bool] = []
    tfimport.after_import("fakelib", lambda m: seen.append(m.READY))
    try:
        assert importlib.util.find_spec("fakelib") is not None and seen == []  # a look-up
        module = importlib.import_module("fakelib")
        assert seen == [True] and isinstance(module, ModuleType)
        tfimport.after_import("fakelib", lambda m: seen.append(False))  # imported: at once
        assert seen == [True, False]
    finally:
        tfimport._watched.after.pop("fakelib", None)
        sys.modules.pop("fakelib", None)


def test_auto_progress_is_on_unless_the_env_says_0():
    from worker_entry.progress.auto import enabled

    assert enabled({}) and enabled({"TFO_AUTO_PROGRESS": "1"})
    assert not any(enabled({"TFO_AUTO_PROGRESS": v}) for v in ("0", "false", "off", " 0"))


def test_source_is_an_optional_field_of_the_markers():
    from orchestrator.loop.markers import read_marker
    from worker_entry import markers

    old = read_marker(markers.line(markers.PROGRESS, step=3).rstrip("\n"))
    new = read_marker(markers.line(markers.PROGRESS, step=3, source="tf.function").rstrip("\n"))
    assert old.record() == {"step": 3}
    assert new.record() == {"step": 3, "source": "tf.function"}
    assert json.loads(json.dumps(new.record()))["source"] == "tf.function"


def test_the_last_count_is_told_at_exit_unless_a_fit_took_over(counted: list[dict]):
    from worker_entry.progress import auto as autoprogress

    step = FakeFunction()
    for _ in range(5):
        step()
    told = [m["step"] for m in counted if m["event"] == "progress"]
    assert told == [2]  # the markers' rate held 3, 4 and 5 back
    autoprogress._state.tell_the_last()
    # No `at`: when the held steps ended is not known
    assert counted[-1] == {"event": "progress", "step": 5, "source": "tf.function",
                           "step_from": "calls"}
    for _ in range(2):
        step()  # counted since, not yet told
    autoprogress._state.fitted = True  # and then Keras's callback told the steps
    autoprogress._state.tell_the_last()
    assert counted[-1]["step"] == 5


def test_steps_held_back_by_the_markers_rate_go_out_once_its_second_passed(
        counted: list[dict], monkeypatch: pytest.MonkeyPatch):
    """Between markers a step costs one compare (the reporter's next_at), and the step
    count stays current: the first call past the second tells the count then."""
    import functools

    from worker_entry.progress import auto as autoprogress
    from worker_entry.progress import loops
    from worker_entry.progress.counting import Reporter

    now = [100.0]
    monkeypatch.setattr(loops, "monotonic", lambda: now[0])
    autoprogress._state.reporters["tf.function"] = Reporter(
        clock=lambda: now[0], emit=functools.partial(autoprogress._state.emit_with,
                                                     source="tf.function"))
    step = FakeFunction()
    for _ in range(42):
        step()
        now[0] += 0.01
    told = [m["step"] for m in counted if m["event"] == "progress"]
    assert told == [2]  # then held back: under a second since
    assert autoprogress._state.best == 42
    now[0] += 1.0
    step()
    told = [m["step"] for m in counted if m["event"] == "progress"]
    assert told == [2, 43]


def test_a_script_s_backup_and_restore_directory_is_told_once(counted: list[dict], tmp_path,
                                                             monkeypatch):
    """A script's own BackupAndRestore (any subclass: by its class's name, TensorFlow not
    imported here): its directory, absolute, in one `backup` marker a task, which the
    coordinator reads (an elastic resize fills it)."""
    from orchestrator.loop.markers import read_marker
    from worker_entry import markers
    from worker_entry.progress import auto as autoprogress

    class BackupAndRestore:
        def __init__(self, backup_dir: str) -> None:
            self.backup_dir = backup_dir

    class Mine(BackupAndRestore):
        pass

    monkeypatch.chdir(tmp_path)
    autoprogress._tell_backup([object(), Mine("backup")])
    autoprogress._tell_backup([BackupAndRestore("/elsewhere")])  # the next fit: told already
    assert counted == [{"event": "backup", "dir": str(tmp_path / "backup")}]
    marker = read_marker(markers.line(markers.BACKUP, dir="/x/backup").rstrip("\n"))
    assert marker.record() == {"dir": "/x/backup"}
