"""`python -m worker_entry`: a task, as every backend starts it. The hooks go in first
(before anything imports TensorFlow), then lifeline.start forks the task from its wrapper,
and the task runs the role's work (runner.main), telling its exit code as it ends."""

import os
import sys

from worker_entry import defaults, faults, joined, tfimport
from worker_entry.progress import auto as autoprogress

defaults.apply(os.environ)  # before anything imports TensorFlow: tf-keras, gRPC's backoff
tfimport.install()  # TensorFlow's import, whoever makes it (a standby first), without the gc
autoprogress.install()  # Keras's fit and tf.function loops report, once the job imports them
joined.install()  # each strategy (or DTensor mesh) the job builds tells the cluster it joined
faults.install()  # a test's kill=/preempt=/stall= (TFO_FAULTS), at an epoch or step

from worker_entry.lifeline import prologue, start  # noqa: E402

start.wrap()  # the wrapper stays in there for good; the task, a child, goes on

from worker_entry.runner import main  # noqa: E402

# The task's exit code, told in its `exiting` marker (prologue.exiting_with): TensorFlow's
# teardown may hang after it, and the coordinator then stops the task without seeing it.
try:
    code = main()
except SystemExit as e:
    prologue.exiting_with(e.code)
    raise
except Exception:
    prologue.exiting_with(1)  # an uncaught exception: Python exits 1 (Ctrl-C: by SIGINT)
    raise
prologue.exiting_with(code)
sys.exit(code)
