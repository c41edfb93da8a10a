"""One-process training with Keras, as TensorFlow's tutorial writes it
(tensorflow.org/tutorials/distribute/keras, "Distributed training with Keras"), on
scikit-learn's digits instead of MNIST (no download). MirroredStrategy over this machine's
devices: no TF_CONFIG, no port. It knows nothing of tfo.

    python mirrored_keras.py --epochs 3 --checkpoint_dir /tmp/training_checkpoints
"""

import argparse
import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--checkpoint_dir", default="./training_checkpoints")
args = parser.parse_args()

x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype(np.float32)

strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")

BUFFER_SIZE = len(x)
BATCH_SIZE_PER_REPLICA = 64
BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync

train_dataset = tf.data.Dataset.from_tensor_slices((x, y)).cache().shuffle(BUFFER_SIZE) \
    .batch(BATCH_SIZE)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(),
                  metrics=["accuracy"])

checkpoint_prefix = os.path.join(args.checkpoint_dir, "ckpt_{epoch}")


def decay(epoch):
    if epoch < 3:
        return 1e-3
    elif epoch >= 3 and epoch < 7:
        return 1e-4
    else:
        return 1e-5


class PrintLR(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"\nLearning rate for epoch {epoch + 1} is {model.optimizer.learning_rate.numpy()}")


callbacks = [
    tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
    tf.keras.callbacks.LearningRateScheduler(decay),
    PrintLR(),
]

model.fit(train_dataset, epochs=args.epochs, callbacks=callbacks, verbose=2)
eval_loss, eval_acc = model.evaluate(train_dataset, verbose=0)
print(f"Eval loss: {eval_loss}, Eval accuracy: {eval_acc}")
