"""`python bench/run.py --only profiler` (issue 41): how long `tfo profile` takes, how often
TensorFlow's profiler crashes a traced task, and what the profiler services cost.

- profile_2_s, profile_8_s: `tfo profile --seconds 2` of a running 2- and 8-worker job (the
  bench's job, long epochs), from the command to the table printed: the helper's start, the
  capture (every task starts tracing 2 s after the request, then traces 2 s), xprof's
  analyses of each trace. Only captures whose table has a row of figures for every worker
  are timed.
- profile_crashes: TensorFlow 2.21's profiler can crash a traced worker (a use-after-free
  when a trace stops: docs/guide/slow.md), and `tfo profile` then names it (`worker:1:
  exited while traced (signal SIGSEGV)`). The jobs restart their workers
  (`restart: {policy: on-failure}`), so after a crash the bench waits until every worker
  trains again and captures again, up to `TRIES` captures a job for `CAPTURES` timed ones;
  the crashes (a traced worker's SIGSEGV or SIGABRT: a group's other workers, stopped for
  its restart, are not counted) ÷ the captures tried, per job, is this figure.
- profiler_ratio: the bench's job (bench/job.py, 2 pinned workers) under tfo with every
  training task's profiler service and tfo's read of its tf.data model every 2 s
  (worker_entry/progress/inputwait.py; both the default) and without (`profiler: false`
  turns off both), alternated
  A B, B A after a short warm-up of each: steady throughput on ÷ off per pair. Between
  captures a service only waits on its socket, so the difference looked for is under 1 %.

  The arms' length. An arm's throughput is the median of its epochs' steps/s
  (run.steady_throughput): relative standard error ≈ 1.25 c / √n for n epoch intervals whose
  rates spread by c (relative standard deviation); a pair's ratio, of two arms, ≈ √2 × 1.25 c
  / √n = 1.77 c / √n. The full setting's arms (8 epochs of 60 steps, n = 7) read pairs of
  0.74-1.14: c ≈ 19 % for a 0.6 s epoch. Longer epochs spread less (hiccups average out):
  three arms here of 12 epochs × 300 steps at load ~5 read c = 3.2-4.5 % (91-95 steps/s):
  so `RATIO_EPOCHS` = 24 epochs of `RATIO_STEPS_PER_EPOCH` = 300 (n = 23, 6,900 steps counted,
  ~72 s at a quiet machine's ~100 steps/s): a pair's noise ≈ 1.77 c / √23 = 0.37 c, 1.2-1.7 %
  at those loaded 3.2-4.5 %, 0.7 % at 2 %, 0.4 % at a quiet machine's 1 %. `RATIO_PAIRS` = 4 pairs
  (the figure is their median) fit the time: 8 arms × (72 s + ~12 s of start and end) + two
  short warm-ups (~20 s each) ≈ 12 min, the captures' two jobs ~3 min: about 15 min. Under
  0.5 % a pair at c = 3.2 % would take n ≈ 130 (6 min an arm, 1.7 h the section), so each
  pair's own noise, from its epochs' spread, is kept as a detail (`profiler_ratio, a pair's
  noise %`): the quiet machine's run shows what it was.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time
from pathlib import Path

from bench.run import (
    PY,
    REPO,
    Setting,
    add,
    detail,
    events,
    interrupt,
    job_args,
    spec,
    task_logs,
    tfo,
    timeline,
    wait,
)

RATIO_PAIRS = 4  # the throughput pairs, and each arm's epochs × steps (module doc)
RATIO_EPOCHS = 24
RATIO_STEPS_PER_EPOCH = 300
CAPTURES = 2  # timed captures of each job (a table of every worker)
TRIES = 5  # at most this many captures of a job (a crash costs one, and a restart)
TRAINING_WAIT_SECONDS = 600  # the job's start, or its restart after a crash, at load 40


def _spec(path: Path, name: str, args: list[str], workers: int, profiler: bool,
          restart: str = "never", max_restarts: int = 0) -> Path:
    spec(path, name, args, workers, restart=restart, max_restarts=max_restarts)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "profiler": profiler}))
    return path


def bench_profiler(s: Setting, tmp: Path) -> None:
    if s.fake:  # the quick setting's tasks import no TensorFlow: no profiler to measure
        print("profiler: skipped in the quick setting (no TensorFlow in its tasks)", flush=True)
        return
    for workers in (2, 8):
        _captures(s, tmp, workers)
    _ratio(s, tmp)


def _ratio(s: Setting, tmp: Path) -> None:
    pairs = RATIO_PAIRS
    print(f"profiler: {pairs} × (profiler services on, off), {RATIO_EPOCHS} epochs × "
          f"{RATIO_STEPS_PER_EPOCH} steps each", flush=True)

    def arm(i: int, on: bool) -> tuple[float, float]:
        """Steady steps/s of one run, and its relative standard error (module doc)."""
        epochs, steps = (RATIO_EPOCHS, RATIO_STEPS_PER_EPOCH) if i >= 0 else (4, 60)
        path = _spec(tmp / f"profiler-{i}-{on}.json", "bench-profiler",
                     job_args(s, epochs=epochs, steps_per_epoch=steps), 2, on)
        rd = tmp / f"profiler-{'on' if on else 'off'}-{i}"
        if wait(tfo("run", str(path), "--run-dir", str(rd)), 900, "tfo run") != 0:
            raise RuntimeError(f"tfo run failed; see {rd}")
        speeds, errors = [], []
        for text in task_logs(rd).values():
            ends = timeline(text)["epoch"]
            rates = [steps / (b - a) for a, b in zip(ends, ends[1:], strict=False)]
            speeds.append(statistics.median(rates))
            errors.append(1.2533 * statistics.stdev(rates) / statistics.median(rates)
                          / len(rates) ** 0.5 if len(rates) > 1 else 0.0)
        if i >= 0:
            detail(f"profiler {'on' if on else 'off'} steps_per_s", statistics.mean(speeds))
        return statistics.mean(speeds), statistics.mean(errors)

    arm(-1, True), arm(-1, False)  # warm-ups, not counted
    for i in range(pairs):
        got = {on: arm(i, on) for on in ((True, False) if i % 2 == 0 else (False, True))}
        add("profiler_ratio", got[True][0] / got[False][0])
        detail("profiler_ratio, a pair's noise %",
               100 * (got[True][1] ** 2 + got[False][1] ** 2) ** 0.5)


def _training(rd: Path, workers: int, restarted: dict[str, float]) -> bool:
    """Every worker reported progress since its latest start, and each in `restarted` (a
    worker the last capture crashed: that capture's time) started again after it (until tfo
    records the restart, the crashed attempt's progress is the latest)."""
    latest: dict[str, str] = {}
    started: dict[str, float] = {}
    for e in events(rd):
        if e["event"] in ("task_started", "task_progress", "task_exited"):
            latest[e["task"]] = e["event"]
        if e["event"] == "task_started":
            started[e["task"]] = e["time"]
    return len(latest) >= workers and all(v == "task_progress" for v in latest.values()) \
        and all(started.get(task, 0.0) >= at for task, at in restarted.items())


def _table_rows(out: str, workers: int) -> int:
    """The workers with a row of figures in `tfo profile`'s table."""
    return sum(1 for line in out.splitlines()
               if line.startswith("worker:") and " ms " in line) if out else 0


def _captures(s: Setting, tmp: Path, workers: int) -> None:
    """A long job of `workers` that restarts its workers; `tfo profile --seconds 2` once
    every worker trains, timed where its table has every worker, again after a crash (once
    every worker trains again); then the job is stopped as Ctrl-C stops it."""
    rd = tmp / f"profile-{workers}"
    path = _spec(tmp / f"profile-{workers}.json", "bench-profile", job_args(s, epochs=1000),
                 workers, True, restart="on-failure", max_restarts=TRIES + 2)
    job = tfo("run", str(path), "--run-dir", str(rd))
    timed = tried = crashes = 0
    restarted: dict[str, float] = {}
    try:
        while timed < CAPTURES and tried < TRIES:
            until = time.monotonic() + TRAINING_WAIT_SECONDS
            while not _training(rd, workers, restarted):
                if job.poll() is not None or time.monotonic() > until:
                    raise RuntimeError(f"tfo run of {workers} workers: not training; see {rd}")
                time.sleep(0.5)
            time.sleep(2)  # past the first steps of a restart
            tried += 1
            at, started = time.time(), time.monotonic()
            done = subprocess.run([PY, "-m", "orchestrator", "profile", str(rd), "--seconds",
                                   "2"], cwd=REPO, capture_output=True, text=True, timeout=300)
            took = time.monotonic() - started
            print(done.stdout, flush=True)
            lost = [line.split(": exited while traced (")[0] for line in
                    done.stdout.splitlines() if ": exited while traced (" in line]
            # The profiler's crash is a SIGSEGV or glibc's abort (docs/guide/slow.md); the
            # other workers of a group the crash restarts exit too (SIGTERM, an error).
            crashes += sum(1 for line in done.stdout.splitlines() if re.search(
                r": exited while traced \(signal (SIGSEGV|SIGABRT)\)", line))
            restarted = dict.fromkeys(lost, at)
            answered = _table_rows(done.stdout, workers)
            if done.returncode == 0 and answered == workers and not lost:
                timed += 1
                add(f"profile_{workers}_s", took)
            elif not lost:  # no crash to excuse it: say what happened, and try again
                print(f"tfo profile of {workers} workers: exit {done.returncode}, "
                      f"{answered} of {workers} rows\n{done.stderr[-2000:]}", flush=True)
            detail(f"profile_{workers}_s: workers with figures", answered)
        add("profile_crashes", crashes / tried)
        detail(f"profile_crashes: {workers} workers, crashes", crashes)
        detail(f"profile_crashes: {workers} workers, captures tried", tried)
    finally:
        interrupt(job, 60)
