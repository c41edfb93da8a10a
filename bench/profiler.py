"""`python bench/run.py --only profiler` (issue 41): what the profiler services cost, and how
long `tfo profile` takes.

- profiler_ratio: the bench's job (bench/job.py, 2 pinned workers) under tfo with every
  training task's profiler service (the default) and without (`profiler: false`), alternated
  A B, B A after a warm-up of each: steady throughput on ÷ off per pair. Between captures a
  service only waits on its socket.
- profile_2_s, profile_8_s: `tfo profile --seconds 2` of a running 2- and 8-worker job (the
  same job, long epochs), from the command to the table printed: the trace's 2 s, the
  client's 3 s start delay for many hosts (every task starts tracing at once), the helper's
  start and xprof's analyses of each trace.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from pathlib import Path

from bench.run import (
    PY,
    REPO,
    Setting,
    add,
    alternated,
    detail,
    events,
    job_args,
    kill_group,
    spec,
    steady_run,
    tfo,
)


def _spec(path: Path, name: str, args: list[str], workers: int, profiler: bool) -> Path:
    spec(path, name, args, workers)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "profiler": profiler}))
    return path


def bench_profiler(s: Setting, tmp: Path) -> None:
    if s.fake:  # the quick setting's tasks import no TensorFlow: no profiler to measure
        print("profiler: skipped in the quick setting (no TensorFlow in its tasks)", flush=True)
        return
    pairs, epochs = s.pairs, s.epochs
    print(f"profiler: {pairs} × (profiler services on, off), {epochs} epochs each", flush=True)

    def arm(i: int, on: bool) -> float:
        path = _spec(tmp / f"profiler-{i}-{on}.json", "bench-profiler",
                     job_args(s, epochs=epochs), 2, on)
        speed = steady_run(s, path, tmp / f"profiler-{'on' if on else 'off'}-{i}")
        if i >= 0:
            detail(f"profiler {'on' if on else 'off'} steps_per_s", speed)
        return speed

    alternated("profiler_ratio", pairs, arm)
    for workers in (2, 8):
        for i in range(max(1, s.pairs // 3)):
            add(f"profile_{workers}_s", _capture_time(s, tmp, workers, i))


def _capture_time(s: Setting, tmp: Path, workers: int, i: int) -> float:
    """A long job of `workers`; once every worker trains, `tfo profile --seconds 2` timed;
    then the job is stopped as Ctrl-C stops it."""
    rd = tmp / f"profile-{workers}-{i}"
    path = _spec(tmp / f"profile-{workers}-{i}.json", "bench-profile",
                 job_args(s, epochs=1000), workers, True)
    job = tfo("run", str(path), "--run-dir", str(rd))
    try:
        until = time.monotonic() + 600
        while time.monotonic() < until and len({e["task"] for e in events(rd)
                                                if e["event"] == "task_progress"}) < workers:
            if job.poll() is not None:
                raise RuntimeError(f"tfo run ended before training; see {rd}")
            time.sleep(0.5)
        time.sleep(2)  # past the first steps
        started = time.monotonic()
        done = subprocess.run([PY, "-m", "orchestrator", "profile", str(rd), "--seconds", "2"],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        took = time.monotonic() - started
        print(done.stdout, flush=True)
        answered = sum(1 for line in done.stdout.splitlines()
                       if line.startswith("worker:") and " ms " in line)
        if done.returncode != 0 or not answered:
            raise RuntimeError(f"tfo profile of {workers} workers: exit {done.returncode}\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        detail(f"profile_{workers}_s: tasks analysed", answered)  # a task may not answer
        return took
    finally:
        with contextlib.suppress(OSError):
            job.send_signal(signal.SIGINT)
        try:
            job.wait(60)
        except subprocess.TimeoutExpired:
            kill_group(job)
