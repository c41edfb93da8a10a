"""Trains for a while, a step at a time, with tfo's progress callback (the live view's
tests): `--epochs 3 --steps 20 --sleep 0.05` is 3 s of steps. Prints a line with an ANSI
color and rich markup first: what a task prints must reach a terminal as text."""

import argparse
import time

import numpy as np
import tensorflow as tf

from worker_entry import progress

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--sleep", type=float, default=0.05)
args = parser.parse_args()

print("\x1b[31mRED\x1b[0m [bold red]markup[/] \x07", flush=True)


class Slow(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(args.sleep)


strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(4,)),
                                 tf.keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd", metrics=["mae"])
x = np.random.rand(16 * args.steps, 4).astype(np.float32)
model.fit(x, x.sum(axis=1), epochs=args.epochs, batch_size=16, verbose=2,
          callbacks=[progress.callback(), Slow()])
print("trained", flush=True)
