"""A script's checkpoints as tfo sees them, without a line of its code: every
`tf.train.Checkpoint` written (`save`, `write`, a `CheckpointManager`'s save, Keras's
BackupAndRestore, PreemptionCheckpointHandler: all end in `Checkpoint._write`) and every one
read back (`restore` and `read` end in `Checkpoint.read`) is told in a `checkpoint` marker:

    {"event": "checkpoint", "op": "saved" | "restored", "path": ".../ckpt-2", "step": 40,
     "epoch": 1}

`step`: the steps this attempt had done at that moment (autoprogress's count, passed in);
`epoch`: on a restore, the checkpoint's own epoch variable where it has one (an integer
scalar whose name says epoch: the custom-loop tutorial's `epoch`, tf-keras's
`ckpt_saved_epoch`), as the script counts it. The coordinator matches a restore's path with
the save it saw (orchestrator/loop/resumes.py): where an attempt began, and what a restart lost.

    checkpoints.install(steps_done)   # autoprogress.install: hooks on TensorFlow's import
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from worker_entry import markers


def install(steps_done: Callable[[], int]) -> Callable[[ModuleType], None]:
    """The hook to run once TensorFlow is imported."""
    def hook(tf: ModuleType) -> None:
        from tensorflow.python.checkpoint.checkpoint import Checkpoint

        if getattr(Checkpoint._write, "_tfo_wrapped", False):
            return
        Checkpoint._write = _told(Checkpoint._write, "saved", steps_done)
        Checkpoint.read = _told(Checkpoint.read, "restored", steps_done)
    return hook


def _told(method: Callable[..., Any], op: str, steps_done: Callable[[], int]
          ) -> Callable[..., Any]:
    @functools.wraps(method)
    def run(self: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, path, *args, **kwargs)
        if op == "saved":
            path = result  # the full path, `ckpt-N` where the prefix numbered it
        if path is not None:
            _tell(self, op, path, steps_done)
        return result
    run._tfo_wrapped = True  # type: ignore[attr-defined]
    return run


def _tell(checkpoint: Any, op: str, path: Any, steps_done: Callable[[], int]) -> None:
    """Never fails the script's save or restore: a path tfo cannot read is not told."""
    try:
        fields: dict[str, Any] = {"op": op, "path": os.path.abspath(os.fsdecode(
            path if isinstance(path, str | bytes | os.PathLike) else path.numpy())),
            "step": int(steps_done())}
        if op == "restored" and (epoch := epoch_of(checkpoint)) is not None:
            fields["epoch"] = epoch
    except Exception:  # noqa: BLE001
        return
    markers.emit(markers.CHECKPOINT, **fields)


def epoch_of(checkpoint: Any) -> int | None:
    """The checkpoint's own epoch variable's value, where it holds exactly one (an integer
    scalar named *epoch*, not a step or batch in one: the tutorial's `step_in_epoch`)."""
    found = []
    for name, value in vars(checkpoint).items():
        dtype, name = getattr(value, "dtype", None), name.lower()
        if "epoch" in name and "step" not in name and "batch" not in name \
                and getattr(dtype, "is_integer", False) \
                and getattr(value, "shape", None) == () and hasattr(value, "numpy"):
            found.append(int(value.numpy()))
    return found[0] if len(found) == 1 else None
