"""worker:1 exits 42 by itself (no SIGTERM reached anyone) and then waits in its teardown,
as a TensorFlow task's can; worker:0 fails a moment later (tests/test_scripts.py). With
--now: exit 42 at once."""

import os
import signal
import sys
import time


class Teardown:
    def __del__(self):  # runs as __main__'s globals are cleared: after atexit, in teardown
        time.sleep(60)


if "--now" in sys.argv:  # exits 42 at once, and that is all
    sys.exit(42)
if os.environ["TFO_TASK"] == "worker:1":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as TF's preemption handler
    held = Teardown()
    sys.exit(42)
time.sleep(2)
sys.exit(1)
