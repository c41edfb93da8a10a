"""`make bench`: every figure of issue 13, each the median of repeated runs (with min and
max), against its target. Writes bench/results.json and bench/results.png, prints a table.

    python bench/run.py            # the full setting: about 10 minutes on 2 quiet cores
    python bench/run.py --quick    # a tiny setting (seconds; only the standbys import
                                   # TensorFlow): checks the harness
    python bench/run.py --extras   # also the parameter-server and SSH-lab figures (the
                                   # lab's recovery too), holding /tmp/sshlab.lock
    python bench/run.py --only light --counts 2,64   # one section (cli, light, paired,
                                                     # resume; repeatable), light tasks at 2, 64

Figures (the job is bench/job.py, the same script under tfo and by hand):
- paired: tfo and the hand launch (TensorFlow's guide: one process per task, TF_CONFIG
  exported, nothing watching) alternate in the same run, A B then B A, so drift cancels,
  after one uncounted warm-up run of each; each
  pair gives a ratio tfo ÷ hand of the whole run's wall time, of start → both workers'
  first step, of training throughput (steps/s after epoch 0) and of CPU (informational).
  Each worker has a core of its own and one intra-op thread (bench/job.py --pin), in both
  arms: unpinned, two workers fighting over 2 cores swung the pairs from 0.61 to 1.54.
- coordinator CPU per wall second: `tfo run` of N light tasks (bench/job.py --fake: a
  process that listens on its port and sleeps), the coordinator's own CPU time over a
  window once all are ready, for N = 2 … 64 (the scale curve).
- SIGKILL → detected / all stopped: in the same runs, one task's wrapper is SIGKILLed;
  task_exited and the last task_stopped, from events.jsonl, against the kill's time.
- recovery (issue 39): the same kill with tfo's defaults (the restart policy alone set) on
  this machine's 2 cores: kill → both training again, and tfo run → first step; paths
  (bench/restart_paths.py): fork-served against standby restarts, time and memory;
  recovery_lab (extras: `--only lab_recovery`): the same job with both workers on an SSH lab
  host (tests/sshlab.py's, under /tmp/sshlab.lock).
- SIGKILL → training resumed: 2-worker MWMS under tfo, a worker SIGKILLed after epoch 0,
  restart on-failure; kill → both workers' first step of attempt 1, with its breakdown.
  `resume` with warm spares (restart.warm_spares: true; the kill waits until both standbys
  have imported TensorFlow), `resume_cold` without, alternated; the spare's RSS in detail.
  Once both workers took their first step again, the run is stopped (exit 143).
- `tfo --help`, `tfo plan`: wall time; `tfo plan --json` of 1,000 tasks: time and size,
  and size per task at 1,000 against 250 (linear: within 10 %).
- TensorFlow's import (informational): the job's imports (numpy, TensorFlow, scikit-learn)
  in each arm, the slower worker of each run.
- MWMS strategy built (informational): TensorFlow imported → the strategy built, the
  slower worker of each run; a max near 1 s is gRPC's default reconnect backoff.
- fit() tail (informational, item of issue 13): last epoch's end → fit() returned; and where
  that wait went since: both workers' code over (`BENCH done`) → the run over, per arm.
- progress (issue 29): the same job under tfo with the automatic progress (the default) and
  without (TFO_AUTO_PROGRESS=0), alternated: throughput on ÷ off; and bench/progress_cost.py:
  the callback's hook alone, a tiny fit's step and a tf.function call, with it − without.
- kitsoak (bench/kitsoak.py, issue 37): 2-worker tf_cluster runs in pytest sessions, plain
  and under -n 2 alternately: how many hung (target 0) or failed otherwise.
- lab (bench/lab.py), kit (bench/kit.py); elastic (bench/elastic.py, issue 27): a 3-worker
  elastic job on 3 SSH lab hosts, one host's link down → training again with 2 workers, and
  back → with 3, in seconds; the loss curve across both (elastic-loss.json/.png).
- profiler (bench/profiler.py, issue 41): throughput with every task's profiler service on ÷
  off, alternated; `tfo profile --seconds 2` of a running 2- and 8-worker job, and how
  often a capture crashed a traced worker (TensorFlow's profiler: docs/guide/slow.md).
- slow (bench/slow.py, issue 41): a worker's input slowed, and a worker's busy thread, to the
  `task_slow` naming it; and any `task_slow` said in balanced jobs (target 0).
- chaos (bench/chaos.py, issue 37): an elastic 3-worker localhost job under random SIGKILL,
  SIGSTOP, SIGTERM and wrapper kills (a fixed seed) for 5 minutes: faults recovered, fault →
  training again, epochs lost, processes and files left after Ctrl-C (chaos.json).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PY = sys.executable
JOB = "bench/job.py"
BENCH_LINE = re.compile(r"^BENCH (\w+)(?: (\d+))? ([\d.]+)$")
ATTEMPT_HEADER = re.compile(r"^===== tfo: \S+ attempt (\d+) =====$")


@dataclass(frozen=True)
class Setting:
    pairs: int  # A B pairs of the paired figures
    epochs: int
    steps_per_epoch: int
    fake: bool  # bench/job.py --fake: no TensorFlow
    counts: tuple[int, ...]  # light-task counts of the coordinator-CPU curve
    runs_per_count: int
    window: float  # seconds of coordinator CPU measured per run
    resumes: int
    cli_reps: int
    plan_tasks: tuple[int, int]  # `tfo plan --json` sizes: (small, large)


FULL = Setting(pairs=7, epochs=8, steps_per_epoch=60, fake=False, counts=(2, 8, 16, 32, 64),
               runs_per_count=5, window=2.0, resumes=5, cli_reps=9, plan_tasks=(250, 1000))
QUICK = Setting(pairs=1, epochs=2, steps_per_epoch=3, fake=True, counts=(2, 4),
                runs_per_count=1, window=0.3, resumes=1, cli_reps=1, plan_tasks=(10, 40))


@dataclass
class Figure:
    key: str
    label: str
    unit: str
    target: float | None  # None: informational
    better: str = "le"  # "le": at most the target; "ge": at least
    before: str = ""  # the figure in the issue, before this work
    samples: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def met(self) -> bool | None:
        if self.target is None or self.median is None:
            return None
        return self.median <= self.target if self.better == "le" else self.median >= self.target

    def summary(self) -> dict:
        d = asdict(self)
        d.update(median=self.median, min=min(self.samples, default=None),
                 max=max(self.samples, default=None), n=len(self.samples), met=self.met)
        return d


FIGURES: dict[str, Figure] = {f.key: f for f in [
    Figure("wall_ratio", "whole run, tfo ÷ hand", "×", 1.02, before="1.084"),
    Figure("first_step_ratio", "start → both first step, tfo ÷ hand", "×", 1.05, before="1.125"),
    Figure("throughput_ratio", "throughput, tfo ÷ hand", "×", 0.99, "ge", before="0.983"),
    Figure("cpu_ratio", "CPU of the whole run, tfo ÷ hand", "×", None, before="1.04"),
    Figure("tasks_started", "tfo run → both tasks started", "s", None, before="0.49"),
    Figure("imports_tfo", "TensorFlow's import, tfo (slower worker)", "s", None),
    Figure("imports_hand", "TensorFlow's import, hand (slower worker)", "s", None),
    Figure("strategy_tfo", "MWMS strategy built, tfo (slower worker)", "s", None),
    Figure("strategy_hand", "MWMS strategy built, hand (slower worker)", "s", None),
    Figure("tfo_cpu_share", "tfo's own CPU while training ÷ its tasks'", "×", None),
    Figure("coord_cpu_2", "coordinator CPU / wall s, 2 light tasks", "cores", 0.01,
           before="0.019"),
    Figure("coord_cpu_64", "coordinator CPU / wall s, 64 light tasks", "cores", 0.03,
           before="0.32"),
    Figure("kill_detected", "SIGKILL → detected, 64 light tasks", "s", 0.1, before="0.011"),
    Figure("kill_stopped", "SIGKILL → all stopped, 64 light tasks", "s", 0.5, before="0.38"),
    Figure("resume", "SIGKILL → training resumed, 2-worker MWMS", "s", 3.0, before="6.1"),
    Figure("resume_cold", "… the same without warm spares", "s", None, before="6.1"),
    # Issue 39: the same with tfo's defaults (no restart key but the policy), where the
    # machine has no spare core: 2 workers pinned to this machine's 2 cores.
    Figure("recovery", "SIGKILL → both training again, tfo's defaults, no spare core", "s",
           1.0, before="3.04"),
    Figure("recovery_first_step", "… tfo run → both workers' first step, same runs", "s",
           None),
    # The same job on a lab host over SSH (bench/extras.py, --extras: the SSH lab).
    Figure("recovery_lab", "SIGKILL → both training again, a lab host over SSH", "s", 1.0),
    Figure("recovery_lab_first_step", "… tfo run → both workers' first step, same runs", "s",
           None),
    # Its way to skip TensorFlow's import (bench/restart_paths.py), informational.
    Figure("path_exec", "… standby: exec → waiting (its import, off the restart)", "s",
           None),
    Figure("path_standby_mib", "… a standby's RSS, per task", "MiB", None),
    Figure("help", "tfo --help", "s", 0.25, before="0.47"),
    Figure("plan", "tfo plan", "s", 0.3, before="0.39"),
    Figure("plan_floor", "… its dependencies' imports alone", "s", None),
    Figure("plan_json_time", "tfo plan --json, 1,000 tasks: time", "s", 1.0, before="1.9"),
    Figure("plan_json_linear", "tfo plan --json: bytes/task at 1,000 ÷ at 250", "×", 1.1,
           before="≈4 (51 MB)"),
    Figure("plan_json_mb", "tfo plan --json, 1,000 tasks: size", "MB", None, before="51"),
    Figure("fit_tail_tfo", "last epoch → fit() returned, tfo (worst worker)", "s", None),
    Figure("fit_tail_hand", "last epoch → fit() returned, hand (worst worker)", "s", None),
    # Python's last garbage collection in a TensorFlow process (3 s here), and a tf.data
    # iterator's destructor waiting for its autotune thread (README, When tasks die): tfo
    # stops a task there 3 s after its peers' code is over (supervise.py); a hand launch waits.
    Figure("exit_tail_tfo", "both workers' code over → run over, tfo", "s", None),
    Figure("exit_tail_hand", "both workers' code over → run over, hand", "s", None),
    # Issue 29: tfo's callback joins every fit by itself (worker_entry/progress/auto.py).
    Figure("progress_ratio", "throughput, automatic progress on ÷ off (tfo)", "×", 0.99,
           "ge"),
    # The same question within one process (bench/progress_cost.py): the bench job's fit
    # with the callback and without, alternated; between runs the pairs swing ±10 %.
    Figure("progress_job_ratio", "… the bench job's throughput, on ÷ off, in one process",
           "×", 0.99, "ge"),
    Figure("progress_hook_us", "… its callback's own work a step (the counted call)", "µs",
           None),
    Figure("progress_fit_us", "… a tiny fit's step, with it − without", "µs", None),
    Figure("progress_call_us", "… a tf.function call, counted − not", "µs", None),
    # Issue 41: every training task's profiler service (bench/profiler.py).
    Figure("profiler_ratio", "throughput, profiler services and input read on ÷ off (tfo)",
           "×", 0.99, "ge"),
    Figure("profile_2_s", "tfo profile --seconds 2, 2 workers: command → table", "s", None),
    Figure("profile_8_s", "… 8 workers", "s", None),
    Figure("profile_crashes", "… traced workers crashed by TF's profiler, per capture", "",
           None),
    # Issue 41: the slow worker named without being asked (bench/slow.py).
    Figure("slow_input_s", "a worker's input slowed → task_slow, cause input", "s", 60.0),
    Figure("slow_compute_s", "a worker's busy thread → task_slow, cause compute", "s", 60.0),
    Figure("slow_false_alarms", "task_slow said in balanced jobs (5 stretches)", "verdicts",
           0),
    # Issue 28: 10 cluster tests in one pytest run (bench/kit.py).
    Figure("kit_ratio", "10 cluster tests, tf_cluster ÷ TF's multi_process_runner", "×", 0.5),
    Figure("kit_tfo", "… tf_cluster, one pytest run", "s", None),
    Figure("kit_mpr", "… multi_process_runner, one pytest run", "s", None),
    Figure("kit_pool_mib", "… memory a pytest worker's pool holds between tests (PSS)",
           "MiB", None),
    # Issue 37 item 9: the kit's tasks never hang (bench/kitsoak.py; exec'd, no longer forked).
    Figure("kit_soak_hangs", "kit soak: 2-worker tf_cluster runs that hung", "runs", 0),
    Figure("kit_soak_failed", "… that failed otherwise", "runs", 0),
    Figure("kit_soak_runs", "… runs (half of them under pytest -n 2)", "runs", None),
    Figure("kit_soak_slowest", "… slowest test (a session's first waits for TF)",
           "s", None),
]}
CURVE: dict[int, list[float]] = {}  # light tasks → coordinator CPU per wall second
DETAIL: dict[str, list[float]] = {}  # breakdowns and absolute values, informational


def detail(name: str, value: float) -> None:
    DETAIL.setdefault(name, []).append(round(value, 4))


def add(key: str, value: float) -> None:
    FIGURES[key].samples.append(round(value, 4))
    print(f"  {FIGURES[key].label}: {value:.4g} {FIGURES[key].unit}", flush=True)


# ---- helpers -----------------------------------------------------------------------------

def events(run_dir: Path) -> list[dict]:
    """The run's events so far, read as `tfo status` reads them: the bench reads while tfo
    writes, and a line caught half-written (a JSONDecodeError once ended a whole bench) is
    skipped, to be read whole next time."""
    from orchestrator.runs.rundir import read_events

    path = run_dir / "events.jsonl"
    return read_events(path)[0] if path.exists() else []


def timeline(text: str, attempt: int | None = None) -> dict[str, list[float]]:
    """BENCH lines of one task's output (of one attempt, from tfo's headers in its log):
    {"first_step": [t], "epoch": [t0, t1, …], "fit_returned": [t], "done": [t]}."""
    found: dict[str, list[float]] = {}
    current = 0
    for line in text.splitlines():
        if m := ATTEMPT_HEADER.match(line):
            current = int(m.group(1))
        elif (m := BENCH_LINE.match(line)) and (attempt is None or current == attempt):
            found.setdefault(m.group(1), []).append(float(m.group(3)))
    return found


def throughput(tl: dict[str, list[float]], steps_per_epoch: int) -> float:
    ends = tl["epoch"]
    return steps_per_epoch * (len(ends) - 1) / (ends[-1] - ends[0])


def steady_throughput(tl: dict[str, list[float]], steps_per_epoch: int) -> float:
    """Steps per second of the median epoch: an epoch slowed by something else on the
    machine moves it less than the mean (a pair's ratio ranged 0.80-1.06 with the mean)."""
    ends = tl["epoch"]
    return statistics.median(steps_per_epoch / (b - a) for a, b in itertools.pairwise(ends))


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_seconds(p: psutil.Process) -> float:
    """CPU time of a process, all its threads: from schedstat in nanoseconds (cpu_times
    counts 10 ms ticks, too coarse for 0.01 of a core over a few seconds)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                total += int(Path(f"/proc/{p.pid}/task/{tid}/schedstat").read_text().split()[0])
    except OSError:
        return sum(p.cpu_times()[:2])
    return total / 1e9


class CpuSampler:
    """CPU seconds, every EVERY s until stopped, of tfo's own processes (the coordinator and
    its children, the tasks' wrappers) and of the tasks (the wrappers' children); for the hand
    launch, of its task processes. Both arms are sampled alike once tfo's tasks are found
    (a few /proc reads each time), so the sampling's own cost falls on both.
    `between(t0, t1)`: (tfo's, the tasks') CPU seconds in that window."""

    EVERY = 0.25

    def __init__(self, coordinator: int | None = None, tasks: tuple[int, ...] = (),
                 expect_tasks: int = 0) -> None:
        self._coordinator, self._tasks = coordinator, tasks
        # tfo's tree is looked for only until its `expect_tasks` tasks are found: psutil's
        # children() reads every process's /proc stat (0.7 ms here), and three calls every
        # 0.25 s took about 1 % of a core from the tfo arm alone, beside two pinned workers.
        self._expect = expect_tasks
        self._tree: tuple[list[int], list[int]] | None = None
        self._own: dict[int, float] = {}  # pid → its last CPU seconds (an exited one's stay)
        self._of_tasks: dict[int, float] = {}
        self._procs: dict[int, psutil.Process] = {}
        self.samples: list[tuple[float, float, float]] = []  # (unix time, tfo's, tasks')
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _cpu(self, pid: int, precise: bool = False) -> float:
        """tfo's own processes use milliseconds over a training window: schedstat's
        nanoseconds (cpu_times' 10 ms ticks read 0 in 3 of 7 pairs); the tasks' seconds
        are read in ticks, cheaply (a TensorFlow task has a hundred threads)."""
        p = self._proc(pid)
        if precise:
            return cpu_seconds(p)
        t = p.cpu_times()
        return t.user + t.system

    def _proc(self, pid: int) -> psutil.Process:
        """One psutil.Process per pid, made once: making one reads its /proc stat (14 µs
        here), which `setdefault` did again at every sample of every process."""
        if pid not in self._procs:
            self._procs[pid] = psutil.Process(pid)
        return self._procs[pid]

    def _find_tree(self) -> tuple[list[int], list[int]]:
        """The coordinator's children (the wrappers) and theirs (the tasks); kept once all
        expected tasks are there (a paired run restarts nothing)."""
        assert self._coordinator is not None
        wrappers = [w.pid for w in self._procs[self._coordinator].children()]
        tasks = [t.pid for w in wrappers for t in self._proc(w).children()]
        if self._expect and len(tasks) >= self._expect:
            self._tree = (wrappers, tasks)
        return wrappers, tasks

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                if self._coordinator is not None:
                    self._own[self._coordinator] = self._cpu(self._coordinator, precise=True)
                    wrappers, tasks = self._tree or self._find_tree()
                    for pid in wrappers:
                        self._own[pid] = self._cpu(pid, precise=True)
                    for pid in tasks:
                        self._of_tasks[pid] = self._cpu(pid)
                for pid in self._tasks:
                    self._of_tasks[pid] = self._cpu(pid)
            self.samples.append((time.time(), sum(self._own.values()),
                                 sum(self._of_tasks.values())))
            self._stop.wait(self.EVERY)

    def _at(self, t: float, k: int) -> float:
        before = [x for x in self.samples if x[0] <= t] or self.samples[:1]
        after = [x for x in self.samples if x[0] >= t] or self.samples[-1:]
        (t0, *v0), (t1, *v1) = before[-1], after[0]
        return v0[k - 1] if t1 == t0 else v0[k - 1] + (v1[k - 1] - v0[k - 1]) * (t - t0) / (t1 - t0)

    def between(self, start: float, end: float) -> tuple[float, float]:
        return (self._at(end, 1) - self._at(start, 1), self._at(end, 2) - self._at(start, 2))


def training_window(tls: list[dict[str, list[float]]]) -> tuple[float, float]:
    """From every worker's end of epoch 0 to the first worker's end of its last epoch: where
    throughput is measured, and all of them train."""
    return max(tl["epoch"][0] for tl in tls), min(tl["epoch"][-1] for tl in tls)


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def interrupt(proc: subprocess.Popen, grace: float = 30) -> None:
    """A `tfo run` still running ended as Ctrl-C ends it, its group SIGKILLed after
    `grace` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            kill_group(proc)


def wait(proc: subprocess.Popen, timeout: float, what: str) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise RuntimeError(f"{what} did not finish in {timeout:g} s") from None


def lab_ready(name: str) -> bool:
    """Whether the SSH lab (tests/sshlab.py's network namespaces) can run here: a section
    that needs it says why it is skipped (`name: skipped, why`) where it cannot, and has
    OpenSSH installed where it can."""
    from tests import sshlab

    ok, reason = sshlab.netns_supported()
    if not ok:
        print(f"{name}: skipped, {reason}", flush=True)
        return False
    sshlab.ensure_openssh()
    return True


def tfo(*args: str, **kw) -> subprocess.Popen:  # noqa: ANN003
    return subprocess.Popen([PY, "-m", "orchestrator", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, **kw)


def job_args(s: Setting, **over: float) -> list[str]:
    args = ["--epochs", str(over.get("epochs", s.epochs)),
            "--steps_per_epoch", str(over.get("steps_per_epoch", s.steps_per_epoch))]
    if s.fake or over.get("fake"):
        args += ["--fake", "--step_seconds", str(over.get("step_seconds", 0.01))]
    else:  # a core and one intra-op thread per worker, in both arms: see bench/job.py
        args += ["--pin"]
    return args


def spec(path: Path, name: str, args: list[str], workers: int, restart: str = "never",
         max_restarts: int = 0, warm_spares: bool | str | None = "auto",
         env: dict[str, str] | None = None, backoff: float | None = 0) -> Path:
    """The bench's cluster file; `warm_spares`/`backoff` None: tfo's defaults (unset)."""
    given = {"warm_spares": warm_spares, "backoff_seconds": backoff}
    path.write_text(json.dumps({
        "name": name, "strategy": "multi_worker_mirrored",
        "job": {"script": JOB, "args": args},
        "tasks": {"worker": ["localhost:auto"] * workers},
        "restart": {"policy": restart, "max_restarts": max_restarts,
                    **{k: v for k, v in given.items() if v is not None}},
        "timeouts": {"startup_seconds": 300, "grace_seconds": 5},
        **({"env": env} if env else {}),
    }))
    return path


def task_logs(run_dir: Path) -> dict[str, str]:
    plan = json.loads((run_dir / "plan.json").read_text())
    logs = {t["name"]: Path(t["log_path"]) for t in plan["tasks"]}
    return {name: p.read_text(errors="replace") if p.exists() else "" for name, p in logs.items()}


# ---- paired: tfo against the hand launch ------------------------------------------------

def run_tfo_job(s: Setting, tmp: Path, i: int) -> tuple[float, float, list[dict], float,
                CpuSampler]:
    rd = tmp / f"pair-tfo-{i}"
    path = spec(tmp / f"pair-{i}.json", "bench-pair", job_args(s), 2)
    cpu0, t0 = children_cpu(), time.time()
    proc = tfo("run", str(path), "--run-dir", str(rd))
    sampler = CpuSampler(coordinator=proc.pid, expect_tasks=2)
    try:
        code = wait(proc, 600, "tfo run")
    finally:
        sampler.stop()
    wall, cpu = time.time() - t0, children_cpu() - cpu0
    if code != 0:
        raise RuntimeError(f"tfo run failed ({code}); see {rd}")
    if i >= 0:  # not the warm-up
        add("tasks_started", max(e["time"] for e in events(rd)
                                 if e["event"] == "task_started") - t0)
    return t0, wall, [timeline(text) for text in task_logs(rd).values()], cpu, sampler


def run_by_hand(s: Setting, tmp: Path, i: int) -> tuple[float, float, list[dict], float,
                CpuSampler]:
    from orchestrator.launch.ports import free_ports

    ports = free_ports(2, avoid=set())
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    outs = [tmp / f"pair-hand-{i}-{k}.log" for k in range(2)]
    cpu0, t0 = children_cpu(), time.time()
    procs = []
    for k, out in enumerate(outs):
        # TF_USE_LEGACY_KERAS: MWMS needs tf_keras on TF 2.21; tfo's tasks default to it.
        env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": k}})}
        with open(out, "wb") as f:
            procs.append(subprocess.Popen([PY, JOB, *job_args(s)], cwd=REPO, env=env, stdout=f,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    sampler = CpuSampler(tasks=tuple(p.pid for p in procs))
    try:
        codes = [wait(p, 600, "the hand launch") for p in procs]
    finally:
        sampler.stop()
        for p in procs:
            if p.poll() is None:
                kill_group(p)
    wall, cpu = time.time() - t0, children_cpu() - cpu0
    if any(codes):
        raise RuntimeError(f"the hand launch failed ({codes}); see {outs}")
    return t0, wall, [timeline(o.read_text(errors="replace")) for o in outs], cpu, sampler


def bench_paired(s: Setting, tmp: Path) -> None:
    print(f"paired: {s.pairs} × (tfo, hand), {s.epochs} epochs × {s.steps_per_epoch} steps",
          flush=True)
    arms = (("tfo", run_tfo_job), ("hand", run_by_hand))
    # A warm-up of each arm first, not counted: the first TensorFlow runs after the light
    # section paid for cold caches (the first pair's tfo run was the slowest of all runs).
    for _, runner in arms:
        runner(s, tmp, -1)
    for i in range(s.pairs):
        got = {}
        # A B, B A, A B, …: with A always first, drift over a pair would tilt every ratio
        # the same way; alternating the order cancels it.
        for who, runner in (arms if i % 2 == 0 else arms[::-1]):
            t0, wall, tls, cpu, sampler = runner(s, tmp, i)
            first = max(tl["first_step"][0] for tl in tls) - t0
            speed = statistics.mean(throughput(tl, s.steps_per_epoch) for tl in tls)
            tail = max(tl["fit_returned"][0] - tl["epoch"][-1] for tl in tls)
            # gRPC's first reconnect after 1 s (hand) or 0.1 s (tfo's tasks: worker_entry/
            # defaults.py): a call that reached a peer just before it listened waits that out.
            if all("strategy_built" in tl for tl in tls):  # (not the quick setting's fakes)
                FIGURES[f"strategy_{who}"].samples.append(round(max(
                    tl["strategy_built"][0] - tl["tf_imported"][0] for tl in tls), 4))
                # tfo's tasks import TensorFlow with the collector paused (worker_entry/
                # tfimport.py); a hand launch's, as Python does by default.
                FIGURES[f"imports_{who}"].samples.append(round(max(
                    tl["tf_imported"][0] - tl["importing"][0] for tl in tls), 4))
            got[who] = (wall, first, speed, cpu)
            for name, v in (("wall", wall), ("first_step", first), ("steps_per_s", speed),
                            ("cpu_s", cpu)):
                detail(f"{who} {name}", v)
            start, end = training_window(tls)
            own, tasks = sampler.between(start, end)
            if tasks > 0:  # (the quick setting's window may hold no sample)
                detail(f"{who} tasks' cores while training", tasks / (end - start))
                if who == "tfo":  # what tfo itself takes from training, beside its tasks
                    detail("tfo's own cores while training (coordinator, wrappers)",
                           own / (end - start))
                    add("tfo_cpu_share", own / tasks)
            FIGURES[f"fit_tail_{who}"].samples.append(round(tail, 4))
            code_over = max(tl["done"][0] for tl in tls)
            FIGURES[f"exit_tail_{who}"].samples.append(round(t0 + wall - code_over, 4))
        (tw, tf_, ts, tc), (hw, hf, hs, hc) = got["tfo"], got["hand"]
        add("wall_ratio", tw / hw)
        add("first_step_ratio", tf_ / hf)
        add("throughput_ratio", ts / hs)
        add("cpu_ratio", tc / hc)


def steady_run(s: Setting, path: Path, rd: Path) -> float:
    """One tfo run of the cluster file `path` into `rd`: its tasks' mean steady steps/s."""
    if wait(tfo("run", str(path), "--run-dir", str(rd)), 600, "tfo run") != 0:
        raise RuntimeError(f"tfo run failed; see {rd}")
    return statistics.mean(steady_throughput(timeline(text), s.steps_per_epoch)
                           for text in task_logs(rd).values())


def alternated(key: str, pairs: int, arm: Callable[[int, bool], float]) -> None:
    """A paired figure: `arm(i, on)` gives steps/s with the thing measured on or off; a
    warm-up of each first (i = -1, not counted), then `pairs` pairs A B, B A, … (drift over a
    pair would tilt every ratio the same way with A always first), on ÷ off added to `key`."""
    arm(-1, True), arm(-1, False)
    for i in range(pairs):
        got = {on: arm(i, on) for on in ((True, False) if i % 2 == 0 else (False, True))}
        add(key, got[True] / got[False])


# ---- the automatic progress: with it against without --------------------------------------

def bench_progress(s: Setting, tmp: Path) -> None:
    """tfo runs of the bench's job with the automatic progress (the default: tfo's callback
    joins its fit) and without (TFO_AUTO_PROGRESS=0), alternating after a warm-up of each;
    throughput with ÷ without per pair. Then bench/progress_cost.py's figures in one process
    (the full setting only: it imports TensorFlow)."""
    # Longer arms and more pairs than the other paired figures: the difference looked for
    # is a few tenths of a percent (bench/progress_cost.py), far under one short run's noise.
    pairs, epochs = (s.pairs, s.epochs) if s.fake else (s.pairs + 4, 3 * s.epochs)
    print(f"progress: {pairs} × (automatic progress on, off), {epochs} epochs each",
          flush=True)

    def arm(i: int, auto: bool) -> float:
        path = spec(tmp / f"progress-{i}-{auto}.json", "bench-progress",
                    job_args(s, epochs=epochs), 2,
                    env=None if auto else {"TFO_AUTO_PROGRESS": "0"})
        speed = steady_run(s, path, tmp / f"progress-{'on' if auto else 'off'}-{i}")
        if i >= 0:
            detail(f"progress {'on' if auto else 'off'} steps_per_s", speed)
        return speed

    alternated("progress_ratio", pairs, arm)
    if s.fake:
        return
    done = subprocess.run([PY, "bench/progress_cost.py", "--pairs", str(s.pairs)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    for line in done.stdout.splitlines():
        name, *values = line.split()[1:] if line.startswith("COST ") else [None]
        if name == "hook_us":
            add("progress_hook_us", float(values[0]))
        elif name == "job_ratio":
            add("progress_job_ratio", float(values[0]))
            detail("progress_job_ratio, lowest pair", float(values[1]))
            detail("progress_job_ratio, highest pair", float(values[2]))
        elif name in ("fit_us_per_step", "call_us"):
            key = "progress_fit_us" if name == "fit_us_per_step" else "progress_call_us"
            add(key, float(values[3]))  # the fastest runs' difference: steadier when busy
            detail(f"{key}, the pairs' median difference",
                   float(values[2]))


# ---- light tasks: coordinator CPU, SIGKILL → detected / stopped --------------------------

def bench_light(s: Setting, tmp: Path) -> None:
    for n in s.counts:
        print(f"light tasks: {n}, {s.runs_per_count} run(s)", flush=True)
        for i in range(s.runs_per_count):
            light_run(s, tmp, n, i)


def light_run(s: Setting, tmp: Path, n: int, i: int) -> None:
    rd = tmp / f"light-{n}-{i}"
    # One step of 10 minutes: the task sits there until it is killed.
    path = spec(tmp / f"light-{n}.json", "bench-light",
                job_args(s, fake=True, epochs=1, steps_per_epoch=1, step_seconds=600), n)
    proc = tfo("run", str(path), "--run-dir", str(rd))
    try:
        coord = psutil.Process(proc.pid)
        until = time.monotonic() + 300
        while sum(e["event"] == "task_ready" for e in events(rd)) < n:
            if proc.poll() is not None or time.monotonic() > until:
                raise RuntimeError(f"{n} light tasks did not all come up; see {rd}")
            time.sleep(0.1)
        time.sleep(min(1.0, s.window))  # the start's own work settles
        c0, t0 = cpu_seconds(coord), time.monotonic()
        time.sleep(s.window)
        per_second = (cpu_seconds(coord) - c0) / (time.monotonic() - t0)
        CURVE.setdefault(n, []).append(round(per_second, 5))
        if n == 2:
            add("coord_cpu_2", per_second)
        elif n == max(s.counts):
            add("coord_cpu_64", per_second)
        else:
            print(f"  coordinator CPU / wall s, {n} light tasks: {per_second:.4g}", flush=True)
        victim = next(e["pid"] for e in events(rd) if e["event"] == "task_started"
                      and e["task"] == "worker:1")
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        wait(proc, 120, "tfo run (after the SIGKILL)")
    finally:
        if proc.poll() is None:
            kill_group(proc)
    ev = events(rd)
    exited = next(e["time"] for e in ev if e["event"] == "task_exited"
                  and e["task"] == "worker:1")
    stopped = max(e["time"] for e in ev if e["event"] in ("task_stopped", "task_exited"))
    if n == max(s.counts):
        add("kill_detected", exited - killed)
        add("kill_stopped", stopped - killed)
    else:
        detail(f"kill_detected {n}", exited - killed)
        detail(f"kill_stopped {n}", stopped - killed)


# ---- SIGKILL → training resumed ---------------------------------------------------------

def bench_resume(s: Setting, tmp: Path) -> None:
    print(f"resume: {s.resumes} run(s) with warm spares, as many without", flush=True)
    for i in range(s.resumes):  # alternated, like the pairs
        resume_run(s, tmp, i, warm=True)
        resume_run(s, tmp, i, warm=False)


class SpareWatch:
    """The standbys of a run (its task_standby_started events): each one's process tree, and
    whether its task is warm, i.e. done importing: asleep, its CPU time still for
    WARM_QUIET_SECONDS (it waits for GO)."""

    WARM_QUIET_SECONDS = 0.5

    def __init__(self) -> None:
        self.cpu: dict[int, tuple[float, float]] = {}  # standby pid → (cpu s, since when)
        self.rss: dict[int, int] = {}  # standby pid → its tree's RSS once warm

    def warm(self, pids: list[int]) -> bool:
        return bool(pids) and all(self._warm(pid) for pid in pids)

    def _warm(self, pid: int) -> bool:
        if pid in self.rss:
            return True
        try:
            tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            cpu = sum(sum(p.cpu_times()[:2]) for p in tree)
            asleep = all(p.status() == psutil.STATUS_SLEEPING for p in tree)
            rss = sum(p.memory_info().rss for p in tree)
        except psutil.Error:
            return False
        now = time.monotonic()
        before, since = self.cpu.get(pid, (None, now))
        if cpu != before or not asleep:
            self.cpu[pid] = (cpu, now)
        elif now - since >= self.WARM_QUIET_SECONDS:
            self.rss[pid] = rss
            return True
        return False


def bench_recovery(s: Setting, tmp: Path) -> None:
    """Issue 39: SIGKILL → both workers training again with tfo's defaults (the restart
    policy alone set) on a machine with no spare core, and tfo run → first step in the
    same runs. `python bench/run.py --only recovery` alone. The full setting only: its
    standbys import TensorFlow (the quick setting's resume section checks the harness)."""
    if s.fake:
        return
    runs = max(3, s.resumes)
    print(f"recovery: {runs} run(s) with tfo's defaults", flush=True)
    for i in range(runs):
        resume_run(s, tmp, i, warm=None)


# With tfo's defaults a standby (if the host has the memory) starts at a worker's first
# progress: the kill waits for those the run made to be warm, or this long after epoch 0.
DEFAULTS_KILL_WAIT = 20.0


def resume_args(s: Setting) -> list[str]:
    """The job's arguments: long enough for the standbys to start (5 s after ready: a
    script reports no progress) and import TensorFlow on a busy machine; stopped early."""
    return job_args(s, epochs=100, step_seconds=0.2) if s.fake else job_args(s, epochs=100)


def resume_run(s: Setting, tmp: Path, i: int, warm: bool | None, path: Path | None = None,
               figure: str = "recovery") -> None:
    """One SIGKILL → resumed measure: `warm` with warm spares (the kill waits until both
    standbys are warm), False without, None with tfo's defaults (the restart policy alone:
    its backoff, its warm_spares; the kill waits for the standbys it made, if any). The job
    runs long enough for that; the run is stopped once both workers took their first step
    again. `path`: another cluster file of the same job (a lab host's), whose figure with
    tfo's defaults is `figure`."""
    how = {True: "warm", False: "cold", None: "defaults"}[warm]
    if path is not None:
        how = f"{figure} {how}"
    rd = tmp / f"resume-{how.replace(' ', '-')}-{i}"
    path = path or spec(tmp / "resume.json", "bench-resume", resume_args(s), 2,
                        restart="on-failure", max_restarts=1, warm_spares=warm,
                        backoff=None if warm is None else 0)
    t0 = time.time()
    proc = tfo("run", str(path), "--run-dir", str(rd))
    peak_coord, peak_task = 0, 0
    spares = SpareWatch()
    try:
        coord = psutil.Process(proc.pid)
        until = time.monotonic() + 600
        killed = stopped = epoch_seen = None
        while proc.poll() is None and time.monotonic() < until:
            with contextlib.suppress(psutil.Error):
                peak_coord = max(peak_coord, coord.memory_info().rss)
                for p in coord.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        peak_task = max(peak_task, p.memory_info().rss)
            if stopped is None and (rd / "plan.json").exists():
                try:
                    logs = task_logs(rd)
                except json.JSONDecodeError:  # plan.json caught half-written
                    time.sleep(0.05)
                    continue
                ev = events(rd)
                standbys = [e["pid"] for e in ev if e["event"] == "task_standby_started"]
                if epoch_seen is None and "epoch" in timeline(logs["worker:1"], attempt=0):
                    epoch_seen = time.monotonic()
                if warm is None and epoch_seen is not None:
                    ready = (len(standbys) == 2 and spares.warm(standbys)) or (
                        not standbys and time.monotonic() - epoch_seen > DEFAULTS_KILL_WAIT)
                else:
                    ready = epoch_seen is not None and (
                        not warm or (len(standbys) == 2 and spares.warm(standbys)))
                if killed is None and ready:
                    victim = next(e["pid"] for e in ev if e["event"] == "task_started"
                                  and e["task"] == "worker:1")
                    killed = time.time()
                    os.kill(victim, signal.SIGKILL)
                elif killed is not None and all("first_step" in timeline(text, attempt=1)
                                                for text in logs.values()):
                    stopped = time.time()
                    proc.send_signal(signal.SIGTERM)  # measured: no need to train on
            time.sleep(0.05)
        code = wait(proc, max(1.0, until - time.monotonic()), "tfo run (resume)")
    finally:
        if proc.poll() is None:
            kill_group(proc)
    if code != 143 or killed is None or stopped is None:
        raise RuntimeError(f"resume run failed ({code}, killed: {killed}, stopped: {stopped}); "
                           f"see {rd}")
    ev = events(rd)

    def last(event: str, attempt: int | None = None) -> float:
        return max((e["time"] for e in ev if e["event"] == event
                    and (attempt is None or e.get("attempt") == attempt)), default=float("nan"))

    resumed = max(timeline(text, attempt=1)["first_step"][0] for text in task_logs(rd).values())
    restarted = last("task_started", 1)
    served = [e.get("warm") for e in ev if e["event"] == "task_started" and e["attempt"] == 1]
    if warm and served != [True, True]:
        raise RuntimeError(f"the restart was not served by the warm spares ({served}); see {rd}")
    if warm is None:
        add(figure, resumed - killed)
        add(f"{figure}_first_step", max(timeline(text, attempt=0)["first_step"][0]
                                        for text in task_logs(rd).values()) - t0)
        paths = sorted({e.get("path", "warm" if e.get("warm") else "cold") for e in ev
                        if e["event"] == "task_started" and e["attempt"] == 1})
        print(f"  restart path: {', '.join(paths)}; backoff "
              f"{[e.get('backoff') for e in ev if e['event'] == 'task_restarted']}", flush=True)
    else:
        add("resume" if warm else "resume_cold", resumed - killed)
    detail(f"resume {how}: kill → detected", last("task_exited", 0) - killed)
    detail(f"resume {how}: kill → all stopped", max(
        e["time"] for e in ev if e["time"] <= restarted
        and e["event"] in ("task_stopped", "task_exited")) - killed)
    detail(f"resume {how}: kill → restarted", restarted - killed)
    detail(f"resume {how}: kill → up (python running our code)", last("task_up", 1) - killed)
    detail(f"resume {how}: kill → ready (TF imported, server up)", last("task_ready", 1) - killed)
    if spares.rss:
        for rss in spares.rss.values():
            detail("spare RSS MiB (a warm standby: wrapper and task)", rss / 2**20)
    detail("coordinator peak RSS MiB", peak_coord / 2**20)
    detail("task peak RSS MiB", peak_task / 2**20)


# ---- the command line -------------------------------------------------------------------

def timed(args: list[str], capture: bool = False) -> tuple[float, bytes]:
    t = time.perf_counter()
    done = subprocess.run([PY, "-m", "orchestrator", *args], cwd=REPO, capture_output=True,
                          check=True)
    return time.perf_counter() - t, done.stdout


# What `tfo plan` cannot go below with its dependencies: Python, their imports and pydantic's
# BaseModel (what validating needs; `import pydantic` alone defers it), no tfo code; garbage
# collection off and the imports frozen at exit, as `tfo` starts (orchestrator/startup.py).
FLOOR = ("import gc; gc.disable(); import typer, yaml, rich.console, rich.table; "
         "from pydantic import BaseModel; gc.freeze()")


def bench_cli(s: Setting, tmp: Path) -> None:
    print(f"command line: {s.cli_reps} × each", flush=True)
    for _ in range(s.cli_reps):  # interleaved, like the pairs
        add("help", timed(["--help"])[0])
        add("plan", timed(["plan", "clusters/localhost.yaml"])[0])
        t = time.perf_counter()
        subprocess.run([PY, "-c", FLOOR], cwd=REPO, check=True)
        add("plan_floor", time.perf_counter() - t)
    small, large = s.plan_tasks
    sizes = {}
    for n in (small, large):
        path = tmp / f"plan-{n}.json"
        hosts = {f"h{h}": {"address": f"10.0.0.{h + 1}"} for h in range(4)}  # ≤ 256 a host
        path.write_text(json.dumps({"name": "bench-plan", "job": {"script": JOB}, "hosts": hosts,
                                    "tasks": {"worker": [f"h{k % 4}:{30000 + k // 4}"
                                                         for k in range(n)]}}))
        for _ in range(s.cli_reps if n == large else 1):
            seconds, out = timed(["plan", str(path), "--json"])
            sizes[n] = len(out)
            if n == large:
                add("plan_json_time", seconds)
    add("plan_json_mb", sizes[large] / 1e6)
    add("plan_json_linear", (sizes[large] / large) / (sizes[small] / small))


# ---- output -----------------------------------------------------------------------------

def explain_misses() -> None:
    """Each missed target's note: the measured reason, where the bench has one."""
    f = FIGURES
    if f["plan"].met is False and f["plan_floor"].samples:
        floor, plan = f["plan_floor"].median, f["plan"].median
        f["plan"].note = (
            f"Python with typer, yaml, rich and pydantic's BaseModel loaded, and no tfo code, "
            f"takes {floor:.3g} s (median, same runs): that leaves {f['plan'].target - floor:.2g} "
            f"s of the target to tfo's own modules, its spec's pydantic models and the plan, "
            f"which take {plan - floor:.2g} s")
    if f["first_step_ratio"].met is False and f["tasks_started"].samples:
        started = f["tasks_started"].median
        hand = DETAIL.get("hand first_step")
        share = (f", {started / statistics.median(hand):.1%} of the hand launch's start → "
                 f"first step ({statistics.median(hand):.3g} s)") if hand else ""
        f["first_step_ratio"].note = (
            f"tfo's tasks started {started:.3g} s after `tfo run` did (median), a hand "
            f"launch's at once{share}; the pairs spread "
            f"{min(f['first_step_ratio'].samples):.3g}–{max(f['first_step_ratio'].samples):.3g}")
    for key in ("throughput_ratio", "wall_ratio"):
        if f[key].met is False and f["tfo_cpu_share"].samples:
            f[key].note = (f"tfo's own processes took {f['tfo_cpu_share'].median:.2%} of its "
                           f"tasks' CPU while training (median); the pairs spread "
                           f"{min(f[key].samples):.3g}–{max(f[key].samples):.3g}")


def table() -> str:
    rows = [f"{'figure':52s} {'before':>10s} {'median':>9s} {'min':>9s} {'max':>9s} "
            f"{'n':>2s}  target     "]
    for f in FIGURES.values():
        if not f.samples:
            continue
        mark = {True: "met", False: "MISSED", None: ""}[f.met]
        target = "" if f.target is None else f"{'≤' if f.better == 'le' else '≥'} {f.target:g}"
        rows.append(f"{f.label:52s} {f.before:>10s} {f.median:9.4g} {min(f.samples):9.4g} "
                    f"{max(f.samples):9.4g} {len(f.samples):2d}  {target:9s} {mark}")
    rows += [f"why {f.label} missed: {f.note}" for f in FIGURES.values() if f.note]
    return "\n".join(rows)


def pyplot():  # noqa: ANN201 - matplotlib's module, imported here only
    """matplotlib's pyplot drawing to files (Agg), or None where it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def saved(fig, path: Path) -> None:  # noqa: ANN001
    """A section's figure written to `path` and closed, said on a line."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()
    print(f"wrote {path}")


def plot(path: Path) -> str | None:
    plt = pyplot()
    if plt is None:
        return "matplotlib is not installed (pip install -e '.[bench]'): no plot"
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    ratios = [FIGURES[k] for k in ("wall_ratio", "first_step_ratio", "throughput_ratio",
                                   "cpu_ratio") if FIGURES[k].samples]
    for x, f in enumerate(ratios):
        med = f.median
        color = {True: "tab:green", False: "tab:red", None: "tab:gray"}[f.met]
        left.bar(x, med, color=color, yerr=[[med - min(f.samples)], [max(f.samples) - med]],
                 capsize=4)
        if f.target is not None:
            left.hlines(f.target, x - 0.4, x + 0.4, colors="black", linestyles="dashed")
    left.axhline(1.0, color="gray", linewidth=0.8)
    left.set_xticks(range(len(ratios)), [f.label.replace(", tfo ÷ hand", "").replace(
        " → ", "→\n") for f in ratios], fontsize=8)
    left.set_ylabel("tfo ÷ hand launch (median, min–max; dashed: target)")
    left.set_title("tfo against a hand launch, paired runs")
    counts = sorted(CURVE)
    if counts:
        med = [statistics.median(CURVE[n]) for n in counts]
        low = [m - min(CURVE[n]) for n, m in zip(counts, med, strict=True)]
        high = [max(CURVE[n]) - m for n, m in zip(counts, med, strict=True)]
        right.errorbar(counts, med, yerr=[low, high],
                       marker="o", capsize=4, label="measured (median, min–max)")
        right.scatter([2, 64], [0.01, 0.03], marker="_", s=400, color="black",
                      label="target")
        right.scatter([2, 64], [0.019, 0.32], marker="x", color="tab:red",
                      label="before (issue 13)")
        right.set_xlabel("light tasks")
        right.set_ylabel("coordinator CPU per wall second (cores)")
        right.set_title("coordinator CPU against task count")
        right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def bench_lab(s: Setting, tmp: Path) -> None:
    """bench/lab.py: 16 SSH lab hosts × 8 light tasks against an OpenSSH fan-out."""
    from bench.lab import bench_lab as lab

    lab(s, tmp)


def bench_paths(s: Setting, tmp: Path) -> None:
    """bench/restart_paths.py: the standby's way to skip a restart's import (the full
    setting only)."""
    if s.fake:
        return
    from bench import restart_paths

    keys = {"exec_to_waiting": "path_exec", "standby_rss_mib": "path_standby_mib"}
    for k, values in restart_paths.measure(4).items():
        for v in values:
            add(keys[k], v)


def bench_kit(s: Setting, tmp: Path) -> None:
    """bench/kit.py: 10 cluster tests with tf_cluster and with TensorFlow's
    multi_process_runner, one pytest run each, alternated (the full setting only)."""
    if s.fake:
        return
    from bench import kit

    print(f"kit: {max(1, s.pairs // 3)} × (tf_cluster, multi_process_runner)", flush=True)
    for tfo_s, mpr_s in kit.pairs(tmp, max(1, s.pairs // 3)):
        add("kit_tfo", tfo_s)
        add("kit_mpr", mpr_s)
        add("kit_ratio", tfo_s / mpr_s)
    add("kit_pool_mib", kit.pool_memory(tmp)["pss_mib"])


def bench_kitsoak(s: Setting, tmp: Path) -> None:
    """bench/kitsoak.py: SOAK_RUNS 2-worker tf_cluster runs in pytest sessions, plain and
    under -n 2 alternately; none may hang (the full setting only: `python bench/kitsoak.py
    --runs 200` is the issue's soak)."""
    if s.fake:
        return
    from bench import kitsoak

    print(f"kit soak: {kitsoak.SOAK_RUNS} runs", flush=True)
    total = kitsoak.soak(tmp, kitsoak.SOAK_RUNS)
    add("kit_soak_runs", total["runs"])
    add("kit_soak_hangs", len(total["hangs"]))
    add("kit_soak_failed", len(total["failed"]))
    add("kit_soak_slowest", total["slowest"])


def bench_elastic(s: Setting, tmp: Path) -> None:
    """bench/elastic.py: a 3-worker elastic job on 3 SSH lab hosts, one host's link down
    and back: → training again with 2, → with 3, and the loss curve across both."""
    from bench.elastic import bench_elastic as elastic

    elastic(s, tmp)


def bench_dataservice(s: Setting, tmp: Path) -> None:
    """bench/dataservice.py: an input-bound 2-worker job with 0, 1 and 2 data workers:
    throughput and the share of the step spent waiting for input."""
    from bench.dataservice import bench_dataservice as dataservice

    dataservice(s, tmp)


def bench_chaos(s: Setting, tmp: Path) -> None:
    """bench/chaos.py: an elastic 3-worker localhost job under random SIGKILL, SIGSTOP,
    SIGTERM and wrapper kills for 5 minutes: recovered, time back, epochs lost, left over."""
    from bench.chaos import bench_chaos as chaos

    chaos(s, tmp)


OUT: list[Path] = [REPO / "bench"]  # this run's output directory (main sets it)

def bench_profiler(s: Setting, tmp: Path) -> None:
    from bench import profiler  # it imports this module's helpers

    profiler.bench_profiler(s, tmp)


def bench_slow(s: Setting, tmp: Path) -> None:
    from bench import slow  # it imports this module's helpers

    slow.bench_slow(s, tmp)


SECTIONS: dict[str, Callable[[Setting, Path], None]] = {
    "cli": bench_cli, "light": bench_light, "paired": bench_paired, "resume": bench_resume,
    "recovery": bench_recovery, "paths": bench_paths,
    "progress": bench_progress, "lab": bench_lab, "kit": bench_kit,
    "kitsoak": bench_kitsoak, "elastic": bench_elastic, "chaos": bench_chaos,
    "profiler": bench_profiler, "slow": bench_slow, "dataservice": bench_dataservice}
# bench/extras.py's sections (--extras runs them all; --only NAME one of them).
EXTRAS = ["ps", "ssh", "lab_recovery"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny setting: the harness only")
    parser.add_argument("--extras", action="store_true", help="also the PS and SSH figures")
    parser.add_argument("--out", type=Path, default=None,
                        help="where results.json and results.png go (default: bench/; with "
                             "--only, a new temporary directory: the full results stay)")
    parser.add_argument("--only", choices=sorted(SECTIONS) + EXTRAS, action="append",
                        help="only this section (repeatable; an extras' section by name)")
    parser.add_argument("--counts", type=lambda v: tuple(int(n) for n in v.split(",")),
                        help="light-task counts, e.g. 2,64")
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    if args.counts:
        s = replace(s, counts=args.counts)
    started = time.monotonic()
    sections: list[Callable[[Setting, Path], None]] = [
        f for name, f in SECTIONS.items() if not args.only or name in args.only]
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="tfo-bench-")) if args.only else REPO / "bench"
    OUT[0] = args.out  # where a section writes a plot of its own (lab.png)
    args.out.mkdir(parents=True, exist_ok=True)  # before that section, not only at the end
    if args.extras or set(args.only or ()) & set(EXTRAS):
        from bench import extras

        sections += [getattr(extras, f"bench_{name}") for name in EXTRAS
                     if args.extras or name in args.only]
    took: dict[str, float] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="tfo-bench-") as d:
        for section in sections:
            t = time.monotonic()
            try:
                section(s, Path(d))
            except Exception as e:  # noqa: BLE001 - the other sections' figures still count
                failed[section.__name__] = f"{type(e).__name__}: {str(e)[-2000:]}"
                print(f"{section.__name__} failed: {failed[section.__name__]}", flush=True)
            took[section.__name__] = round(time.monotonic() - t, 1)
    explain_misses()
    args.out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    results = {
        "setting": asdict(s) | {"name": "quick" if args.quick else "full"},
        "machine": {"cpus": os.cpu_count(), "load_average_at_end": [round(x, 2) for x in load],
                    "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)},
        "seconds": round(time.monotonic() - started, 1),
        "section_seconds": took,
        "failed_sections": failed,
        "figures": {k: f.summary() for k, f in FIGURES.items() if f.samples},
        "coordinator_cpu_curve": {str(n): v for n, v in sorted(CURVE.items())},
        "detail": DETAIL,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    problem = plot(args.out / "results.png")
    print()
    if args.quick:
        print("QUICK setting: tiny sizes (see results.json's setting), no TensorFlow but in "
              "the warm spares; the figures check the harness, not the targets")
    print(table())
    print(f"\n{results['seconds']:g} s on {os.cpu_count()} cores, load average at the end "
          f"{load[0]:.2f}; wrote {args.out / 'results.json'}"
          + (f"; {problem}" if problem else f" and {args.out / 'results.png'}"))
    missed = [f.label for f in FIGURES.values() if f.met is False]
    if missed:
        print("missed: " + "; ".join(missed))
    if failed:
        print("failed sections (no figures): " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.modules.setdefault("bench.run", sys.modules[__name__])  # one FIGURES for the sections
    sys.exit(main())
