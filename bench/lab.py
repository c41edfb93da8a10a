"""`python bench/run.py --only lab` (issue 26): a lab as it is, 16 hosts (network namespaces
on 10.202.0.0/24, each with a stock sshd) × 8 light tasks (tests/scripts/listen_sleep.py: a
process that listens on its TF_CONFIG port and sleeps), side by side in one run with the
anchor: the same tasks started by a plain OpenSSH fan-out, one `ssh` per host, all hosts at
once, as pdsh does.

- ready: from the launch (`tfo run`'s, or the first `ssh`'s) to every task's port accepting a
  connection, polled from this machine the same way for both; tfo's after one uncounted run
  that copied the code to the hosts. Against the number of hosts (1, 4, 8, 16), both, plotted
  into lab.png in the output directory.
- at 16 hosts, with every task ready: the coordinator's CPU per wall second over WINDOW s and
  its threads; then SIGINT → every task process (wrappers and tasks) gone.
- `--quick` (make test's harness check) runs QUICK_HOSTS hosts only (each with its 8 tasks),
  with a 2 s idle window: the same steps, a sixth of the processes.

TFO_BENCH_CODE=DIR runs the tfo of another checkout (e.g. `git worktree add` of the code
before a change) against the same lab: the before → after of the closing note. Skipped
where network namespaces cannot be made (not root).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import time
from pathlib import Path

import psutil

from bench import run
from bench.run import FIGURES, OUT, PY, REPO, Figure, Setting, add, detail, events, lab_ready
from tests.procs import alive

PREFIX, SUBNET = "t26", ipaddress.ip_network("10.202.0.0/24")
HOSTS, TASKS = 16, 8
QUICK_HOSTS = 2
COUNTS = (1, 4, 8, 16)
WINDOW = 10.0  # seconds of idle coordinator CPU measured
SCRIPT = "tests/scripts/listen_sleep.py"
CURVE: dict[str, dict[int, list[float]]] = {"tfo run": {}, "OpenSSH fan-out": {}}

for _f in [
    Figure("lab_ready_ratio", f"lab {HOSTS}×{TASKS}: run → all ready, tfo ÷ fan-out", "×", 1.2,
           before="14.4–31 s ÷ 2.8 s"),
    Figure("lab_ready_tfo", f"lab {HOSTS}×{TASKS}: tfo run → all ready", "s", None,
           before="14.4–31"),
    Figure("lab_ready_fanout", f"lab {HOSTS}×{TASKS}: OpenSSH fan-out → all ready", "s", None,
           before="2.8"),
    Figure("lab_stop", f"lab {HOSTS}×{TASKS}: Ctrl-C → all stopped", "s", 1.0),
    Figure("lab_idle_cpu", f"lab {HOSTS}×{TASKS}: coordinator CPU per wall s, idle", "cores",
           0.01, before="0.05"),
    Figure("lab_threads", f"lab {HOSTS}×{TASKS}: coordinator threads", "", 2 * HOSTS + 10,
           before="274"),
]:
    FIGURES[_f.key] = _f


def _wait_listening(addresses: list[tuple[str, int]], timeout: float = 120) -> float | None:
    """When every (address, port) accepted a connection (monotonic), or None."""
    left = set(addresses)
    until = time.monotonic() + timeout
    while left and time.monotonic() < until:
        for addr in list(left):
            with contextlib.suppress(OSError), socket.create_connection(addr, timeout=0.2):
                left.discard(addr)
        if left:
            time.sleep(0.02)
    return None if left else time.monotonic()


def _ports(hosts: list, base: int) -> list[tuple[str, int]]:
    return [(h.address, base + i) for h in hosts for i in range(TASKS)]


def _kill_tasks(hosts: list) -> None:
    """The fan-out's tasks (its ssh sessions do not end them), by their script's name."""
    for h in hosts:
        out = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True,
                             timeout=10).stdout
        for pid in map(int, out.split()):
            with contextlib.suppress(psutil.Error):
                if SCRIPT.rsplit("/", 1)[1] in " ".join(psutil.Process(pid).cmdline()):
                    os.kill(pid, signal.SIGKILL)


def fan_out(hosts: list) -> float:
    """One `ssh` per host, all at once, each starting its host's tasks: → all listening."""
    from tests import sshlab

    script = REPO / SCRIPT
    procs = []
    t0 = time.monotonic()
    for h in hosts:
        starts = []
        for i in range(TASKS):
            config = json.dumps({"cluster": {"worker": [f"{h.address}:{21000 + i}"]},
                                 "task": {"type": "worker", "index": 0}})
            starts.append(f"TF_CONFIG={shlex.quote(config)} {shlex.quote(PY)} "
                          f"{shlex.quote(str(script))} 600 >/dev/null 2>&1 &")
        procs.append(subprocess.Popen([*sshlab.ssh_argv(h), " ".join(starts) + " wait"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True))
    ready = _wait_listening(_ports(hosts, 21000))
    for p in procs:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    _kill_tasks(hosts)
    assert ready is not None, "the fan-out's tasks did not all listen within 120 s"
    return ready - t0


def _spec(hosts: list, tmp: Path) -> Path:
    lines = []
    for h in hosts:
        fields = {"address": h.address, "user": h.user, "key": h.key,
                  "known_hosts": h.known_hosts, "python": PY,
                  "workdir": str(tmp / "work" / h.name), "connect_timeout_seconds": 10}
        lines.append(f"  {h.name}: {json.dumps(fields)}")
    workers = ", ".join(f"{h.name}:{20000 + i}" for h in hosts for i in range(TASKS))
    spec = tmp / f"lab{len(hosts)}.yaml"
    spec.write_text(f"name: bench-lab\njob: {{script: {SCRIPT}, args: ['600']}}\nhosts:\n"
                    + "\n".join(lines) + f"\ntasks:\n  worker: [{workers}]\n"
                    "restart: {policy: never}\ntimeouts: {startup_seconds: 300}\n")
    return spec


def _run_processes(run_id: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            env = p.environ()  # a forked task's is its host agent's: TFO_RUN_DIR
            if run_id in env.get("TFO_JOB", "") or run_id in env.get("TFO_RUN_DIR", ""):
                found.append(p.pid)
    return found


def tfo_run(hosts: list, tmp: Path, code: Path, idle: bool, window: float = WINDOW) -> float:
    """`tfo run` of every host's tasks: → all listening; with `idle`, the idle coordinator's
    CPU and threads, then SIGINT → all stopped. Ends the run either way."""
    rd = tmp / f"run-{len(hosts)}-{time.monotonic_ns()}"
    t0 = time.monotonic()
    proc = subprocess.Popen([PY, "-m", "orchestrator", "run", str(_spec(hosts, tmp)),
                             "--run-dir", str(rd)], cwd=code, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=open(rd.with_suffix(".err"), "wb"),  # noqa: SIM115
                            start_new_session=True)
    try:
        ready = _wait_listening(_ports(hosts, 20000), timeout=180)
        assert ready is not None, f"tfo's tasks did not all listen: {rd.with_suffix('.err')}"
        if idle:
            coordinator = psutil.Process(proc.pid)
            # A port listens a moment before tfo writes its task_ready: read them all.
            until = time.monotonic() + 60
            ev = events(rd)
            while (sum(e["event"] == "task_ready" for e in ev) < len(hosts) * TASKS
                   and time.monotonic() < until):
                time.sleep(0.05)
                ev = events(rd)
            tfo_ready = max(e["time"] for e in ev if e["event"] == "task_ready")
            first = min(e["time"] for e in ev if e["event"] == "task_started")
            last = max(e["time"] for e in ev if e["event"] == "task_started")
            detail("lab: task_started spread (first → last) s", last - first)
            detail("lab: run_started → last task_ready s", tfo_ready - min(
                e["time"] for e in ev if e["event"] == "run_started"))
            time.sleep(2.0)  # the start's own work settled
            before, t = coordinator.cpu_times(), time.monotonic()
            time.sleep(window)
            after, wall = coordinator.cpu_times(), time.monotonic() - t
            add("lab_idle_cpu", (after.user + after.system - before.user - before.system)
                / wall)
            add("lab_threads", coordinator.num_threads())
            run_id = json.loads((rd / "plan.json").read_text())["run_id"]
            pids = _run_processes(run_id)
            detail("lab: task processes (wrappers and tasks)", len(pids))
            stop_at = time.monotonic()
            proc.send_signal(signal.SIGINT)
            until = stop_at + 60
            while time.monotonic() < until and any(alive(p) for p in pids):
                time.sleep(0.01)
            add("lab_stop", time.monotonic() - stop_at)
            proc.wait(60)
            detail("lab: Ctrl-C → tfo exited s", time.monotonic() - stop_at)
        return ready - t0
    finally:
        run.interrupt(proc)
        _kill_tasks(hosts)


def bench_lab(s: Setting, tmp: Path) -> None:
    from tests import sshlab

    if not lab_ready("lab"):
        return
    code = Path(os.environ.get("TFO_BENCH_CODE") or REPO)
    reps = 1 if s.fake else 2
    # --quick checks the harness (make test): a 2-host lab once, a short idle window.
    most = QUICK_HOSTS if s.fake else HOSTS
    counts, window = ((most,), 2.0) if s.fake else (COUNTS, WINDOW)
    with sshlab.lab_hosts(tmp / "lab", prefix=PREFIX, count=most, subnet=SUBNET) as hosts:
        tfo_run(hosts, tmp, code, idle=False)  # copies the code to every host: not counted
        for rep in range(reps):
            for n in counts:
                # Alternated, the order flipped each repeat: drift falls on both.
                arms = [("OpenSSH fan-out", lambda n=n: fan_out(hosts[:n])),
                        ("tfo run", lambda n=n: tfo_run(hosts[:n], tmp, code,
                                                        idle=n == most, window=window))]
                for name, arm in arms[::-1] if rep % 2 else arms:
                    took = arm()
                    CURVE[name].setdefault(n, []).append(took)
                    detail(f"lab: {name} → all ready, {n} host(s) s", took)
                    print(f"  lab {n}×{TASKS} {name}: {took:.2f} s", flush=True)
            tfo, fan = CURVE["tfo run"][most][-1], CURVE["OpenSSH fan-out"][most][-1]
            add("lab_ready_tfo", tfo)
            add("lab_ready_fanout", fan)
            add("lab_ready_ratio", tfo / fan)
    detail("lab: load average at the end", os.getloadavg()[0])
    # Beside results.json: a --quick or --only run does not overwrite the committed plot.
    plot(Path(os.environ.get("TFO_BENCH_PLOT") or OUT[0] / "lab.png"))


def plot(path: Path) -> None:
    plt = run.pyplot()
    if plt is None:
        print("lab: no matplotlib, no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, curve in CURVE.items():
        counts = sorted(curve)
        med = [statistics.median(curve[n]) for n in counts]
        low = [m - min(curve[n]) for n, m in zip(counts, med, strict=True)]
        high = [max(curve[n]) - m for n, m in zip(counts, med, strict=True)]
        ax.errorbar(counts, med, yerr=[low, high], marker="o", capsize=4, label=name)
    ax.set_xlabel(f"hosts ({TASKS} light tasks each)")
    ax.set_ylabel("launch → every task listening (s)")
    ax.set_title("start time against hosts")
    ax.set_xticks(COUNTS)
    ax.legend()
    run.saved(fig, path)
    plt.close(fig)
