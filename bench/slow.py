"""`python bench/run.py --only slow` (issue 41, item 3): how soon tfo names the worker that
holds a synchronous job back, and whether it ever names one in a balanced job.

- slow_input_s: a 3-worker MultiWorkerMirrored job of tests/scripts/slow_input.py whose
  worker:1's `map` sleeps 5 ms an element from the start: from worker:1's first step
  (`task_first_step`) to the `task_slow` naming it, cause input (loop/starved.py: the 30 s
  hold, a 10 s window first). RUNS runs.
- slow_compute_s: a 3-worker job of tests/scripts/busy_worker.py, balanced for
  BALANCED_SECONDS of training, then worker:2 starts a Python thread that computes besides
  training: from the thread's start (its line seen in the task's log, polled every 0.5 s)
  to `task_slow` naming worker:2, cause compute (loop/demand.py). RUNS runs.
- slow_false_alarms: every `task_slow` said while a job was balanced: the compute runs'
  balanced phases and BALANCED_RUNS more jobs of busy_worker.py with no busy thread, each
  trained BALANCED_SECONDS (more than a hold and its window): RUNS + BALANCED_RUNS balanced
  stretches, 5 in the full setting. Target 0: a false alarm is worse than none.

Each job is stopped (Ctrl-C, as a user would) once its figure is taken. The tasks share this
machine's cores with each other, as the tests' do: a crowded host is the harder case for
the CPU signal (every task waits on the runqueue).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.run import REPO, Setting, add, detail, events, interrupt, tfo

RUNS = 2
BALANCED_RUNS = 3
BALANCED_SECONDS = 60.0
NAMED_WITHIN = 180.0  # give up on a run after this long of training: the figure is missing
START_SECONDS = 300.0  # a 3-worker job's start at load 20


def _spec(path: Path, name: str, script: str, args: list[str]) -> Path:
    path.write_text(json.dumps({
        "name": name, "strategy": "multi_worker_mirrored",
        "job": {"script": str(REPO / "tests" / "scripts" / script), "args": args},
        "tasks": {"worker": ["localhost:auto"] * 3},
        "restart": {"policy": "never"}, "timeouts": {"startup_seconds": 300}}))
    return path


def _first(rd: Path, event: str, task: str | None = None) -> dict | None:
    return next((e for e in events(rd) if e["event"] == event
                 and (task is None or e.get("task") == task)), None)


def _until(check, seconds: float):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    return None


def bench_slow(s: Setting, tmp: Path) -> None:
    if s.fake:  # the quick setting's tasks import no TensorFlow: nothing trains to judge
        print("slow: skipped in the quick setting (no TensorFlow in its tasks)", flush=True)
        return
    false_alarms = stretches = 0
    for i in range(RUNS):
        rd = tmp / f"slow-input-{i}"
        job = tfo("run", str(_spec(tmp / f"slow-input-{i}.json", "bench-slow-input",
                                   "slow_input.py", ["--slow_task", "worker:1", "--sleep_ms",
                                                     "5", "--steps", "100000"])),
                  "--run-dir", str(rd))
        try:
            first = _until(lambda rd=rd: _first(rd, "task_first_step", "worker:1"),
                           START_SECONDS)
            named = first and _until(lambda rd=rd: _first(rd, "task_slow"), NAMED_WITHIN)
        finally:
            interrupt(job)
        if named and (named["task"], named["cause"]) == ("worker:1", "input"):
            add("slow_input_s", named["time"] - first["time"])
            detail("slow_input: worker:1's share waiting", named["input_wait_share"])
            detail("slow_input: its peers' share", named["peers_input_wait_share"])
        else:
            print(f"  slow input run {i}: not named as it should be: {named}", flush=True)

        rd = tmp / f"slow-compute-{i}"
        job = tfo("run", str(_spec(tmp / f"slow-compute-{i}.json", "bench-slow-compute",
                                   "busy_worker.py", ["--busy_task", "worker:2", "--busy_after",
                                                      str(BALANCED_SECONDS), "--steps",
                                                      "100000"])), "--run-dir", str(rd))
        log = rd / "logs" / "worker-2.log"
        try:
            started = _until(lambda log=log: log.exists() and "background job started"
                             in log.read_text(errors="replace") and time.time(),
                             START_SECONDS + BALANCED_SECONDS)
            named = started and _until(lambda rd=rd: _first(rd, "task_slow"), NAMED_WITHIN)
        finally:
            interrupt(job)
        if started:
            stretches += 1
            false_alarms += sum(1 for e in events(rd)
                                if e["event"] == "task_slow" and e["time"] < started)
        if named and named["time"] >= started and \
                (named["task"], named["cause"]) == ("worker:2", "compute"):
            add("slow_compute_s", named["time"] - started)
        else:
            print(f"  slow compute run {i}: not named as it should be: {named}", flush=True)

    for i in range(BALANCED_RUNS):
        rd = tmp / f"slow-balanced-{i}"
        job = tfo("run", str(_spec(tmp / f"slow-balanced-{i}.json", "bench-slow-balanced",
                                   "busy_worker.py", ["--steps", "100000"])),
                  "--run-dir", str(rd))
        try:
            first = _until(lambda rd=rd: _first(rd, "task_first_step"), START_SECONDS)
            if first:
                time.sleep(BALANCED_SECONDS)
        finally:
            interrupt(job)
        if first:
            stretches += 1
            false_alarms += sum(1 for e in events(rd) if e["event"] == "task_slow")
    if stretches:
        add("slow_false_alarms", false_alarms)
        detail("slow: balanced stretches of training judged", stretches)
