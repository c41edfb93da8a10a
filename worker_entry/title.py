"""The task's name in `ps` and `top`: `tfo worker:1 train.py`, not `python -m worker_entry`.

    title.set_title(title.describe(os.environ))              # in the task
    title.set_title(title.describe(os.environ, "wrapper"))   # in its wrapper

`setproctitle` (a dependency of the task side, `pip install tf-orchestrator[tf]`) rewrites
the process's command line. A lab host without it keeps the plain one: nothing fails. It
runs with SPT_NOENV, so it only uses the command line's own room and leaves the environment
as it is in /proc/PID/environ, where tfo tells its tasks' processes apart (launch/orphans.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

_NOENV = "SPT_NOENV"


def describe(env: Mapping[str, str], part: str | None = None) -> str:
    """`tfo worker:1 train.py`, `tfo worker:0 -m pkg.train`, `tfo chief:0 pkg.mod:train`,
    `tfo ps:0 server`; with `part`, `[part]` after it."""
    try:
        job = json.loads(env.get("TFO_JOB") or "{}")
    except ValueError:
        job = {}
    job = job if isinstance(job, dict) else {}
    if job.get("serve"):
        what = "server"
    elif job.get("script"):
        what = str(job["script"])
    elif job.get("module"):
        what = f"-m {job['module']}"
    else:
        what = str(job.get("entry") or "")
    text = " ".join(w for w in ("tfo", env.get("TFO_TASK") or _from_tf_config(env), what) if w)
    return f"{text} [{part}]" if part else text


def _from_tf_config(env: Mapping[str, str]) -> str:
    """`worker:1` from TF_CONFIG (a TFJob's pod has no TFO_TASK until the runner sets it)."""
    try:
        task = json.loads(env.get("TF_CONFIG") or "{}")["task"]
        return f"{task['type']}:{int(task['index'])}"
    except (ValueError, KeyError, TypeError):
        return "task"


def set_title(text: str) -> bool:
    """The process's title, where setproctitle is installed (else False, nothing done)."""
    had = os.environ.get(_NOENV)
    os.environ[_NOENV] = "1"  # read as the module loads: keep /proc/PID/environ readable
    try:
        from setproctitle import setproctitle
    except ImportError:
        return False
    else:
        setproctitle(text)
        return True
    finally:
        if had is None:
            os.environ.pop(_NOENV, None)
        else:
            os.environ[_NOENV] = had
