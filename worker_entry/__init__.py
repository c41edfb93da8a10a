"""What runs inside every task: `python -m worker_entry`, configured by the environment.

The coordinator sets TF_CONFIG, TFO_TASK and TFO_JOB; this package reads them, builds the
strategy for the task's role, and calls the job's `module:function` with a TaskContext.
Importing this package does not import TensorFlow (the coordinator reads `markers`).
"""
