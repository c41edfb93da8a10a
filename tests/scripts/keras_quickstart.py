"""TensorFlow 2 quickstart for beginners, as TensorFlow's tutorial writes it
(tensorflow.org/tutorials/quickstart/beginner), on scikit-learn's digits instead of MNIST (no
download): no distribution strategy at all, so each process trains a model of its own. It
knows nothing of tfo.

    python keras_quickstart.py --epochs 2
"""

import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
args = parser.parse_args()

x, y = load_digits(return_X_y=True)
x_train = (x / 16.0).astype(np.float32)
y_train = y

model = tf.keras.models.Sequential([
    tf.keras.layers.InputLayer(input_shape=(64,)),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dropout(0.2),
    tf.keras.layers.Dense(10),
])
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
model.compile(optimizer="adam", loss=loss_fn, metrics=["accuracy"])
model.fit(x_train, y_train, epochs=args.epochs, verbose=2)
model.evaluate(x_train, y_train, verbose=2)
