"""Keras training that reads its data a shard per epoch, as a script whose data set does not
fit in memory might: shard-0.npz and shard-1.npz are there, shard-2.npz is not, so the third
epoch fails with FileNotFoundError. It knows nothing of tfo."""

import argparse
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--data_dir", required=True)
parser.add_argument("--epochs", type=int, default=5)
args = parser.parse_args()


def load_shard(epoch):
    with np.load(os.path.join(args.data_dir, f"shard-{epoch}.npz")) as shard:
        return shard["x"], shard["y"]


class ShardLoader(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        load_shard(epoch)


os.makedirs(args.data_dir, exist_ok=True)
for i in range(2):
    x = np.random.rand(64, 4).astype(np.float32)
    np.savez(os.path.join(args.data_dir, f"shard-{i}.npz"), x=x, y=x.sum(axis=1))

x, y = load_shard(0)
model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(4,)),
                             tf.keras.layers.Dense(1)])
model.compile(loss="mse", optimizer="sgd")
model.fit(x, y, epochs=args.epochs, batch_size=16, verbose=2, callbacks=[ShardLoader()])
