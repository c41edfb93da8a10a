"""The benchmark's job: one script, run unchanged by `tfo run` (job.script) and by hand
(`TF_CONFIG=... python bench/job.py`, as TensorFlow's multi-worker guide does).

It prints its own timeline, the same way under both, for bench/run.py to read:

    BENCH first_step <unix time>      the first training step finished
    BENCH epoch <n> <unix time>       epoch n (0-based) ended
    BENCH fit_returned <unix time>    model.fit() returned
    BENCH done <unix time>            the script is about to exit

--backup DIR: BackupAndRestore there, as TensorFlow's guide writes it. --trace_tail SECONDS:
once the last epoch ended, dump every thread's stack to stderr every SECONDS until fit()
returns (what fit() waits for when it returns late).

--fake: no TensorFlow. It listens on its TF_CONFIG port (how a script task is seen ready)
and sleeps `--step_seconds` per step: the harness's quick setting, and the "light task"
of the coordinator-CPU figures (one step of many seconds).
"""

import argparse
import faulthandler
import json
import os
import socket
import sys
import time


def say(*what: object) -> None:
    print("BENCH", *what, time.time(), flush=True)


def fake(args: argparse.Namespace) -> None:
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task") or {}
    address = config.get("cluster", {}).get(task.get("type"), [None])[int(task.get("index", 0))]
    server = socket.socket()
    if address:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", int(address.rsplit(":", 1)[1])))
        server.listen()
    for epoch in range(args.epochs):
        for step in range(args.steps_per_epoch):
            time.sleep(args.step_seconds)
            if epoch == 0 and step == 0:
                say("first_step")
        say("epoch", epoch)
    say("fit_returned")


def real(args: argparse.Namespace) -> None:
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    x, y = load_digits(return_X_y=True)
    data = tf.data.Dataset.from_tensor_slices(((x / 16.0).astype(np.float32),
                                               y.astype(np.int64)))
    data = data.shuffle(2000, seed=7).repeat().batch(64 * workers)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input(shape=(64,)),
                                     tf.keras.layers.Dense(64, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), metrics=["accuracy"],
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Timeline(tf.keras.callbacks.Callback):
        first = True

        def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001
            if self.first:
                self.first = False
                say("first_step")

        def on_epoch_end(self, epoch, logs=None):  # noqa: ANN001
            say("epoch", epoch)
            if args.trace_tail and epoch == args.epochs - 1:
                faulthandler.dump_traceback_later(args.trace_tail, repeat=True)

    callbacks = [Timeline()]
    if args.backup:
        callbacks.append(tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup))
    model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
              callbacks=callbacks, verbose=0)
    faulthandler.cancel_dump_traceback_later()
    say("fit_returned")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps_per_epoch", type=int, default=50)
    parser.add_argument("--fake", action="store_true")
    parser.add_argument("--step_seconds", type=float, default=0.01)
    parser.add_argument("--backup", default="")
    parser.add_argument("--trace_tail", type=float, default=0.0)
    args = parser.parse_args()
    (fake if args.fake else real)(args)
    say("done")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
