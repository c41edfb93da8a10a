"""Keras fits of every kind in one task process, for tfo's automatic progress callback
(tests/test_autoprogress.py): before each fit a `CASE <name>` line, after it a `RESULT
<json>` line with what the script itself saw; the markers tfo's callback emitted lie
between. One small model on random data, 2 epochs of 20 steps a fit (15 with
steps_per_execution 4: its last call of an epoch runs 3)."""

import json
import os
import sys

import numpy as np
import tensorflow as tf

# Which CallbackList each fit made (to see whether Keras calls batch hooks at all).
made: list = []
plain_init = tf.keras.callbacks.CallbackList.__init__


def recording_init(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    plain_init(self, *args, **kwargs)
    made.append(self)


tf.keras.callbacks.CallbackList.__init__ = recording_init

rng = np.random.default_rng(7)
x = rng.random((320, 4), dtype=np.float32)
y = x.sum(axis=1) + rng.random(320, dtype=np.float32) * 0.1
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")


class BatchCounter(tf.keras.callbacks.Callback):
    """A script's own callback with a batch hook; it also looks at model.train_function."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0
        self.tracings: list[int] = []

    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):  # noqa: ANN001, ANN201
        self.tracings.append(int(model.train_function.experimental_get_tracing_count()))


class FailAtEpoch1(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):  # noqa: ANN001, ANN201
        if epoch == 1:
            raise RuntimeError("the script's callback failed")


class FailAtEpoch1Batch12(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        if batch == 12 and self.epoch == 1:
            raise RuntimeError("the script's callback failed")

    def on_epoch_begin(self, epoch, logs=None):  # noqa: ANN001, ANN201
        self.epoch = epoch


def fit(case: str, steps: int = 20, on=None, **kwargs) -> dict:  # noqa: ANN001, ANN003
    print(f"CASE {case}", flush=True)
    seen: dict = {}
    try:
        history = (on or model).fit(data, epochs=2, steps_per_epoch=steps, **kwargs)
        seen["loss"] = history.history["loss"][-1]
    except RuntimeError as e:
        seen["raised"] = str(e)
    seen["batch_hooks"] = made[-1]._should_call_train_batch_hooks
    seen["train_function"] = type((on or model).train_function).__name__
    return seen


def result(seen: dict) -> None:
    print("RESULT " + json.dumps(seen), flush=True)


result(fit("quiet", verbose=0))
result(fit("progress_bar", verbose=1))
counter = BatchCounter()
seen = fit("own_batch_callback", verbose=0, callbacks=[counter])
result({**seen, "batches": counter.batches, "tracings": counter.tracings})
seen = fit("raised", verbose=0, callbacks=[FailAtEpoch1()])
model.save(os.path.join(sys.argv[1], "saved_raised"))  # tfo's counter still in the model
seen["predicts"] = tf.keras.models.load_model(
    os.path.join(sys.argv[1], "saved_raised")).predict(x[:2], verbose=0).shape[0]
result(seen)
result(fit("after_raised", verbose=0))
path = os.path.join(sys.argv[1], "saved")
print("CASE save", flush=True)
model.save(path)
restored = tf.keras.models.load_model(path)
result({"predicts": restored.predict(x[:2], verbose=0).shape[0],
        "train_function": type(model.train_function).__name__})
# A backup every 5 steps: the fit that fails in epoch 1 after its 13th step resumes there
# from the backup of its 10th. Another model: after a fit with BackupAndRestore, tf-keras
# 2.21 fails a fit without it (its on_train_end deletes the model's `_training_state`).
resumable = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
resumable.compile(optimizer="sgd", loss="mse")
backup = os.path.join(sys.argv[1], "backup")
result(fit("backup_raised", on=resumable, verbose=0, callbacks=[
    tf.keras.callbacks.BackupAndRestore(backup, save_freq=5), FailAtEpoch1Batch12()]))
result(fit("backup_resumed", on=resumable, verbose=0, callbacks=[
    tf.keras.callbacks.BackupAndRestore(backup, save_freq=5)]))
model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
result(fit("steps_per_execution", steps=15, verbose=0))
