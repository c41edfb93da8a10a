"""A profile from Python: `orchestrator.run(profile=...)` and the test kit's
`tf_cluster.run(profile=...)` capture the job's training tasks once, as `tfo profile` does
(issue 41, item 2: a test can capture a profile of its cluster)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.api import Capture
from orchestrator.errors import SpecError
from orchestrator.launch import profiling
from orchestrator.launch.profiling import Profile, lines
from orchestrator.planning.strategy import RULES
from worker_entry.markers import Role, Strategy

BAD = [
    ({"seconds": 2}, "profile: "),
    ({"step": 0}, "profile: "),
    ({"step": True}, "profile: "),
    ({"step": 5, "when": 1}, "profile: "),
    ({"step": 5, "seconds": 0}, "profile.seconds: 0"),
    ({"step": 5, "seconds": 601}, "profile.seconds: 601"),
    ({"step": 5, "tasks": "worker:0"}, "profile.tasks: 'worker:0'"),
]


@pytest.mark.parametrize(("given", "said"), BAD, ids=[str(g) for g, _ in BAD])
def test_a_bad_profile_request_is_named(given, said):
    with pytest.raises(SpecError) as err:
        Capture.asked(given)
    assert str(err.value).startswith(said)


def _job(steps: dict[str, int | None]) -> SimpleNamespace:
    def rec(name: str, step: int | None) -> SimpleNamespace:
        role = Role(name.split(":")[0])
        progress = SimpleNamespace(step=step) if step is not None else None
        return SimpleNamespace(role=role, current=SimpleNamespace(
            work=SimpleNamespace(progress=progress)))
    return SimpleNamespace(records={n: rec(n, s) for n, s in steps.items()},
                           rules=RULES[Strategy.MULTI_WORKER_MIRRORED],
                           plan=SimpleNamespace(run_dir="/r"))


def test_the_capture_starts_once_every_training_task_ran_its_steps(monkeypatch):
    asked = []
    monkeypatch.setattr(profiling, "profile", lambda rd, seconds, tasks: asked.append(
        (rd.path, seconds, tasks)) or Profile([], session="/r/tb/s"))
    capture = Capture.asked({"step": 20, "seconds": 3, "tasks": ["worker:1"]})
    capture.watch(_job({"worker:0": 25, "worker:1": 19, "evaluator:0": None}))
    assert capture.thread is None  # worker:1 is not there yet; an evaluator does not count
    capture.watch(_job({"worker:0": 25, "worker:1": None}))
    assert capture.thread is None  # a restarted worker:1 has no progress yet
    capture.watch(_job({"worker:0": 26, "worker:1": 20, "evaluator:0": None}))
    capture.watch(_job({"worker:0": 27, "worker:1": 21}))  # once
    assert capture.found().session == "/r/tb/s"
    assert asked == [("/r", 3.0, ["worker:1"])]


def test_no_capture_is_said_as_such(monkeypatch):
    monkeypatch.setattr(profiling, "profile", lambda *a: (_ for _ in ()).throw(
        profiling.ProfileError("/r: the run is over; tfo profile captures a running job")))
    never = Capture.asked({"step": 50})
    assert never.found().errors == ["no capture: the job ended before every training task "
                                    "ran 50 steps"]
    late = Capture.asked({"step": 1})
    late.watch(_job({"worker:0": 3}))
    found = late.found()
    assert not found.traced and found.errors == [
        "/r: the run is over; tfo profile captures a running job"]


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_the_kit_captures_a_profile_of_its_cluster(tf_cluster):
    """A 2-worker job whose worker:1 waits for its input (tests/scripts/slow_input.py, as a
    tutorial writes it): captured once both ran 20 steps; the table names worker:1, cause
    input, and the job goes on to its end. TensorFlow 2.21's profiler can crash the traced
    worker:1 (docs/guide/slow.md): then the capture says so, and the job restarts it."""
    result = tf_cluster.run("tests/scripts/slow_input.py", workers=2, restart="on-failure",
                            args=["--slow_task", "worker:1", "--sleep_ms", "5",
                                  "--steps", "200"],
                            profile={"step": 20, "seconds": 3}, timeout=240)
    assert result.ok, result.explain()
    found = result.profile
    text = "\n".join(lines(found))
    if "worker:1" in found.lost:  # the profiler's crash, said
        assert result.restarts >= 1 and "exited while traced" in text, text
        return
    assert found.traced, text
    assert found.verdict is not None and (found.verdict.task, found.verdict.cause) == \
        ("worker:1", "input"), text
    assert "traces: " in text and result.run_dir in text
