"""Keras's SidecarEvaluator as its documentation writes it (tf.keras.utils.SidecarEvaluator):
the worker trains and saves a checkpoint each epoch with ModelCheckpoint; the evaluator task
evaluates each new checkpoint, and never exits. It knows nothing of tfo."""

import argparse
import json
import os

import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--checkpoint_dir", required=True)
args = parser.parse_args()



def make_data():  # after the strategy: MWMS must configure TensorFlow before anything runs
    x, y = load_digits(return_X_y=True)
    return tf.data.Dataset.from_tensor_slices(((x / 16.0).astype("float32"), y)).batch(64)


def make_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(64,)),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


if json.loads(os.environ["TF_CONFIG"])["task"]["type"] == "evaluator":
    tf.keras.utils.SidecarEvaluator(model=make_model(), data=make_data(),
                                    checkpoint_dir=args.checkpoint_dir).start()
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = make_model()
    checkpoint = tf.keras.callbacks.ModelCheckpoint(
        filepath=os.path.join(args.checkpoint_dir, "ckpt-{epoch}"), save_weights_only=True)
    model.fit(make_data().repeat(), epochs=args.epochs, steps_per_epoch=30, callbacks=[checkpoint],
              verbose=2)
