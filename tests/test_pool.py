"""The warm pool's decision: how many standbys to start as a task takes one (pure)."""

from __future__ import annotations

import pytest

from orchestrator.pool import starts


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
