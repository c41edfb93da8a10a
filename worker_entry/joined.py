"""Which cluster the task's strategy joined, told to tfo: a `joined` marker each time the
task builds a distribution strategy or initializes DTensor.

    joined.install()   # in the task, before any of its code runs (worker_entry/__main__)

A launcher's whole point is that its tasks train together; a script that ignores TF_CONFIG
(builds `MirroredStrategy`, no strategy, its own in-process cluster, DTensor without its
variables) trains alone in every process and exits 0 all the same. The coordinator compares
what each task says it joined with the plan's cluster (orchestrator/loop/joined.py); this side
only tells the facts, read from the strategy once built:

- a `tf.distribute` strategy (every class TensorFlow defines: MultiWorkerMirrored and its
  experimental and V1 variants, ParameterServer, Mirrored, OneDevice, CentralStorage, TPU):
  `via` its public name, `cluster` its cluster resolver's cluster spec (none: {}), `member`
  the resolver's task type and id;
- DTensor (`dtensor.initialize_accelerator_system` and its aliases): `clients`, `client`,
  and `cluster` {DTENSOR_JOB_NAME: DTENSOR_JOBS} as dtensor.config read them;
- `in_process`: the addresses of that cluster served by a `tf.distribute.Server` this very
  process started (TensorFlow's ParameterServer tutorial's `create_in_process_cluster`).

What it cannot see: a strategy of another library (a custom class not derived from
tf.distribute.Strategy, JAX, PyTorch) tells nothing, which the coordinator takes as no
strategy. Nothing is imported here: the hook waits for the script's own import of TensorFlow.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from worker_entry import markers, tfimport

# TensorFlow's class names for its strategies, by the name a user writes.
_PUBLIC = {
    "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy",
    "_CollectiveAllReduceStrategyExperimental": "MultiWorkerMirroredStrategy",
    "CollectiveAllReduceStrategyV1": "MultiWorkerMirroredStrategy",
    "ParameterServerStrategyV2": "ParameterServerStrategy",
    "ParameterServerStrategyV1": "ParameterServerStrategy",
    "MirroredStrategyV1": "MirroredStrategy",
    "OneDeviceStrategyV1": "OneDeviceStrategy",
    "CentralStorageStrategyV1": "CentralStorageStrategy",
    "TPUStrategyV1": "TPUStrategy",
    "TPUStrategyV2": "TPUStrategy",
}
# DTensor's set-up, under each name TensorFlow exports it by.
_DTENSOR_INITS = ("initialize_accelerator_system", "initialize_tpu_system",
                  "initialize_multi_client")

_served: set[str] = set()  # addresses a tf.distribute.Server of this process serves
_local = threading.local()  # .depth: a strategy's __init__ under way (a subclass's super())


def install() -> None:
    tfimport.after_import("tensorflow", _hook_all)


def _hook_all(tf: ModuleType) -> None:
    for hook in (_hook_strategies, _hook_servers, _hook_dtensor):
        try:
            hook(tf)
        except Exception as e:  # noqa: BLE001  another TensorFlow costs the check, not the import
            print(f"[tfo] cannot tell tfo which cluster this task joins ({hook.__name__}): "
                  f"{e!r}", file=sys.stderr, flush=True)


def _hook_strategies(tf: ModuleType) -> None:
    from tensorflow.python.distribute import distribute_lib

    base = distribute_lib.StrategyBase
    skip = {distribute_lib.Strategy, distribute_lib.StrategyV1}
    seen: set[type] = set()
    todo = list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        # The default strategy is what a script that builds none has: no join.
        if cls in skip or cls.__name__.startswith("_Default") or "__init__" not in vars(cls):
            continue
        init = cls.__init__
        if not getattr(init, "_tfo_wrapped", False):
            cls.__init__ = _told(init)  # type: ignore[misc]


def _told(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def run(self: Any, *args: Any, **kwargs: Any) -> None:
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        try:
            init(self, *args, **kwargs)
        finally:
            _local.depth = depth
        if depth == 0:  # the outermost: the strategy is built
            _tell(_strategy_fields(self))
    run._tfo_wrapped = True  # type: ignore[attr-defined]
    return run


def _strategy_fields(strategy: Any) -> dict[str, Any]:
    name = type(strategy).__name__
    via = _PUBLIC.get(name, name)
    try:
        resolver = strategy.cluster_resolver
    except Exception:  # noqa: BLE001  a strategy without one
        resolver = None
    if resolver is None:  # ParameterServerStrategyV2 keeps it without the property
        resolver = getattr(strategy, "_cluster_resolver", None)
    if resolver is None:
        return {"via": via, "cluster": {}, "member": None}
    cluster = _as_lists(resolver.cluster_spec().as_dict())
    task_type, task_id = getattr(resolver, "task_type", None), getattr(resolver, "task_id", None)
    member = f"{task_type}:{task_id or 0}" if task_type else None
    return {"via": via, "cluster": cluster, "member": member}


def _as_lists(cluster: dict[str, Any]) -> dict[str, list[str]]:
    """A cluster spec's jobs as lists of addresses (a sparse job, a dict by index, in order)."""
    return {str(job): [str(tasks[i]) for i in sorted(tasks)] if isinstance(tasks, dict)
            else [str(t) for t in tasks] for job, tasks in cluster.items()}


def _tell(fields: dict[str, Any]) -> None:
    addresses = {a for tasks in fields["cluster"].values() for a in tasks}
    markers.emit(markers.JOINED, **fields, in_process=sorted(addresses & _served))


def _hook_servers(tf: ModuleType) -> None:
    """Every tf.distribute.Server this process starts: its own address in its cluster."""
    from tensorflow.python.training import server_lib

    init = server_lib.Server.__init__
    if getattr(init, "_tfo_wrapped", False):
        return

    @functools.wraps(init)
    def run(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            sd = self.server_def
            for job in sd.cluster.job:
                if job.name == sd.job_name and sd.task_index in job.tasks:
                    _served.add(job.tasks[sd.task_index])
        except Exception:  # noqa: BLE001, S110  the check loses one server, nothing else
            pass
    run._tfo_wrapped = True  # type: ignore[attr-defined]
    server_lib.Server.__init__ = run  # type: ignore[method-assign]


def _hook_dtensor(tf: ModuleType) -> None:
    """DTensor's set-up, wherever a script finds it: its module and TensorFlow's API
    modules re-export the same function (tf.experimental.dtensor, its compat.v2 twin)."""
    from tensorflow.dtensor.python import accelerator_util

    originals = {name: getattr(accelerator_util, name) for name in _DTENSOR_INITS
                 if hasattr(accelerator_util, name)}
    wrapped = {id(f): _dtensor_told(f) for f in set(originals.values())
               if not getattr(f, "_tfo_wrapped", False)}
    modules = [accelerator_util, *(m for n, m in list(sys.modules.items())
                                   if n.startswith("tensorflow._api.") and n.endswith(".dtensor"))]
    for module in modules:
        for name in _DTENSOR_INITS:
            f = getattr(module, name, None)
            if f is not None and id(f) in wrapped:
                setattr(module, name, wrapped[id(f)])


def _dtensor_told(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def run(*args: Any, **kwargs: Any) -> Any:
        result = init(*args, **kwargs)
        from tensorflow.dtensor.python import config

        jobs = config.jobs()
        _tell({"via": "DTensor", "cluster": {config.job_name(): jobs} if jobs else {},
               "member": f"{config.job_name()}:{config.client_id()}",
               "clients": config.num_clients(), "client": config.client_id()})
        return result
    run._tfo_wrapped = True  # type: ignore[attr-defined]
    return run
