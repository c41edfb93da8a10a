"""What the wrapper reads of its task's plan, from the environment the coordinator set:
the task's temp dir and SIGTERM grace (TFO_JOB), and the port that tells a script's task is
up (TF_CONFIG). A plan that is missing or malformed reads as none: the runner, in the
task, names the problem.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable

_GRACE_SECONDS = 10.0  # from SIGTERM to SIGKILL when the plan does not say (spec's default)


def _job() -> dict:
    try:
        job = json.loads(os.environ.get("TFO_JOB") or "{}")
    except ValueError:
        return {}
    return job if isinstance(job, dict) else {}


def tmp_dir() -> str | None:
    """The task's own temp dir (plan.py), removed with the task."""
    path = _job().get("tmp_dir")
    return os.path.expanduser(path) if isinstance(path, str) and path else None


def grace() -> float:
    """Seconds from a SIGTERM to the SIGKILL, for a task with a SIGTERM handler."""
    seconds = _job().get("grace_seconds")
    return float(seconds) if isinstance(seconds, int | float) and seconds >= 0 \
        else _GRACE_SECONDS


def script_port() -> int | None:
    """The port to watch for readiness: a script task's own, from TF_CONFIG. None for an
    entry or a server (they report READY themselves) and for a role without a port."""
    try:
        job = json.loads(os.environ.get("TFO_JOB") or "{}")
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        if "entry" in job or job.get("serve"):
            return None
        task = config["task"]
        address = config["cluster"][task["type"]][int(task["index"])]
        return int(str(address).rsplit(":", 1)[1])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None  # the evaluator (no port), or no plan: the runner names the problem


def _to_stderr(message: str) -> None:
    """Before the wrapper's frames begin (the task not forked yet)."""
    with contextlib.suppress(OSError, ValueError):
        print(message, file=sys.stderr, flush=True)


def make_tmp_dir(path: str, say: Callable[[str], None] | None = None) -> bool:
    """Make the task's temp dir; False (and said) where it cannot be made."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        (say or _to_stderr)(f"[tfo] cannot create the task's temp dir {path}: "
                            f"{e.strerror or e}")
        return False
    return True
