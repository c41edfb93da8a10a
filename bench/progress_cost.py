"""What the automatic progress (worker_entry/progress/auto.py) costs a task, in one process:

- per step: tfo's callback (`Progress`) counts a fit's steps by wrapping its train_function
  (`_CountedTrainFunction`: a counter, one clock compare, the logs kept), so Keras needs no
  batch hook for it; what the wrapper adds to a call of a function that does nothing;
- fit: the time per step of a tiny model's fit (Dense 4 → 1, batches of 16, verbose 0, no
  other callback: tf-keras then skips its per-batch callback dispatch, which cost ~17 us a
  step while tfo's callback had a batch hook), with tfo's callback against without: ~0 now;
- tf.function: the time per call of a trivial tf.function, counted (the hook's wrapper of
  `Function.__call__`) against not;
- the bench's job (bench/job.py's model: digits, Dense 64 → 10, batches of 128, one
  intra-op thread, the process on one core): its throughput with tfo's callback ÷ without, in one
  process, fit after fit alternated. Between two tfo runs the same job's throughput swings
  ±10 % (where each run's threads land, its memory), which hides a tenth of that; within
  one process the pairs differ by what the callback does.

The arms alternate (A B, B A, ...) after a warm-up of each; each prints the arms' medians,
the median of the pairs' differences and the difference of the arms' fastest runs (the
steadier figure on a busy machine):

    python bench/progress_cost.py [--steps 2000] [--calls 20000] [--pairs 7]
    COST hook_us <the counted train_function's own share of a call, fastest runs' difference>
    COST fit_us_per_step <without> <with> <difference> <difference of the fastest>
    COST call_us <without> <with> <difference> <difference of the fastest>
    COST job_ratio <median of the pairs' throughput with ÷ without> <lowest> <highest>
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--job-steps", type=int, default=2000)
    # The pinned core runs the job at one of two speeds (about 800 or 1,250 steps a second
    # here, by turns, whatever the arm): a pair whose fits ran at different speeds reads
    # 0.6 or 1.6, one at the same speed 0.9996-1.0003. The median needs most pairs alike:
    # 15 pairs, 2,000 steps a fit (an A/A run of 9 pairs read 1.0002 (q1 1.0000, q3 1.305)).
    parser.add_argument("--job-pairs", type=int, default=15)
    args = parser.parse_args()
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ["TFO_TASK"] = "worker:0"  # the callback's markers go out, as in a task
    import numpy as np
    # One core for the whole process, as bench/job.py --pin: set before TensorFlow makes its
    # threads, which keep the affinity they were made with (set after, only this thread was
    # pinned: the fits ran at ~1,000 or ~1,900 steps a second by turns, a pair read 0.5-2).
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import tensorflow as tf
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

    from worker_entry.progress import auto as autoprogress
    from worker_entry.progress.fit import Progress, _CountedTrainFunction

    out, sys.stdout = sys.stdout, open(os.devnull, "w")  # noqa: SIM115 (the markers)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")
    rng = np.random.default_rng(7)
    data = tf.data.Dataset.from_tensor_slices((rng.random((64, 4), "f"), rng.random(64, "f")))
    data = data.batch(16).repeat()

    def fit(ours: bool) -> float:
        start = time.perf_counter()
        model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0,
                  callbacks=[Progress()] if ours else [])
        return (time.perf_counter() - start) / args.steps * 1e6

    plain = Function.__call__
    counted = autoprogress._counted(plain)
    function, x = tf.function(lambda v: v + 1), tf.constant(1.0)

    def call(ours: bool) -> float:
        Function.__call__ = counted if ours else plain
        start = time.perf_counter()
        for _ in range(args.calls):
            function(x)
        took = (time.perf_counter() - start) / args.calls * 1e6
        Function.__call__ = plain
        return took

    from sklearn.datasets import load_digits

    dx, dy = load_digits(return_X_y=True)
    digits = tf.data.Dataset.from_tensor_slices(((dx / 16.0).astype("float32"),
                                                 dy.astype("int64")))
    digits = digits.shuffle(2000, seed=7).repeat().batch(128)
    job = tf.keras.Sequential([tf.keras.Input(shape=(64,)),
                               tf.keras.layers.Dense(64, activation="relu"),
                               tf.keras.layers.Dense(10)])
    job.compile(optimizer=tf.keras.optimizers.SGD(0.1), metrics=["accuracy"],
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def job_fit(ours: bool) -> float:
        """Steps a second of the bench job's fit, with tfo's callback or without."""
        start = time.perf_counter()
        job.fit(digits, epochs=1, steps_per_epoch=args.job_steps, verbose=0,
                callbacks=[Progress()] if ours else [])
        return args.job_steps / (time.perf_counter() - start)

    hook = Progress()
    hook.set_model(model)
    hook.set_params({"epochs": 1, "steps": args.steps})
    logs = {"loss": tf.constant(0.5)}

    def step(iterator: object) -> dict:
        return logs

    counter = hook._counter = _CountedTrainFunction(step, hook)

    def per_call(function: object) -> float:
        start = time.perf_counter()
        for _ in range(args.calls):
            function(None)
        return (time.perf_counter() - start) / args.calls * 1e6

    def hook_alone() -> float:
        """Its own share of a step: the counted train_function's call less the function's."""
        return per_call(counter) - per_call(step)

    hook_alone()
    print(f"COST hook_us {min(hook_alone() for _ in range(args.pairs)):.3f}", file=out,
          flush=True)
    for name, measure in (("fit_us_per_step", fit), ("call_us", call)):
        measure(False), measure(True)  # warm-ups: tracing, the first calls
        without, with_, diffs = [], [], []
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {ours: measure(ours) for ours in order}
            without.append(got[False])
            with_.append(got[True])
            diffs.append(got[True] - got[False])
        print(f"COST {name} {statistics.median(without):.3f} {statistics.median(with_):.3f} "
              f"{statistics.median(diffs):.3f} {min(with_) - min(without):.3f}", file=out,
              flush=True)
    job_fit(False), job_fit(True)  # warm-ups: tracing
    ratios = []
    for i in range(args.job_pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {ours: job_fit(ours) for ours in order}
        ratios.append(got[True] / got[False])
    print(f"COST job_ratio {statistics.median(ratios):.4f} {min(ratios):.4f} "
          f"{max(ratios):.4f}", file=out, flush=True)


if __name__ == "__main__":
    main()
