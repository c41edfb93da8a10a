"""Richer progress for a script of your own, in one import:

    from worker_entry import progress
    model.fit(..., callbacks=[progress.callback()])      # Keras

    for step in ...:                                      # a custom training loop
        loss = train_step(...)
        progress.report(epoch=epoch, loss=float(loss))   # once per step

Under tfo the task then reports its epochs and steps (the live view, `tfo status`, stall
detection, events.jsonl); run any other way, both do nothing. Free of TensorFlow until
`callback()` is called.

Design: What a task tells of its training
====================

An entry's callbacks and a script's own `progress` calls report epochs, steps and loss. A
script that reports nothing is watched through its imports (`worker_entry/autoprogress.py`,
installed before any job code runs, in the wrapper's process before the fork, so a warm
spare's early import of TensorFlow gets the same hooks): once tf-keras or Keras 3 is
imported, `Model.fit` adds our `Progress` (`_EpochProgress` under ParameterServer) after the
script's callbacks, one instance for every fit of the task, unless one of ours is there
already; `evaluate` and `predict` are only marked as Keras's own loops. `Progress` counts a
tf-keras fit's steps without a batch hook: from `on_train_begin` to `on_train_end` the
model's `train_function` is a `_CountedTrainFunction` (per call a counter, one clock compare
and the step's logs kept; the markers' step, epoch, step in epoch and loss, read from the
logs only when a marker goes out; other attributes are the function's), and its
`_implements_train_batch_hooks` is False, so a fit whose other callbacks need none (verbose
0 or 2) skips tf-keras's per-batch dispatch, which cost 17 us a step (4 % of the bench job's
short steps). A wrapper a fit that raised left behind is taken out by the next fit. Where a
call is not one step or an epoch may not start at its first step, the batch hook counts as
before, its `batch` the step done (`progress.counts_calls(FitFacts)`: steps_per_execution
other than 1 or autotuned, a ParameterServer coordinator, a BackupAndRestore that resumes
mid-epoch, Keras 3's fit). Once TensorFlow is imported, `Function.__call__` counts each
completed call made at the top (not while another call runs or traces, in any thread's own
count; not in Keras's loops; not after a fit ran; not once the script called
`progress.report`), per function; the most-called function's count is the step, reported
from its second call (`first_step` then, `approximate`, with `source: "tf.function"`), at
most once a second (between markers a call that completes costs a compare with the
reporter's `next_at`), and the last count at exit. Where one call runs many steps (orbit's
`steps_per_loop`, a `tf.range` loop over the iterator) a call is not a step: when a marker
is due, the step is the optimizer's iteration count, read then from the int64 step counters
(`iteration`, `iter`) among the variables the function's traced graphs touch (nested
functions' and loops' included; looked for once a tracing in TensorFlow's function cache,
`_iterations`), where it moved past the step told; else the step told plus the calls since
(`progress.loop_step`, pure: never back); the marker says which (`step_from`: `optimizer` or
`calls`). So the step is the trainer's (a resumed training's starts where its checkpoint
left it). A ParameterServer coordinator's closures run on worker threads through concrete
functions, not `Function.__call__`: there each closure the queue marks finished is a step
(`source: "coordinator"`). An evaluator task running the user's script (not an entry's,
which reports `evaluated` itself) counts each completed top-level `evaluate` (`source:
"evaluate"`). The markers are those an entry emits; `source` is an optional field, unset for
Keras's and the script's own steps. `TFO_AUTO_PROGRESS=0` in the task's environment installs
none of it.

Every `progress` marker carries `at`, the task's monotonic clock when its step was counted.
Steps per second (`orchestrator/loop/rate.py`, pure: `rated`, `shown`, table-tested in
`tests/test_rate.py`) are the steps between two of a task's markers over the time between
them on that clock, over a window of 5 s of it (`Work.rate`); never over their arrival at
the coordinator, which bunches them (a pipe, an SSH channel, one read of several lines, an
epoch's end told right after a throttled marker): the live table read 49,042 and 203,567
steps/s for 7 ms steps that way. Unknown (`-`), not guessed, before the markers span a
second, for markers without `at`, and once they stop coming (3 s, or two of their usual
intervals for slow steps). The `task_progress` event records the rate as the live table
showed it then (`steps_per_second`, absent where unknown), and `tfo status` shows the last
one (`-` for a running task whose progress events stopped coming, by the same rule on their
times).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker_entry import markers

# A marker per step would flood the coordinator on fast steps; one a second is what the live
# view shows and what stall detection (whole seconds) needs.
EVERY_SECONDS = 1.0


class Reporter:
    """Counts steps and emits a `progress` marker at most every EVERY_SECONDS (and always at
    an epoch's last step, so a finished epoch shows whole)."""

    def __init__(self, clock: Any = time.monotonic, emit: Any = markers.emit) -> None:
        self.step = 0
        self._clock, self._emit = clock, emit
        self._last = -math.inf
        # When the next marker may go out: a caller that counts its own steps (Progress's
        # counted train_function) asks only then, one compare a step.
        self.next_at = -math.inf

    def report(self, *, epoch: int | None = None, epochs: int | None = None,
               step_in_epoch: int | None = None, steps: int | None = None,
               loss: float | Callable[[], float] | None = None,
               step: int | None = None, step_from: str | None = None) -> None:
        """One more step done (`step`: the count so far, where the caller counts; `step_from`:
        where that count came from, `loop_step`'s). `loss` may be a function, called only when
        a marker goes out (reading a tensor waits for its step)."""
        self.step = self.step + 1 if step is None else step
        now = self._clock()
        last_of_epoch = steps is not None and step_in_epoch == steps
        if now - self._last < EVERY_SECONDS and not last_of_epoch:
            return
        self._last = now
        self.next_at = now + EVERY_SECONDS
        # `at`: the task's clock, which the coordinator's steps/s is taken over (orchestrator/
        # rate.py); the markers' arrival bunches them
        fields: dict[str, Any] = {"step": int(self.step), "at": round(now, 3)}
        for key, value in (("epoch", epoch), ("epochs", epochs),
                           ("step_in_epoch", step_in_epoch), ("steps", steps)):
            if value is not None:
                fields[key] = int(value)
        if step_from is not None:
            fields["step_from"] = step_from
        if callable(loss):
            loss = loss()
        if loss is not None and math.isfinite(float(loss)):
            fields["loss"] = round(float(loss), 6)
        self._emit(markers.PROGRESS, **fields)


# Where a loop's step came from (`loop_step`): its optimizer's iteration count, or its calls.
FROM_OPTIMIZER = "optimizer"
FROM_CALLS = "calls"


def loop_step(told: int, told_calls: int, calls: int, iterations: int | None) -> tuple[int, str]:
    """The step a marker of a loop tfo counts tells (worker_entry/autoprogress.py), after
    `told` at `told_calls` calls, now `calls` calls in: the optimizer's `iterations` where
    it moved past the step told (a call that ran 10 steps, orbit's steps_per_loop, moved it
    10; a resumed training's starts where its checkpoint left it), else the step told plus
    the calls since (no optimizer found in the loop's function; one that did not move
    with its calls, such as a schedule read in an evaluation loop). Never back."""
    if iterations is not None and iterations > told:
        return iterations, FROM_OPTIMIZER
    if iterations is not None and calls == told_calls:
        return told, FROM_OPTIMIZER
    return told + max(0, calls - told_calls), FROM_CALLS


@dataclass(frozen=True)
class FitFacts:
    """What decides how tfo's Keras callback (worker_entry.context `Progress`) counts a fit's
    steps (`context.fit_facts` reads them off the model)."""

    tf_keras: bool  # tf-keras's fit loop (Keras 3's is another)
    steps_per_execution: int | None  # steps one train_function call runs (None: unreadable)
    autotuned: bool  # steps_per_execution changed by Keras while the fit runs
    coordinator: bool  # ParameterServer: a call schedules a step on a worker, later
    mid_epoch_resume: bool  # a BackupAndRestore that may resume inside an epoch


def counts_calls(facts: FitFacts) -> bool:
    """Does `Progress` count the fit's steps by its train_function's completed calls (then it
    needs no batch hook, and a fit with no other batch callback skips Keras's per-batch
    dispatch, ~17 us a step), or by the batch hook, whose `batch` says where it is?

    Counting calls is exact only where a call is one step and every epoch starts at its
    first step: not with steps_per_execution > 1 or autotuned (a call runs several steps,
    fewer at an epoch's tail), not under a ParameterServer coordinator (a call schedules a
    step), not with a backup that resumes mid-epoch (BackupAndRestore's integer save_freq or
    save_before_preemption: the first epoch starts where only the batch says), and not in
    Keras 3, whose fit loop is another."""
    return (facts.tf_keras and facts.steps_per_execution == 1 and not facts.autotuned
            and not facts.coordinator and not facts.mid_epoch_resume)


_reporter = Reporter()
_by_script = False


def reported_by_script() -> bool:
    """Has the script reported for itself? Then tfo's own counting of its loop stands down
    (worker_entry/autoprogress.py)."""
    return _by_script


def steps_reported() -> int:
    """The steps the script has reported so far."""
    return _reporter.step


def report(*, epoch: int | None = None, epochs: int | None = None,
           step_in_epoch: int | None = None, steps: int | None = None,
           loss: float | None = None) -> None:
    """One training step ended: tell tfo (throttled). A no-op outside tfo."""
    global _by_script
    if os.environ.get("TFO_TASK"):
        _by_script = True
        _reporter.report(epoch=epoch, epochs=epochs, step_in_epoch=step_in_epoch, steps=steps,
                         loss=loss)


def callback() -> Any:
    """A Keras callback that reports progress markers under tfo; a no-op elsewhere."""
    import tensorflow as tf

    if not os.environ.get("TFO_TASK"):
        return tf.keras.callbacks.Callback()
    from worker_entry.context import Progress

    return Progress()
