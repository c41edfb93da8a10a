"""The tf.data service's servers, run by tfo with no user code: a task of role `dispatcher` or
`data_worker` (orchestrator/planning/strategy.py DATA_SERVICE) serves until it is stopped.

    dispatcher:  DispatchServer(port, work_dir=<run dir>/dataservice, fault_tolerant_mode)
    data_worker: WorkerServer(dispatcher_address, worker_address=<its host>:<port>, port)

The plan gives each its `listen` address (the host the trainers reach, the plan's port) and
the dispatcher's `work_dir` in TFO_JOB, and every task the dispatcher's address as
TFO_DATA_SERVICE (grpc://host:port). The dispatcher journals its state in its work
directory (fault-tolerant mode): restarted, it reads it back, and its workers and the
trainers reconnect to the same address. A data worker registers with the dispatcher (and
keeps trying while the dispatcher is down); restarted, it comes back at the same address.
Both say READY once serving, as a ps does.
"""

from __future__ import annotations

import os
from typing import Any

from worker_entry import markers
from worker_entry.markers import Role

DATA_SERVICE_ENV = "TFO_DATA_SERVICE"  # as orchestrator/planning/plan.py sets it


def _port(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


def serve(tf: Any, role: str, job: dict[str, Any]) -> int:
    """Start the role's server from TFO_JOB's `listen` and `work_dir`; serve until stopped."""
    service = tf.data.experimental.service
    listen = job["listen"]
    if role == Role.DISPATCHER:
        work_dir = os.path.expanduser(job["work_dir"])
        os.makedirs(work_dir, exist_ok=True)
        server = service.DispatchServer(service.DispatcherConfig(
            port=_port(listen), work_dir=work_dir, fault_tolerant_mode=True))
        markers.emit(markers.READY, what="serving", target=server.target)
    else:
        dispatcher = os.environ[DATA_SERVICE_ENV].split("://", 1)[-1]
        server = service.WorkerServer(service.WorkerConfig(
            dispatcher_address=dispatcher, worker_address=listen, port=_port(listen)))
        markers.emit(markers.READY, what="serving", target=f"grpc://{listen}")
    server.join()
    return 0
