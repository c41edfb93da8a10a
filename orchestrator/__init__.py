"""tf-orchestrator: bring up, watch, restart and tear down multi-process TensorFlow jobs.

The coordinator side never imports TensorFlow. The flow of one run:
cluster file → spec.ClusterSpec → plan.Plan → launch.TaskHandle → supervise.RunResult.
"""

__version__ = "0.1.0"

__all__ = ["Result", "TaskResult", "run"]


def __getattr__(name: str):  # noqa: ANN202 - `import orchestrator` stays light (PEP 562)
    if name in __all__:
        from orchestrator import api

        return getattr(api, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
