"""Multi-worker training with Keras, as TensorFlow's tutorial writes it, whose input pipeline
is slow on one worker: its `map` runs a Python function (tf.py_function, as a script that
decodes or augments in Python does) that sleeps a few ms per element on the task named by
--slow_task, as a slow disk or a busy host would make it. --busy_task: that task runs a
thread that hashes all the time (a background job of the script's own), which takes CPU from
its training. Everything else is the tutorial's.

    TF_CONFIG=... python slow_input.py --slow_task worker:1 --sleep_ms 5 --steps 300
"""

import argparse
import hashlib
import json
import os
import threading
import time

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--slow_task", default="")
parser.add_argument("--sleep_ms", type=float, default=5.0)
parser.add_argument("--busy_task", default="")
parser.add_argument("--busy_threads", type=int, default=2)
args = parser.parse_args()

tf_config = json.loads(os.environ["TF_CONFIG"])
me = "%s:%d" % (tf_config["task"]["type"], tf_config["task"]["index"])
slow = me == args.slow_task


def busy():
    data = b"x" * (1 << 22)
    while True:
        hashlib.sha256(data).digest()  # releases the GIL: it takes a core, not the GIL


if me == args.busy_task:
    for _ in range(args.busy_threads):
        threading.Thread(target=busy, daemon=True).start()


def decode(x, y):
    if slow:
        time.sleep(args.sleep_ms / 1000.0)
    return x, y


def dataset(batch_size):
    rng = np.random.default_rng(0)
    x = rng.random((4096, 64), dtype=np.float32)
    y = rng.integers(0, 10, 4096)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    ds = ds.map(lambda a, b: tf.py_function(decode, [a, b], [tf.float32, tf.int64]))
    ds = ds.map(lambda a, b: (tf.ensure_shape(a, [64]), tf.ensure_shape(b, [])))
    return ds.batch(batch_size)


strategy = tf.distribute.MultiWorkerMirroredStrategy()
num_workers = sum(len(tf_config["cluster"].get(role, [])) for role in ("chief", "worker"))
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.1))
model.fit(dataset(32 * num_workers), epochs=1, steps_per_epoch=args.steps, verbose=2)
