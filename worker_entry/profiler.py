"""TensorFlow's profiler service in every training task, so that `tfo profile` can capture
them all at once without a line of the job's code.

    profiler.serve()   # in the task (runner.main), before the job's code runs

The plan gives each training task a port of its own (TFO_PROFILER_PORT, on the task's host;
`profiler: false` in the cluster file gives none). The service is started once TensorFlow is
imported in the task, whoever imports it (the job's code, an entry's runner, a warm spare
before its GO: then at once, here), never by importing it
ourselves: a task that never imports TensorFlow costs nothing. It is
`tf.profiler.experimental.server.start`, a gRPC server that answers TensorFlow's profiler
client (`tf.profiler.experimental.client.trace`, TensorBoard's Capture Profile, xprof's
`trace`); it binds every interface as the task's own server does, and the loopback shim keeps
both on the loopback in an all-local job (orchestrator/launch/loopback.py). Between two
captures it only waits on its socket: its cost on throughput is in bench/profiler.py.

TensorFlow's server only logs when it cannot bind its port (profiler_server.cc: `Unable to
bind`), and then serves nothing. So the port is tried first: one held by another process is
said in the task's log (`tfo profile` names the task that did not answer) and the task
trains on without a profiler.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from types import ModuleType

from worker_entry import tfimport

ENV = "TFO_PROFILER_PORT"


def serve(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Start the service once TensorFlow is imported (at once if it is already)."""
    port = environ.get(ENV, "").strip()
    if not port.isdigit():
        return
    tfimport.after_import("tensorflow", lambda tf: _start(tf, int(port)))


def taken(port: int) -> str | None:
    """Why the port cannot be ours (another process listens there), or None: free now."""
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here: the IPv4 try decides
        try:
            s.bind((addr, port))
            return None
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return "in use by another process"
            if family == socket.AF_INET6:
                continue
            return os.strerror(e.errno or 0) or str(e)
        finally:
            s.close()
    return None


def _start(tf: ModuleType, port: int) -> None:
    why = taken(port)
    if why is None:
        try:
            tf.profiler.experimental.server.start(port)
            return
        except Exception as e:  # noqa: BLE001 - another TensorFlow: the task trains on
            why = f"{type(e).__name__}: {e}"
    print(f"[tfo] profiler: port {port} {why}; this task has no profiler (tfo profile "
          "cannot capture it)", file=sys.stderr, flush=True)
