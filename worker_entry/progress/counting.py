"""How a task's steps are counted and told, free of TensorFlow (tests pass a clock): the
throttled `Reporter` every source of progress shares (a script's reports, tfo's Keras
callback, the steps tfo infers), `loop_step` (which count a loop's marker tells), and
`counts_calls` (how tfo's Keras callback counts a fit's steps)."""

from __future__ import annotations

import math
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
    """The step a marker of a loop tfo counts tells (progress.auto), after
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
    """What decides how tfo's Keras callback (progress.fit `Progress`) counts a fit's steps
    (`fit.fit_facts` reads them off the model)."""

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
