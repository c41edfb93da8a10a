"""A multi-worker custom training loop whose `tf.function` runs several steps a call, as
TensorFlow Model Garden's trainer (orbit, `steps_per_loop`) does: a `tf.range` loop over
the iterator inside the function. Each step takes a known time (`--step_ms`, a sleep in the
input pipeline's place, as a slow reader would), and the script logs its own speed as
orbit does (`train | step: N | steps/sec: R`, measured over each loop), then the
optimizer's iteration count and the rate of the whole run. It knows nothing of tfo.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--loops", type=int, default=30)
parser.add_argument("--steps_per_loop", type=int, default=10)
parser.add_argument("--step_ms", type=float, default=20.0)
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = 16 * strategy.num_replicas_in_sync

x = np.random.rand(1024, 8).astype(np.float32)
y = x.sum(axis=1, keepdims=True)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch_size)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(8,)),
                                 tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)
iterator = iter(strategy.experimental_distribute_dataset(dataset))


def slow_input(seconds):
    time.sleep(float(seconds))
    return 0.0


@tf.function
def train(iterator, num_steps):
    def step_fn(inputs):
        features, labels = inputs
        tf.py_function(slow_input, [args.step_ms / 1000.0], tf.float32)
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(
                tf.keras.losses.mean_squared_error(labels, model(features, training=True)),
                global_batch_size=global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    loss = tf.constant(0.0)
    for _ in tf.range(num_steps):
        per_replica = strategy.run(step_fn, args=(next(iterator),))
        loss = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    return loss


steps_per_loop = tf.constant(args.steps_per_loop)
train(iterator, steps_per_loop)  # traces: not timed
start = last = time.monotonic()
for _ in range(args.loops):
    loss = train(iterator, steps_per_loop)
    now = time.monotonic()
    print(f"train | step: {int(optimizer.iterations.numpy())} | "
          f"steps/sec: {args.steps_per_loop / (now - last):.1f} | loss: {float(loss):.4f}",
          flush=True)
    last = now
print(f"optimizer iterations: {int(optimizer.iterations.numpy())}", flush=True)
print(f"steps/sec over the run: {args.loops * args.steps_per_loop / (last - start):.2f}",
      flush=True)
