"""A warm pool: local task processes that have imported TensorFlow before their job exists,
so consecutive small jobs (a file of cluster tests) do not each pay the import.

    pool = WarmPool(workdir=Path.cwd())
    orchestrator.run(entry="pkg.steps:fn", workers=2, pool=pool)   # takes 2, starts 2 more
    pool.close()                                                  # kills the standbys left

A pool standby is a warm spare (launch/spares.py, worker_entry/standby.py) started with
no task: `python -m worker_entry` with TFO_STANDBY=1 and POOL_ENV naming a file of its own.
`take(task, attempt)` writes that task's environment and directory into the file and sends
GO; the wrapper and then the task read it (standby.adopt_pool_env) and run as the task
started now would. Only what was fixed at the standby's exec must match: the interpreter's
command, the directory its sys.path was built in, and what the import read (CUDA devices,
the Keras choice, the loopback shim's LD_PRELOAD); a task that differs starts cold.
`size` standbys are kept (the plugin raises it to a test's task count): each one taken, the
oldest, is replaced at once while `refill` is on. The plugin turns it off for a test that no
later test of the session follows onto the pool: a standby started then would only be killed
at the session's end (`starts`).

Every standby is exec'd and imports TensorFlow itself, at its normal priority (tfo's spares
import at nice 19, beside training; a pool standby's import is the next test's start, and at
nice 19 on a busy machine it waited for the test to take it), while the test before its own
runs: the kit's tasks are never
forked from a process that imported TensorFlow. Until issue 37 item 9 they were, from a fork
server that imported it once (a standby cost a fork, not 1.3-1.4 s of a core); a user's
2-worker tests under `pytest -n 2` hung in their first collective 1 run in 3, with a cause
that 520+ soak runs did not find (docs/evidence/kit-hang/). A standby is the warm spare
tfo's own restarts use (launch/spares.py), a plain process, so the kit now starts its tasks
as tfo starts any task: an exec, with its import ahead of need. The import is taken off the
test's path by starting each replacement as a task takes a standby, not when the next test
asks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from worker_entry import forkstart, markers
from worker_entry.standby import KEEP_PRIORITY_ENV, POOL_ENV

if TYPE_CHECKING:
    from orchestrator.launch.local import LocalHandle
    from orchestrator.planning.plan import TaskPlan

# What a standby read before GO (its import, `python -m worker_entry`'s start): it must be
# the same for the task that takes it.
IMPORT_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_USE_LEGACY_KERAS",
              "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "LD_PRELOAD", "TFO_AUTO_PROGRESS")


def _import_value(key: str, value: str | None) -> str | None:
    """What the import saw: worker_entry/defaults.py gives TF_USE_LEGACY_KERAS unset a 1."""
    return "1" if key == "TF_USE_LEGACY_KERAS" and value is None else value


def same_start(task_env: Mapping[str, str], pool_env: Mapping[str, str]) -> bool:
    """Would a task with `task_env` have started and imported as a standby started with
    `pool_env` did: the same IMPORT_ENV and the same variables the interpreter, the dynamic
    loader and the C library read at a start (worker_entry.forkstart: `LD_LIBRARY_PATH`,
    where CUDA's libraries are found, a locale ...). LD_PRELOAD is the loopback shim's,
    compared on its own."""
    keys = {*IMPORT_ENV, *(k for env in (task_env, pool_env) for k in env
                           if forkstart.is_startup_var(k))} - {"LD_PRELOAD"}
    return all(_import_value(k, task_env.get(k)) == _import_value(k, pool_env.get(k))
               for k in keys)


def starts(held: int, size: int, refill: bool) -> tuple[int, int]:
    """Standbys to start as a task takes one, `held` alive: (before the take, after it).
    None held: `size` start at once (the first test), or only the taker's own where none will
    be taken after this job (`refill` off). After the take, the pool is filled to `size` again
    for the next test, or not at all."""
    before = (size if refill else 1) if held == 0 else 0
    after = max(0, size - (held + before - 1)) if refill else 0
    return before, after


@dataclass
class _Slot:
    """The stand-in task a pool standby is started as (LocalHandle reads these fields);
    `take` puts the real task in its place."""

    name: str
    command: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str
    tmp_dir: str
    gpus: list[int] = field(default_factory=list)


class WarmPool:
    """Standbys for local CPU tasks run from `workdir`; one process owns it (not threads:
    `take` and `close` hold a lock, for a Ctrl-C between them)."""

    def __init__(self, workdir: Path, size: int = 2, env: dict[str, str] | None = None) -> None:
        self.workdir, self.size = str(workdir), size
        self._env = {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                     "PYTHONPATH": self.workdir, **(env or {})}
        self._dir = tempfile.mkdtemp(prefix="tfo-pool-")  # 0700: the env files are private
        self._held: list[LocalHandle] = []
        self._made = 0
        self._built: tuple[Path | None] | None = None  # the loopback shim, once looked for
        self._lock = threading.Lock()
        self.refill = True  # replace what is taken (off: no later job takes from this pool)
        self.taken = self.cold = 0  # how many tasks it served, and how many it could not
        self.pids: list[int] = []  # every standby it started (the tests check they are gone)

    def _start(self) -> LocalHandle:
        from orchestrator.launch.local import LocalHandle

        self._made += 1
        slot = os.path.join(self._dir, f"slot-{self._made}")
        env = {**self._env, markers.STANDBY_ENV: "1", POOL_ENV: f"{slot}.json",
               KEEP_PRIORITY_ENV: "1", "TFO_JOB": "{}"}
        stand_in = _Slot(name=f"pool:{self._made}", command=[sys.executable, "-m",
                                                             "worker_entry"],
                         env=env, cwd=self.workdir, log_path=f"{slot}.log", tmp_dir=slot)
        handle = LocalHandle(stand_in, 0, standby=True, shim=self._shim())  # type: ignore[arg-type]
        self.pids.append(handle.pid)
        return handle

    def _shim(self) -> Path | None:
        """The loopback shim every standby is started with (all of them local, their whole
        cluster on this machine): built, or found, once."""
        from orchestrator.launch import loopback

        if self._built is None:
            self._built = (loopback.try_build()[0],)
        return self._built[0]

    def fill(self) -> None:
        """Start standbys up to `size` (each imports TensorFlow meanwhile)."""
        with self._lock:
            self._reap()
            self._more(self.size - len(self._held))

    def _reap(self) -> None:
        for dead in [h for h in self._held if h.poll() is not None]:
            self._held.remove(dead)
            dead.discard()

    def _more(self, n: int) -> None:
        for _ in range(n):
            self._held.append(self._start())

    def fits(self, task: TaskPlan, shim: Path | None) -> bool:
        """Can a standby serve `task`: the same command, directory and start
        (`same_start`) as it was started with, and the same loopback shim."""
        return (task.placement.kind == "local"
                and task.command == [sys.executable, "-m", "worker_entry"]
                and task.cwd == self.workdir and shim == self._shim()
                and same_start({**os.environ, **task.env}, {**os.environ, **self._env}))

    def take(self, task: TaskPlan, attempt: int, shim: Path | None) -> LocalHandle | None:
        """A standby told to run `task`'s `attempt`, and one started in its place; None
        where none fits (the caller starts the task cold)."""
        from orchestrator.launch import loopback

        with self._lock:
            if not self.fits(task, shim):
                self.cold += 1
                return None
            self._reap()
            before, after = starts(len(self._held), self.size, self.refill)
            self._more(before)
            handle = self._held.pop(0)  # the oldest: the likeliest to have imported already
            self._more(after)
        env = {**os.environ, **task.env, "TFO_ATTEMPT": str(attempt),
               markers.LIFELINE_ENV: markers.LIFELINE_STDIN}
        if shim is not None:
            env = loopback.with_preload(env, shim)
        slot = handle.task.env[POOL_ENV]  # type: ignore[attr-defined]
        os.makedirs(task.cwd, exist_ok=True)
        with open(os.open(slot, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump({"env": env, "cwd": task.cwd}, f)
        handle.task, handle.attempt = task, attempt
        handle.go()
        self.taken += 1
        return handle

    def close(self) -> None:
        """Kill every standby left and remove the pool's files."""
        with self._lock:
            for handle in self._held:
                handle.discard()
            self._held = []
        with contextlib.suppress(OSError):
            shutil.rmtree(self._dir)
