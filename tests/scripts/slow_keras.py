"""One-process Keras training (MirroredStrategy: no TF_CONFIG, no port) whose steps are slow
and whose first step is slower still, as a big model's are: its input keeps a core busy
--first_seconds for the first batch (as a first step's compilation would) and --step_seconds
for each after. It knows nothing of tfo."""

import argparse
import time

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps_per_epoch", type=int, default=2)
parser.add_argument("--first_seconds", type=float, default=8.0)
parser.add_argument("--step_seconds", type=float, default=1.5)
args = parser.parse_args()
batches = 0


def work():
    """Busy, not asleep: a slow step computes."""
    global batches
    batches += 1
    until = time.monotonic() + (args.first_seconds if batches == 1 else args.step_seconds)
    while time.monotonic() < until:
        pass
    return batches


def heavy(x, y):
    with tf.control_dependencies([tf.py_function(work, [], tf.int64)]):
        return tf.identity(x), y


strategy = tf.distribute.MirroredStrategy()
x = np.random.rand(64, 4).astype(np.float32)
data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1))).repeat().batch(16).map(heavy)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(4,)),
                                 tf.keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")
model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2)
