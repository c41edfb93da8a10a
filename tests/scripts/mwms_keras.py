"""Multi-worker training with Keras, as TensorFlow's tutorial writes it
(tensorflow.org/tutorials/distribute/multi_worker_with_keras), on scikit-learn's digits
instead of MNIST (no download). It knows nothing of tfo: it reads TF_CONFIG, builds its own
strategy, fits with BackupAndRestore, and saves with the chief / temporary-directory pattern.

    TF_CONFIG='{"cluster": ..., "task": ...}' python mwms_keras.py --model_path /tmp/keras-model
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps_per_epoch", type=int, default=20)
parser.add_argument("--model_path", default="/tmp/keras-model")
# Under tfo, by default, the task's own directory, as docs/guide/scripts.md suggests.
parser.add_argument("--backup_dir", default=os.environ.get("TFO_BACKUP_DIR", "/tmp/backup"))
args = parser.parse_args()


def digits_dataset(batch_size):
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2000).repeat().batch(batch_size)


def build_and_compile_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
        metrics=["accuracy"])
    return model


per_worker_batch_size = 64
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = digits_dataset(global_batch_size)

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = build_and_compile_model()

callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup_dir)]
multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs,
                       steps_per_epoch=args.steps_per_epoch, callbacks=callbacks, verbose=2)


def _is_chief(task_type, task_id):
    # Note: there are two possible `TF_CONFIG` configurations.
    #   1) In addition to `worker` tasks, a `chief` task type is use;
    #      in this case, this function should be modified to
    #      `return task_type == 'chief'`.
    #   2) Only `worker` task type is used; in this case, worker 0 is
    #      regarded as the chief. The implementation demonstrated here
    #      is for this case.
    # For the purpose of this Colab section, the `task_type` is `None` case
    # is added because it is effectively run with only a single worker.
    return (task_type == "worker" and task_id == 0) or task_type is None


def _get_temp_dir(dirpath, task_id):
    base_dirpath = "workertemp_" + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


task_type, task_id = (strategy.cluster_resolver.task_type,
                      strategy.cluster_resolver.task_id)
write_model_path = write_filepath(args.model_path, task_type, task_id)

multi_worker_model.save(write_model_path)

if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(os.path.dirname(write_model_path))
