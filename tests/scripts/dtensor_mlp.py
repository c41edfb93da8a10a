"""Multi-client DTensor training, as TensorFlow's DTensor guides write it
(tensorflow.org/guide/dtensor_overview, tutorials/distribute/dtensor_ml_tutorial): DTensor
reads its clients from DTENSOR_JOBS, DTENSOR_CLIENT_ID and DTENSOR_JOB_NAME (not TF_CONFIG);
a distributed mesh of each client's CPU device, the batch sharded over it, a small linear
model's weights replicated, a few training steps. Without those variables each process is a
one-client mesh of its own. It knows nothing of tfo.

    python dtensor_mlp.py --steps 5
"""

import argparse

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--batch_per_client", type=int, default=16)
args = parser.parse_args()

dtensor.initialize_accelerator_system("CPU")
print(f"DTensor client {dtensor.client_id()} of {dtensor.num_clients()}, "
      f"job {dtensor.job_name()}", flush=True)

mesh = dtensor.create_distributed_mesh(
    [("batch", dtensor.num_global_devices("CPU"))], device_type="CPU")
print(f"mesh of {mesh.num_local_devices()} local device(s), {mesh.size} in all", flush=True)

replicated = dtensor.Layout.replicated(mesh, rank=2)
batch_sharded = dtensor.Layout(["batch", dtensor.UNSHARDED], mesh)

features = 8
rng = np.random.default_rng(0)
true_w = rng.normal(size=(features, 1)).astype(np.float32)
w = dtensor.DVariable(dtensor.call_with_layout(tf.zeros, replicated, (features, 1)))

# Each client makes its own shard of the global batch and packs it on its local devices.
local_rng = np.random.default_rng(1 + dtensor.client_id())


def batch():
    x = local_rng.normal(size=(args.batch_per_client, features)).astype(np.float32)
    y = x @ true_w
    return (dtensor.pack([tf.constant(x)] * mesh.num_local_devices(), batch_sharded),
            dtensor.pack([tf.constant(y)] * mesh.num_local_devices(), batch_sharded))


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    w.assign_sub(0.1 * tape.gradient(loss, w))
    return loss


for step in range(args.steps):
    x, y = batch()
    loss = train_step(x, y)
    print(f"step {step + 1}: loss {float(dtensor.unpack(loss)[0]):.4f}", flush=True)
