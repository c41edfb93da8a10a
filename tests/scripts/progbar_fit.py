"""A tutorial's model.fit with Keras's progress bar (verbose=1): tf-keras draws it with \\r
and runs of \\b even into a pipe. 12 short epochs (tests/test_output.py)."""

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.random.default_rng(0).random((80, 4), dtype=np.float32)
model.fit(x, x.sum(axis=1), batch_size=16, epochs=12, verbose=1)
