"""Preemption-tolerant multi-worker training with a custom loop, as TensorFlow's
PreemptionCheckpointHandler documentation writes it (tf.distribute.experimental.
PreemptionCheckpointHandler; tensorflow.org/tutorials/distribute/multi_worker_with_ctl):
epoch and step-in-epoch variables in the checkpoint, each single-step train function run
through the handler. On SIGTERM every worker saves at an agreed step and exits 42; started
again, the handler restores that checkpoint and training goes on from that step.

Prints `resumed at epoch E step S` on start, and reports progress to tfo (one import).
"""

import argparse
import os
import time

import numpy as np
import tensorflow as tf

from worker_entry import progress

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps_per_epoch", type=int, default=60)
parser.add_argument("--step_seconds", type=float, default=0.1)
parser.add_argument("--checkpoint_dir",
                    default=os.path.join(os.environ.get("TFO_MODEL_DIR", "/tmp/m"), "ckpt"))
args = parser.parse_args()

NUM_EPOCH, STEPS_PER_EPOCH = args.epochs, args.steps_per_epoch

strategy = tf.distribute.MultiWorkerMirroredStrategy()
cluster_resolver = strategy.cluster_resolver

trained_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64),
                            name="epoch")
step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64),
                            name="step_in_epoch")

x = np.random.rand(1024, 8).astype(np.float32)
y = x.sum(axis=1, keepdims=True)
global_batch = 32 * strategy.num_replicas_in_sync

with strategy.scope():
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch))
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(8,)),
                                 tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)

    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model,
                                     trained_epoch=trained_epoch, step_in_epoch=step_in_epoch)
    preemption_checkpoint_handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        cluster_resolver, checkpoint, args.checkpoint_dir)


@tf.function
def distributed_train_function(inputs):
    def step_fn(batch):
        features, labels = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((model(features) - labels) ** 2) / global_batch
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    per_replica = strategy.run(step_fn, args=(inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


print(f"resumed at epoch {trained_epoch.numpy()} step {step_in_epoch.numpy()} "
      f"(run calls {preemption_checkpoint_handler.total_run_calls})", flush=True)
iterator = iter(dataset)
while trained_epoch.numpy() < NUM_EPOCH:
    while step_in_epoch.numpy() < STEPS_PER_EPOCH:
        # The docstring's `args=(...)` would reach the function as a keyword: run(f, *args).
        loss = preemption_checkpoint_handler.run(distributed_train_function, next(iterator))
        step_in_epoch.assign_add(1)
        progress.report(epoch=int(trained_epoch.numpy()), epochs=NUM_EPOCH,
                        step_in_epoch=int(step_in_epoch.numpy()), steps=STEPS_PER_EPOCH,
                        loss=float(loss))
        time.sleep(args.step_seconds)
    print(f"epoch {trained_epoch.numpy()} done, loss {float(loss):.4f}", flush=True)
    trained_epoch.assign_add(1)
    step_in_epoch.assign(0)
