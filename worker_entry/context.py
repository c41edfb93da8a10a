"""The TaskContext handed to the job's entry function: everything a task needs to know.

    def train(ctx: TaskContext) -> None:
        with ctx.strategy.scope():
            model = build_model()
        model.fit(ctx.dataset(make_dataset), epochs=5, steps_per_epoch=20,
                  callbacks=ctx.callbacks())
        with ctx.save_path() as path:     # the real model_dir on the chief only
            model.save(path)

The same entry runs under MultiWorkerMirrored and ParameterServer: `ctx.dataset` and
`ctx.callbacks` hide what differs.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from worker_entry import markers
from worker_entry.backup import TaskBackup
from worker_entry.markers import Strategy
from worker_entry.progress.fit import EpochProgress, Progress


@dataclass
class TaskContext:
    role: str  # chief, worker, ps or evaluator
    index: int
    strategy: Any  # tf.distribute.Strategy; None on the evaluator
    strategy_name: str  # "multi_worker_mirrored" or "parameter_server"
    is_chief: bool  # the chief, or worker 0 when there is no chief
    model_dir: str
    run_dir: str
    tmp_dir: str  # this task's own scratch space, removed when the task ends
    backup_dir: str  # this task's own BackupAndRestore state (tasks must not share one)
    attempt: int  # 0 on the first start, +1 on each restart
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def task(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def checkpoint_dir(self) -> str:
        """Where the chief's per-epoch checkpoints go; the evaluator follows them."""
        return os.path.join(self.model_dir, "checkpoints")

    @property
    def num_workers(self) -> int:
        """The training group's size now: TFO_NUM_WORKERS (an elastic job's, which changes
        between attempts), else TF_CONFIG's chief and workers."""
        return markers.num_workers()

    @property
    def num_replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync) if self.strategy is not None else 1

    @contextlib.contextmanager
    def save_path(self, name: str = "saved_model") -> Iterator[str]:
        """A path to save to. Every MWMS worker must save (saving runs collectives), so
        non-chief tasks get a temporary directory that is removed after the save."""
        if self.is_chief:
            path = os.path.join(self.model_dir, name)
            os.makedirs(self.model_dir, exist_ok=True)
            yield path
            markers.emit(markers.SAVED, path=path, chief=True)
            return
        os.makedirs(self.tmp_dir, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="save-", dir=self.tmp_dir)
        try:
            yield os.path.join(scratch, name)
            markers.emit(markers.SAVED, path=scratch, chief=False)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def dataset(self, dataset_fn: Callable[[Any], Any]) -> Any:
        """What to pass to `fit` for `dataset_fn(input_context) -> tf.data.Dataset`."""
        if self.strategy is None:
            return dataset_fn(tf.distribute.InputContext())
        return tf.keras.utils.experimental.DatasetCreator(dataset_fn)

    def follow_checkpoints(self, model: Any, data: Any, expected: int,
                           poll_seconds: float = 0.5) -> dict[int, dict[str, float]]:
        """The evaluator's work: evaluate each of the chief's per-epoch checkpoints once, in
        order, until the one of epoch `expected` (the last). Metrics go to the log, to a
        marker the coordinator records, and to TensorBoard under the run directory."""
        state_path = os.path.join(self.run_dir, self.role, "evaluated.json")  # evaluator/
        os.makedirs(os.path.dirname(state_path), exist_ok=True)
        results: dict[int, dict[str, float]] = {}
        if os.path.exists(state_path):  # a restarted evaluator does not repeat itself
            with open(state_path) as f:
                results = {int(k): v for k, v in json.load(f).items()}
        writer = tf.summary.create_file_writer(os.path.join(self.run_dir, "tensorboard", "eval"))
        while expected not in results:
            for epoch, prefix in _checkpoints(self.checkpoint_dir):
                if epoch in results:
                    continue
                try:
                    model.load_weights(prefix).expect_partial()
                except (tf.errors.OpError, ValueError) as e:  # still being written
                    print(f"[tfo] checkpoint {prefix} not readable yet: {e}", flush=True)
                    break
                metrics = {k: float(v) for k, v in
                           model.evaluate(data, verbose=0, return_dict=True).items()}
                results[epoch] = metrics
                print(f"[evaluator] epoch {epoch}: " + ", ".join(
                    f"{k}={v:.4f}" for k, v in metrics.items()), flush=True)
                markers.emit(markers.EVALUATED, epoch=epoch, checkpoint=prefix, metrics=metrics)
                with writer.as_default():
                    for k, v in metrics.items():
                        tf.summary.scalar(f"eval/{k}", v, step=epoch)
                writer.flush()
                with open(state_path, "w") as f:
                    json.dump(results, f)
            else:
                time.sleep(poll_seconds)
        return results

    def callbacks(self, backup: bool = True, checkpoints: bool = True) -> list[Any]:
        """Progress markers, BackupAndRestore (resume after a restart) and per-epoch
        checkpoints for the evaluator."""
        # ParameterServer fit refuses batch-level callbacks.
        ps = self.strategy_name == Strategy.PARAMETER_SERVER
        cbs: list[Any] = [EpochProgress() if ps else Progress()]
        if backup:
            cbs.append(TaskBackup(backup_dir=self.backup_dir))
        if checkpoints:
            cbs.append(tf.keras.callbacks.ModelCheckpoint(
                filepath=os.path.join(self.checkpoint_dir, "ckpt-{epoch:03d}"),
                save_weights_only=True))
        return cbs


def _checkpoints(directory: str) -> list[tuple[int, str]]:
    """(epoch, prefix) of every complete checkpoint `ckpt-NNN` in `directory`, oldest first."""
    found = []
    for index in glob.glob(os.path.join(directory, "ckpt-*.index")):
        prefix = index[: -len(".index")]
        epoch = prefix.rsplit("-", 1)[-1]
        if epoch.isdigit():
            found.append((int(epoch), prefix))
    return sorted(found)
