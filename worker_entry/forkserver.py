"""One TensorFlow import for a whole pool: pool standbys forked from a process that has it.

    python -m worker_entry.forkserver     # stdin: a SOCK_SEQPACKET socket to the coordinator

A file of cluster tests (the pytest plugin's warm pool, orchestrator/launch/pool.py) paid a
TensorFlow import per task: 1.3-1.4 s of a core each, 80 % of the kit's CPU, on 2 cores
most of its wall time. This process imports TensorFlow and tf-keras once, as a pool standby
would (`standby.warm_up`), with the pool standbys' environment, and then forks each standby's
wrapper on request: what `python -m worker_entry` would be after its import, at the cost of
a fork.

A request is one message: JSON `{"cwd": ..., "env": {...}, "parent": PID}` with two
descriptors, the wrapper's stdin (its lifeline) and its output's write end. The answer is
`{"pid": PID}` (or `{"error": "..."}`). The wrapper is forked twice (this process forks a
child, which forks the wrapper and exits): the wrapper is re-parented to the nearest child
subreaper, the coordinator (`parent`), which can then wait for it, signal its group and read
its exit as for a process it started itself. The wrapper waits until it is the coordinator's
before it runs: its lifeline follows its parent's death (PR_SET_PDEATHSIG), which must be
the coordinator's, not the short-lived middle child's.

What a fork shares that an exec would not, and is undone here: numpy's global random state
(seeded at its import: every task would draw the same numbers; Python's `random` reseeds
itself after a fork). What is shared and left: the hash seed (every task of the pool orders
a set of strings alike) and the memory, copy-on-write.

Safe to fork only from one thread: a fork copies the memory of every thread but runs
only the caller, so a lock another thread held (malloc's, a thread pool's, gRPC's or absl's)
stays held for good in the child, and a runtime that believes its threads exist waits for
them forever. After its import TensorFlow has made no op, context, thread pool nor gRPC
channel (measured: `threading.enumerate()` and /proc/self/task after the import); the only
threads are OpenBLAS's (numpy's and scipy's), parked on a condition variable, which
OpenBLAS's own pthread_atfork handler joins before any fork. So the server forks once and
discards the child (`quiesce`: every library's atfork handler runs), then checks before each
fork that it is alone (`threads`); where it is not (a library that started a thread at its
import), it refuses, and the pool execs its standbys as before. The coordinator's end:
orchestrator/launch/forkserver.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from typing import Any, NoReturn

from worker_entry import defaults, forkstart, standby, tfimport

MAX_MESSAGE = 1 << 20  # a request: the task's environment as JSON
ADOPTED_SECONDS = 5.0  # a wrapper waits this long at most to become the coordinator's child


def main() -> None:
    defaults.apply(os.environ)
    tfimport.install()
    standby.warm_up()  # TensorFlow, tf-keras: what a pool standby imports before GO
    forkstart.preload()
    sys.stdout.flush()
    sys.stderr.flush()
    quiesce()
    server = socket.socket(fileno=0)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(server, MAX_MESSAGE, 2)
        except OSError:
            return
        if not data:
            return  # the coordinator closed its end (or is gone)
        try:
            if (count := threads()) != 1:
                raise RuntimeError(f"{count} threads in the fork server: a fork would copy "
                                   "their locks without them")
            answer: dict[str, Any] = {"pid": _fork_wrapper(json.loads(data), fds)}
        except Exception as e:  # noqa: BLE001 - told to the coordinator, which starts cold
            answer = {"error": repr(e)}
            print(f"fork server: {e}; the pool execs its standbys", file=sys.stderr,
                  flush=True)  # its log (the pool's forks.log): why the kit got slower
        finally:
            for fd in fds:
                os.close(fd)
        with contextlib.suppress(OSError):
            server.send(json.dumps(answer).encode())


def threads() -> int:
    """This process's threads, as the kernel counts them (Python's count misses C++'s)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1  # no /proc: nothing to tell by (not Linux)


def quiesce() -> None:
    """Fork once and let the child exit at once: the libraries' pthread_atfork handlers run
    (OpenBLAS joins its idle thread pools), so the first wrapper is forked from a process
    as alone as the later ones."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _fork_wrapper(request: dict[str, Any], fds: list[int]) -> int:
    """Fork twice; the wrapper's pid once the middle child is gone (the wrapper is the
    coordinator's child by then)."""
    if len(fds) != 2:
        raise ValueError(f"expected 2 descriptors, got {len(fds)}")
    stdin, out = fds
    cwd, env, parent = str(request["cwd"]), dict(request["env"]), int(request["parent"])
    wrapper_r, wrapper_w = os.pipe()  # the middle child tells the wrapper's pid on it
    middle = os.fork()
    if middle == 0:
        code = 1
        try:
            os.close(wrapper_r)
            pid = os.fork()
            if pid == 0:
                os.close(wrapper_w)
                _adopted_wrapper(cwd, env, stdin, out, parent)
            os.write(wrapper_w, str(pid).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(wrapper_w)
    with os.fdopen(wrapper_r, "rb") as f:
        told = f.read()
    os.waitpid(middle, 0)
    if not told:
        raise RuntimeError("the middle child failed to fork the wrapper")
    return int(told)


def _adopted_wrapper(cwd: str, env: dict[str, str], stdin: int, out: int,
                    parent: int) -> NoReturn:
    deadline = time.monotonic() + ADOPTED_SECONDS
    while os.getppid() != parent:  # the middle child is still exiting
        if time.monotonic() > deadline:
            os._exit(1)  # not adopted (no subreaper): nobody would wait for us
        time.sleep(0.0005)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed()  # from the OS's entropy, as numpy's import in a fresh process
    forkstart.become_wrapper(cwd, env, stdin, out)


if __name__ == "__main__":
    main()
