"""A plain TensorFlow script, as a user would write one: no tfo import. It reads TF_CONFIG,
builds MultiWorkerMirroredStrategy, all-reduces one number, and prints what it was given."""

import argparse
import json
import os

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--greeting", default="hello")
args = parser.parse_args()

task = json.loads(os.environ["TF_CONFIG"])["task"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                        strategy.run(lambda: tf.constant(1.0)), axis=None)
print(f"[allreduce_args] {args.greeting} from {task['type']}:{task['index']} "
      f"all_reduce={float(total)}", flush=True)
