"""A test job that reports what a task was given: its CUDA_VISIBLE_DEVICES, the GPUs
TensorFlow sees, and the strategy's collective implementation; then one all-reduce."""

from __future__ import annotations

import os

import tensorflow as tf

from worker_entry.context import TaskContext


def report(ctx: TaskContext) -> None:
    # TF keeps the options it was built with here; there is no public accessor.
    impl = ctx.strategy.extended._communication_options.implementation
    total = ctx.strategy.reduce(
        tf.distribute.ReduceOp.SUM, ctx.strategy.run(lambda: tf.constant(1.0)), axis=None)
    print(f"[devices] {ctx.task} CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} "
          f"gpus_seen={len(tf.config.list_physical_devices('GPU'))} collective={impl.value} "
          f"all_reduce={float(total)}", flush=True)
