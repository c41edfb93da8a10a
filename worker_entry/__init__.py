"""What runs inside every task: `python -m worker_entry`, configured by the environment.

The coordinator sets TF_CONFIG, TFO_TASK and TFO_JOB; this package reads them, builds the
strategy for the task's role, and calls the job's `module:function` with a TaskContext.
Importing this package does not import TensorFlow (the coordinator reads `markers`).

Where things are:

- the protocol both sides import: `markers` (roles, markers, exit codes), `channel` (the
  wrapper's frames);
- the two processes of a task: `lifeline/` (the wrapper and the task's prologue; its
  docstring has the design), with
  `proctree`, `usage`, `listen`, `title`;
- the task's work: `runner`, `context` (the entry API, `TaskContext`), `backup`, `standby`;
- what the task tells without the job's help: `progress/`, `joined`, `checkpoints`, with
  `tfimport` (hooks on TensorFlow's import) and `defaults`; `faults` for tests;
- a lab host's agent and its forks: `agent`, `frames`, `forkstart`, `portlocks`.
"""
