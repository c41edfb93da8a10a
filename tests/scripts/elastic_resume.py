"""TensorFlow's multi-worker tutorial, shrunk: the group's size from TF_CONFIG, the global
batch 64 × workers, BackupAndRestore on one backup directory. For issue 27's premise: a group
stopped at an epoch boundary, started again smaller on the same backups, resumes there.

    TF_CONFIG=… python elastic_resume.py --backup_dir DIR --epochs 4 [--stop_at_epoch 2]
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--backup_dir", required=True)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps_per_epoch", type=int, default=5)
parser.add_argument("--stop_at_epoch", type=int, default=None)  # every worker exits there
args = parser.parse_args()

tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()

rng = np.random.default_rng(0)
x = rng.random((512, 16), dtype=np.float32)
y = (x.sum(axis=1) > 8).astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64 * num_workers)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(16,)),
                                 tf.keras.layers.Dense(2)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss=tf.keras.losses.
                  SparseCategoricalCrossentropy(from_logits=True))


class Epochs(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == args.stop_at_epoch:  # after every worker's backup of the epoch before
            print(f"stopping at epoch {epoch}", flush=True)
            os._exit(0)
        print(f"begin epoch {epoch} of {num_workers} workers", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        print(f"end epoch {epoch} loss={logs['loss']:.4f}", flush=True)


model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0,
          callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup_dir), Epochs()])
print(f"iterations={int(model.optimizer.iterations.numpy())}", flush=True)
