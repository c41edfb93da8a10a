"""Progress markers: the task side throttles them, the coordinator validates them."""

import dataclasses

import pytest

from orchestrator.loop.markers import BadMarker, Progress, read_marker
from worker_entry import markers
from worker_entry.progress import FitFacts, Reporter, counts_calls


def test_reporter_counts_every_step_and_emits_at_most_once_a_second() -> None:
    now, out = [0.0], []
    r = Reporter(clock=lambda: now[0], emit=lambda event, **f: out.append(f))
    for i in range(10):
        now[0] = i * 0.3
        r.report(epoch=0, step_in_epoch=i + 1, steps=10, loss=0.5)
    # t=0, 1.2 and 2.4 s, and the epoch's last step whatever the time
    assert [f["step"] for f in out] == [1, 5, 9, 10]
    assert out[-1] == {"step": 10, "at": 2.7, "epoch": 0, "step_in_epoch": 10, "steps": 10,
                       "loss": 0.5}


def test_reporter_drops_a_loss_that_is_not_finite() -> None:
    out: list[dict] = []
    Reporter(clock=lambda: 3.0, emit=lambda event, **f: out.append(f)).report(loss=float("nan"))
    assert out == [{"step": 1, "at": 3.0}]


def test_progress_marker_round_trip_and_bad_ones() -> None:
    line = markers.line(markers.PROGRESS, step=7, epoch=1, loss=0.25).rstrip("\n")
    marker = read_marker(line)
    assert isinstance(marker, Progress) and marker.step == 7 and marker.loss == 0.25
    for bad in ('{"event": "progress"}', '{"event": "progress", "step": -1}',
                '{"event": "progress", "step": 1, "loss": "low"}'):
        with pytest.raises(BadMarker):
            read_marker(markers.MARK + bad)


def test_a_loss_given_as_a_function_is_read_only_when_a_marker_goes_out() -> None:
    """Keras's callback hands the step's tensor: reading it waits for the step, so only the
    markers' steps (at most one a second) read it."""
    now, out, read = [0.0], [], []
    r = Reporter(clock=lambda: now[0], emit=lambda event, **f: out.append(f))
    for i in range(5):
        now[0] = i * 0.4
        r.report(loss=lambda i=i: read.append(i) or 0.25)
    assert read == [0, 3] and [f["step"] for f in out] == [1, 4]
    assert out[0]["loss"] == 0.25


def test_next_at_says_when_the_next_marker_may_go_out() -> None:
    """What Progress's counted train_function compares its clock with, once a step."""
    now = [5.0]
    r = Reporter(clock=lambda: now[0], emit=lambda event, **f: None)
    assert r.next_at == float("-inf")  # the first step is told at once
    r.report(step=1)
    assert r.next_at == 6.0
    now[0] = 5.5
    r.report(step=2)  # held back: next_at stays
    assert r.next_at == 6.0


QUIET = FitFacts(tf_keras=True, steps_per_execution=1, autotuned=False, coordinator=False,
                 mid_epoch_resume=False)


@pytest.mark.parametrize(("change", "counted"), [
    ({}, True),  # a call is a step, every epoch starts at its first: no batch hook needed
    ({"steps_per_execution": 4}, False),  # a call runs 4 steps, fewer at an epoch's tail
    ({"steps_per_execution": None}, False),  # unreadable
    ({"autotuned": True}, False),
    ({"coordinator": True}, False),  # a call schedules a step on a worker
    ({"mid_epoch_resume": True}, False),  # the first epoch starts where only the batch says
    ({"tf_keras": False}, False),  # Keras 3's fit loop
])
def test_a_fit_is_counted_by_its_calls_only_where_a_call_is_a_step(change: dict,
                                                                    counted: bool) -> None:
    assert counts_calls(dataclasses.replace(QUIET, **change)) is counted
