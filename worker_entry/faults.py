"""Faults a test asks for (orchestrator.run's and the pytest plugin's `kill=`, `preempt=`,
`stall=`), carried out in the task once it reaches an epoch or a step.

    TFO_FAULTS='{"worker:1": {"kill": {"epoch": 2}}}'   # in the task's environment

`install()` (python -m worker_entry, before any job code) watches the task's own `epoch` and
`progress` markers (markers.emit: Keras's fit, a counted tf.function, `progress.report`), so
every kind of job can be struck. TFO_FAULTS is read at the first such marker, not at the
start: a pool standby (orchestrator/launch/pool.py) gets its task's environment only at GO. Only the
first attempt is struck: a restart runs clean, and a test sees the recovery. `kill`: SIGKILL
to the task itself (exit -9). `preempt`: SIGTERM to its wrapper, as a preemption notice comes
(the task gets it with the job's grace, a sigterm marker says so). `stall`: the thread that
reached the point sleeps for good (its stack shows where).
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
KINDS = ("kill", "preempt", "stall")
UNITS = {"epoch": markers.EPOCH, "step": markers.PROGRESS}


def planned(environ: Any = os.environ) -> tuple[str, str, int] | None:
    """This task's fault, (kind, unit, n), from TFO_FAULTS; None for none (or on a restart)."""
    if environ.get("TFO_ATTEMPT", "0") != "0":
        return None
    try:
        mine = json.loads(environ.get(FAULTS_ENV) or "{}").get(environ.get("TFO_TASK", ""))
        (kind, at), = mine.items()
        (unit, n), = at.items()
    except (ValueError, AttributeError, TypeError):
        return None
    if kind not in KINDS or unit not in UNITS or not isinstance(n, int):
        return None
    return kind, unit, n


def install() -> None:
    fault: list[tuple[str, str, int] | None] = []  # read at the first marker that could count

    def watch(name: str, fields: dict[str, Any]) -> None:
        if name not in (markers.EPOCH, markers.PROGRESS):
            return
        if not fault:
            fault.append(planned())
        if fault[0] is None:
            return
        kind, unit, n = fault[0]
        value = fields.get(unit)
        if name != UNITS[unit] or not isinstance(value, int) or value < n:
            return
        fault[0] = None  # once
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
