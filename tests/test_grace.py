"""The grace a stopped task gets: short where its group stops because a peer is gone (it
cannot save without that peer), grace_seconds for a preemption. Real TensorFlow workers
running TensorFlow's PreemptionCheckpointHandler pattern (tests/scripts/mwms_preemption.py),
real signals; one job, a fault of each kind in turn."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from orchestrator.loop.decide import PEER_LOST_GRACE_SECONDS
from tests.conftest import events, write_spec
from tests.helpers import Tfo, first, progressed, task_process

GRACE = 10  # the spec's default grace_seconds
SPEC = """\
name: grace
job:
  script: tests/scripts/mwms_preemption.py
  args: {args}
tasks:
  worker: [localhost:auto, localhost:auto]
restart: {{policy: on-failure, max_restarts: 2, backoff_seconds: 0.5}}
timeouts: {{startup_seconds: 120, grace_seconds: {grace}}}
"""
ARGS = ["--epochs", "2", "--steps_per_epoch", "60", "--step_seconds", "0.05"]


def spec(tmp_path: Path) -> Path:
    return write_spec(tmp_path / "cluster.yaml", SPEC.format(args=json.dumps(ARGS),
                                                             grace=GRACE))


def training_again(run_dir: Path, attempt: int) -> float:
    """When every worker of `attempt` had told its first step (events' wall time)."""
    ev = events(run_dir)
    return max(first(ev, "task_progress", task, attempt=attempt)["time"]
               for task in ("worker:0", "worker:1"))


@pytest.mark.tf
@pytest.mark.timeout(420)
def test_a_lost_peer_s_survivor_gets_the_short_grace_and_a_preemption_its_whole_grace(
        run_dir: Path, tmp_path: Path):
    """One job, one fault in each of its first two attempts (a job each before: a group's
    start saved).

    Attempt 0: worker:1's task SIGKILLed. worker:0, its SIGTERM handler TensorFlow's
    PreemptionCheckpointHandler's, cannot save without it and waits on its dead peer; tfo
    SIGKILLs it PEER_LOST_GRACE_SECONDS after the SIGTERM, not grace_seconds (before: 10 s,
    `still running 10 s after SIGTERM`). Nothing was saved, so the restart says it started
    over.

    Attempt 1: SIGTERM to worker:1's wrapper from outside (a preemption notice): every
    worker saves at the agreed step within grace_seconds and exits 42, nothing is killed,
    and the restart says it resumed from that checkpoint having lost next to nothing."""
    tfo = Tfo(spec(tmp_path), run_dir)
    try:
        progressed(tfo, "worker:1", 20)
        task = task_process(tfo, "worker:1")
        killed_at = time.time()
        task.kill()
        wrapper = tfo.wait_event("task_started", "worker:1", attempt=1)["pid"]
        progressed(tfo, "worker:1", 20, attempt=1)
        os.kill(wrapper, signal.SIGTERM)
        code, err = tfo.finish(timeout=300)
    finally:
        tfo.close()
    assert code == 0, err[-3000:]
    ev = events(run_dir)

    # Attempt 0: a lost peer.
    stopping = first(ev, "task_stopping", "worker:0")
    assert stopping and stopping["reason"] == "restart", [e for e in ev if e["task"] == "worker:0"]
    # The restart begins within the short grace (and the exit's collection), never after
    # grace_seconds; a loaded machine may add a little.
    restarted = first(ev, "task_restarted", "worker:0")
    assert restarted["time"] - stopping["time"] < GRACE - 3, (stopping, restarted)
    killed = first(ev, "task_killed", "worker:0", pid=stopping["pid"])
    if killed is not None:  # else its code ended by itself within the grace (1 run in 4)
        assert killed["reason"] == f"still running {PEER_LOST_GRACE_SECONDS:g} s after SIGTERM"
        assert PEER_LOST_GRACE_SECONDS <= killed["time"] - stopping["time"] < GRACE - 4
    restart = training_again(run_dir, 1) - killed_at
    print(f"SIGKILL → both workers training again: {restart:.1f} s")
    said = [e for e in ev if e["event"] == "task_resumed" and e["attempt"] == 1]
    assert said and all(e["how"] == "started over" and e["lost_steps"] >= 20 for e in said)

    # Attempt 1: a preemption.
    assert first(ev, "task_preempted", attempt=1)
    attempt1 = {e["pid"] for e in ev if e["event"] == "task_started" and e["attempt"] == 1}
    assert not [e for e in ev if e["event"] == "task_killed" and e["pid"] in attempt1]
    saved = [e for e in ev if e["event"] == "task_checkpoint" and e["op"] == "saved"
             and e["attempt"] == 1]
    said = [e for e in ev if e["event"] == "task_resumed" and e["attempt"] == 2]
    assert {e["task"] for e in said} == {"worker:0", "worker:1"}, said
    for e in said:
        assert e["how"] == "resumed" and e["restored"] in {s["path"] for s in saved}
        # the handler saves at the step the workers agree on, about the last marker: the
        # steps lost are those after it that tfo saw. Mostly none; 1 in 3 of this stop's
        # runs under load, one (a progress marker of step 33 after the save at 32): which
        # of the two, tfo's count or the save, is a step late is not yet known (closing note)
        assert e["lost_steps"] in (0, 1) and e["epoch"] in (0, 1), e
        assert e["words"] == f"resumed at epoch {e['epoch']} (lost {e['lost_steps']} steps)"
