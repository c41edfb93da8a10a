"""Richer progress for a script of your own, in one import and one callback:

    from worker_entry import progress
    model.fit(..., callbacks=[progress.callback()])

Under tfo the task then reports its epochs and its first step (`tfo status`, events.jsonl);
run any other way, the callback does nothing.
"""

from __future__ import annotations

import os
from typing import Any


def callback() -> Any:
    """A Keras callback that reports progress markers under tfo; a no-op elsewhere."""
    import tensorflow as tf

    if not os.environ.get("TFO_TASK"):
        return tf.keras.callbacks.Callback()
    from worker_entry.context import Progress

    return Progress()
