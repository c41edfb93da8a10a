"""Multi-worker training with Keras, as TensorFlow's tutorial writes it, where one worker
also runs a background job of the script's own: a Python thread that computes all the time
(statistics of a log, say), on the task named by --busy_task (TFO_TASK), started once it
has trained --busy_after seconds (a callback). The thread holds the GIL while it computes,
so it takes from that worker's training both a core and the interpreter. Without
--busy_task (and until the thread starts) every worker does the same: a balanced job.

    TF_CONFIG=... python busy_worker.py --busy_task worker:2 --busy_after 40 --steps 400
"""

import argparse
import json
import os
import threading
import time

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--busy_task", default="")
parser.add_argument("--busy_after", type=float, default=0.0)
args = parser.parse_args()


def background_job():
    total = 0
    while True:
        for i in range(100_000):
            total = (total + i * i) % 1_000_003


class BackgroundJob(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.started_at, self.running = time.time(), False

    def on_train_batch_end(self, batch, logs=None):
        if not self.running and time.time() - self.started_at >= args.busy_after:
            self.running = True
            threading.Thread(target=background_job, daemon=True).start()
            print("background job started", flush=True)


callbacks = []
if args.busy_task and os.environ.get("TFO_TASK") == args.busy_task:
    callbacks.append(BackgroundJob())


def dataset(batch_size):
    rng = np.random.default_rng(0)
    x = rng.random((4096, 64), dtype=np.float32)
    y = rng.integers(0, 10, 4096)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096).repeat().batch(batch_size)


tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(64,)),
        tf.keras.layers.Dense(256, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
                  metrics=["accuracy"])
model.fit(dataset(64 * num_workers), epochs=args.epochs, steps_per_epoch=args.steps,
          callbacks=callbacks, verbose=2)
