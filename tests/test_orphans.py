"""orphans: a SIGKILLed wrapper's leftovers swept on a thread, their deaths waited on pidfds
(the real wrapper cases are tests/test_escape.py's)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from orchestrator.launch import orphans


def test_reap_returns_once_the_killed_children_ended_and_reaps_them() -> None:
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
    t = time.monotonic()
    orphans._reap([p.pid for p in procs], 30.0)
    assert time.monotonic() - t < 10  # not the timeout: their pidfds said so
    for p in procs:  # reaped by _reap: nothing left for their Popen to wait for
        try:
            os.waitpid(p.pid, os.WNOHANG)
        except ChildProcessError:
            continue
        raise AssertionError(f"{p.pid} was not reaped")


def test_a_sweep_soon_runs_on_its_thread_and_settle_waits_for_it(monkeypatch) -> None:
    ran: list[float | None] = []

    def slow_sweep(since: float | None = None) -> int:
        time.sleep(0.3)
        ran.append(since)
        return 0

    monkeypatch.setattr(orphans, "sweep", slow_sweep)
    orphans.sweep_soon(since=1.0)
    assert ran == []  # the caller went on at once
    orphans.settle()
    assert ran == [1.0]
    orphans.settle()  # nothing under way: returns at once
