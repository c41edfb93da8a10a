"""Stall rules, stack dumps and the wrapper's usage meter: pure, no processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.loop.stall import (
    IDLE_CPU,
    Pace,
    Stall,
    StallRule,
    Watched,
    blame_order,
    find_stalls,
    main_thread,
    paced,
    startup_over,
    stuck_thread,
    threads,
    where,
)
from worker_entry.usage import Meter, read_stat

FIXED = StallRule(seconds=10)


def at(name: str, step: int | None = None, moved_at: float = 0.0, busy_at: float | None = None,
       **kw) -> Watched:
    """A task whose steps (from 1) last moved to `step` at `moved_at`; busy until `busy_at`
    (default: its last step)."""
    pace = Pace(0.0) if step is None else Pace(0.0, step=step, moved_at=moved_at, first=1)
    return Watched(name, pace, moved_at if busy_at is None else busy_at, **kw)


def test_nothing_until_one_task_is_over_the_limit():
    w = [at("worker:0", 5, moved_at=0.0, busy_at=9.9), at("worker:1", 5, moved_at=0.5)]
    assert find_stalls(w, now=9.9, rule=FIXED) == []
    stalls = find_stalls(w, now=10.0, rule=FIXED)
    # worker:1 is 0.5 s short of the limit but stuck with worker:0: both are named.
    assert [s.task for s in stalls] == ["worker:0", "worker:1"]
    assert stalls[0].reason == "no progress for 10 s (step 5)"
    assert stalls[0].limit == "10 s"


def test_a_stopped_task_is_the_cause_named_first():
    w = [at("worker:0", 5, moved_at=0.0),
         at("worker:1", 5, moved_at=1.0, stopped_since=2.0, usage_at=10.0)]
    stalls = find_stalls(w, now=10.0, rule=FIXED)
    assert [(s.task, s.stopped) for s in stalls] == [("worker:1", True), ("worker:0", False)]
    assert stalls[0].reason == "stopped (state T) for 8 s (step 5)"


def test_a_silent_wrapper_is_a_likely_cause():
    """The whole process group stopped (Ctrl-Z): its wrapper cannot report either."""
    w = [at("worker:0", 5, moved_at=0.0, usage_at=9.0),
         at("worker:1", 5, moved_at=0.5, usage_at=2.0)]
    stalls = find_stalls(w, now=10.0, rule=FIXED)
    assert [(s.task, s.stopped) for s in stalls] == [("worker:1", True), ("worker:0", False)]
    assert "has not reported for 8 s" in stalls[0].reason


def test_without_steps_a_stopped_task_or_an_idle_group_is_a_stall():
    busy = at("worker:0", busy_at=99.0)
    stopped = at("worker:1", busy_at=0.0, stopped_since=1.0)
    assert [s.task for s in find_stalls([busy, stopped], now=100.0, rule=FIXED)] == ["worker:1"]
    idle = [at("worker:0", busy_at=80.0), at("worker:1", busy_at=89.0)]
    assert find_stalls(idle, now=98.9, rule=FIXED) == []
    stalls = find_stalls(idle, now=99.0, rule=FIXED)
    assert [s.task for s in stalls] == ["worker:0", "worker:1"]  # quiet longest first
    assert stalls[0].reason == f"idle for 19 s (no step seen): no output, CPU under {IDLE_CPU:g} %"


def timeline(marks: list[tuple[float, int, int | None, int | None, int | None]]) -> Pace:
    """A task's pace after progress markers (time, step, epoch, step_in_epoch, steps), of a
    fit of 2 epochs where epochs are known."""
    pace = Pace(0.0)
    for t, step, epoch, in_epoch, steps in marks:
        pace = paced(pace, t, step, epoch, in_epoch, steps, None if steps is None else 2)
    return pace


def every(start: float, seconds: float, steps: range, per_epoch: int | None = None):
    """A marker a step, `seconds` apart, from `start` (Keras: epoch and place known)."""
    return [(start + i * seconds, n, None if per_epoch is None else (n - 1) // per_epoch,
             None if per_epoch is None else (n - 1) % per_epoch + 1, per_epoch)
            for i, n in enumerate(steps)]


# Compilation: 90 s to the first step, then a marker a second (fast steps, throttled).
FAST = every(90.0, 1.0, range(1, 41))
# Steps of 20 s each after 30 s to the first.
SLOW = every(30.0, 20.0, range(1, 26))
# An epoch of 30 steps, a marker a second, then 100 s of validation before epoch 1.
EPOCH_END = every(10.0, 1.0, range(1, 31), per_epoch=30)
AFTER_VALIDATION = EPOCH_END + every(139.0, 1.0, range(31, 36), per_epoch=30)
FIT_OVER = AFTER_VALIDATION + every(144.0, 1.0, range(36, 61), per_epoch=30)
AUTO = StallRule()


@pytest.mark.parametrize("case, marks, busy, now, stalled, limit", [
    # The first step's wait (compilation) is not a step: a second a step, the floor.
    ("compilation excluded", FAST, False, 129.0 + 59.9, False, 60.0),
    ("compilation excluded, over", FAST, False, 129.0 + 60.0, True, 60.0),
    # 20 s steps: 10 x 20 s, not 60 s, and a busy task is judged by its steps alone.
    ("20 s steps adapt", SLOW, True, 510.0 + 199.0, False, 200.0),
    ("20 s steps, over", SLOW, True, 510.0 + 200.0, True, 200.0),
    # Fewer than WARMUP_STEPS steps after the first: steps tell nothing yet, work does.
    ("warming up, busy", FAST[:15], True, 1000.0, False, 60.0),
    ("warming up, idle", FAST[:15], False, 104.0 + 60.0, True, 60.0),
    # The first epoch's end (validation, checkpoints) is waited out while the task works...
    ("first epoch end, busy", EPOCH_END, True, 39.0 + 500.0, False, 60.0),
    ("first epoch end, idle", EPOCH_END, False, 39.0 + 60.0, True, 60.0),
    # ... and once over, its 100 s are the longest wait: the limit is 1000 s.
    ("after the first epoch", AFTER_VALIDATION, True, 143.0 + 999.0, False, 1000.0),
    ("after the first epoch, over", AFTER_VALIDATION, True, 143.0 + 1000.0, True, 1000.0),
    # Its fit's last step (2 epochs of 30): evaluating or saving after it is no step.
    ("after its fit, busy", FIT_OVER, True, 168.0 + 5000.0, False, 1000.0),
    ("after its fit, idle", FIT_OVER, False, 168.0 + 1000.0, True, 1000.0),
])
def test_auto_adapts_to_the_steps(case, marks, busy, now, stalled, limit):
    pace = timeline(marks)
    assert AUTO.limit(pace) == pytest.approx(limit), case
    busy_at = now if busy else pace.moved_at
    w = Watched("worker:0", pace, busy_at)
    assert bool(find_stalls([w], now, AUTO)) is stalled, case


def test_a_first_step_compiling_for_90_s_is_not_a_stall_while_it_works():
    starting = Watched("worker:0", Pace(0.0), busy_at=89.0)
    assert find_stalls([starting], 90.0, AUTO) == []
    assert find_stalls([Watched("worker:0", Pace(0.0), busy_at=0.0)], 60.0, AUTO)


def test_the_floor_is_a_setting():
    assert StallRule(floor=3.0).limit(timeline(FAST)) == 10.0  # 10 x a second
    assert StallRule(floor=30.0).limit(timeline(FAST)) == 30.0


def test_steps_that_do_not_move_change_nothing():
    pace = timeline(FAST)
    assert paced(pace, 500.0, pace.step or 0) == pace


@pytest.mark.parametrize("case, group, stalled", [
    ("every task idle", [at("worker:0", busy_at=0.0), at("worker:1", busy_at=1.0)],
     ["worker:0", "worker:1"]),
    ("one works", [at("worker:0", busy_at=0.0), at("worker:1", busy_at=60.0)], []),
    # Usage comes every 2 s: a limit shorter than that must not find a busy task idle.
    ("its last usage was busy", [at("worker:0", busy_at=0.0, cpu=50.0)], []),
    ("its last usage was idle", [at("worker:0", busy_at=0.0, cpu=0.5)], ["worker:0"]),
    # A task still starting is the startup limit's: its peers wait for it, idle.
    ("one not up", [at("worker:0", busy_at=0.0), at("worker:1", busy_at=0.0, up=False)], []),
    # PS: the chief waits while the servers work; a server is never named itself.
    ("servers work", [at("chief:0", busy_at=0.0), at("worker:0", busy_at=70.0, server=True)],
     []),
    ("servers idle too", [at("chief:0", busy_at=0.0), at("worker:0", busy_at=0.0, server=True)],
     ["chief:0"]),
])
def test_the_idle_signal_takes_the_whole_group(case, group, stalled):
    assert [s.task for s in find_stalls(group, 70.0, AUTO)] == stalled, case


@pytest.mark.parametrize("case, started_at, busy_at, now, over", [
    ("within the limit, idle", 0.0, 0.0, 30.0, False),
    ("over, idle", 0.0, 0.0, 30.1, True),
    ("over, working", 0.0, 28.0, 30.1, False),  # a one-process script loading its data
    ("over, idle not long enough", 0.0, 26.0, 30.9, False),
    ("over, idle long enough", 0.0, 26.0, 31.0, True),
])
def test_the_startup_limit_fails_only_an_idle_task(case, started_at, busy_at, now, over):
    w = Watched("worker:0", Pace(started_at), busy_at, up=False)
    assert startup_over([w], now, limit=30.0) is over, case


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
    stacks = {"worker:0": threads(BLOCKED), "worker:1": threads(sleeping)}
    assert [s.task for s in blame_order(stalls, stacks)] == ["worker:2", "worker:1", "worker:0"]


def test_a_worker_blocked_in_its_input_pipeline_is_blamed_with_that_thread():
    """A tf.py_function runs in one of TensorFlow's threads: the main thread of the blocked
    worker waits inside TensorFlow as its peer's does; the thread in the user's own code
    tells them apart, and is the stack shown."""
    input_thread = ["Thread 0x00007f09 (most recent call first):",
                    '  File "/job/main.py", line 31 in slow_map',
                    f'  File "{TF}/ops/script_ops.py", line 151 in __call__', ""]
    waiting = ["Thread 0x00007f08 (most recent call first):",
               '  File "/x/lib/python3.11/threading.py", line 324 in wait', ""]
    blocked, peer = threads(input_thread + BLOCKED), threads(waiting + BLOCKED)
    stalls = [Stall("worker:0", "no progress", False), Stall("worker:1", "no progress", False)]
    order = blame_order(stalls, {"worker:0": peer, "worker:1": blocked})
    assert [s.task for s in order] == ["worker:1", "worker:0"]
    assert where(stuck_thread(blocked)) == ["slow_map (/job/main.py:31)"]
    assert where(stuck_thread(peer)) == frames(BLOCKED)  # no thread of its own: the main one


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
    waits = {1: {10: 10**9, 11: 0}, 2: {20: 10**9}}  # ns on a runqueue, by thread
    meter = Meter(clock=clock, read=stats.get, waits=waits.get)
    ticks = os.sysconf("SC_CLK_TCK")
    first = meter.measure([1, 2, 3])  # 3 is gone: not counted
    assert first == {"cpu": round(100.0 * 150 / ticks / 2, 1), "wait": 100.0,
                     "cpus": len(os.sched_getaffinity(0)), "rss": 1500, "processes": 2,
                     "stopped": True}
    stats[1], stats[2] = ("R", 100 + ticks, 1000), ("S", 50, 500)  # one core-second more
    # thread 11 waited half a second, 12 is new (all its wait counts), 20 ended
    waits[1], waits[2] = {10: 10**9, 11: 5 * 10**8, 12: 10**8}, {}
    second = meter.measure([1, 2])
    assert (second["cpu"], second["wait"], second["stopped"]) == (50.0, 30.0, False)
    assert "wait" not in Meter(read=stats.get, waits=lambda pid: None).measure([1])


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
