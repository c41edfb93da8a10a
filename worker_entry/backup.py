"""The entry's BackupAndRestore (`TaskBackup`, from `ctx.callbacks()`): one real backup
per task, in the task's own directory, and every MultiWorkerMirrored worker resuming from
the same one.
"""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf


class TaskBackup(tf.keras.callbacks.BackupAndRestore):
    """BackupAndRestore with one real backup per task, in the task's own directory.

    tf-keras lets only the chief keep its backup and has every other worker restore from
    the chief's directory, which needs a shared filesystem (lab machines have none; and a
    per-task directory then restores epoch 0 beside the chief's epoch N, and the collectives
    mismatch). MWMS variables are identical on every worker, so each task keeping its own
    backup gives every task the same state to resume from.

    Under MWMS each task keeps its last KEEP backups, not tf-keras's one: a worker killed
    between the workers' writes of an epoch's backup leaves the others one backup ahead,
    and the one before it, which all of them still have, is where the group resumes.
    """

    KEEP = 2

    def on_train_begin(self, logs: dict | None = None) -> None:
        mwms = isinstance(self.model.distribute_strategy,
                          tf.distribute.MultiWorkerMirroredStrategy)
        if mwms:
            self._agree_on_backup()
        super().on_train_begin(logs)
        state = self._training_state
        if state.write_checkpoint_manager is not state.read_checkpoint_manager:
            tf.io.gfile.rmtree(state.write_checkpoint_manager.directory)  # the unused temp dir
            state.write_checkpoint_manager = state.read_checkpoint_manager
        if mwms:  # tf-keras makes it with max_to_keep=1, and sweeps only when it saves
            state.read_checkpoint_manager._max_to_keep = self.KEEP

    def _agree_on_backup(self) -> None:
        """Every worker must resume from the same backup, or the restore's collectives
        mismatch and every restart fails the same way. Before restoring, the workers gather
        which backups each holds (one all-gather) and all resume from the newest one every
        worker has, deleting newer ones; with none in common (a host's backups were
        lost), all discard theirs and start over."""
        strategy = self.model.distribute_strategy
        backup = os.path.join(self.backup_dir, "chief")  # tf-keras's name for the one it keeps
        mine = _backups(backup)
        # float32, as the collectives have GPU kernels for it; save numbers stay exact to 2**24
        held = tf.constant([[*mine[-self.KEEP:], *[-1] * self.KEEP][:self.KEEP]], tf.float32)

        @tf.function  # eager collectives work but warn about their overhead
        def all_gather(x: Any) -> Any:
            return strategy.gather(strategy.run(tf.identity, args=(x,)), axis=0)

        everyone = [{int(n) for n in row if n >= 0} for row in all_gather(held).numpy()]
        common = set.intersection(*everyone)
        if not any(everyone) or (common and max(common) == mine[-1]):
            return  # a first start, or this worker holds the newest common one
        if not common:
            print(f"[tfo] no backup every worker has (this one: "
                  f"{_named(mine) or 'none'}); every worker discards its backups and "
                  "training starts over", flush=True)
            if tf.io.gfile.exists(backup):
                tf.io.gfile.rmtree(backup)
            return
        newest = max(common)
        print(f"[tfo] resuming from ckpt-{newest}, the newest backup every worker has "
              f"(this one had {_named(mine)}; newer ones are discarded)", flush=True)
        for n in mine:
            if n > newest:
                for path in tf.io.gfile.glob(os.path.join(backup, f"ckpt-{n}.*")):
                    tf.io.gfile.remove(path)
        kept = [os.path.join(backup, f"ckpt-{n}") for n in mine if n <= newest]
        tf.compat.v1.train.update_checkpoint_state(backup, kept[-1], kept)


def _backups(directory: str) -> list[int]:
    """The save numbers of the backups in `directory` whose files are there, oldest first."""
    state = tf.train.get_checkpoint_state(directory) if tf.io.gfile.exists(directory) else None
    found = []
    for path in state.all_model_checkpoint_paths if state else ():
        path = path if os.path.isabs(path) else os.path.join(directory, path)
        suffix = path.rsplit("-", 1)[-1]
        if suffix.isdigit() and tf.io.gfile.exists(path + ".index"):
            found.append(int(suffix))
    return sorted(found)


def _named(numbers: list[int]) -> str:
    return ", ".join(f"ckpt-{n}" for n in numbers)
