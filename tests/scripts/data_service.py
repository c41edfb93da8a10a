"""Multi-worker training whose input pipeline runs on the tf.data service, as TensorFlow's
guide writes it (tensorflow.org/api_docs/python/tf/data/experimental/service): the dataset is
`distribute`d to the dispatcher the launcher names, in "distributed_epoch" mode, so the
trainers share one pass over the data (each element goes to one of them), and a custom
training loop over `strategy.distribute_datasets_from_function` (tutorials/distribute/
multi_worker_with_ctl), whose iterator evens out the trainers' last batches. Each element
costs --delay_ms of waiting, as reading remote storage does (tf.data's own sleep
transformation: a Python function could not run on the data workers).

It writes the ids of the elements it trained on, per epoch, to --seen_dir/<task>.json.
"""

import argparse
import json
import os

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
    if args.delay_ms:
        dataset = dataset.apply(testing.sleep(int(args.delay_ms * 1000)))
    dataset = dataset.map(lambda i: (i, tf.cast(tf.reshape(i % 10, [1]), tf.float32)))
    dataset = dataset.batch(args.batch)
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
for epoch in range(args.epochs):
    ids = []
    step = 0
    for inputs in dist_dataset:
        for local in strategy.experimental_local_results(inputs[0]):
            ids += local.numpy().tolist()
        train_step(inputs)
        step += 1
    print(f"{task} epoch {epoch}: {step} steps, {len(ids)} elements", flush=True)
    seen.append(ids)

if args.seen_dir:
    os.makedirs(args.seen_dir, exist_ok=True)
    with open(os.path.join(args.seen_dir, f"{task}.json"), "w") as f:
        json.dump(seen, f)
