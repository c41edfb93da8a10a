"""Test jobs built on the digits example, with faults a test switches on.

- args `fail_task`, `fail_epoch`, `exit_code`: that task exits with the code after that
  epoch, on its first attempt only (all attempts with `fail_always`).
- args `epoch_sleep`: seconds to pause after each epoch, so a test can kill mid-run.
- args `orphan_task`: that task starts `sleep 300` in a session of its own (a straggler).
- env `FAULTY_HANG_TASK`: that task hangs while importing this module, before TF starts.
- env `FAULTY_BROKEN_TASK`: that task exits 3 while importing this module on every attempt
  after its first (its place broke: an elastic job loses it by its failures in a row).
"""

from __future__ import annotations

import os
import socket
import sys
import time

if os.environ.get("TFO_TASK") and os.environ.get("TFO_TASK") == os.environ.get("FAULTY_HANG_TASK"):
    print("[faulty] hanging before training", flush=True)
    time.sleep(3600)

if os.environ.get("TFO_TASK") and os.environ.get("TFO_TASK") == \
        os.environ.get("FAULTY_BROKEN_TASK") and int(os.environ.get("TFO_ATTEMPT", "0")) > 0:
    print("[faulty] broken: exiting before training", flush=True)
    sys.exit(3)

import tensorflow as tf  # noqa: E402

from worker_entry.context import TaskContext  # noqa: E402
from worker_entry.examples import digits  # noqa: E402


class _ExitAfterEpoch(tf.keras.callbacks.Callback):
    def __init__(self, epoch: int, code: int) -> None:
        super().__init__()
        self.epoch, self.code = epoch, code

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if epoch == self.epoch:
            print(f"[faulty] exiting with {self.code} after epoch {epoch}", flush=True)
            sys.stdout.flush()
            os._exit(self.code)


def train(ctx: TaskContext) -> None:
    args = ctx.args
    print(f"[faulty] {ctx.task} on {socket.gethostname()}", flush=True)  # where it really ran
    if args.get("orphan_task") == ctx.task:  # a child that leaves the task's process group
        import subprocess

        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        print(f"[faulty] started a straggler pid={child.pid}", flush=True)
    callbacks = []
    if args.get("fail_task") == ctx.task and (ctx.attempt == 0 or args.get("fail_always")):
        callbacks.append(_ExitAfterEpoch(int(args.get("fail_epoch", 0)),
                                         int(args.get("exit_code", 3))))
    if args.get("epoch_sleep"):
        pause = float(args["epoch_sleep"])
        callbacks.append(tf.keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: time.sleep(pause)))
    digits.train(ctx, callbacks=callbacks)
