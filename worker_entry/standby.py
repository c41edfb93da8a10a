"""A warm spare's task: the slow part of starting done ahead, then a wait for its turn.

    standby.serve(go_fd)   # in the task (a standby's), first thing: returns once it may run

Importing TensorFlow (and tf-keras, and an entry's module, which imports them) is most of a
task's start: seconds of a core. A standby does it while the attempt before its own still
trains, then blocks on `go_fd` until its wrapper relays GO from the coordinator (the
lifeline, worker_entry.lifeline). Nothing it does before GO may touch the task's port, its
peers or its files: the attempt it will replace still owns them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import tempfile

from worker_entry import markers


def warm_up() -> None:
    """Import what the task will import first. A failure is the real run's to report: it
    imports the same again, and fails the same way, once it runs."""
    with contextlib.suppress(Exception):
        import tensorflow  # noqa: F401

        if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
            import tf_keras  # noqa: F401
        job = json.loads(os.environ.get("TFO_JOB") or "{}")
        entry = job.get("entry") if isinstance(job, dict) else None
        if isinstance(entry, str) and not job.get("serve"):
            importlib.import_module(entry.partition(":")[0])


def serve(go_fd: int) -> None:
    """Warm up, then wait for GO on `go_fd`; without it (the wrapper is gone), exit."""
    warm_up()
    try:
        go = os.read(go_fd, 1)
    except OSError:
        go = b""
    if go != markers.GO:
        os._exit(0)
    os.close(go_fd)
    os.environ.pop(markers.STANDBY_ENV, None)  # not for the job's code, nor what it starts
    # The task's temp dir is made at GO (the attempt before removed it when it ended): let
    # `tempfile` look for it again, should an import have asked while it was missing.
    tempfile.tempdir = None
