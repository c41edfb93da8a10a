"""tf-orchestrator: bring up, watch, restart and tear down multi-process TensorFlow jobs.

The coordinator side never imports TensorFlow. The flow of one run:
cluster file → spec.ClusterSpec → plan.Plan → launch.TaskHandle → supervise.RunResult.
"""

__version__ = "0.1.0"

__all__ = ["Result", "TaskResult", "run"]


def __getattr__(name: str) -> object:
    """`orchestrator.run` and its result types, imported at first use (PEP 562): `import
    orchestrator` (the CLI, a task's lab host) loads nothing more."""
    if name in __all__:
        from orchestrator import api

        return getattr(api, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
