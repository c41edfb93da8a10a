"""Multi-worker training whose input pipeline runs on the tf.data service, as TensorFlow's
guide writes it (tensorflow.org/api_docs/python/tf/data/experimental/service): the dataset is
`distribute`d to the dispatcher the launcher names, in "distributed_epoch" mode, so the
trainers share one pass over the data (each element goes to one of them), and a custom
training loop over `strategy.distribute_datasets_from_function` (tutorials/distribute/
multi_worker_with_ctl), whose iterator evens out the trainers' last batches. Each element
costs --delay_ms of waiting, as reading remote storage does (tf.data's own sleep
transformation: a Python function could not run on the data workers).

It writes the ids of the elements it trained on, per epoch, to --seen_dir/<task>.json, and
its time waiting for input and computing to <task>.timing.json. Without TFO_DATA_SERVICE
each trainer reads its own shard, as the tutorial does.
"""

import argparse
import json
import os
import time

import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing

parser = argparse.ArgumentParser()
parser.add_argument("--elements", type=int, default=256)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--delay_ms", type=float, default=0.0)
parser.add_argument("--mode", default="distributed_epoch")
parser.add_argument("--seen_dir", default=None)
args = parser.parse_args()

tf_config = json.loads(os.environ["TF_CONFIG"])
task = f"{tf_config['task']['type']}:{tf_config['task']['index']}"
strategy = tf.distribute.MultiWorkerMirroredStrategy()


def dataset_fn(input_context):
    dataset = tf.data.Dataset.range(args.elements)
    if "TFO_DATA_SERVICE" not in os.environ:  # no service: each trainer reads its shard
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
    if args.delay_ms:
        dataset = dataset.apply(testing.sleep(int(args.delay_ms * 1000)))
    dataset = dataset.map(lambda i: (i, tf.cast(tf.reshape(i % 10, [1]), tf.float32)))
    dataset = dataset.batch(args.batch)
    if "TFO_DATA_SERVICE" not in os.environ:
        return dataset
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=args.mode, service=os.environ["TFO_DATA_SERVICE"],
        job_name="train"))


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.build((None, 1))
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)


@tf.function
def train_step(inputs):
    def step_fn(inputs):
        _, x = inputs
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - x))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return strategy.run(step_fn, args=(inputs,))


dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
seen = []
waiting = computing = 0.0  # seconds spent in next(iterator), and in the step
started = time.perf_counter()
for epoch in range(args.epochs):
    ids = []
    step = 0
    iterator = iter(dist_dataset)
    while True:
        t0 = time.perf_counter()
        try:
            inputs = next(iterator)
        except StopIteration:
            break
        t1 = time.perf_counter()
        for local in strategy.experimental_local_results(inputs[0]):
            ids += local.numpy().tolist()
        losses = train_step(inputs)
        strategy.experimental_local_results(losses)[0].numpy()  # the step done
        waiting, computing = waiting + t1 - t0, computing + time.perf_counter() - t1
        step += 1
    print(f"{task} epoch {epoch}: {step} steps, {len(ids)} elements", flush=True)
    seen.append(ids)

if args.seen_dir:
    os.makedirs(args.seen_dir, exist_ok=True)
    with open(os.path.join(args.seen_dir, f"{task}.json"), "w") as f:
        json.dump(seen, f)
    with open(os.path.join(args.seen_dir, f"{task}.timing.json"), "w") as f:
        json.dump({"seconds": time.perf_counter() - started, "waiting": waiting,
                   "computing": computing, "elements": sum(map(len, seen))}, f)
