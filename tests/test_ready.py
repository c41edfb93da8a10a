"""Ready means running, for every kind of script: a one-process script (MirroredStrategy,
the default strategy) opens no port, and is up at its first step; until then the startup
limit fails it only while it idles. Real TensorFlow processes, short startup limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import events, run_tfo
from tests.helpers import first, script_spec

ONE_WORKER = "  worker: [localhost:auto]"
SHORT = "timeouts: {startup_seconds: 3, grace_seconds: 5, stall_min_seconds: 1}\n"
# The tutorials' test is of the startup limit, not of the stall floor (the slow-steps test
# below is): a floor of 1 s stalled mirrored_ctl.py twice at step 2, when its process used
# no CPU and waited for none for 2 s (usage 0.0 and 0.0; make test, load ~7). Still far
# under the default floor.
TUTORIAL_FLOOR = "stall_min_seconds: 10"


def one_process(tmp_path: Path, script: str, args: list[str], floor: str = "") -> Path:
    cluster = script_spec(tmp_path, script, args, tasks=ONE_WORKER)
    text = cluster.read_text()
    short = SHORT.replace("stall_min_seconds: 1", floor) if floor else SHORT
    cluster.write_text(text[:text.index("timeouts:")] + short)
    return cluster


@pytest.mark.tf
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("script", "args", "epochs"), [
    ("mirrored_keras.py", ["--epochs", "8"], list(range(8))),
    ("mirrored_ctl.py", ["--epochs", "8"], []),  # a custom loop: steps, no epochs
])
def test_a_one_process_tutorial_trains_past_a_short_startup_limit(script, args, epochs,
                                                                  tmp_path, run_dir):
    """Unmodified, with a 3 s startup limit: up at its first step, done when it is."""
    if script == "mirrored_keras.py":
        args = [*args, "--checkpoint_dir", str(tmp_path / "ckpt")]
    res = run_tfo("run", str(one_process(tmp_path, script, args, TUTORIAL_FLOOR)), "--run-dir",
                  str(run_dir), timeout=150)
    assert res.returncode == 0, res.output[-4000:]
    ev = events(run_dir)
    started, ready = first(ev, "task_started", "worker:0"), first(ev, "task_ready", "worker:0")
    assert ready and ready["by"] == "step", ready
    done = first(ev, "task_exited", "worker:0")
    assert done["time"] - started["time"] > 3  # trained past the startup limit
    # Its training as tfo shows it (autoprogress: test_autoprogress ran these scripts
    # again for this alone): each epoch, one first step, every step (1797 digits in
    # batches of 64: 29 an epoch).
    assert [e["epoch"] for e in ev if e["event"] == "task_epoch"] == epochs
    assert len([e for e in ev if e["event"] == "task_first_step"]) == 1
    assert [e["step"] for e in ev if e["event"] == "task_progress"][-1] == 8 * 29
    assert not first(ev, "task_startup_timeout") and not first(ev, "task_stalled")


@pytest.mark.tf
@pytest.mark.timeout(180)
def test_a_long_first_step_and_slow_steps_are_neither_a_startup_timeout_nor_a_stall(
        tmp_path, run_dir):
    """Its first step computes for 8 s (as a compilation would), then each for 1.5 s: with
    a 3 s startup limit and auto's floor at 1 s, it is working, then up, then judged by its
    own steps (10 x 1.5 s), never by the floor."""
    res = run_tfo("run", str(one_process(tmp_path, "slow_keras.py", [])), "--run-dir",
                  str(run_dir), timeout=150)
    assert res.returncode == 0, res.output[-4000:]
    ev = events(run_dir)
    started, ready = first(ev, "task_started", "worker:0"), first(ev, "task_ready", "worker:0")
    assert ready and ready["by"] == "step" and ready["time"] - started["time"] > 8, ready
    moves = [e["time"] for e in ev if e["event"] == "task_progress"]
    gaps = [b - a for a, b in zip(moves, moves[1:], strict=False)]
    assert len(moves) == 6 and min(gaps) > 1.2, moves
    assert [e["epoch"] for e in ev if e["event"] == "task_epoch"] == [0, 1, 2]
    assert not first(ev, "task_startup_timeout") and not first(ev, "task_stalled")
