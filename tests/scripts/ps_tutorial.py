"""Parameter-server training with Keras's Model.fit, as TensorFlow's tutorial writes it
(tensorflow.org/tutorials/distribute/parameter_server_training, "Training with
Model.fit"), on random data instead of the tutorial's. The tutorial builds its cluster in
the same process (`create_in_process_cluster`): the servers tfo started are never used, and
the coordinator trains alone. `--cluster tf_config` is what the tutorial says to do in a
real cluster: `TFConfigClusterResolver()`. It knows nothing of tfo.

    python ps_tutorial.py --cluster in_process    # the tutorial as published
    python ps_tutorial.py --cluster tf_config     # the cluster TF_CONFIG names
"""

import argparse
import multiprocessing
import os
import socket

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--cluster", choices=["in_process", "tf_config"], default="in_process")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps_per_epoch", type=int, default=10)
args = parser.parse_args()


def pick_unused_port():
    # The tutorial's portpicker.pick_unused_port, without the package.
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def create_in_process_cluster(num_workers, num_ps):
    """Creates and starts local servers and returns the cluster_resolver."""
    worker_ports = [pick_unused_port() for _ in range(num_workers)]
    ps_ports = [pick_unused_port() for _ in range(num_ps)]

    cluster_dict = {}
    cluster_dict["worker"] = ["localhost:%s" % port for port in worker_ports]
    if num_ps > 0:
        cluster_dict["ps"] = ["localhost:%s" % port for port in ps_ports]

    cluster_spec = tf.train.ClusterSpec(cluster_dict)

    # Workers need some inter_ops threads to work properly.
    worker_config = tf.compat.v1.ConfigProto()
    if multiprocessing.cpu_count() < num_workers + 1:
        worker_config.inter_op_parallelism_threads = num_workers + 1

    for i in range(num_workers):
        tf.distribute.Server(
            cluster_spec,
            job_name="worker",
            task_index=i,
            config=worker_config,
            protocol="grpc")

    for i in range(num_ps):
        tf.distribute.Server(
            cluster_spec,
            job_name="ps",
            task_index=i,
            protocol="grpc")

    cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster_spec, rpc_layer="grpc")
    return cluster_resolver


# Set the environment variable to allow reporting worker and ps failure to the
# coordinator. This is a workaround and won't be necessary in the future.
os.environ["GRPC_FAIL_FAST"] = "use_caller"

NUM_WORKERS = 3
NUM_PS = 2
if args.cluster == "in_process":
    cluster_resolver = create_in_process_cluster(NUM_WORKERS, NUM_PS)
else:
    cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()

variable_partitioner = (
    tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=(256 << 10),
        max_shards=NUM_PS))

strategy = tf.distribute.ParameterServerStrategy(
    cluster_resolver,
    variable_partitioner=variable_partitioner)

global_batch_size = 64

x = tf.random.uniform((10, 10))
y = tf.random.uniform((10,))

dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
dataset = dataset.batch(global_batch_size)
dataset = dataset.prefetch(2)

with strategy.scope():
    model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])

    model.compile(tf.keras.optimizers.legacy.SGD(), loss="mse", steps_per_execution=10)

model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)
print("trained on", sorted(cluster_resolver.cluster_spec().as_dict()))
