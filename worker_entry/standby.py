"""A warm spare's task: the slow part of starting done ahead, then a wait for its turn.

    standby.serve(go_fd)   # in the task (a standby's), first thing: returns once it may run

Importing TensorFlow (and tf-keras, and an entry's module, which imports them; for a script
or module job, the installed libraries it imports) is most of a task's start: seconds of a
core. A standby does it while the attempt before its own still trains, at the lowest CPU
priority (`yield_cpu`, undone at GO), then blocks on `go_fd` until its wrapper relays GO
from the coordinator (the lifeline, worker_entry.lifeline). Nothing it does before GO may
touch the task's port, its peers or its files: the attempt it will replace still owns them.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import gc
import importlib
import importlib.util
import json
import os
import sys
import sysconfig
import tempfile
import threading

from worker_entry import defaults, markers, title

# A pool standby (orchestrator/launch/pool.py, the pytest plugin's warm pool) is started before its
# job exists: its environment and directory come at GO, from the JSON file this names
# (`{"env": {...}, "cwd": "..."}`), written by the coordinator just before it sends GO.
POOL_ENV = "TFO_POOL_ENV"


def adopt_pool_env() -> bool:
    """A pool standby at GO (its wrapper, then its task): take the task's environment and
    directory from the file POOL_ENV names; False for any other process. `sys.path` keeps
    what was imported; an entry of the old directory is pointed at the new one."""
    path = os.environ.get(POOL_ENV)
    if not path:
        return False
    with open(path) as f:
        given = json.load(f)
    old = os.getcwd()
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in given["env"].items()})
    defaults.apply(os.environ)  # as `python -m worker_entry` did at the standby's start
    os.chdir(given["cwd"])
    sys.path[:] = [given["cwd"] if p == old else p for p in sys.path]
    return True


def warm_up() -> None:
    """Import what the task will import first. A failure is the real run's to report: it
    imports the same again, and fails the same way, once it runs."""
    job = json.loads(os.environ.get("TFO_JOB") or "{}")
    if not isinstance(job, dict):
        job = {}
    names = ["tensorflow"]
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        names.append("tf_keras")
    if isinstance(job.get("entry"), str) and not job.get("serve"):
        names.append(job["entry"].partition(":")[0])  # the job's own module, and its imports
    else:
        names += _libraries(_source(job))
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    # What runs the job after GO (tfo's own: runner, profiler) and the Keras API behind
    # `tf.keras`, which TensorFlow loads at its first use (79 modules of tf_keras.api, 13 ms
    # of a core): imports only, no TensorFlow context (a script may still set its devices
    # and threads). Then what the imports made is left out of later collections, as
    # tfimport does for TensorFlow's own (the script's libraries' objects too).
    with contextlib.suppress(Exception):
        importlib.import_module("worker_entry.runner")
        if "tensorflow" in sys.modules:
            getattr(sys.modules["tensorflow"].keras, "Model", None)
    gc.freeze()
    atexit.register(gc.unfreeze)  # Python's last collection sees everything (tfimport)


def _source(job: dict) -> str | None:
    """The file of a script or (top-level) module job: found without importing anything."""
    with contextlib.suppress(Exception):
        if isinstance(job.get("script"), str):
            return os.path.abspath(os.path.expanduser(job["script"]))
        module = job.get("module")
        if isinstance(module, str) and "." not in module:  # a parent would be imported
            spec = importlib.util.find_spec(module)
            return spec.origin if spec is not None and spec.has_location else None
    return None


def _libraries(path: str | None) -> list[str]:
    """The installed libraries a script imports, anywhere in it (`import x`, `from x.y
    import z`): numpy, sklearn.datasets, ... Only those found in the interpreter's own
    library and site-packages directories: the job's own modules may expect what the
    script does first (its sys.argv, its sys.path), so they are left to the script."""
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    places = {os.path.realpath(p) + os.sep for key, p in sysconfig.get_paths().items()
              if key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return [name for name in dict.fromkeys(names) if _installed(name, places)]


def _installed(name: str, places: set[str]) -> bool:
    try:
        spec = importlib.util.find_spec(name.partition(".")[0])  # top level: imports nothing
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.has_location or not spec.origin:
        return False  # built in, or frozen: nothing to gain
    return os.path.realpath(spec.origin).startswith(tuple(places))


# Set by the test kit's pool (launch/pool.py): its standby's import is the next test's start,
# not a spare beside a training job; at nice 19 on a busy machine it got no CPU until the
# test took it (each test waited for its own imports: 2.6-3.0x slower than forked tasks).
KEEP_PRIORITY_ENV = "TFO_STANDBY_KEEP_PRIORITY"


def yield_cpu() -> int | None:
    """The lowest CPU priority (nice 19) for the warm-up, so that a standby's import takes
    no core from the tasks training beside it (issue 39: spares without spare cores), where
    it can be undone at GO: tried first on a thread of its own (Linux's nice is a thread's),
    which ends anyway. The priority to go back to; None where it stays as it is."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    undone: list[bool] = []

    def trial() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 19)
            os.setpriority(os.PRIO_PROCESS, 0, before)  # needs CAP_SYS_NICE or RLIMIT_NICE
            undone.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=trial, name="tfo-nice-trial")
    thread.start()
    thread.join()
    if not undone or before >= 19:
        return None
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    return before


def restore_cpu(priority: int | None) -> None:
    """Every thread back to `priority` (what the import started inherited its 19)."""
    if priority is None:
        return
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(tid), priority)


def serve(go_fd: int) -> None:
    """Warm up, then wait for GO on `go_fd`; without it (the wrapper is gone), exit. GO is
    awaited from the start, on a thread: one that comes while the import still runs (a
    restart soon after the standby's start, a loaded machine) gives the import its normal
    priority back at once, not after it finished at nice 19."""
    priority = None if os.environ.get(KEEP_PRIORITY_ENV) == "1" else yield_cpu()
    came = threading.Event()

    def await_go() -> None:
        try:
            go = os.read(go_fd, 1)
        except OSError:
            go = b""
        if go != markers.GO:
            os._exit(0)
        restore_cpu(priority)
        came.set()

    threading.Thread(target=await_go, name="tfo-standby-go", daemon=True).start()
    warm_up()
    came.wait()
    restore_cpu(priority)  # a thread the import started while the other restored
    os.close(go_fd)
    if adopt_pool_env():
        title.set_title(title.describe(os.environ, room=title.room()))
    os.environ.pop(markers.STANDBY_ENV, None)  # not for the job's code, nor what it starts
    # The task's temp dir is made at GO (the attempt before removed it when it ended): let
    # `tempfile` look for it again, should an import have asked while it was missing.
    tempfile.tempdir = None
