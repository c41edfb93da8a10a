"""tfo's Keras callbacks, which report a fit's progress: `EpochProgress` (each epoch; the
first step when the first epoch ends: ParameterServer fit refuses batch-level callbacks)
and `Progress` (every step too, throttled by counting.Reporter). An entry's
`ctx.callbacks()` and a script's `progress.callback()` hand them out, and progress.auto adds
one to a fit that has none. On the chief they write the training scalars to TensorBoard.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from worker_entry import markers
from worker_entry.progress.counting import FitFacts, Reporter, counts_calls


class _TrainScalars:
    """The chief's training scalars for TensorBoard, under the run directory
    (`tensorboard/train`, beside the evaluator's `eval`): Keras's names, `epoch_loss` and the
    epoch's metrics per epoch, `batch_loss` at the progress markers' rate. Other tasks, and
    runs outside tfo, write nothing."""

    def __init__(self) -> None:
        run_dir = os.environ.get("TFO_RUN_DIR")
        self._dir = os.path.join(run_dir, "tensorboard", "train") \
            if run_dir and os.environ.get("TFO_IS_CHIEF") == "1" else None
        self.on = self._dir is not None
        self._writer: Any = None

    def write(self, values: dict[str, Any], step: int) -> None:
        if not self.on:
            return
        if self._writer is None:  # made at the first write: constructing a callback is free
            self._writer = tf.summary.create_file_writer(self._dir)
        with self._writer.as_default():
            for name, value in values.items():
                with contextlib.suppress(TypeError, ValueError):  # a metric that is no number
                    tf.summary.scalar(name, float(value), step=step)
        self._writer.flush()


class EpochProgress(tf.keras.callbacks.Callback):
    """Reports each epoch as a marker the coordinator records; the first step is reported
    when the first epoch ends (ParameterServer fit has no batch-level hooks). On the chief,
    each epoch's loss and metrics go to TensorBoard."""

    def __init__(self) -> None:
        super().__init__()
        self._first = True
        self._scalars = _TrainScalars()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        markers.emit(markers.EPOCH, epoch=epoch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._first:
            self._first = False
            markers.emit(markers.FIRST_STEP, batch=None, approximate=True)
        self._epoch_scalars(epoch, logs)

    def _epoch_scalars(self, epoch: int, logs: dict | None) -> None:
        self._scalars.write({f"epoch_{k}": v for k, v in (logs or {}).items()}, step=epoch)


def summed_replicas(model: Any) -> int:
    """tf-keras hands callbacks a step's metrics summed over the strategy's replicas (its
    `distribute_reduction_method` "auto" is "sum" but on TPU), each replica's its own running
    mean: with 2 workers the logged loss was twice the one Keras prints at the epoch's end,
    which is the metric's own result. Their count, to divide by (1 where not summed)."""
    method = getattr(model, "distribute_reduction_method", "auto")
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or method not in ("auto", "sum") \
            or (method == "auto" and "TPU" in type(strategy).__name__):
        return 1
    try:
        return max(int(strategy.num_replicas_in_sync), 1)
    except (AttributeError, TypeError, ValueError):
        return 1


def fit_facts(model: Any) -> FitFacts:
    """The model's `FitFacts` as its fit starts: `_implements_train_batch_hooks` (Keras
    asks as it makes the fit's CallbackList) and `on_train_begin` (after the script's
    callbacks': a BackupAndRestore's training state is known then)."""
    tf_keras = sys.modules.get("tf_keras")
    spe: int | None = 1
    variable = getattr(model, "_steps_per_execution", None)
    if variable is not None:  # tf-keras's, a tf.Variable; None before compile means 1
        try:
            spe = int(variable.numpy())
        except Exception:  # noqa: BLE001 (a variable on a ParameterServer, another Keras's)
            spe = None  # the batch hook, as ever
    state = getattr(model, "_training_state", None)
    strategy = getattr(model, "distribute_strategy", None)
    return FitFacts(
        tf_keras=tf_keras is not None and isinstance(model, tf_keras.Model),
        steps_per_execution=spe,
        autotuned=bool(getattr(model, "autotune_steps_per_execution", False)),
        coordinator=bool(getattr(strategy, "_should_use_with_coordinator", False)),
        mid_epoch_resume=state is not None and (
            isinstance(getattr(state, "_save_freq", "epoch"), int)
            or bool(getattr(state, "_enable_save_before_preemption", False))))


class _CountedTrainFunction:
    """A fit's train_function, counting its completed calls for `Progress`: per step a
    counter, one clock compare and the step's logs kept (their loss is read only when a
    marker goes out). Other attributes are the function's, for a script that looks at
    `model.train_function`. `fit` is the fit's params dict (the same object every callback
    of one fit holds): a counter another fit left behind (one that raised, so no
    `on_train_end` took it out) is told from one another callback of this fit put in."""

    def __init__(self, function: Callable[..., Any], progress: Progress) -> None:
        self.function = function
        self.calls = 0
        self.logs: Any = None
        self.next_at = -float("inf")  # the first call tells the first step
        self.fit = progress.params
        self._progress = progress

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        logs = self.function(*args, **kwargs)
        self.calls += 1
        self.logs = logs
        if time.monotonic() >= self.next_at:
            self._progress._due(self)
        return logs

    def __getattr__(self, name: str) -> Any:
        if name == "function":  # not set yet (a copy under construction)
            raise AttributeError(name)
        return getattr(self.function, name)


def _unwrapped(function: Any, live: Any) -> Any:
    """`function` without the counters of fits other than `live` (a params dict)."""
    if isinstance(function, _CountedTrainFunction):
        inner = _unwrapped(function.function, live)
        if function.fit is live:
            function.function = inner
            return function
        function.next_at = float("inf")  # nothing more from it, wherever it is still held
        return inner
    return function


class Progress(EpochProgress):
    """Also reports the first training step as soon as it ends, and every step (throttled:
    counting.Reporter) with its epoch and loss; the chief writes that loss to TensorBoard
    too, at the optimizer's step.

    Its steps are counted without a batch hook where that is exact (`counts_calls`): from
    `on_train_begin` to `on_train_end` the model's train_function is a
    `_CountedTrainFunction`, which tells the markers itself, so Keras skips its per-batch
    dispatch when no other callback (a progress bar, a script's own) needs it. Elsewhere the
    batch hook counts, its `batch` the epoch's last step done."""

    # Keras then hands it the step's tensors as they are: the loss is read (the step waited
    # for) only when a marker goes out, at most once a second. A fit whose other callbacks
    # want no numbers per step (verbose 0 or 2) keeps running ahead of its steps' results.
    _supports_tf_logs = True

    def __init__(self) -> None:
        super().__init__()
        self._epoch = 0
        self._replicas = 1  # how many replicas' values a step's logged loss is the sum of
        self._reporter = Reporter(emit=self._emit)
        self._before = 0  # steps done before this epoch, every fit of this callback's
        self._counter: _CountedTrainFunction | None = None  # this fit's, where it counts
        self._epoch_start = 0  # the counter's calls when the epoch began
        self._hooked = 0  # the batch hook's steps done in this epoch
        self._per_call = 1  # steps a train_function call runs as the fit starts
        self._resuming = False  # the fit may start mid-epoch, its first batch hook not seen

    def _implements_train_batch_hooks(self) -> bool:
        """Asked by Keras's CallbackList as a fit makes it, once model and params are set."""
        return self.model is None or not counts_calls(fit_facts(self.model))

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._replicas = summed_replicas(self.model)
        self._next_epoch()  # a fit that raised: its steps stay counted
        self._counter = None
        model = self.model
        # tf-keras's fit set train_function just now, to the model's cached one: a counter
        # there is another fit's, left behind by an exception.
        function = _unwrapped(getattr(model, "train_function", None), self.params)
        if function is not getattr(model, "train_function", None):
            model.train_function = function
        facts = fit_facts(model)
        self._per_call = facts.steps_per_execution or 1
        self._resuming = facts.mid_epoch_resume
        if function is not None and counts_calls(facts):
            self._counter = model.train_function = _CountedTrainFunction(function, self)
            self._epoch_start = 0

    def on_train_end(self, logs: dict | None = None) -> None:
        self._next_epoch()
        counter, self._counter = self._counter, None
        if counter is not None and getattr(self.model, "train_function", None) is counter:
            self.model.train_function = counter.function

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch
        self._next_epoch()
        super().on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        counter = self._counter
        if counter is not None and counter.calls > self._epoch_start and \
                self._reporter.step != self._before + counter.calls - self._epoch_start:
            self._due(counter)  # the epoch's last step, which a marker always tells
        self._epoch_scalars(epoch, logs)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._counter is not None:
            return  # counted by the train_function (another callback asked for the hook)
        done = batch + 1  # the epoch's steps done, the call's own last (steps_per_execution)
        if self._resuming:  # the fit's first call: the steps before it, an earlier attempt's
            self._resuming = False
            self._before -= max(0, done - self._per_call)
        self._hooked = done
        self._tell(done, logs)

    def steps_done(self) -> int:
        """The steps of every fit of this callback's so far, now."""
        counter = self._counter
        return self._before + self._hooked + (
            counter.calls - self._epoch_start if counter is not None else 0)

    def _next_epoch(self) -> None:
        """The epoch's steps join the steps before it."""
        counter = self._counter
        if counter is not None:
            self._before += counter.calls - self._epoch_start
            self._epoch_start = counter.calls
        self._before += self._hooked
        self._hooked = 0

    def _due(self, counter: _CountedTrainFunction) -> None:
        """The counter's calls, told (a marker if its time has come)."""
        if counter is not self._counter:
            counter.next_at = float("inf")  # another fit's, left behind
            return
        self._tell(counter.calls - self._epoch_start, counter.logs)
        counter.next_at = self._reporter.next_at

    def _tell(self, done: int, logs: Any) -> None:
        """`done` steps of the epoch are done, the last one's logs `logs`."""
        if self._first:
            self._first = False
            markers.emit(markers.FIRST_STEP, batch=done - 1)
        loss = logs.get("loss") if isinstance(logs, dict) else None
        self._reporter.report(epoch=self._epoch, epochs=self.params.get("epochs"),
                              step_in_epoch=done, steps=self.params.get("steps"),
                              step=self._before + done,
                              loss=None if loss is None else
                              lambda: float(loss) / self._replicas)

    def _emit(self, event: str, **fields: Any) -> None:
        markers.emit(event, **fields)
        if "loss" in fields and self._scalars.on:  # the step read only where it is written
            self._scalars.write({"batch_loss": fields["loss"]}, step=self._global_step())

    def _global_step(self) -> int:
        """The optimizer's step: across restarts (BackupAndRestore restores it), unlike the
        marker's per-attempt count."""
        try:
            return int(self.model.optimizer.iterations.numpy())
        except (AttributeError, TypeError, ValueError):
            return self._reporter.step
