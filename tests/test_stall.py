"""Stall rules, stack dumps and the wrapper's usage meter: pure, no processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from orchestrator.stall import Stall, Watched, blame_order, find_stalls, main_thread, where
from worker_entry.usage import Meter, read_stat


def test_nothing_until_one_task_is_over_the_limit():
    w = [Watched("worker:0", 5, progress_at=0.0), Watched("worker:1", 5, progress_at=0.5)]
    assert find_stalls(w, now=9.9, limit=10, every_task=False) == []
    stalls = find_stalls(w, now=10.0, limit=10, every_task=False)
    # worker:1 is 0.5 s short of the limit but stuck with worker:0: both are named.
    assert [s.task for s in stalls] == ["worker:0", "worker:1"]
    assert stalls[0].reason == "no progress for 10 s (step 5)"


def test_a_stopped_task_is_the_cause_named_first():
    w = [Watched("worker:0", 5, progress_at=0.0),
         Watched("worker:1", 5, progress_at=1.0, stopped_since=2.0, usage_at=10.0)]
    stalls = find_stalls(w, now=10.0, limit=10, every_task=False)
    assert [(s.task, s.stopped) for s in stalls] == [("worker:1", True), ("worker:0", False)]
    assert stalls[0].reason == "stopped (state T) for 8 s (step 5)"


def test_a_silent_wrapper_is_a_likely_cause():
    """The whole process group stopped (Ctrl-Z): its wrapper cannot report either."""
    w = [Watched("worker:0", 5, progress_at=0.0, usage_at=9.0),
         Watched("worker:1", 5, progress_at=0.5, usage_at=2.0)]
    stalls = find_stalls(w, now=10.0, limit=10, every_task=False)
    assert [(s.task, s.stopped) for s in stalls] == [("worker:1", True), ("worker:0", False)]
    assert "has not reported for 8 s" in stalls[0].reason


def test_without_progress_only_stopped_counts_and_only_when_set():
    quiet = Watched("worker:0", None, progress_at=0.0)
    stopped = Watched("worker:1", None, progress_at=0.0, stopped_since=1.0)
    assert find_stalls([quiet, stopped], now=100.0, limit=10, every_task=False) == []
    assert [s.task for s in find_stalls([quiet, stopped], now=100.0, limit=10,
                                        every_task=True)] == ["worker:1"]


def frames(lines: list[str]) -> list[str]:
    return where(main_thread(lines))


def test_the_main_thread_is_the_last_block_of_the_last_dump():
    lines = ["epoch 1",
             "Thread 0x00007f01 (most recent call first):",
             '  File "/x/threading.py", line 324 in wait',
             "",
             "Current thread 0x00007f02 (most recent call first):",
             '  File "/old.py", line 1 in old',
             "another line of the task",
             "Thread 0x00007f03 (most recent call first):",
             '  File "/x/threading.py", line 324 in wait',
             "",
             "Thread 0x00007f04 (most recent call first):",
             '  File "/job/train.py", line 21 in train_step',
             '  File "/job/train.py", line 30 in run',
             '  File "/job/train.py", line 40 in loop',
             '  File "/job/train.py", line 50 in <module>']
    assert frames(lines) == ["train_step (/job/train.py:21)", "run (/job/train.py:30)",
                             "loop (/job/train.py:40)"]
    assert frames(["no dump here"]) == []


TF = "/venv/lib/python3.11/site-packages/tensorflow/python/eager"
BLOCKED = ["Current thread 0x00007f04 (most recent call first):",
           f'  File "{TF}/execute.py", line 53 in quick_execute',
           f'  File "{TF}/context.py", line 1688 in call_function',
           '  File "/job/train.py", line 51 in train_step',
           '  File "/job/train.py", line 59 in <module>',
           '  File "<frozen runpy>", line 88 in _run_code',
           '  File "/repo/worker_entry/runner.py", line 52 in run_script']


def test_a_stack_inside_tensorflow_shows_where_the_users_code_called_in():
    assert frames(BLOCKED) == [f"quick_execute ({TF}/execute.py:53)",
                               "train_step (/job/train.py:51)", "<module> (/job/train.py:59)"]


def test_the_task_stuck_in_its_own_code_is_blamed_before_its_blocked_peer():
    sleeping = ["Current thread 0x00007f04 (most recent call first):",
                '  File "/job/train.py", line 44 in wait_forever',
                '  File "/job/train.py", line 50 in train_step']
    stalls = [Stall("worker:0", "no progress", False), Stall("worker:1", "no progress", False),
              Stall("worker:2", "stopped", True)]
    stacks = {"worker:0": main_thread(BLOCKED), "worker:1": main_thread(sleeping)}
    assert [s.task for s in blame_order(stalls, stacks)] == ["worker:2", "worker:1", "worker:0"]


def test_a_real_faulthandler_dump_is_read(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(
        "import faulthandler, signal, threading, time\n"
        "faulthandler.register(signal.SIGUSR2, all_threads=True)\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "def train_step():\n"
        "    print('ready', flush=True); time.sleep(30)\n"
        "train_step()\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR2)
        time.sleep(0.5)
    finally:
        proc.kill()
    out = proc.communicate()[0].splitlines()
    assert frames(out) == [f"train_step ({script}:5)", f"<module> ({script}:6)"]


def test_the_meter_sums_a_tree_and_sees_a_stopped_process():
    clock = iter([0.0, 2.0, 4.0]).__next__
    stats = {1: ("S", 100, 1000), 2: ("T", 50, 500)}
    meter = Meter(clock=clock, read=stats.get)
    ticks = os.sysconf("SC_CLK_TCK")
    first = meter.measure([1, 2, 3])  # 3 is gone: not counted
    assert first == {"cpu": round(100.0 * 150 / ticks / 2, 1), "rss": 1500, "processes": 2,
                     "stopped": True}
    stats[1], stats[2] = ("R", 100 + ticks, 1000), ("S", 50, 500)  # one core-second more
    second = meter.measure([1, 2])
    assert (second["cpu"], second["stopped"]) == (50.0, False)


def test_read_stat_of_a_stopped_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.2)
        stat = read_stat(proc.pid)
        assert stat is not None and stat[0] == "T" and stat[2] > 0
    finally:
        proc.kill()
        proc.wait()
    assert read_stat(proc.pid) is None
