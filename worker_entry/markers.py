"""The one-line protocol by which a task tells the coordinator how far it got.

A marker is a line on stdout: `@tfo {"event": "ready", ...}`. The coordinator reads
them from the task's output (local pipe or SSH channel alike), checks each against its
model in orchestrator.markers and records it as an event. This side stays free of pydantic.
"""

from __future__ import annotations

import json
import sys
from typing import Any

PREFIX = "@tfo "
# With a heartbeat lifeline (SSH), the task's wrapper writes this byte to stdout every
# second; one byte, so it lands whole even amid the task's own output. Readers drop it.
BEAT = b"\x1e"

# Events a task reports, in the order it reaches them.
UP = "up"  # the process runs; TensorFlow not imported yet
CONNECTING = "connecting"  # building the strategy: waiting for every peer to connect
READY = "ready"  # training: the strategy is built (all peers connected); serving: server up
FIRST_STEP = "first_step"  # the first training step finished
EPOCH = "epoch"  # an epoch began (`epoch`, 0-based)
EVALUATED = "evaluated"  # the evaluator evaluated a checkpoint (`epoch`, `metrics`)
SAVED = "saved"  # the model was written (`path`, `chief`)
DONE = "done"  # the entry returned

# A task's exit code for "retrying cannot help": its entry's module or function does not
# exist. The supervisor never restarts it, whatever the restart policy. 78 is EX_CONFIG
# (sysexits.h); user code exiting 78 on its own is taken the same way.
EXIT_PERMANENT = 78


def emit(event: str, **fields: Any) -> None:
    print(PREFIX + json.dumps({"event": event, **fields}, default=str), flush=True)
    sys.stdout.flush()
