"""How long the task waited for its input: tf.data's own record of each iterator, read every
EVERY_SECONDS and told to tfo in an `input` marker, which names a worker of a synchronous job
that waits on its input pipeline while its peers wait on it (orchestrator/loop/starved.py).

    tfimport.after_import("tensorflow", inputwait.hooked)   # progress.auto.install

tf.data keeps, for every iterator it autotunes (the default: `options.autotune.enabled`),
a model of its pipeline, and in it the gaps between its consumer's calls: the time the
consumer spent elsewhere, stepping, between one element and the next
(`tf.data.experimental.get_model_proto`: its `gap_times`, in µs, the latest ones, and the
root's `num_elements`). Over an interval of `dt` in which `n` elements went out, the consumer
waited in its calls for the rest: dt - (its last n gaps). A worker whose pipeline is slow
waits most of its step for it; its peers of a synchronous job, waiting for that worker in
the collective, find their next element ready (prefetched) and wait none:

    worker:1 (its map sleeps 5 ms an element)   gaps 16-26 ms   waited 95-97 % of the time
    worker:0, worker:2                          gaps 507-538 ms waited 0 % (22 % when an
                                                interval holds 3 elements, not 4: the
                                                interval's edges; loop/starved.py judges
                                                over 10 s and more)

(3-worker MultiWorkerMirrored Keras fit of tests/scripts/slow_input.py on 2 cores.) The
read costs 0.2-0.4 ms of CPU per iterator. Which iterators: every `OwnedIterator` the task
makes (its `iter(dataset)`, Keras's, a distributed dataset's per-device ones, which the
training step calls), kept weakly, so an epoch's iterator that is dropped is forgotten.
Per interval the task's figure is its longest-waiting iterator's: a step that takes from two
waits for the slower. An iterator without a model (autotune off), or any error reading it,
is left out for good: no figure rather than a wrong one.

`profiler: false` in the cluster file turns it off (INPUT_WAIT_ENV=0 in the task's
environment), with the profiler service: both are tfo's instruments in the task.

The marker: `waited` (s, summed over this attempt) and `at` (the task's clock), sent only
for an interval in which some iterator gave elements.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from worker_entry import markers

EVERY_SECONDS = 2.0
ENV = markers.INPUT_WAIT_ENV
_ITERATORS = "tensorflow.python.data.ops.iterator_ops"


def waited(seconds: float, elements: int, gaps_us: Sequence[int]) -> float:
    """The seconds a consumer waited in an interval of `seconds` in which it took `elements`
    elements, the model's latest gaps being `gaps_us` (the last is the latest): the interval
    less the gaps of those elements (their mean where fewer were kept)."""
    if elements <= 0 or seconds <= 0:
        return 0.0
    recent = list(gaps_us)[-elements:]
    if not recent:
        return 0.0
    away = (sum(recent) if len(recent) == elements else elements * sum(recent) / len(recent))
    return min(seconds, max(0.0, seconds - away / 1e6))


class Watch:
    """The task's iterators and what they waited; `read(proto_of)` once an interval (free of
    TensorFlow: `proto_of(iterator)` gives the model, tests pass their own)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 emit: Callable[..., None] = markers.emit) -> None:
        self.iterators: weakref.WeakSet[Any] = weakref.WeakSet()
        self.total = 0.0
        self._last: weakref.WeakKeyDictionary[Any, tuple[float, int]] = \
            weakref.WeakKeyDictionary()
        self._clock, self._emit = clock, emit

    def add(self, iterator: Any) -> None:
        self.iterators.add(iterator)

    def read(self, proto_of: Callable[[Any], Any]) -> None:
        now, longest, active = self._clock(), 0.0, False
        try:
            iterators = list(self.iterators)
        except RuntimeError:  # one was made meanwhile: the next interval takes it
            return
        for it in iterators:
            try:
                proto = proto_of(it)
                elements = int(proto.nodes[proto.output].num_elements)
                gaps = list(proto.gap_times)
            except Exception:  # noqa: BLE001  no model (autotune off), or gone: left out
                self.iterators.discard(it)
                continue
            before = self._last.get(it)
            self._last[it] = (now, elements)
            if before is None or elements <= before[1]:
                continue
            active = True
            longest = max(longest, waited(now - before[0], elements - before[1], gaps))
        if active:
            self.total += longest
            self._emit(markers.INPUT, waited=round(self.total, 3), at=round(now, 3))


_watch = Watch()


def hooked(tf: ModuleType) -> None:
    """Once TensorFlow is imported (progress.auto.install): every iterator made is watched."""
    if os.environ.get(ENV, "1").strip() == "0":
        return
    owned = sys.modules[_ITERATORS].OwnedIterator
    made = owned.__init__
    proto_of = tf.data.experimental.get_model_proto
    started = threading.Event()

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        _watch.add(self)
        if not started.is_set():
            started.set()
            atexit.register(_reading.acquire, timeout=5.0)  # a read hung: exit anyway
            threading.Thread(target=_loop, args=(proto_of,), name="tfo-inputwait",
                             daemon=True).start()

    init.__wrapped__ = made  # type: ignore[attr-defined]
    owned.__init__ = init


# Held while a read runs, and for good from the task's exit on (atexit: before TensorFlow's
# C++ statics go), so a daemon thread never calls into TensorFlow while the process ends.
_reading = threading.Lock()


def _loop(proto_of: Callable[[Any], Any]) -> None:
    while True:
        time.sleep(EVERY_SECONDS)
        with _reading:
            _watch.read(proto_of)
