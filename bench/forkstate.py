"""What a forked kit task inherits (issue 37 item 9): the fork server's state at each fork.

    python bench/forkstate.py      # prints the facts; docs/evidence/kit-hang/forkstate.txt

It does what the fork server does before its first fork (worker_entry.forkserver.main:
defaults, TensorFlow and tf-keras imported as a standby would, worker_entry preloaded)
and then, without the server's `quiesce`, forks three children:

- threads: counted by Python's before-fork hook (before libc's fork() runs the libraries'
  pthread_atfork prepare handlers), in the parent after fork(), and in each child. What
  another thread could hold at the fork is what it held then.
- after each child, one BLAS call in the parent (OpenBLAS starts its pool again), so each
  fork is from a process whose pool was running, as a server's would be that computed.
- the parent's descriptors and writable shared mappings (shared with every child), whether
  TensorFlow's eager context (its thread pools, gRPC) exists, `worker_entry.forkserver.
  unsafe()`'s verdict.
- each child's first unseeded `tf.random.uniform` (a random state seeded before the fork
  would give every task the same numbers, and the same ids TensorFlow draws from it).
- the parities of bind(0) and connect() ports: an `auto` port (bind(0), odd) is never a
  connection's source port (even) until half the range is used.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tasks() -> list[str]:
    """`tid:state` of each thread of this process."""
    out = []
    for tid in sorted(os.listdir("/proc/self/task")):
        with open(f"/proc/self/task/{tid}/stat") as f:
            stat = f.read()
        out.append(f"{tid}:{stat[stat.rfind(')') + 2]}")
    return out


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    sys.path.insert(0, str(REPO))
    from worker_entry import defaults, forkserver, forkstart, standby, tfimport

    defaults.apply(os.environ)
    tfimport.install()
    standby.warm_up()
    forkstart.preload()
    log: list[tuple[str, object]] = []
    os.register_at_fork(before=lambda: log.append(("before fork()", tasks())),
                        after_in_parent=lambda: log.append(("parent after fork()", tasks())))
    import numpy as np

    for i in range(3):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            import tensorflow as tf

            draw = tf.random.uniform([2]).numpy().tolist()
            os.write(w, f"threads at its start {tasks()[:1]}, first draw {draw}".encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            log.append((f"child {i}", f.read().decode()))
        os.waitpid(pid, 0)
        np.dot(np.ones((300, 300)), np.ones((300, 300)))
        log.append(("parent after a BLAS call", tasks()))
    for what, value in log:
        print(f"{what}: {value}")
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    print("libraries with threads of their own:", sorted({
        line.split()[-1].rsplit("/", 1)[-1] for line in maps
        if any(k in line.lower() for k in ("openblas", "gomp", "libomp", "libiomp"))}))
    fds = os.listdir("/proc/self/fd")
    print("descriptors:", {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in fds
                           if os.path.exists(f"/proc/self/fd/{fd}")})
    print("shared mappings:", [line.split(maxsplit=5)[-1] for line in maps
                               if line.split()[1][3] == "s"])
    from tensorflow.python.eager import context

    started = context._context is not None and context._context._context_handle is not None
    print("TensorFlow's eager context (thread pools, gRPC) started:", started)
    print("grpc-like threads or modules:", [m for m in sys.modules if "grpc" in m.lower()])
    np.dot(np.ones((300, 300)), np.ones((300, 300)))
    print("unsafe() with OpenBLAS's pool running:", forkserver.unsafe())
    forkserver.quiesce()
    print("unsafe() after quiesce:", forkserver.unsafe())
    print("port parities, bind(0):", _parities(bound=True), "connect():",
          _parities(bound=False))


def _parities(bound: bool) -> list[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(50)
    out = []
    for _ in range(12):
        with socket.socket() as s:
            if bound:
                s.bind(("0.0.0.0", 0))
            else:
                s.connect(listener.getsockname())
            out.append(s.getsockname()[1] % 2)
    listener.close()
    return out


if __name__ == "__main__":
    main()
