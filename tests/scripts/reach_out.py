"""A user's script that reaches outward while its own server listens: it downloads its data
from a URL, starts its strategy (whose gRPC server listens on its TF_CONFIG port), writes the
data to --out and waits for --release to appear (tests/test_loopback.py probes meanwhile)."""

import argparse
import os
import time
import urllib.request

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--url", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--release", required=True)
args = parser.parse_args()

data = urllib.request.urlopen(args.url, timeout=20).read()
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with open(args.out, "wb") as f:
    f.write(data)
until = time.monotonic() + 90
while not os.path.exists(args.release) and time.monotonic() < until:
    time.sleep(0.1)
print("released", os.path.exists(args.release))
