"""A small MultiWorkerMirrored custom training loop that reports its steps to tfo (one
import, one call a step). With --hang_worker N, worker N's training step sleeps forever on
the first attempt: a wedged step, which blocks its peers in the next all-reduce."""

import argparse
import json
import os
import time

import tensorflow as tf

from worker_entry import progress

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps_per_epoch", type=int, default=30)
parser.add_argument("--step_seconds", type=float, default=0.05)
parser.add_argument("--hang_worker", type=int, default=-1)
parser.add_argument("--hang_at_step", type=int, default=20)
args = parser.parse_args()

task = json.loads(os.environ["TF_CONFIG"])["task"]
hang = task["index"] == args.hang_worker and os.environ.get("TFO_ATTEMPT") == "0"

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    w = tf.Variable(tf.zeros([4, 1]))
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)

x = tf.random.uniform([64, 4])
y = tf.reduce_sum(x, axis=1, keepdims=True)


@tf.function
def replica_step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
    optimizer.apply_gradients([(tape.gradient(loss, w), w)])
    return loss


def wait_forever():
    while True:
        time.sleep(3600)


def train_step(step):
    if hang and step == args.hang_at_step:
        print(f"worker {task['index']}: hanging in step {step}", flush=True)
        wait_forever()
    loss = strategy.run(replica_step)
    return strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)


step = 0
for epoch in range(args.epochs):
    for i in range(args.steps_per_epoch):
        step += 1
        loss = train_step(step)
        progress.report(epoch=epoch, epochs=args.epochs, step_in_epoch=i + 1,
                        steps=args.steps_per_epoch, loss=float(loss))
        time.sleep(args.step_seconds)
    print(f"epoch {epoch} done at step {step}, loss {float(loss):.4f}", flush=True)
