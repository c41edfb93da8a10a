"""The benchmark's job: one script, run unchanged by `tfo run` (job.script) and by hand
(`TF_CONFIG=... python bench/job.py`, as TensorFlow's multi-worker guide does).

It prints its own timeline, the same way under both, for bench/run.py to read:

    BENCH importing <unix time>       about to import numpy, TensorFlow, scikit-learn
    BENCH tf_imported <unix time>     TensorFlow (and the script's other imports) loaded
    BENCH strategy_built <unix time>  MultiWorkerMirroredStrategy() returned
    BENCH first_step <unix time>      the first training step finished
    BENCH epoch <n> <unix time>       epoch n (0-based) ended
    BENCH fit_returned <unix time>    model.fit() returned
    BENCH done <unix time>            the script is about to exit

--keep_locals: fit()'s locals (its dataset iterator) stay referenced until the process ends.
--backup DIR: BackupAndRestore there, as TensorFlow's guide writes it. --trace_tail SECONDS:
once the last epoch ended, dump every thread's stack to stderr every SECONDS until fit()
returns, and profile every call from then on: each call (Python or C) that took over 1 s
is printed as `BENCH slow_call <seconds> <function> <where>` (what fit() waits for).

--pin: one core per task (task index modulo the cores this process may use) and one
TensorFlow intra-op thread, set before TensorFlow is imported. Two workers that each spread
over both cores of a 2-core machine make the paired figures swing by ±50 % from run to run;
the same flag in both arms keeps the comparison fair.

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


class SlowCalls:
    """sys.setprofile hook: every call that takes over `limit` seconds, innermost first."""

    def __init__(self, limit: float = 1.0) -> None:
        self.limit, self.stack, self.slow = limit, [], []

    def __call__(self, frame, event, arg):  # noqa: ANN001
        if event in ("call", "c_call"):
            name = getattr(arg, "__qualname__", None) or repr(arg) if event == "c_call" \
                else frame.f_code.co_qualname
            self.stack.append((time.monotonic(), name,
                               f"{frame.f_code.co_filename}:{frame.f_lineno}"))
        elif event in ("return", "c_return", "c_exception") and self.stack:
            start, name, where = self.stack.pop()
            if time.monotonic() - start > self.limit:
                self.slow.append((time.monotonic() - start, name, where))

    def report(self) -> None:
        for took, name, where in self.slow:
            print(f"BENCH slow_call {took:.2f} {name} {where}", flush=True)


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


def pin() -> None:
    task = (json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {})
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[int(task.get("index", 0)) % len(cores)]})
    for var in ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = "1"


def real(args: argparse.Namespace) -> None:
    say("importing")
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    say("tf_imported")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    say("strategy_built")
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

        def on_train_end(self, logs=None):  # noqa: ANN001
            # fit()'s locals outlive its return here, then go one by one: which one's end waits?
            frame = sys._getframe()
            while (args.trace_tail or args.keep_locals) and frame and frame.f_code.co_name != "fit":
                frame = frame.f_back
            if (args.trace_tail or args.keep_locals) and frame:
                kept.update(frame.f_locals)

        def on_epoch_end(self, epoch, logs=None):  # noqa: ANN001
            say("epoch", epoch)
            if args.trace_tail and epoch == args.epochs - 1:
                faulthandler.dump_traceback_later(args.trace_tail, repeat=True)
                sys.setprofile(slow)

    slow, kept = SlowCalls(), {}
    callbacks = [Timeline()]
    if args.backup:
        callbacks.append(tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup))
    model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
              callbacks=callbacks, verbose=0)
    sys.setprofile(None)
    faulthandler.cancel_dump_traceback_later()
    say("fit_returned")
    slow.report()
    if args.keep_locals:  # the workaround under test: fit's locals live until the process ends
        return
    for name in list(kept):
        start = time.monotonic()
        del kept[name]
        if time.monotonic() - start > 0.5:
            took = time.monotonic() - start
            print(f"BENCH slow_free {took:.2f} fit's local {name!r}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps_per_epoch", type=int, default=50)
    parser.add_argument("--fake", action="store_true")
    parser.add_argument("--step_seconds", type=float, default=0.01)
    parser.add_argument("--backup", default="")
    parser.add_argument("--trace_tail", type=float, default=0.0)
    parser.add_argument("--keep_locals", action="store_true")
    parser.add_argument("--pin", action="store_true")
    args = parser.parse_args()
    if args.pin:
        pin()
    (fake if args.fake else real)(args)
    say("done")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
