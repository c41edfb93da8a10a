"""Multi-worker Keras training with a sidecar evaluator, as TensorFlow's guides pair them
(tf.keras.utils.SidecarEvaluator): the workers fit and save a checkpoint per epoch; the
evaluator task evaluates each one as it appears. It knows nothing of tfo.
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
parser.add_argument("--checkpoint_dir", default="/tmp/sidecar-ckpt")
args = parser.parse_args()

x, y = load_digits(return_X_y=True)
x, y = (x / 16.0).astype(np.float32), y.astype(np.int64)


def build_model():
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(64,)),
                                 tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.1), metrics=["accuracy"])
    return model


task_type = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
if task_type == "evaluator":
    data = tf.data.Dataset.from_tensor_slices((x, y))
    model = build_model()
    tf.keras.utils.SidecarEvaluator(model=model, data=data.batch(256), steps=2,
                                    checkpoint_dir=args.checkpoint_dir,
                                    max_evaluations=args.epochs).start()
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any op: collectives
    data = tf.data.Dataset.from_tensor_slices((x, y))
    with strategy.scope():
        model = build_model()
    checkpoint = tf.keras.callbacks.ModelCheckpoint(
        filepath=os.path.join(args.checkpoint_dir, "ckpt-{epoch}"), save_weights_only=True)
    model.fit(data.shuffle(2000).repeat().batch(64), epochs=args.epochs,
              steps_per_epoch=args.steps_per_epoch, callbacks=[checkpoint], verbose=2)
