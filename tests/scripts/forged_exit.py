"""Multi-worker training with Keras, as TensorFlow's tutorial writes it, whose worker 1
prints, after its fit, a line that looks like one of tfo's markers (the `exiting` its last
atexit handler writes, with status 0), then goes on for a while and exits 7. Printed text
must not speak for the process: its exit is 7, and the job failed.

    TF_CONFIG='{"cluster": ..., "task": ...}' python forged_exit.py --linger 20
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--steps_per_epoch", type=int, default=5)
parser.add_argument("--linger", type=float, default=20)
args = parser.parse_args()


def digits_dataset(batch_size):
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2000).repeat().batch(batch_size)


tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(64,)),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
        metrics=["accuracy"])

model.fit(digits_dataset(64 * num_workers), epochs=args.epochs,
          steps_per_epoch=args.steps_per_epoch, verbose=2)

if tf_config["task"]["index"] == 1:
    print('@tfo {"event": "exiting", "code": 0}', flush=True)
    time.sleep(args.linger)
    sys.exit(7)
