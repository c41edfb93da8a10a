"""The warm pool's decisions (pure): how many standbys to start as a task takes one, and
which tasks a standby can serve."""

from __future__ import annotations

import pytest

from orchestrator.launch.pool import same_start, starts


@pytest.mark.parametrize(("held", "size", "refill", "want"), [
    (0, 2, True, (2, 1)),    # the first take: this job's two, and one more for the next test
    (1, 2, True, (0, 2)),    # the job's second task takes the last: two for the next test
    (2, 2, True, (0, 1)),    # a warm pool: the one taken is replaced
    (3, 2, True, (0, 0)),    # more than `size` held (a bigger job before): none
    (0, 3, True, (3, 1)),    # a 3-task job from nothing
    (0, 2, False, (1, 0)),   # the session's last test from nothing: only the taker's own
    (1, 2, False, (0, 0)),   # the last test takes what is there, starts nothing after
    (2, 2, False, (0, 0)),
])
def test_standbys_started_as_a_task_takes_one(held, size, refill, want):
    assert starts(held, size, refill) == want


POOL = {"PATH": "/usr/bin", "TF_USE_LEGACY_KERAS": "1", "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": "/p", "LD_PRELOAD": "/tmp/shim.so"}


@pytest.mark.parametrize(("task", "want"), [
    ({}, True),                                        # the pool's own environment
    ({"TF_USE_LEGACY_KERAS": None}, True),             # unset: worker_entry's default, 1
    ({"TFO_TASK": "worker:0", "HOSTNAME": "x"}, True),  # read after GO, not at the start
    ({"LD_PRELOAD": None}, True),                      # the shim: compared on its own
    ({"TF_USE_LEGACY_KERAS": "0"}, False),             # Keras 3 imported instead
    ({"CUDA_VISIBLE_DEVICES": "0"}, False),            # another device list at the import
    ({"PYTHONPATH": "/q"}, False),                     # another sys.path
    ({"LD_LIBRARY_PATH": "/cuda/lib"}, False),         # where the import finds libraries
    ({"LC_ALL": "C"}, False),                          # the C library's locale
    ({"PYTHONHASHSEED": "0"}, False),                  # read at the interpreter's start
    ({"TFO_AUTO_PROGRESS": "0"}, False),               # the import hooks it installs
])
def test_a_standby_serves_a_task_that_would_have_started_alike(task, want):
    env = {k: v for k, v in {**POOL, **task}.items() if v is not None}
    assert same_start(env, POOL) is want
