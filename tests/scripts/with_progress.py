"""A script that opts in to richer progress under tfo: one import, one callback."""

import numpy as np
import tensorflow as tf

from worker_entry import progress

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(4,)),
                                 tf.keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")
x = np.random.rand(64, 4).astype(np.float32)
model.fit(x, x.sum(axis=1), epochs=2, batch_size=16, verbose=2,
          callbacks=[progress.callback()])
