"""TensorFlow's multi-worker Keras tutorial (mwms_keras.py), or with --tutorial mwms_ctl.py its
custom-training-loop tutorial, unmodified but for its input pipeline: on worker
--block_worker's first attempt, reading the data blocks for good after --block_after
batches (a tf.py_function that sleeps, as a stuck file read or a dead NFS mount would).
Every other argument goes to the tutorial.

    python blocked_input.py --block_worker 1 --block_after 40 --epochs 2 --steps_per_epoch 60
"""

import argparse
import json
import os
import runpy
import sys
import time
from pathlib import Path

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--block_worker", type=int, default=1)
parser.add_argument("--block_after", type=int, default=40)
parser.add_argument("--tutorial", default="mwms_keras.py", choices=["mwms_keras.py", "mwms_ctl.py"])
args, tutorial_args = parser.parse_known_args()

task = json.loads(os.environ["TF_CONFIG"])["task"]
blocks = task["index"] == args.block_worker and os.environ.get("TFO_ATTEMPT") == "0"
read = 0


def read_batch():
    """The input's read: on the blocking worker it never returns after --block_after."""
    global read
    read += 1
    if blocks and read > args.block_after:
        print(f"input blocked at {time.time():.3f} (batch {read})", flush=True)
        while True:
            time.sleep(3600)
    return read


original_batch = tf.data.Dataset.batch


def batch(self, *a, **kw):
    def reading(x, y):
        with tf.control_dependencies([tf.py_function(read_batch, [], tf.int64)]):
            return tf.identity(x), y

    return original_batch(self, *a, **kw).map(reading)


tf.data.Dataset.batch = batch
tutorial = Path(__file__).with_name(args.tutorial)
sys.argv = [str(tutorial), *tutorial_args]
runpy.run_path(str(tutorial), run_name="__main__")
