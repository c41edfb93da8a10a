"""The closures each worker of a ParameterServer job finished, counted in the chief (the
coordinator's process) and told to tfo, which names a worker that finishes far fewer than
its peers (orchestrator/loop/closures.py). Free of TensorFlow (tests pass a clock).

    counter = Counter()
    counter.finished(threading.current_thread().name)   # each closure marked finished

TensorFlow's ClusterCoordinator runs each worker's closures in a thread of its own, named
"WorkerClosureProcessingLoop-<worker index>" (cluster_coordinator.py `Worker`), which marks
each closure it ran finished (`_CoordinatedClosureQueue.mark_finished`: progress.auto wraps
it): the calling thread's name says which worker ran it. A call from any other thread (a
newer TensorFlow's) is not counted. The counts go out in a `closures` marker
(`by_worker`: {"0": n, ...}, `at`: the task's clock) at most every EVERY_SECONDS: on the
closure path, a dict increment and a clock compare. A custom loop's and a Keras fit's
closures alike, whether or not the chief's steps are counted.
"""

from __future__ import annotations

import math
import time
from typing import Any

from worker_entry import markers

THREAD_PREFIX = "WorkerClosureProcessingLoop-"
# Rates are taken over a window of several markers (orchestrator/loop/rate.py); one every
# 2 s is enough for a verdict held 30 s, and half of progress's traffic.
EVERY_SECONDS = 2.0


class Counter:
    """Closures finished per worker index, this attempt of the chief."""

    def __init__(self, clock: Any = time.monotonic, emit: Any = markers.emit) -> None:
        self.by_worker: dict[str, int] = {}
        self._clock, self._emit = clock, emit
        self._next_at = -math.inf

    def finished(self, thread: str) -> None:
        """One closure finished, marked so from the thread named `thread`. Each worker's
        thread adds to its own key alone, so no count is lost without a lock."""
        if not thread.startswith(THREAD_PREFIX):
            return
        worker = thread[len(THREAD_PREFIX):]
        if not (worker.isascii() and worker.isdigit()):
            return
        self.by_worker[worker] = self.by_worker.get(worker, 0) + 1
        now = self._clock()
        if now < self._next_at:
            return
        self._next_at = now + EVERY_SECONDS
        self._emit(markers.CLOSURES, by_worker=dict(self.by_worker), at=round(now, 3))
