"""A task that starts processes meant to outlive it, for tests that check none does.

Each task starts, with TFO_ESCAPEE=<marker> in their environment (tests find them by it):
(a) a child in a session and process group of its own (start_new_session), and
(b) a double-forked daemon: fork, setsid, fork again, the middle one exits, so the daemon
    is nobody's child that the task knows of.

As a TF entry (`tests.jobs.escape:train`), args: `marker`, `exit_code` (default 0), `hold`
(seconds to wait before exiting). It also converts a function with autograph (a
`__autograph_generated_file*.py` in the temp dir) and prints where that dir is.

Without TensorFlow, behind the task wrapper only (fast tests of the wrapper itself):

    TFO_JOB='{"tmp_dir": ...}' TFO_LIFELINE=stdin python -m tests.jobs.escape MARKER ACTION

ACTION: `exit:N` (exit with N), `signal:N` (kill itself with signal N), `hold` (ignore
SIGTERM like TensorFlow does, and wait), `preempt` (on SIGTERM, "save" for a moment and
exit 42, as TensorFlow's PreemptionCheckpointHandler does), `deaf` (a SIGTERM handler that
does nothing). And `double-fault`, without the wrapper: what a wrapper SIGKILLed after it
reaped its task, while it killed the rest, leaves. It starts the escapees and SIGKILLs
itself, with no task left in its process group.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker_entry.context import TaskContext

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
DAEMONIZE = f"""
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, {SLEEPER!r})
    os._exit(0)
os.wait()
"""


def spawn_escapees(marker: str) -> None:
    env = {**os.environ, "TFO_ESCAPEE": marker}
    child = subprocess.Popen(SLEEPER, env=env, start_new_session=True)
    subprocess.run([sys.executable, "-c", DAEMONIZE], env=env, check=True)
    print(f"[escape] started a session child pid={child.pid} and a daemon", flush=True)


def train(ctx: TaskContext) -> None:
    import tensorflow as tf

    spawn_escapees(f"{ctx.args['marker']}:{ctx.task}")

    @tf.function
    def tfo_escape_probe(x: tf.Tensor) -> tf.Tensor:
        if x > 0:  # autograph converts this: its source goes to a temp file
            return x
        return -x

    tfo_escape_probe(tf.constant(1))
    found = glob.glob(os.path.join(tempfile.gettempdir(), "__autograph_generated_file*.py"))
    print(f"[escape] {ctx.task} tempdir={tempfile.gettempdir()} autograph_files={len(found)}",
          flush=True)
    time.sleep(float(ctx.args.get("hold", 0)))
    raise SystemExit(int(ctx.args.get("exit_code", 0)))


def _main(marker: str, action: str) -> None:
    from worker_entry.lifeline import start

    if action == "double-fault":
        spawn_escapees(marker)
        os.kill(os.getpid(), signal.SIGKILL)
    start.wrap()
    what, _, arg = action.partition(":")
    spawn_escapees(marker)
    # Before the task line, which tests wait for: what they do next meets the handler.
    handlers = {"preempt": _preempted, "deaf": lambda signum, frame: None,
                "plain": signal.SIG_DFL}
    signal.signal(signal.SIGTERM, handlers.get(what, signal.SIG_IGN))
    print(f"[escape] task pid={os.getpid()} tempdir={tempfile.gettempdir()}", flush=True)
    if what == "exit":
        sys.exit(int(arg))
    if what == "signal":
        os.kill(os.getpid(), int(arg))
    time.sleep(600)


def _preempted(signum: int, frame: object) -> None:
    print("[escape] SIGTERM: saving", flush=True)
    time.sleep(0.3)
    sys.exit(42)


if __name__ == "__main__":
    _main(*sys.argv[1:3])
