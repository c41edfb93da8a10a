"""The steps tfo infers from a script that reports none (progress.auto's hooks count, this
holds the count): per source ("tf.function", "coordinator", "evaluate") a throttled
Reporter; for a loop, the most-called tf.function's completed calls, or its optimizer's
step counter where its graph holds one (a call may run many steps); and at exit, the last
steps the markers' rate held back.
"""

from __future__ import annotations

import atexit
import functools
import re
import threading
from time import monotonic
from typing import Any

from worker_entry import markers, progress
from worker_entry.progress.counting import Reporter, loop_step

# The sources whose steps are a loop's calls (`State.loop_step`), not a count of their own.
_LOOPS = ("tf.function", "coordinator")


class State:
    """The task's one counter of steps inferred, and whether Keras's loops run now."""

    def __init__(self) -> None:
        self.in_keras = 0  # fit/evaluate/predict calls under way, any thread
        self.fitted = False  # a Keras fit ran: its callback tells the steps from then on
        self.local = threading.local()  # .depth: a tf.function call of ours under way
        self.best = 0  # the most-called function's completed calls
        self.first_told = False
        self.reporters: dict[str, Reporter] = {}
        self.keras_callback: Any = None
        self.given_callback: Any = None  # the script's or entry's own, in its last fit
        self.told: dict[str, int] = {}  # per source, the last step a marker told
        self.told_calls: dict[str, int] = {}  # per loop source, its calls when it was told
        self.leader: Any = None  # the tf.function whose calls were the step at the last marker
        self.evaluations = 0  # a script's evaluator: evaluate calls completed
        self.backup_told = False  # the script's BackupAndRestore's directory (_tell_backup)

    def tell_the_last(self) -> None:
        """At exit: the last steps, which the markers' rate may have held back (unless a
        fit or the script took over since: theirs are the last word)."""
        if self.fitted or progress.reported_by_script():
            return
        for source, reporter in self.reporters.items():
            if source in _LOOPS:
                if self.best <= self.told_calls.get(source, 0):
                    continue
                step, step_from = self.loop_step(source, self.best)
                # No `at`: when the held steps ended is not known (the rate stays the window's)
                self.emit_with(markers.PROGRESS, source=source, step=step, step_from=step_from)
            elif reporter.step > self.told.get(source, 0):
                self.emit_with(markers.PROGRESS, source=source, step=reporter.step)

    def counting(self) -> bool:
        return not (self.in_keras or self.fitted or progress.reported_by_script())

    def completed(self, count: int, source: str, function: Any = None) -> None:
        """A counted call (of `function`, a tf.function) completed, the `count`th of its
        kind: a step if it is the most."""
        if count <= self.best:
            return
        self.best = count
        if count < 2:
            return
        reporter = self.reporters.get(source)
        if reporter is not None and monotonic() < reporter.next_at:
            return  # the next marker (or tell_the_last) tells it: one compare, not a report()
        if function is not None:
            self.leader = function
        if not self.first_told:
            self.first_told = True
            markers.emit(markers.FIRST_STEP, batch=None, approximate=True, source=source)
        reporter = self.reporter(source)
        step, step_from = self.loop_step(source, count)
        reporter.report(step=step, step_from=step_from)

    def loop_step(self, source: str, calls: int) -> tuple[int, str]:
        """The step to tell `calls` calls in, and where it came from (counting.loop_step):
        the optimizer's, read now, where the loop's function holds one."""
        iterations = _iterations(self.leader) if source == "tf.function" else None
        step, step_from = loop_step(self.reporter(source).step,
                                             self.told_calls.get(source, 0), calls, iterations)
        self.told_calls[source] = calls
        return step, step_from

    def reporter(self, source: str) -> Reporter:
        """The markers of one source, at most one a second."""
        if not self.reporters:
            atexit.register(self.tell_the_last)
        if source not in self.reporters:
            self.reporters[source] = Reporter(
                emit=functools.partial(self.emit_with, source=source))
        return self.reporters[source]

    def emit_with(self, event: str, source: str, **fields: Any) -> None:
        """A marker of `source`'s, its step remembered as told."""
        self.told[source] = fields["step"]
        markers.emit(event, **fields, source=source)


# An optimizer's step counter, as its graph names it: tf-keras's `iteration` (optimizer_v2's
# `iter`, under the loop's scope where it was made: `while/Adam/iter:0`), Keras 3's
# `sgd/iteration:0`.
_ITERATIONS = re.compile(r"(?:^|/)(?:iter|iteration|iterations)(?:_\d+)?:\d+$")


def _iterations(function: Any) -> int | None:
    """The optimizer's step after `function`'s last call: the largest step counter (an
    optimizer's `iterations`) its traced graphs touch. The counters are looked for once a
    tracing (TensorFlow's private function cache: where it is missing, None), and read
    only when a marker goes out. None: no optimizer in the function (the loop's calls count)."""
    try:
        held = function.__dict__
        traced = function.experimental_get_tracing_count()
        found = held.get("_tfo_iterations")
        if found is None or found[0] != traced:
            found = held["_tfo_iterations"] = (traced, _step_counters(function))
        return max((int(v.numpy()) for v in found[1]), default=None)
    except Exception:  # noqa: BLE001 (another TensorFlow's internals; a variable gone)
        return None


def _step_counters(function: Any) -> tuple[Any, ...]:
    """The int64 scalar variables named as an optimizer's step counter in the function's
    concrete functions (each a graph's variables: the ones it reads or writes, nested
    functions' and loops' included; a distributed variable's local components)."""
    found: dict[int, Any] = {}
    for concrete in function._function_cache.values():
        for v in concrete.graph.variables:
            if v.dtype.name == "int64" and v.shape.rank == 0 and _ITERATIONS.search(v.name):
                found[id(v)] = v
    return tuple(found.values())
