"""Faults a test asks for (orchestrator.run's and the pytest plugin's `kill=`, `preempt=`,
`stall=`), carried out in the task once it reaches an epoch or a step.

    TFO_FAULTS='{"worker:1": {"kill": {"epoch": 2}}}'   # in the task's environment

`install()` (python -m worker_entry, before any job code) watches the task's own `epoch` and
`progress` markers (markers.emit: Keras's fit, a counted tf.function, `progress.report`), so
every kind of job can be struck. Only the first attempt is: a restart runs clean, and a test
sees the recovery. `kill`: SIGKILL to the task itself (exit -9). `preempt`: SIGTERM to its
wrapper, as a preemption notice comes (the task gets it with the job's grace, a sigterm
marker says so). `stall`: the thread that reached the point sleeps for good (its stack shows
where).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from worker_entry import markers

FAULTS_ENV = "TFO_FAULTS"


def install() -> None:
    try:
        faults = json.loads(os.environ.get(FAULTS_ENV) or "{}")
        mine = faults.get(os.environ.get("TFO_TASK", ""))
    except (ValueError, AttributeError):
        return
    if not isinstance(mine, dict) or len(mine) != 1:
        return
    (kind, at), = mine.items()
    if not isinstance(at, dict) or len(at) != 1:
        return
    (unit, n), = at.items()
    if kind not in ("kill", "preempt", "stall") or unit not in ("epoch", "step") \
            or not isinstance(n, int):
        return
    event = markers.EPOCH if unit == "epoch" else markers.PROGRESS
    struck = False

    def watch(name: str, fields: dict[str, Any]) -> None:
        nonlocal struck
        value = fields.get(unit)
        if struck or name != event or not isinstance(value, int) or value < n \
                or os.environ.get("TFO_ATTEMPT", "0") != "0":
            return
        struck = True
        print(f"[tfo] fault: {kind} {os.environ.get('TFO_TASK')} at {unit} {value}",
              file=sys.stderr, flush=True)
        strike(kind)

    markers.on_emit(watch)


def strike(kind: str) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "preempt":
        os.kill(os.getppid(), signal.SIGTERM)  # the wrapper: it passes it on with the grace
    else:
        while True:
            time.sleep(3600)
