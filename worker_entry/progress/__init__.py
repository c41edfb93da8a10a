"""A task's progress: its epochs and steps, told to tfo as `progress` markers (the live view,
`tfo status`, stall detection, events.jsonl). Richer progress for a script of your own, in
one import:

    from worker_entry import progress
    model.fit(..., callbacks=[progress.callback()])      # Keras

    for step in ...:                                      # a custom training loop
        loss = train_step(...)
        progress.report(epoch=epoch, loss=float(loss))   # once per step

Under tfo the task then reports its epochs and steps; run any other way, both do nothing.
Free of TensorFlow until `callback()` is called.

Where a task's progress comes from, one module each:

- a script's own reports: here (`report`, `callback`);
- a Keras fit: tfo's callbacks, `fit` (`Progress`, and `EpochProgress` under
  ParameterServer), which an entry's `ctx.callbacks()` and `callback()` hand out;
- a script that reports nothing: `auto` hooks Keras's fit (adding the callback) and infers
  steps from its tf.function loops, a ParameterServer coordinator's closures and an
  evaluator's evaluations; `loops` holds the count it infers;
- every source: `counting`, the throttled `Reporter` (at most a marker a second) and the
  pure rules of what is counted.

Design: What a task tells of its training
====================

An entry's callbacks and a script's own `progress` calls report epochs, steps and loss. A
script that reports nothing is watched through its imports (`progress.auto`,
installed before any job code runs, in the wrapper's process before the fork, so a warm
spare's early import of TensorFlow gets the same hooks): once tf-keras or Keras 3 is
imported, `Model.fit` adds our `Progress` (`EpochProgress` under ParameterServer) after the
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
before, its `batch` the step done (`counting.counts_calls(FitFacts)`: steps_per_execution
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
`loops._iterations`), where it moved past the step told; else the step told plus the calls since
(`counting.loop_step`, pure: never back); the marker says which (`step_from`: `optimizer` or
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

import os
from typing import Any

from worker_entry.progress.counting import Reporter

_reporter = Reporter()
_by_script = False


def reported_by_script() -> bool:
    """Has the script reported for itself? Then tfo's own counting of its loop stands down
    (progress.auto)."""
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
    from worker_entry.progress.fit import Progress

    return Progress()
