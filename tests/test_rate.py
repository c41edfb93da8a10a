"""Steps per second from progress markers (orchestrator/loop/rate.py): the task's own clock, over
a window, unknown where it cannot be known. A fake clock throughout."""

from __future__ import annotations

import pytest

from orchestrator.loop.rate import Rate, rated, shown


def fold(markers: list[tuple[float | None, int, float]]) -> Rate:
    """(task's time, step, arrival) each, in order."""
    rate = Rate()
    for at, step, arrived in markers:
        rate = rated(rate, at, step, arrived)
    return rate


# 7 ms steps, a marker a second, the task's clock 1000 s ahead of ours.
STEADY = [(1000.0 + i, 1 + int(i / 0.007), 5.0 + i) for i in range(8)]


@pytest.mark.parametrize(("name", "markers", "now", "expected"), [
    ("one marker: no rate yet", STEADY[:1], 5.5, None),
    ("two a second apart", STEADY[:2], 6.5, 142.0),
    ("steady over the window", STEADY, 12.5, 142.6),
    # The case: markers bunched on arrival (an epoch's end right after a throttled
    # marker, read in one pump) read 49,042 and 203,567 steps/s; the task's clock says 142.
    ("bunched arrivals", [(1000.0, 1, 5.0), (1001.0, 143, 6.0), (1001.3, 186, 6.0),
                          (1002.0, 286, 6.0001)], 6.2, 142.5),
    ("closer than a second on the task's clock: too little to tell",
     [(1000.0, 1, 5.0), (1000.4, 60, 5.4)], 5.5, None),
    # One slow stretch (a checkpoint) moves a 5 s window a little, not to zero.
    ("a 1 s pause in a window", [(1000.0, 0, 0.0), (1001.0, 100, 1.0), (1002.0, 100, 2.0),
                                 (1003.0, 200, 3.0), (1004.0, 300, 4.0), (1005.0, 400, 5.0)],
     5.5, 80.0),
    # The window forgets what is older than it: the rate is now's.
    ("slowed down 10 s ago", [(1000.0 + i, 100 * i, float(i)) for i in range(10)]
     + [(1010.0 + i, 900 + 10 * i, 10.0 + i) for i in range(1, 11)], 20.5, 10.0),
    # Stale: no marker for 3 s where they came every second: unknown, not the last rate.
    ("markers stopped", STEADY, 15.5, None),
    # Slow steps (a marker per 5 s step): stale only after two of its intervals.
    ("slow steps", [(1000.0 + 5 * i, i, 5.0 * i) for i in range(4)], 15.0 + 9.0, 0.2),
    ("slow steps, stopped", [(1000.0 + 5 * i, i, 5.0 * i) for i in range(4)], 15.0 + 11.0,
     None),
    # A new counter (a fit after the loop: its steps from 1 again) starts over.
    ("step went back", [*STEADY[:4], (1004.0, 3, 9.0)], 9.5, None),
    ("task's clock went back", [*STEADY[:4], (900.0, 2000, 9.0)], 9.5, None),
    # No task time at all (a script's own marker by hand): unknown, never arrival-timed.
    ("no task time", [(None, 10, 0.0), (None, 500, 1.0), (None, 1000, 2.0)], 2.5, None),
    # A loop's last steps, told at its exit without a time: the window's rate stands.
    ("untimed marker after timed ones", [*STEADY[:4], (None, 600, 8.5)], 9.0, 142.6),
])
def test_steps_per_second_is_the_task_s_own_rate(name: str, markers: list, now: float,
                                                 expected: float | None) -> None:
    got = shown(fold(markers), now)
    if expected is None:
        assert got is None, name
    else:
        assert got == pytest.approx(expected, rel=0.005), name


def test_a_fit_of_tiny_epochs_keeps_a_small_window() -> None:
    """An epoch's end is always told: 1,000 markers a second keep a few dozen samples."""
    rate = Rate()
    for i in range(10_000):
        rate = rated(rate, 1000.0 + i / 1000, 10 * i, 5.0 + i / 1000)
    assert len(rate.samples) <= 25
    assert shown(rate, 15.0) == pytest.approx(10_000, rel=0.01)
