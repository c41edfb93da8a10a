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

Why a forked task is as sound as an exec'd one (issue 37 item 9; the measurements are
bench/forkstate.py's, in docs/evidence/kit-hang/): a fork copies a process's memory but
runs only the forking thread, so what breaks in the child is state that lives outside
that memory or that other threads were keeping: their locks and work, an event loop's
kernel objects (one epoll set or eventfd is shared by every child), writable shared
memory, and a random state seeded once for all. The server forks before any of that
exists. After TensorFlow's and tf-keras's import it has no eager context (so no thread
pool, no gRPC: they start with the task's strategy, in the task), no descriptor but its
channel and log, no writable shared mapping, and TensorFlow's random state is seeded at
its first use (each child draws its own numbers). Its only other threads are OpenBLAS's
(numpy's and scipy's builds), and OpenBLAS's pthread_atfork prepare handler
(`blas_thread_shutdown_`, seen in gdb under `__libc_fork`) joins them before every fork:
each fork, the first too, is from one thread. The server checks all of it before each
fork (`unsafe`: one thread, no eager context, no event-loop descriptor or socket but its
channel, no writable shared mapping) and refuses where anything is there (a library that
starts a thread or a loop at its import): the pool then execs its standbys as before. It
forks once after its import (`quiesce`) so that OpenBLAS's pools are joined before the
first check. The coordinator's end: orchestrator/launch/forkserver.py.
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
            if (why := unsafe()) is not None:
                raise RuntimeError(why)
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


def unsafe() -> str | None:
    """Why forking this process now could give a child a runtime it cannot use, or None.
    Each is state a fork copies without what keeps it working: another thread (its locks
    and the work it was doing), TensorFlow's started runtime (its eager context owns thread
    pools and, distributed, gRPC's completion queues), a runtime's descriptor (an epoll set
    or eventfd is one kernel object shared by every child: one child's wait takes another's
    wake-up; a socket), memory shared writable (one child's lock or counter is all of
    theirs)."""
    why = []
    if (count := threads()) != 1:
        why.append(f"{count} threads in the fork server: a fork would copy their locks "
                   "without them")
    context = sys.modules.get("tensorflow.python.eager.context")
    started = getattr(context, "_context", None)
    if started is not None and getattr(started, "_context_handle", None) is not None:
        why.append("TensorFlow's runtime started in the fork server (its eager context): a "
                   "fork would copy its thread pools' state without their threads")
    if found := runtime_fds():
        why.append(f"the fork server holds {', '.join(found)}: every child would share "
                   "one kernel object with it and each other")
    if found := shared_memory():
        why.append(f"the fork server maps {', '.join(found)} shared and writable: every "
                   "child would share it")
    return "; ".join(why) or None


def threads() -> int:
    """This process's threads, as the kernel counts them (Python's count misses C++'s)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1  # no /proc: nothing to tell by (not Linux)


_RUNTIME_FDS = ("socket:", "anon_inode:[eventpoll]", "anon_inode:[eventfd]",
                "anon_inode:[timerfd]", "anon_inode:[signalfd]", "anon_inode:[io_uring]")


def runtime_fds() -> list[str]:
    """This process's descriptors of an event loop or a connection (`fd 5 (anon_inode:
    [eventpoll])`), other than its channel to the coordinator (stdin)."""
    found = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{name}")
                if name != "0" and target.startswith(_RUNTIME_FDS):
                    found.append(f"fd {name} ({target})")
    return found


def shared_memory() -> list[str]:
    """The writable shared mappings of this process (a MAP_SHARED region, /dev/shm, memfd)."""
    found = []
    with contextlib.suppress(OSError), open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) >= 2 and fields[1][1] == "w" and fields[1][3] == "s":
                found.append(fields[5].strip() if len(fields) > 5 else f"[{fields[0]}]")
    return found


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
