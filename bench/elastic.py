"""`python bench/run.py --only elastic` (issue 27): an elastic job on three SSH lab hosts
(network namespaces on 10.203.0.0/24, each with a stock sshd; not the tests' lab subnet), 3
workers of tests/jobs/faulty.py:train (digits, `min_workers: 2`, probes every 2 s, lifeline
5 s). Each repeat, one run:

- shrink: once every worker holds the backup of epoch CUT - 1, lab3's link goes down; from
  the cut to training again with 2 workers: the last of the 2 workers' first step after the
  `job_resized` event. Counted from the cut, not from the event: what a user waits includes
  noticing the host is gone (the lifeline's silence, 5 s here: `hosts.X.lifeline_seconds`),
  and the breakdown says how much that was.
- grow: two epochs later its link comes back; from the link up to training with 3 workers:
  the last of the 3 workers' first step after the second `job_resized`. It includes the probe
  (probe_seconds 2) and waiting for worker 0's next epoch boundary (an epoch is ~2-3 s here),
  then the graceful stop and the restart.
- the loss curve: worker 0's loss at each epoch's last step (its `task_progress` marker),
  epoch by epoch across the whole run, with the size it trained at; written to
  elastic-loss.json and elastic-loss.png in the run's output directory, and printed. A resize
  resumes from the group's backup: the epoch count goes on, and the loss with it.

Each restart is cold (`warm_spares: false`): TensorFlow imported again. With the default
("auto") the standbys are there or not by the machine's load, and the figure with them: one
repeat took 2.5 s from job_resized to the first step, its neighbours 11 and 22 s. The
bench's `resume` and `resume_cold` figures tell what warm spares take off a restart.

Skipped where network namespaces cannot be made (not root), and in the quick setting (it
needs TensorFlow).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench import run
from bench.run import FIGURES, OUT, PY, REPO, Figure, Setting, add, detail, events, lab_ready

PREFIX, SUBNET = "t27", ipaddress.ip_network("10.203.0.0/24")
REPEATS = 3
EPOCHS, CUT, EPOCH_SLEEP = 12, 3, 2.0  # the link goes down once epoch CUT began
LIFELINE, PROBE = 5, 2
CURVES: list[dict] = []  # each repeat's loss curve and resizes

for _f in [
    Figure("elastic_shrink_s", "elastic 3 → 2: link down → training with 2", "s", None),
    Figure("elastic_grow_s", "elastic 2 → 3: link up → training with 3", "s", None),
]:
    FIGURES[_f.key] = _f


def _spec(hosts: list, tmp: Path) -> Path:
    lines = []
    for h in hosts:
        fields = {"address": h.address, "user": h.user, "key": h.key,
                  "known_hosts": h.known_hosts, "python": PY, "workdir": str(tmp / h.name),
                  "connect_timeout_seconds": 3, "lifeline_seconds": LIFELINE}
        lines.append(f"  {h.name}: {json.dumps(fields)}")
    spec = tmp / "elastic.yaml"
    spec.write_text(
        "name: bench-elastic\n"
        f"job: {{entry: 'tests.jobs.faulty:train', args: {{epochs: {EPOCHS}, "
        f"epoch_sleep: {EPOCH_SLEEP}}}}}\nhosts:\n" + "\n".join(lines) + "\n"
        f"tasks:\n  worker: [{', '.join(f'{h.name}:20000' for h in hosts)}]\n"
        f"elastic: {{min_workers: 2, probe_seconds: {PROBE}}}\n"
        "restart: {policy: on-failure, max_restarts: 2, backoff_seconds: 0, "
        "warm_spares: false}\n")
    return spec


def _until(what: str, rd: Path, found: Callable[[list[dict]], object], timeout: float,
           proc: subprocess.Popen) -> object:
    """`found(events)` once it is something, polling; an error naming `what` at the limit
    or when tfo ended first."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        got = found(events(rd))
        if got:
            return got
        if proc.poll() is not None:
            raise RuntimeError(f"tfo run ended ({proc.returncode}) before {what}; see {rd}")
        time.sleep(0.1)
    raise RuntimeError(f"no {what} within {timeout:g} s; see {rd}")


def _resized(to: int) -> Callable[[list[dict]], dict | None]:
    return lambda evs: next((e for e in evs if e["event"] == "job_resized" and e["to"] == to),
                            None)


def _all_stepping(since: dict, size: int) -> Callable[[list[dict]], float | None]:
    """When every worker of the group took its first step after the event `since`."""
    def found(evs: list[dict]) -> float | None:
        after = evs[evs.index(since):] if since in evs else []
        steps = {e["task"]: e["time"] for e in reversed(after) if e["event"] == "task_first_step"}
        return max(steps.values()) if len(steps) >= size else None
    return found


def _epoch_began(epoch: int, task: str = "worker:0") -> Callable[[list[dict]], dict | None]:
    return lambda evs: next((e for e in evs if e["event"] == "task_epoch" and e["task"] == task
                             and e["epoch"] >= epoch), None)


def loss_curve(evs: list[dict], task: str = "worker:0") -> dict:
    """The task's loss at each epoch's last step, in the order trained, each with the number
    of workers it trained with; and each resize: where it falls in that list (`at`), the
    last epoch finished before it and the first epoch after it."""
    resized = [e for e in evs if e["event"] == "job_resized"]
    size = resized[0]["from"] if resized else len(
        {e["task"] for e in evs if e["event"] == "task_started" and e["task"].startswith("worker")})
    curve, resizes = [], []
    for e in evs:
        if e["event"] == "job_resized":
            size = e["to"]
            resizes.append({"from": e["from"], "to": e["to"], "hosts": e["hosts"],
                            "save": e.get("save"), "at": len(curve)})
        elif (e["event"] == "task_progress" and e["task"] == task and "loss" in e
              and e.get("steps") and e.get("step_in_epoch") == e["steps"]):
            curve.append({"epoch": e["epoch"], "loss": e["loss"], "workers": size})
    for r in resizes:
        r["last_before"] = curve[r["at"] - 1]["epoch"] if r["at"] else None
        r["first_after"] = curve[r["at"]]["epoch"] if r["at"] < len(curve) else None
    return {"epochs": curve, "resizes": resizes}


def describe(curve: dict) -> str:
    """The curve in one line: `epoch:loss`, a resize as `| 3→2 |` where it fell."""
    at = {r["at"]: f"| {r['from']}→{r['to']} |" for r in curve["resizes"]}
    parts = []
    for i, e in enumerate(curve["epochs"]):
        parts += [at[i]] if i in at else []
        parts.append(f"{e['epoch']}:{e['loss']:.3f}")
    return " ".join(parts)


def one_run(hosts: list, tmp: Path, rep: int) -> None:
    from orchestrator.elastic import backups
    from tests import sshlab

    tmp.mkdir(parents=True, exist_ok=True)
    rd = tmp / f"run-{rep}"
    err = rd.with_suffix(".err")
    proc = subprocess.Popen([PY, "-m", "orchestrator", "run", str(_spec(hosts, tmp)),
                             "--run-dir", str(rd)], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=open(err, "wb"),  # noqa: SIM115
                            start_new_session=True)
    try:
        _until(f"worker 0's epoch {CUT}", rd, _epoch_began(CUT), 300, proc)
        run_id = json.loads((rd / "plan.json").read_text())["run_id"]
        dirs = [tmp / h.name / "runs" / run_id / "backup" / f"worker-{i}"
                for i, h in enumerate(hosts)]
        # every worker's backup of epoch CUT - 1 written: a cut during the save's
        # collectives would leave the group an older one
        _until(f"backup {CUT} on every host", rd,
               lambda _: all(CUT in backups.held(d) for d in dirs), 60, proc)
        cut = time.time()
        with sshlab.partition(hosts[2].netns):
            shrunk = _until("job_resized to 2", rd, _resized(2), 120, proc)
            again = _until("training with 2", rd, _all_stepping(shrunk, 2), 180, proc)
            # two epochs with 2 workers on the loss curve before the host comes back
            _until("2 epochs with 2 workers", rd, _epoch_began(
                (shrunk.get("save") or CUT) + 2), 180, proc)
            up = time.time()
        grown = _until("job_resized to 3", rd, _resized(3), 180, proc)
        three = _until("training with 3", rd, _all_stepping(grown, 3), 180, proc)
        code = proc.wait(600)
        if code != 0:
            raise RuntimeError(f"tfo run exited {code}; see {err}")
    finally:
        run.interrupt(proc)
    assert isinstance(shrunk, dict) and isinstance(grown, dict)
    add("elastic_shrink_s", again - cut)  # type: ignore[operator]
    detail("elastic: link down → job_resized (the lifeline's silence, then the stop) s",
           shrunk["time"] - cut)
    detail("elastic: job_resized → 2 workers' first step s", again - shrunk["time"])  # type: ignore[operator]
    add("elastic_grow_s", three - up)  # type: ignore[operator]
    detail("elastic: link up → job_resized (probe, next epoch, graceful stop) s",
           grown["time"] - up)
    detail("elastic: job_resized → 3 workers' first step s", three - grown["time"])  # type: ignore[operator]
    curve = loss_curve(events(rd))
    CURVES.append(curve)
    print(f"  elastic run {rep}: " + describe(curve), flush=True)


def bench_elastic(s: Setting, tmp: Path) -> None:
    from tests import sshlab

    if s.fake:
        print("elastic: skipped in the quick setting (it trains with TensorFlow)")
        return
    if not lab_ready("elastic"):
        return
    print(f"elastic: {REPEATS} runs of 3 workers on 3 lab hosts, lab3's link down and up",
          flush=True)
    with sshlab.lab_hosts(tmp / "elastic-lab", prefix=PREFIX, count=3, subnet=SUBNET) as hosts:
        for rep in range(REPEATS):
            one_run(hosts, tmp / "elastic", rep)
    detail("elastic: load average at the end", os.getloadavg()[0])
    out = Path(os.environ.get("TFO_BENCH_PLOT_DIR") or OUT[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / "elastic-loss.json").write_text(json.dumps(CURVES, indent=1) + "\n")
    print(f"elastic: wrote {out / 'elastic-loss.json'}")
    plot(out / "elastic-loss.png")


def plot(path: Path) -> None:
    plt = run.pyplot()
    if plt is None:
        print("elastic: no matplotlib, no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, curve in enumerate(CURVES):
        xs = range(len(curve["epochs"]))
        ax.plot(xs, [e["loss"] for e in curve["epochs"]], marker="o", label=f"run {i}",
                alpha=0.8)
        for r in curve["resizes"] if i == 0 else []:
            ax.axvline(r["at"] - 0.5, color="gray", linestyle="dashed")
            ax.annotate(f"{r['from']}→{r['to']}", (r["at"] - 0.45, 0.92),
                        xycoords=("data", "axes fraction"), fontsize=8)
    if CURVES:
        ax.set_xticks(range(len(CURVES[0]["epochs"])),
                      [str(e["epoch"]) for e in CURVES[0]["epochs"]])
    ax.set_xlabel("epoch, in the order trained (run 0's numbers)")
    ax.set_ylabel("worker 0's loss at the epoch's end")
    ax.set_title("loss across a shrink (lab3 lost) and a grow (lab3 back)")
    ax.legend(fontsize=8)
    run.saved(fig, path)
    plt.close(fig)
