"""A task's wrapper forked from the host agent, as `python -m worker_entry` would start it.

Starting 128 tasks on 16 hosts was 128 interpreters starting and importing worker_entry
(about 50 ms of CPU each): most of a lab's start on its machines. The agent is the same
python, in the same workdir, with worker_entry imported already (`preload`): a fork of it
is what an exec would have made, where nothing the interpreter reads at its start differs,
and costs about a millisecond. So the agent forks (`spawn`) where `can_fork` says the
result is the same, and execs otherwise (another python, or a task whose own environment
sets a variable read at an interpreter's start: `PYTHONPATH`, `LD_LIBRARY_PATH`, a locale).
The agent is started with the startup variables its tasks share (`startup_env`) for that.

In the child, what the exec would have reset is reset here: its own session, stdin and
output on the task's pipes, no other descriptor of the agent's, default signal handlers,
the task's directory, environment, argv and sys.path[0]. Then worker_entry's __main__ runs
as under `-m`, and the child exits as Python would (threads joined, atexit handlers run,
streams flushed): never back into the agent's loop.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Mapping
from typing import NoReturn

WRAPPER = ("-m", "worker_entry")
# Read once, when an interpreter (or the dynamic loader, or the C library) starts: a child
# forked from a process started with other values would not be what an exec makes.
_STARTUP_PREFIXES = ("PYTHON", "LD_", "LC_", "MALLOC_")
_STARTUP_NAMES = frozenset({"LANG", "LANGUAGE", "GLIBC_TUNABLES", "HOME"})  # HOME: user site
_PRELOADED = ("defaults", "tfimport", "progress.auto", "faults", "lifeline.start", "runner",
              "standby", "markers", "title", "usage", "listen", "progress", "frames")


def is_startup_var(name: str) -> bool:
    return name in _STARTUP_NAMES or name.startswith(_STARTUP_PREFIXES)


def startup_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that an interpreter's start reads."""
    return {k: v for k, v in env.items() if is_startup_var(k)}


def shared_startup_env(envs: list[Mapping[str, str]]) -> dict[str, str]:
    """The startup variables every one of `envs` sets to the same value: what a host's agent
    is started with, so that its tasks can be forked."""
    if not envs:
        return {}
    first = startup_env(envs[0])
    return {k: v for k, v in first.items() if all(e.get(k) == v for e in envs[1:])}


def can_fork(command: list[str], env: Mapping[str, str],
             here: Mapping[str, str] | None = None, executable: str | None = None) -> bool:
    """Would forking this process give what exec'ing `command` with `env` gives? Only for
    `python -m worker_entry` with this python, and the same startup variables."""
    here = os.environ if here is None else here
    executable = executable or sys.executable
    if len(command) != 3 or tuple(command[1:]) != WRAPPER or not executable:
        return False
    found = shutil.which(command[0], path=env.get("PATH")) if "/" not in command[0] \
        else command[0]
    if found is None or os.path.abspath(found) != executable:
        return False
    return startup_env(env) == startup_env(here)


def preload() -> None:
    """worker_entry's modules, imported once here for every child (none imports TensorFlow
    or changes anything at import)."""
    import importlib

    for name in _PRELOADED:
        importlib.import_module(f"worker_entry.{name}")


def spawn(cwd: str, env: Mapping[str, str]) -> tuple[int, int, int]:
    """Fork the task's wrapper: (pid, its stdin's write end, its output's read end)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        become_wrapper(cwd, dict(env), in_r, out_w)
    os.close(in_r)
    os.close(out_w)
    os.set_inheritable(in_w, False)
    os.set_inheritable(out_r, False)
    return pid, in_w, out_r


def become_wrapper(cwd: str, env: dict[str, str], stdin: int, out: int) -> NoReturn:
    code: int = 1
    try:
        os.setsid()
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, _max_fd())  # the agent's channel, wake-up pipe, other tasks' pipes
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        code = _run_main()
    finally:
        os._exit(code)


def _run_main() -> int:
    """worker_entry's __main__, then Python's own exit: threads joined, atexit handlers,
    streams flushed. Its exit code (an uncaught KeyboardInterrupt: by SIGINT, as Python)."""
    import atexit
    import runpy
    import threading
    import traceback

    code, interrupted = 0, False
    try:
        runpy.run_module("worker_entry", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 130, True
    except BaseException:  # noqa: BLE001 - Python prints it and exits 1
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):  # exiting either way
        threading._shutdown()  # type: ignore[attr-defined]  # as Python's exit does
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _exit_code(value: object) -> int:
    """SystemExit's code as Python's exit makes it: None 0, an int itself, else printed, 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _max_fd() -> int:
    try:
        return max(os.sysconf("SC_OPEN_MAX"), 256)
    except (ValueError, OSError):
        return 65536
