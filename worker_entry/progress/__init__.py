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
