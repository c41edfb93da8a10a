"""Entries for the test kit's tests (tests/test_kit.py): small, a few seconds each."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from worker_entry.context import TaskContext


def allreduce_ones(ctx: TaskContext) -> float:
    """5 steps of an all-reduce of one 1.0 per replica: the sum is the replica count."""
    strategy = ctx.strategy

    @tf.function
    def step() -> tf.Tensor:
        return strategy.run(lambda: tf.constant(1.0))

    for _ in range(5):
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, step(), axis=None)
    return float(total)


def fit_epochs(ctx: TaskContext) -> dict:
    """A tiny Keras fit of `epochs` (default 3) epochs of 4 steps, with tfo's progress
    callback (epoch and progress markers: where the fault helpers strike)."""
    epochs = int(ctx.args.get("epochs", 3))
    with ctx.strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
        model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((64, 4), "float32"), np.ones((64, 1), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
    history = model.fit(data, epochs=epochs, steps_per_epoch=4, verbose=0,
                        callbacks=ctx.callbacks(backup=False, checkpoints=False))
    return {"epochs": len(history.history["loss"]), "attempt": ctx.attempt}


def big_value() -> list[int]:
    """More than a done marker may carry: the value does not come back, the job succeeds."""
    return list(range(100_000))
