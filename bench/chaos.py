"""`python bench/run.py --only chaos` (issue 37): a chaos soak. An elastic 3-worker job on
localhost (`min_workers: 2`), TensorFlow's multi-worker tutorial script
(tests/scripts/mwms_keras.py) with `BackupAndRestore(backup_dir=os.environ["TFO_BACKUP_DIR"])`
(the documented pattern), restart on-failure, under faults drawn from `random.Random(SEED)`
for about SOAK_SECONDS:

- kill: the task proper (the wrapper's child) SIGKILLed;
- stop: the task proper SIGSTOPped for STOP_FOR seconds, then SIGCONT;
- term: the task proper SIGTERMed (TensorFlow's runtime catches it: the task trains on);
- wrapper: the task's wrapper (task_started's pid) SIGKILLed.

A fault goes to one worker of the group as it is (a resize renames them 0…n-1), 20–40 s after
the job trained again from the one before. Per fault, from events.jsonl:

- recovered: every worker of the group took a step again (a `task_progress` event) after the
  fault's end (the SIGCONT for a stop): of an attempt started after the fault for a kill,
  else of one started after it or past the worker's step at the fault; within
  RECOVER_LIMIT s.
- back to training: the fault's end → the last of those workers' first progress after it.
- epochs lost, beyond the one in progress: the last epoch the group completed before the fault
  (one less than the last `task_epoch`, which says an epoch began) against the epoch each
  worker began first after it; the `task_resumed` events' words go into the fault's record.

Then tfo gets SIGINT (Ctrl-C) and must end within END_GRACE s; left after it: processes whose
environment carries the run's id (tests/conftest.py run_processes), entries of the tasks' tmp
dirs (run dir's tmp/), and port reservations under /tmp/tfo-* naming the run. The faults'
records go to chaos.json in the run's output directory.

Skipped in the quick setting (it trains with TensorFlow).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench.run import FIGURES, OUT, PY, REPO, Figure, Setting, add, detail, events

SEED = 37
SOAK_SECONDS = 300  # faults injected until this long after the first
GAP = (20.0, 40.0)  # seconds between training again and the next fault
STOP_FOR = (5.0, 15.0)  # how long a SIGSTOPped task stays stopped
KINDS = ("kill", "stop", "term", "wrapper")
WORKERS = 3
RECOVER_LIMIT = 300.0
END_GRACE = 60.0
FAULTS: list[dict] = []  # this run's faults, each a record (chaos.json)

for _f in [
    Figure("chaos_faults", "chaos soak: faults injected", "faults", None),
    Figure("chaos_unrecovered", "… after which the job did not train again", "faults", 0),
    Figure("chaos_back_median_s", "… fault → training again, median", "s", None),
    Figure("chaos_back_worst_s", "… fault → training again, worst", "s", None),
    Figure("chaos_epochs_lost", "… epochs lost beyond the one in progress (all faults)",
           "epochs", 0),
    Figure("chaos_unclean_end", "… Ctrl-C did not end tfo cleanly", "runs", 0),
    Figure("chaos_procs_left", "… processes of the run left after it", "procs", 0),
    Figure("chaos_files_left", "… tmp files and reservations of the run left", "files", 0),
]:
    FIGURES[_f.key] = _f


def _spec(tmp: Path) -> Path:
    spec = tmp / "chaos.yaml"
    spec.write_text(
        "name: bench-chaos\n"
        f"job:\n  script: {REPO}/tests/scripts/mwms_keras.py\n"
        f"  args: [--epochs, '100000', --steps_per_epoch, '10', --model_path, "
        f"'{tmp}/model']\n"
        f"tasks:\n  worker: [{', '.join(['localhost:auto'] * WORKERS)}]\n"
        "elastic: {min_workers: 2, probe_seconds: 10}\n"
        # cold restarts: standbys would double the TensorFlow processes on a loaded machine
        "restart: {policy: on-failure, max_restarts: 1000, backoff_seconds: 0, "
        "warm_spares: false}\n")
    return spec


def group(evs: list[dict]) -> dict[str, dict]:
    """The group's workers now (a resize's `to`, else all), each its latest task_started."""
    resized = [e for e in evs if e["event"] == "job_resized"]
    size = resized[-1]["to"] if resized else WORKERS
    started: dict[str, dict] = {}
    for e in evs:
        if e["event"] == "task_started" and e["task"].startswith("worker:"):
            started[e["task"]] = e
    return {f"worker:{i}": started[f"worker:{i}"] for i in range(size)
            if f"worker:{i}" in started}


def training_again(evs: list[dict], since: float, restarted_after: float | None,
                   steps: dict[str, int], fault: float = 0.0) -> float | None:
    """When every worker of the group had stepped after `since`, in its latest attempt: one
    started after `restarted_after` where given, else one started after the `fault` or
    past its `steps` at the fault; the last of their first progress events, None while one
    has not."""
    firsts = []
    for name, start in group(evs).items():
        if restarted_after is not None and start["time"] <= restarted_after:
            return None
        new = start["time"] > fault
        first = next((e["time"] for e in evs if e["event"] == "task_progress"
                      and e["task"] == name and e["time"] > since
                      and e.get("attempt") == start["attempt"]
                      and (new or e.get("step", 0) > steps.get(name, -1))), None)
        if first is None:
            return None
        firsts.append(first)
    return max(firsts) if firsts else None


def last_steps(evs: list[dict]) -> dict[str, int]:
    return {e["task"]: e.get("step", 0) for e in evs if e["event"] == "task_progress"}


def epoch_began(evs: list[dict], before: float | None = None) -> int | None:
    """The last epoch any worker began before `before` (all, when None)."""
    began = [e["epoch"] for e in evs if e["event"] == "task_epoch"
             and (before is None or e["time"] <= before)]
    return max(began) if began else None


def resumed_at(evs: list[dict], since: float) -> dict[str, int]:
    """Each worker of the group's first epoch begun after `since`, in its latest attempt."""
    out = {}
    for name, start in group(evs).items():
        e = next((e for e in evs if e["event"] == "task_epoch" and e["task"] == name
                  and e["time"] > since and e.get("attempt") == start["attempt"]), None)
        if e is not None:
            out[name] = e["epoch"]
    return out


def _wait_for(what: str, found, timeout: float, proc: subprocess.Popen) -> object:  # noqa: ANN001
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if (got := found()) is not None:
            return got
        if proc.poll() is not None:
            raise RuntimeError(f"tfo run ended ({proc.returncode}) before {what}")
        time.sleep(0.2)
    return None


def inject(kind: str, wrapper: int, stop_for: float) -> tuple[float, float, int]:
    """The fault on the task whose wrapper is `wrapper`: (its time, its end, the pid hit)."""
    target = wrapper
    if kind != "wrapper":
        children = psutil.Process(wrapper).children()
        if not children:
            raise RuntimeError(f"wrapper {wrapper} has no task process to {kind}")
        target = children[0].pid
    t = time.time()
    if kind == "stop":
        os.kill(target, signal.SIGSTOP)
        time.sleep(stop_for)
        with contextlib.suppress(ProcessLookupError):  # tfo may have ended it meanwhile
            os.kill(target, signal.SIGCONT)
        return t, time.time(), target
    os.kill(target, signal.SIGTERM if kind == "term" else signal.SIGKILL)
    return t, t, target


def one_fault(rng: random.Random, rd: Path, proc: subprocess.Popen) -> dict:
    kind, stop_for = rng.choice(KINDS), rng.uniform(*STOP_FOR)
    evs = events(rd)
    members = group(evs)
    victim = rng.choice(sorted(members))
    steps = last_steps(evs)
    try:
        t, end, pid = inject(kind, members[victim]["pid"], stop_for)
    except (ProcessLookupError, psutil.NoSuchProcess):  # it ended as we aimed: once again
        time.sleep(1)
        evs = events(rd)
        members, steps = group(evs), last_steps(evs)
        t, end, pid = inject(kind, members[victim]["pid"], stop_for)
    # A kill ends the task: training again is a new attempt's. A stop does not; nor, mostly,
    # does a SIGTERM: TensorFlow's runtime catches it in the task (its preemption notifier),
    # and only a Python handler would act on it, which this script has none of.
    back = _wait_for(f"training again after {kind} of {victim}", lambda: training_again(
        events(rd), end, t if kind in ("kill", "wrapper") else None, steps, t),
        RECOVER_LIMIT, proc)
    evs = events(rd)
    completed = (epoch_began(evs, t) or 0) - 1
    resumed = resumed_at(evs, end) if back is not None else {}
    lost = max([completed + 1 - e for e in resumed.values()] + [0])
    said = sorted({e["words"] for e in evs if e["event"] == "task_resumed" and e["time"] > t})
    return {"kind": kind, "task": victim, "pid": pid, "at": t, "ended": end,
            "stopped_for": round(end - t, 2) if kind == "stop" else None,
            "recovered": back is not None,
            "restarted": any(e["event"] == "task_restarted" and e["time"] > t for e in evs),
            "back_s": round(back - end, 3) if back is not None else None,  # type: ignore[operator]
            "completed_before": completed, "resumed_at": resumed, "epochs_lost": lost,
            "resumed_words": said,
            "resized": [(e["from"], e["to"]) for e in evs
                        if e["event"] == "job_resized" and e["time"] > t]}


def leftovers(run_id: str, rd: Path) -> tuple[list[int], list[str]]:
    """Processes of the run still alive (killed here once counted) and its files left."""
    from tests.conftest import kill_tree, run_processes, wait_until

    wait_until(lambda: not run_processes(run_id), 10, 0.5)
    procs = [p.pid for p in run_processes(run_id)]
    for pid in procs:
        kill_tree(pid)
    files = [str(p) for p in (rd / "tmp").rglob("*")]  # a task's dir itself too
    for d in Path("/tmp").glob("tfo-*"):
        if rd.resolve().is_relative_to(d.resolve()):
            continue  # the bench's own temporary directory (tfo-bench-…), the run dir in it
        for f in d.rglob("*") if d.is_dir() else [d]:
            try:
                if f.is_file() and run_id in f.read_text(errors="replace"):
                    files.append(str(f))
            except OSError:
                continue
    return procs, files


def soak(tmp: Path) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    rd = tmp / "run"
    err = tmp / "tfo.err"
    rng = random.Random(SEED)
    proc = subprocess.Popen([PY, "-m", "orchestrator", "run", str(_spec(tmp)), "--run-dir",
                             str(rd)], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=open(tmp / "tfo.out", "wb"),  # noqa: SIM115
                            stderr=open(err, "wb"), start_new_session=True)  # noqa: SIM115
    code, run_id = None, None
    try:
        if _wait_for("epoch 1 on every worker", lambda: (
                epoch_began(events(rd)) or 0) >= 1 and training_again(
                    events(rd), 0, None, {}) or None, 600, proc) is None:
            raise RuntimeError(f"the job did not train within 600 s; see {rd}")
        run_id = json.loads((rd / "plan.json").read_text())["run_id"]
        began = time.monotonic()
        while time.monotonic() - began < SOAK_SECONDS:
            time.sleep(rng.uniform(*GAP))
            fault = one_fault(rng, rd, proc)
            FAULTS.append(fault)
            print(f"  chaos {len(FAULTS)}: {fault['kind']} {fault['task']} → "
                  + (f"training again in {fault['back_s']:.1f} s, epochs lost "
                     f"{fault['epochs_lost']}" if fault["recovered"] else "NOT RECOVERED")
                  + (f"; {'; '.join(fault['resumed_words'])}" if fault["resumed_words"] else "")
                  + (f"; resized {fault['resized']}" if fault["resized"] else ""), flush=True)
            if not fault["recovered"]:
                break
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(END_GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if sys.exc_info()[0] is not None:  # the evidence, kept past the bench's tmp dir
            shutil.copytree(rd, Path(OUT[0]) / "chaos-run", dirs_exist_ok=True)
            print(f"chaos: the run's directory copied to {Path(OUT[0]) / 'chaos-run'}")
    assert run_id is not None
    procs, files = leftovers(run_id, rd)
    backs = [f["back_s"] for f in FAULTS if f["recovered"]]
    add("chaos_faults", len(FAULTS))
    add("chaos_unrecovered", sum(not f["recovered"] for f in FAULTS))
    if backs:
        add("chaos_back_median_s", statistics.median(backs))
        add("chaos_back_worst_s", max(backs))
    add("chaos_epochs_lost", sum(f["epochs_lost"] for f in FAULTS))
    # Ctrl-C: tfo stops its tasks and exits 130 within the grace
    add("chaos_unclean_end", 0 if code == 130 else 1)
    add("chaos_procs_left", len(procs))
    add("chaos_files_left", len(files))
    for kind in KINDS:
        for f in FAULTS:
            if f["kind"] == kind and f["recovered"]:
                detail(f"chaos: {kind} → training again s", f["back_s"])
    detail("chaos: tfo's exit code after Ctrl-C (None: SIGKILLed)", code if code is not None
           else -1)
    out = Path(os.environ.get("TFO_BENCH_PLOT_DIR") or OUT[0])
    out.mkdir(parents=True, exist_ok=True)
    if any(not f["recovered"] for f in FAULTS) or procs or files or code != 130:
        shutil.copytree(rd, out / "chaos-run", dirs_exist_ok=True)  # the evidence, kept
        rd = out / "chaos-run"
    (out / "chaos.json").write_text(json.dumps(
        {"seed": SEED, "faults": FAULTS, "exit_code": code, "processes_left": procs,
         "files_left": files, "run_dir": str(rd)}, indent=1) + "\n")
    print(f"chaos: tfo exited {code} after Ctrl-C; wrote {out / 'chaos.json'}"
          + (f"; left: processes {procs}, files {files}" if procs or files else ""), flush=True)


def bench_chaos(s: Setting, tmp: Path) -> None:
    if s.fake:
        print("chaos: skipped in the quick setting (it trains with TensorFlow)")
        return
    print(f"chaos: {WORKERS} elastic workers, random faults (seed {SEED}) every "
          f"{GAP[0]:g}–{GAP[1]:g} s for {SOAK_SECONDS} s", flush=True)
    soak(tmp / "chaos")
