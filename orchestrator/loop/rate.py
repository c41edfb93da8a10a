"""A task's steps per second, from its progress markers (the live table, `tfo status`, the
`task_progress` events).

    rate = rated(rate, at=marker.at, step=marker.step, arrived=now)   # each progress marker
    shown(rate, now)                                                  # the figure, or None

A rate is the steps between two markers over the time between them on the task's own clock
(the marker's `at`): never over their arrival here, which bunches them (a pipe, an SSH
channel, the loop's one read of several lines) and made 7 ms steps read 200,000 steps/s.
It is taken over a window of WINDOW_SECONDS of the task's time, so one slow step (a
checkpoint, an epoch's end) does not swing it, and it is unknown (None) where tfo cannot
know it: before the task's markers span MIN_SPAN_SECONDS, from markers without the task's
time, and once markers stop coming (the fit is over, the task stuck): shown is the rate
now, never the last one remembered.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# The rate averages this much of the task's time: steady, and still current.
WINDOW_SECONDS = 5.0
# Below this span (markers go out at most once a second but at an epoch's end) a rate is
# one step's noise.
MIN_SPAN_SECONDS = 1.0
# No marker for this long (or for STALE_INTERVALS of its markers' usual interval, where
# steps are slower than that) and the rate is no longer known.
STALE_SECONDS = 3.0
STALE_INTERVALS = 2.0
# Markers closer than this to the one before replace it (an epoch's end is always told: a
# fit of short epochs sends many a second), so a window holds a few dozen at most.
SPACING_SECONDS = WINDOW_SECONDS / 20


@dataclass(frozen=True)
class Rate:
    """The markers of one attempt's window: (task's time, step), oldest first."""

    samples: tuple[tuple[float, int], ...] = ()
    arrived: float | None = None  # when the last one arrived (the coordinator's clock)

    @property
    def per_second(self) -> float | None:
        """Steps per second over the window, on the task's clock; None: not known."""
        if len(self.samples) < 2:
            return None
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 - t0 >= MIN_SPAN_SECONDS else None

    @property
    def interval(self) -> float:
        """The usual time between its markers (0 with fewer than two)."""
        n = len(self.samples)
        return (self.samples[-1][0] - self.samples[0][0]) / (n - 1) if n > 1 else 0.0


def rated(rate: Rate, at: float | None, step: int, arrived: float,
          window: float = WINDOW_SECONDS) -> Rate:
    """`rate` after a progress marker that said `step` at the task's time `at`. A step or a
    time that went back (another counter took over: a fit after a loop) starts the window
    over. A marker without the task's time (a loop's last steps, told at its exit; a
    script's own marker) says steps went on, not how fast: the window stays."""
    if at is None:
        went_on = rate.samples and step >= rate.samples[-1][1]
        return replace(rate, arrived=arrived) if went_on else Rate(arrived=arrived)
    if not rate.samples or step < rate.samples[-1][1] or at < rate.samples[-1][0]:
        return Rate(((at, step),), arrived)
    kept = rate.samples
    if len(kept) > 1 and at - kept[-2][0] < SPACING_SECONDS:
        kept = kept[:-1]  # the last is as good as replaced: the window's end moves on
    samples = (*kept, (at, step))
    # Keep the newest sample at least `window` old, so the window is whole.
    while len(samples) > 2 and samples[1][0] <= at - window:
        samples = samples[1:]
    return replace(rate, samples=samples, arrived=arrived)


def shown(rate: Rate, now: float) -> float | None:
    """The rate to show at `now` (the coordinator's clock): None once markers stopped."""
    per_second = rate.per_second
    if per_second is None or rate.arrived is None:
        return None
    if now - rate.arrived > max(STALE_SECONDS, STALE_INTERVALS * rate.interval):
        return None
    return per_second
