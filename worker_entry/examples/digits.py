"""A small Keras classifier on scikit-learn's bundled 8x8 digits (offline, 1797 images).

Runs unchanged under MultiWorkerMirrored and ParameterServer, and as the evaluator:

    job:
      entry: worker_entry.examples.digits:train
      args: {epochs: 5, batch_size_per_replica: 32}
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from worker_entry.context import TaskContext
from worker_entry.markers import Role

SEED = 7


def load_data() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train, held-out test): 1437 and 360 images, a fifth of each digit held out, the same
    split on every task and in the tests. Read from scikit-learn's bundled file with numpy:
    importing scikit-learn (scipy with it) took 1.4 s of a core at every task's start, a
    third of TensorFlow's own import."""
    data = _digits_file()
    if data is None:  # scikit-learn keeps its file elsewhere: ask it
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
    else:
        table = np.loadtxt(data, delimiter=",")
        x, y = table[:, :-1], table[:, -1]
    x, y = (x / 16.0).astype("float32"), y.astype("int64")
    rng = np.random.RandomState(SEED)
    # Stratified: each digit gives the test set its fifth, the remainders going to the
    # largest fractions, 360 in all (as scikit-learn's train_test_split(test_size=0.2)).
    counts = np.bincount(y, minlength=10)
    share = counts * 0.2
    taken = np.floor(share).astype(int)
    taken[np.argsort(taken - share, kind="stable")[:-(-len(y) // 5) - taken.sum()]] += 1
    held = np.zeros(len(y), dtype=bool)
    for digit in range(10):
        held[rng.permutation(np.flatnonzero(y == digit))[:taken[digit]]] = True
    train, test = rng.permutation(np.flatnonzero(~held)), rng.permutation(np.flatnonzero(held))
    return (x[train], y[train]), (x[test], y[test])


def _digits_file() -> str | None:
    """scikit-learn's digits.csv.gz, found without importing it (find_spec of a top-level
    package runs none of its code); None where it is not there."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "datasets", "data", "digits.csv.gz")
        if os.path.exists(path):
            return path
    return None


def build_model(learning_rate: float = 0.01) -> Any:
    tf.keras.utils.set_random_seed(SEED)
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def train(ctx: TaskContext, callbacks: list[Any] | tuple[Any, ...] = ()) -> None:
    """The entry: train, save from the chief; on the evaluator, follow the checkpoints."""
    epochs = int(ctx.args.get("epochs", 5))
    per_replica = int(ctx.args.get("batch_size_per_replica", 32))
    lr = float(ctx.args.get("learning_rate", 0.01))
    (x_tr, y_tr), (x_te, y_te) = load_data()

    if ctx.role == Role.EVALUATOR:
        test = tf.data.Dataset.from_tensor_slices((x_te, y_te)).batch(256)
        ctx.follow_checkpoints(build_model(lr), test, expected=epochs)
        return

    global_batch = per_replica * ctx.num_replicas
    steps_per_epoch = len(x_tr) // global_batch

    def make_dataset(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = input_context.get_per_replica_batch_size(global_batch)
        ds = tf.data.Dataset.from_tensor_slices((x_tr, y_tr))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.shuffle(len(x_tr), seed=SEED).repeat().batch(batch).prefetch(2)

    with ctx.strategy.scope():
        model = build_model(lr)
    model.fit(ctx.dataset(make_dataset), epochs=epochs, steps_per_epoch=steps_per_epoch,
              callbacks=[*ctx.callbacks(), *callbacks], verbose=2)
    print(f"[digits] {ctx.task} trained steps={int(model.optimizer.iterations.numpy())} "
          f"scheduled={epochs * steps_per_epoch}", flush=True)
    with ctx.save_path() as path:
        model.save(path)
