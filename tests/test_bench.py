"""`make bench`'s harness on its tiny setting (no TensorFlow but in warm spares, a 2-host
lab): every figure of issue 13 is measured and written, with its median, min, max and
whether it met its target."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO

FIGURES = {"wall_ratio", "first_step_ratio", "throughput_ratio", "coord_cpu_2", "coord_cpu_64",
           "kill_detected", "kill_stopped", "resume", "resume_cold", "help", "plan",
           "plan_json_time", "plan_json_linear", "plan_json_mb", "tasks_started", "plan_floor",
           "exit_tail_tfo", "exit_tail_hand", "progress_ratio"}
LAB_FIGURES = {"lab_ready_ratio", "lab_stop", "lab_idle_cpu", "lab_threads"}


def test_quick_bench_measures_every_figure(tmp_path: Path) -> None:
    done = subprocess.run([PYTHON, "bench/run.py", "--quick", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    written = tmp_path / "results.json"
    results = json.loads(written.read_text()) if written.exists() else {}
    # A failed section's reason is printed above the table, out of the tail's reach.
    assert done.returncode == 0, (f"failed sections: {results.get('failed_sections')}\n"
                                  + done.stdout[-3000:] + done.stderr[-3000:])
    assert not FIGURES - set(results["figures"])
    if "lab: load average at the end" in results["detail"]:  # the lab section ran (root)
        assert not LAB_FIGURES - set(results["figures"])
        assert (tmp_path / "lab.png").stat().st_size > 10_000
    for key, f in results["figures"].items():
        assert f["n"] >= 1 and f["min"] <= f["median"] <= f["max"], key
        # met: the median against the target, in the figure's direction; none without one.
        if f["target"] is None:
            assert f["met"] is None, key
        else:
            by = {"le": f["median"] <= f["target"], "ge": f["median"] >= f["target"]}
            assert f["met"] is by[f["better"]], key
    assert set(results["coordinator_cpu_curve"]) == {"2", "4"}
    assert (tmp_path / "results.png").stat().st_size > 10_000
    table = done.stdout
    assert "tfo --help" in table and ("met" in table or "MISSED" in table)


def test_cpu_in_a_window_is_read_between_the_samples() -> None:
    """tfo's own CPU while training: the sampled totals, interpolated at the window's ends."""
    from bench.run import CpuSampler, training_window

    sampler = CpuSampler()
    sampler.stop()
    sampler.samples = [(10.0, 1.0, 10.0), (11.0, 1.5, 12.0), (12.0, 2.0, 16.0)]
    assert sampler.between(10.5, 11.5) == pytest.approx((0.5, 3.0))
    assert sampler.between(11.0, 12.0) == pytest.approx((0.5, 4.0))
    tls = [{"epoch": [10.4, 11.0, 11.6]}, {"epoch": [10.5, 11.1, 11.5]}]
    assert training_window(tls) == (10.5, 11.5)


def test_a_missed_target_says_its_measured_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """The notes under the table: how much of `tfo plan` its dependencies take, and what
    share of the hand launch's start → first step tfo's own start is."""
    from bench import run

    monkeypatch.setattr(run, "DETAIL", {"hand first_step": [6.0, 8.0, 7.0]})
    for key, samples in {"plan": [0.45, 0.5, 0.4], "plan_floor": [0.26, 0.28, 0.27],
                         "first_step_ratio": [1.02, 1.12, 1.07],
                         "tasks_started": [0.35, 0.42]}.items():
        monkeypatch.setattr(run.FIGURES[key], "samples", samples)
        monkeypatch.setattr(run.FIGURES[key], "note", "")  # undone after the test, as samples
    run.explain_misses()
    assert "takes 0.27 s" in run.FIGURES["plan"].note
    assert "leaves 0.03 s" in run.FIGURES["plan"].note and "take 0.18 s" in run.FIGURES["plan"].note
    note = run.FIGURES["first_step_ratio"].note
    assert "started 0.385 s" in note and "5.5% of the hand launch's" in note and "(7 s)" in note
    assert "1.02–1.12" in note


def test_events_read_while_tfo_writes_leave_the_unfinished_line(tmp_path: Path) -> None:
    """The bench polls events.jsonl while tfo appends to it: a line caught half-written is
    read next time, not a JSONDecodeError that ends the whole bench."""
    from bench.run import events

    assert events(tmp_path) == []
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "run_started"}\n{"event": "task_rea')
    assert events(tmp_path) == [{"event": "run_started"}]
    path.write_text('{"event": "run_started"}\n{"event": "task_ready"}\n')
    assert [e["event"] for e in events(tmp_path)] == ["run_started", "task_ready"]


def _ev(time: float, event: str, task: str, **fields: object) -> dict:
    return {"time": time, "event": event, "task": task, **fields}


# The chaos soak (bench/chaos.py) reads "training again" from events: after a kill, every
# worker's progress in an attempt started after the fault; after a stop (or a SIGTERM that
# TensorFlow's runtime caught), progress past each worker's step at the fault will do.
_STARTED = [_ev(0, "task_started", f"worker:{i}", pid=10 + i, attempt=0) for i in range(3)]
_RESTARTED = [_ev(12, "task_started", f"worker:{i}", pid=20 + i, attempt=1) for i in range(3)]
CHAOS = [
    ("a peer's late progress of the old attempt is not training again",
     _STARTED + [_ev(10.5, "task_progress", "worker:0", attempt=0, step=50)], 10, 10, None),
    ("every worker's progress in the new attempt",
     _STARTED + _RESTARTED + [_ev(14 + i, "task_progress", f"worker:{i}", attempt=1, step=40)
                              for i in range(3)], 10, 10, 16),
    ("one worker not back yet", _STARTED + _RESTARTED + [
        _ev(14, "task_progress", "worker:0", attempt=1, step=40)], 10, 10, None),
    ("a stop: the same attempt, past the step at the fault",
     _STARTED + [_ev(21 + i, "task_progress", f"worker:{i}", attempt=0, step=51)
                 for i in range(3)], 20, None, 23),
    ("a stop: a progress event at the fault's step is not a step",
     _STARTED + [_ev(21, "task_progress", f"worker:{i}", attempt=0, step=50)
                 for i in range(3)], 20, None, None),
    ("after a shrink to 2, the two workers count",
     _STARTED + [_ev(11, "job_resized", "", **{"from": 3, "to": 2}), *_RESTARTED[:2]]
     + [_ev(14 + i, "task_progress", f"worker:{i}", attempt=1, step=40) for i in range(2)],
     10, 10, 15),
]


@pytest.mark.parametrize(("evs", "since", "restarted_after", "back"),
                         [c[1:] for c in CHAOS], ids=[c[0] for c in CHAOS])
def test_the_chaos_soak_s_training_again(evs: list, since: float,
                                         restarted_after: float | None,
                                         back: float | None) -> None:
    from bench.chaos import training_again

    steps = {f"worker:{i}": 50 for i in range(3)}
    assert training_again(evs, since, restarted_after, steps, fault=since) == back
