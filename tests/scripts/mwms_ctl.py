"""Multi-worker training with a custom training loop, as TensorFlow's tutorial writes it
(tensorflow.org/tutorials/distribute/multi_worker_with_ctl), on scikit-learn's digits
instead of MNIST. It knows nothing of tfo: `strategy.run`, a tf.train.CheckpointManager
written with the chief / temporary-directory pattern, restored on start (by default under
`multiprocessing.util.get_temp_dir()`, as the tutorial keeps it). One change: its loss is
not divided by zero batches when it resumes (the tutorial's own would fail there).
"""

import argparse
import json
import os
from multiprocessing import util

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps_per_epoch", type=int, default=20)
# The tutorial's own: a new temporary directory per process, which no restart finds again.
parser.add_argument("--checkpoint_dir", default=os.path.join(util.get_temp_dir(), "ckpt"))
parser.add_argument("--model_path", default="/tmp/ctl-model")
args = parser.parse_args()


def digits_dataset(batch_size):
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2000).repeat()


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = digits_dataset(batch_size)
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    return dataset


def build_model():
    return tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


per_worker_batch_size = 64
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
global_batch_size = per_worker_batch_size * num_workers
num_epochs = args.epochs
num_steps_per_epoch = args.steps_per_epoch

strategy = tf.distribute.MultiWorkerMirroredStrategy()

with strategy.scope():
    multi_worker_dataset = strategy.distribute_datasets_from_function(
        lambda input_context: dataset_fn(global_batch_size, input_context))
    multi_worker_model = build_model()
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


@tf.function
def train_step(iterator):
    """Training step function."""

    def step_fn(inputs):
        """Per-Replica step function."""
        x, y = inputs
        with tf.GradientTape() as tape:
            predictions = multi_worker_model(x, training=True)
            per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=tf.keras.losses.Reduction.NONE)(y, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss,
                                              global_batch_size=global_batch_size)
        grads = tape.gradient(loss, multi_worker_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))
        train_accuracy.update_state(y, predictions)
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


checkpoint_dir = args.checkpoint_dir


def _is_chief(task_type, task_id, cluster_spec):
    return (task_type is None
            or task_type == "chief"
            or (task_type == "worker"
                and task_id == 0
                and "chief" not in cluster_spec.as_dict()))


def _get_temp_dir(dirpath, task_id):
    base_dirpath = "workertemp_" + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id, cluster_spec):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id, cluster_spec):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


# Define Checkpoint-related variables.
epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64),
                            name="step_in_epoch")
task_type, task_id, cluster_spec = (strategy.cluster_resolver.task_type,
                                    strategy.cluster_resolver.task_id,
                                    strategy.cluster_resolver.cluster_spec())

checkpoint = tf.train.Checkpoint(model=multi_worker_model, epoch=epoch,
                                 step_in_epoch=step_in_epoch)

write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id, cluster_spec)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir,
                                                max_to_keep=1)

# Restoring the checkpoint.
latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
if latest_checkpoint:
    checkpoint.restore(latest_checkpoint)
print("Starting at epoch %d." % epoch.numpy())

# Resume our CTL training
while epoch.numpy() < num_epochs:
    iterator = iter(multi_worker_dataset)
    total_loss = 0.0
    num_batches = 0

    while step_in_epoch.numpy() < num_steps_per_epoch:
        total_loss += train_step(iterator)
        num_batches += 1
        step_in_epoch.assign_add(1)

    # The tutorial divides by num_batches, which is 0 when it resumes from its own checkpoint
    # (saved at an epoch's end, before step_in_epoch is reset): ZeroDivisionError.
    train_loss = total_loss / max(num_batches, 1)
    print("Epoch: %d, accuracy: %f, train_loss: %f."
          % (epoch.numpy(), train_accuracy.result(), train_loss))

    train_accuracy.reset_states()

    checkpoint_manager.save()
    if not _is_chief(task_type, task_id, cluster_spec):
        tf.io.gfile.rmtree(write_checkpoint_dir)

    epoch.assign_add(1)
    step_in_epoch.assign(0)

write_model_path = write_filepath(args.model_path, task_type, task_id, cluster_spec)
multi_worker_model.save(write_model_path)
if not _is_chief(task_type, task_id, cluster_spec):
    tf.io.gfile.rmtree(os.path.dirname(write_model_path))
