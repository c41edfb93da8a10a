"""Progress from a script that reports none: tfo sees its training without a line of its code.
These are the hooks; the steps they infer are counted in progress.loops.

    auto.install()   # in the task, before any of its code runs (worker_entry/__main__)

Nothing is imported here: the hooks wait for the script's own imports (tfimport.after_import).

- Keras (tf-keras, and Keras 3 where a script uses it): once imported, `Model.fit` adds tfo's
  progress callback (progress.fit `Progress`; `EpochProgress` under
  ParameterServer, whose fit refuses batch-level callbacks) after the script's own, unless
  one is there already (`progress.callback()`, an entry's `ctx.callbacks()`). One callback
  serves every fit of the task, so its steps keep counting and its first step is told once.
  It counts a tf-keras fit's steps by wrapping the model's train_function for the fit, with
  no batch hook, so a fit with no other batch callback skips Keras's per-batch dispatch
  (its cost per step was the callback's whole cost); where a call is not one step
  (steps_per_execution, ParameterServer, a mid-epoch resume, Keras 3) by the batch hook
  (`counting.counts_calls`).
- A custom training loop: once TensorFlow is imported, every completed top-level call of a
  `tf.function` is counted per function (not calls made while one traces or runs, nor
  inside Keras's fit, evaluate or predict, which report for themselves). The most-called
  function's count is the task's step, reported once some function has completed twice
  (a function called once is set-up, not a loop), with the first step then
  (`approximate`: told a step late); where that function updates an optimizer, its
  iteration count is the step instead (a call may run many steps: orbit's
  steps_per_loop), read only when a marker goes out (`step_from` says which). No epoch,
  no loss: those only the script knows. Once
  a Keras fit ran, its callback alone tells the steps (saving the model afterwards calls
  tf.functions too).
- A ParameterServer coordinator's own loop (`ClusterCoordinator.schedule`): its closures
  run on the workers, outside any call of ours, so each closure that completes (the queue's
  `mark_finished`, TensorFlow's private API: where it is missing, nothing is counted) is a
  step. The closures each worker finished are told apart (progress.closures), a Keras
  fit's too: tfo names a worker that finishes far fewer than its peers.
- An evaluator task running the script (SidecarEvaluator, an evaluate loop): each `evaluate`
  that completed is a step. Not its metrics nor its epoch: which checkpoint it evaluated is
  the loop's own business.

Markers counted by the last three say so (`source`: "tf.function", "coordinator",
"evaluate"), so the coordinator can tell a step a script told from a step inferred. A script
that reports for itself (`progress.report`) turns the counting off from its first report on.

`TFO_AUTO_PROGRESS=0` in the task's environment (the spec's `env`) turns all of it off.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from worker_entry import checkpoints, markers, progress, tfimport
from worker_entry.progress import closures, inputwait, loops

ENV = "TFO_AUTO_PROGRESS"
# Keras's own loops: their tf.function calls are Keras's steps, which its callback reports.
_KERAS_LOOPS = ("fit", "evaluate", "predict")


def enabled(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def install() -> None:
    if not enabled():
        return
    tfimport.after_import("tensorflow", _guarded(_count_functions))
    tfimport.after_import("tensorflow", _guarded(checkpoints.install(steps_done)))
    tfimport.after_import("tensorflow", _guarded(inputwait.hooked))
    for name in ("tf_keras", "keras"):
        tfimport.after_import(name, _guarded(_wrap_keras))


def _guarded(hook: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    """A hook that fails (another TensorFlow, another Keras) costs the progress, never the
    script's import."""
    def run(module: ModuleType) -> None:
        try:
            hook(module)
        except Exception as e:  # noqa: BLE001
            print(f"[tfo] no automatic progress from {module.__name__}: {e!r}", file=sys.stderr,
                  flush=True)
    return run


_state = loops.State()


def steps_done() -> int:
    """The steps this attempt has done as tfo counts them, now (not at the last marker):
    the script's own reports, a Keras fit's callback, else the counted loop's."""
    if progress.reported_by_script():
        return progress.steps_reported()
    callback = _state.given_callback or (
        _state.keras_callback[1] if _state.keras_callback else None)
    if _state.fitted and callback is not None and hasattr(callback, "steps_done"):
        return int(callback.steps_done())
    return _state.best


# --- Keras ------------------------------------------------------------------------------

def _wrap_keras(module: ModuleType) -> None:
    model = module.Model
    for name in _KERAS_LOOPS:
        method = getattr(model, name, None)
        if method is not None and not getattr(method, "_tfo_wrapped", False):
            setattr(model, name, _with_callback(method) if name == "fit" else _keras_loop(method))


def _keras_loop(method: Callable[..., Any]) -> Callable[..., Any]:
    evaluations = method.__name__ == "evaluate" and _script_evaluator()

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        _state.in_keras += 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            _state.in_keras -= 1
        if evaluations and not _state.in_keras:  # not fit's validation
            _state.evaluations += 1
            _state.reporter("evaluate").report(step=_state.evaluations)
        return result
    run._tfo_wrapped = True  # type: ignore[attr-defined]
    return run


def _script_evaluator() -> bool:
    """An evaluator task running the user's script (SidecarEvaluator, an evaluate loop): its
    evaluations are its steps. An entry's evaluator (TaskContext.follow_checkpoints) reports
    its own `evaluated` markers."""
    try:
        task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
        job = json.loads(os.environ.get("TFO_JOB") or "{}")
    except (ValueError, AttributeError):
        return False
    return task.get("type") == "evaluator" and isinstance(job, dict) and "entry" not in job


def _with_callback(fit: Callable[..., Any]) -> Callable[..., Any]:
    """`fit`, with tfo's callback last among the script's."""
    # Here, in the task once Keras is in, not at the top: the wrapper imports this module
    # too, and `inspect` (with dis, tokenize ...) was 1.2 MB of its 16 MB, which a SIGKILLed
    # wrapper frees before the coordinator can learn of its death.
    import inspect

    at = list(inspect.signature(fit).parameters).index("callbacks") - 1  # after self

    loop = _keras_loop(fit)

    @functools.wraps(fit)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) > at:
            args = (*args[:at], _joined(self, args[at]), *args[at + 1:])
        else:
            kwargs["callbacks"] = _joined(self, kwargs.get("callbacks"))
        return loop(self, *args, **kwargs)
    run._tfo_wrapped = True  # type: ignore[attr-defined]
    return run


def _joined(model: Any, callbacks: Any) -> Any:
    from worker_entry.backup import TaskBackup  # TensorFlow is in by now
    from worker_entry.progress.fit import EpochProgress

    _state.fitted = True  # saving the model after calls tf.functions: they are no steps
    if callbacks is None:
        callbacks = []
    held = getattr(callbacks, "callbacks", callbacks)  # a CallbackList, or a list
    try:
        held = list(held)
    except TypeError:
        return callbacks  # something Keras will refuse anyway: left to it
    _tell_backup(cb for cb in held if not isinstance(cb, TaskBackup))
    given = next((cb for cb in held if isinstance(cb, EpochProgress)), None)
    if given is not None:
        _state.given_callback = given  # its steps are the task's (steps_done)
        return callbacks  # the script's own progress.callback(), an entry's ctx.callbacks()
    _state.given_callback = None
    ours = _callback(_parameter_server(model))
    if hasattr(callbacks, "append") and not isinstance(callbacks, list):
        callbacks.append(ours)  # a CallbackList the script made
        return callbacks
    return [*held, ours]


def _tell_backup(callbacks: Any) -> None:
    """The script's own BackupAndRestore's directory, once a task: an elastic resize fills
    it where a worker lacks the group's backup (the tutorial's keeps it in the chief's
    directory alone; tfo's own, an entry's, in TFO_BACKUP_DIR, which the coordinator knows)."""
    if _state.backup_told:
        return
    for cb in callbacks:
        if any(c.__name__ == "BackupAndRestore" for c in type(cb).__mro__) and \
                isinstance(getattr(cb, "backup_dir", None), str):
            _state.backup_told = True
            markers.emit(markers.BACKUP, dir=os.path.abspath(cb.backup_dir))
            return


def _parameter_server(model: Any) -> bool:
    strategy = getattr(model, "distribute_strategy", None)
    return type(strategy).__name__.startswith("ParameterServerStrategy")


def _callback(ps: bool) -> Any:
    """One callback per kind for every fit of the task: its steps go on counting and its
    first step is told once."""
    from worker_entry.progress.fit import EpochProgress, Progress

    key = "ps" if ps else "steps"
    if _state.keras_callback is None or _state.keras_callback[0] != key:
        _state.keras_callback = (key, EpochProgress() if ps else Progress())
    return _state.keras_callback[1]


# --- tf.function and the ParameterServer coordinator ------------------------------------

def _count_functions(tf: ModuleType) -> None:
    try:
        from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function
    except ImportError:
        from tensorflow.python.eager.def_function import Function  # older TensorFlow
    if not getattr(Function.__call__, "_tfo_wrapped", False):
        Function.__call__ = _counted(Function.__call__)
    try:
        from tensorflow.python.distribute.coordinator.cluster_coordinator import (
            _CoordinatedClosureQueue as Queue,
        )
    except ImportError:
        return
    if hasattr(Queue, "mark_finished") and not getattr(Queue.mark_finished, "_tfo_wrapped",
                                                       False):
        Queue.mark_finished = _closures_counted(Queue.mark_finished)


def _counted(call: Callable[..., Any]) -> Callable[..., Any]:
    state, local = _state, _state.local

    @functools.wraps(call)
    def run(function: Any, *args: Any, **kwargs: Any) -> Any:
        # Keras's loops first: a fit's every step passes here (0.56 us checked the other way)
        if state.in_keras or getattr(local, "depth", 0) or not state.counting():
            return call(function, *args, **kwargs)
        local.depth = 1
        try:
            result = call(function, *args, **kwargs)
        finally:
            local.depth = 0
        calls = function.__dict__
        count = calls["_tfo_calls"] = calls.get("_tfo_calls", 0) + 1
        state.completed(count, "tf.function", function)
        return result
    run._tfo_wrapped = True  # type: ignore[attr-defined]
    return run


def _closures_counted(mark_finished: Callable[..., Any]) -> Callable[..., Any]:
    done = [0]
    by_worker = closures.Counter()

    @functools.wraps(mark_finished)
    def run(queue: Any) -> Any:
        result = mark_finished(queue)
        by_worker.finished(threading.current_thread().name)  # counted anyway: Keras's too
        if _state.counting():
            done[0] += 1
            _state.completed(done[0], "coordinator")
        return result
    run._tfo_wrapped = True  # type: ignore[attr-defined]
    return run
