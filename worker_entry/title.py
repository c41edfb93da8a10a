"""The task's name in `ps` and `top`: `tfo worker:1 train.py`, not `python -m worker_entry`.

    title.set_title(title.describe(os.environ))              # in the task
    title.set_title(title.describe(os.environ, "wrapper"))   # in its wrapper

`setproctitle` (a dependency of the task side, `pip install tf-orchestrator[tf]`) rewrites
the process's command line. It also sets the kernel's short name (`comm`, 15 bytes, the
second field of /proc/PID/stat) to the title's start, `tfo worker:0 tr`: with its spaces,
Slurm's proctrack/cgroup could not read the ppid after it (it scans the stat line by
whitespace), took the wrapper for no task of the step's, and sent it no `scancel --signal=TERM`
(SIGKILL only), so a step stopped by tfo sat out its whole grace. The short name is
`tfo-worker:0` instead: one word, as a process's name is expected to be.

It runs with SPT_NOENV, so it only uses the command line's own room and leaves the
environment as it is in /proc/PID/environ, where tfo tells its tasks' processes apart
(launch/orphans.py). A lab host's python without setproctitle gets the same by hand
(`_by_hand`): the short name by prctl(PR_SET_NAME), the command line's own bytes rewritten
through /proc/self/mem (its bounds from /proc/self/stat). Without that, a lab task forked
from its host's agent (worker_entry/forkstart.py) showed the agent's command line,
`python -m worker_entry.agent 15`. Where neither works, nothing fails.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping

_NOENV = "SPT_NOENV"


def describe(env: Mapping[str, str], part: str | None = None, room: int | None = None) -> str:
    """`tfo worker:1 train.py`, `tfo worker:0 -m pkg.train`, `tfo chief:0 pkg.mod:train`,
    `tfo ps:0 server`; with `part`, `[part]` after it. Within `room` characters (see `room()`):
    a script's path gives way to its file name, then the code's name is cut; the task and the
    part stay."""
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
    head = f"tfo {env.get('TFO_TASK') or _from_tf_config(env)}"
    tail = f" [{part}]" if part else ""
    if room is None:
        return head + (f" {what}" if what else "") + tail
    for text in (what, os.path.basename(what) if job.get("script") else what):
        if len(head) + len(tail) + (len(text) + 1 if text else 0) <= room:
            return head + (f" {text}" if text else "") + tail
    cut = room - len(head) - len(tail) - 1
    return (head + (f" {text[:cut]}" if cut >= 3 else "") + tail)[:room]


def room() -> int | None:
    """How many characters this process's title can hold: under SPT_NOENV, setproctitle
    writes within the command line's own bytes (its arguments and their NULs)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return max(len(f.read()) - 2, 0)  # its last NUL, and one setproctitle keeps
    except OSError:
        return None


def _from_tf_config(env: Mapping[str, str]) -> str:
    """`worker:1` from TF_CONFIG (a TFJob's pod has no TFO_TASK until the runner sets it)."""
    try:
        task = json.loads(env.get("TF_CONFIG") or "{}")["task"]
        return f"{task['type']}:{int(task['index'])}"
    except (ValueError, KeyError, TypeError):
        return "task"


def short_name(title: str) -> str:
    """The kernel's name for a titled process: `tfo-worker:0`, one word of at most 15 bytes
    (see the top: tools that read /proc/PID/stat split it at whitespace)."""
    words = title.split()
    name = "-".join(words[:2]) if words[:1] == ["tfo"] else "".join(words[:1]) or "tfo"
    return "".join(c if c.isprintable() and c not in "()" else "_" for c in name)[:15]


def set_title(text: str) -> bool:
    """The process's title and its short name (`short_name`): by setproctitle where it is
    installed, else by hand (`_by_hand`). False: neither could."""
    had = os.environ.get(_NOENV)
    os.environ[_NOENV] = "1"  # read as the module loads: keep /proc/PID/environ readable
    try:
        from setproctitle import setproctitle, setthreadtitle
    except ImportError:
        return _by_hand(text)
    else:
        setproctitle(text)
        setthreadtitle(short_name(text))  # the main thread's name is the process's `comm`
        return True
    finally:
        if had is None:
            os.environ.pop(_NOENV, None)
        else:
            os.environ[_NOENV] = had


PR_SET_NAME = 15  # linux/prctl.h
# /proc/PID/stat's fields after the name's closing parenthesis start at field 3 (state):
# arg_start and arg_end are fields 48 and 49 (proc(5), Linux 3.5+).
_ARG_START = 48 - 3


def _by_hand(text: str) -> bool:
    """setproctitle's work without it: the kernel's short name (prctl on this, the main,
    thread) and the command line's bytes, overwritten in place and padded with NULs (no
    byte beyond them: the environment after them stays as it is)."""
    done = False
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        done = libc.prctl(PR_SET_NAME, ctypes.c_char_p(short_name(text).encode()[:15]),
                          0, 0, 0) == 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[_ARG_START]), int(fields[_ARG_START + 1])
        if end - start > 1:
            with open("/proc/self/mem", "r+b", buffering=0) as mem:
                mem.seek(start)
                mem.write(text.encode()[:end - start - 1].ljust(end - start, b"\0"))
            done = True
    return done
