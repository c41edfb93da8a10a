"""tf-orchestrator: bring up, watch, restart and tear down multi-process TensorFlow jobs.

The coordinator side never imports TensorFlow. The flow of one run:
cluster file → spec.ClusterSpec → plan.Plan → launch.TaskHandle → supervise.RunResult.
"""

__version__ = "0.1.0"
