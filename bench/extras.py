"""`python bench/run.py --extras`: the parameter-server job's wall time and peak RSS per
role, the SSH lab's `tfo check` and bring-up on 1 and 2 hosts, and issue 39's recovery on a
lab host (they need real sshd and network namespaces; skipped where the lab cannot run).

The lab is tests/sshlab.py's (10.200.0.0/24), which the tests share: a section that uses it
holds /tmp/sshlab.lock (as `flock /tmp/sshlab.lock pytest ...` does), so a bench and a test
run never bring it up at once."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from bench.run import PY, REPO, Setting, detail, events, lab_ready, resume_args, resume_run

SSHLAB_LOCK = "/tmp/sshlab.lock"


@contextlib.contextmanager
def sshlab_held():  # noqa: ANN201
    """The SSH lab, ours alone while we use it (tests take the same lock)."""
    with open(SSHLAB_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_sampled(args: list[str], run_dir: Path, timeout: float = 600,
                on_event=None) -> tuple[int, float, dict[str, int], int]:  # noqa: ANN001
    """Run tfo, sampling RSS of the coordinator and of each task (by TFO_TASK) every 0.2 s."""
    t0 = time.time()
    proc = subprocess.Popen([PY, "-m", "orchestrator", *args, "--run-dir", str(run_dir)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    coord = psutil.Process(proc.pid)
    peak_tasks: dict[str, int] = {}
    peak_coord = 0
    fired = False
    while proc.poll() is None and time.time() - t0 < timeout:
        with contextlib.suppress(psutil.Error):
            peak_coord = max(peak_coord, coord.memory_info().rss)
        for p in coord.children(recursive=True):
            try:
                task = p.environ().get("TFO_TASK")
                if task:
                    rss = p.memory_info().rss
                    peak_tasks[task] = max(peak_tasks.get(task, 0), rss)
            except psutil.Error:
                continue
        if on_event and not fired:
            fired = on_event(events(run_dir))
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return proc.returncode, time.time() - t0, peak_tasks, peak_coord


def bench_ps(s: Setting, tmp: Path) -> None:
    rd = tmp / "ps"
    code, wall, peaks, coord = run_sampled(["run", "clusters/localhost-ps.yaml"], rd)
    assert code == 0, f"ps run failed ({code})"
    detail("ps wall time of tfo run s", wall)
    detail("ps coordinator peak RSS MiB", coord / 2**20)
    for task, rss in sorted(peaks.items()):
        detail(f"ps {task} peak RSS MiB", rss / 2**20)


def bench_ssh(s: Setting, tmp: Path) -> None:
    from tests import sshlab

    if not lab_ready("ssh"):
        return
    with sshlab_held(), sshlab.lab_hosts(tmp / "lab") as hosts:
        for count in (1, 2):
            lines = []
            for h in hosts[:count]:
                fields = {"address": h.address, "user": h.user, "key": h.key,
                          "known_hosts": h.known_hosts, "python": PY,
                          "workdir": str(tmp / f"w{count}-{h.name}")}
                lines.append(f"  {h.name}: {json.dumps(fields)}")
            workers = ", ".join(f"{hosts[i % count].name}:{20000 + i}" for i in range(2))
            spec = tmp / f"lab{count}.yaml"
            spec.write_text("name: bench-lab\njob: {entry: 'worker_entry.examples.digits:train',"
                            " args: {epochs: 1}}\nhosts:\n" + "\n".join(lines)
                            + f"\ntasks:\n  worker: [{workers}]\n")
            t = time.perf_counter()
            subprocess.run([PY, "-m", "orchestrator", "check", str(spec)], cwd=REPO,
                           capture_output=True, check=True)
            detail(f"ssh tfo check, {count} host(s) s", time.perf_counter() - t)
            rd = tmp / f"lab{count}-run"
            code, _, _, _ = run_sampled(["run", str(spec)], rd)
            assert code == 0, f"lab run on {count} host(s) failed ({code})"
            ev = events(rd)
            start = next(e["time"] for e in ev if e["event"] == "run_started")
            ready = max(e["time"] for e in ev if e["event"] == "task_ready")
            detail(f"ssh bring-up, {count} host(s) (start -> all ready) s", ready - start)


def bench_lab_recovery(s: Setting, tmp: Path) -> None:
    """Issue 39 on a lab host: the recovery section's job (bench/job.py, 2 MWMS workers,
    tfo's defaults but the restart policy) with both workers on one SSH lab host; a worker
    SIGKILLed there (the lab is a network namespace of this machine: its pids are ours to
    signal) → both training again, from the tasks' own clocks (the same machine's). Its
    warm spares, if the host's free memory holds them (`auto`), wait on the host, each a
    task of its agent. The full setting only: its standbys import TensorFlow."""
    if s.fake:
        return
    from tests import sshlab

    if not lab_ready("lab recovery"):
        return
    runs = max(3, s.resumes)
    print(f"lab recovery: {runs} run(s) on an SSH lab host with tfo's defaults", flush=True)
    with sshlab_held(), sshlab.lab_hosts(tmp / "lab-recovery", count=1) as (host,):
        fields = {"address": host.address, "port": host.port, "user": host.user,
                  "key": host.key, "known_hosts": host.known_hosts, "python": PY,
                  "workdir": str(tmp / "lab-recovery-work")}
        path = tmp / "lab-recovery.json"
        path.write_text(json.dumps({
            "name": "bench-lab-recovery", "strategy": "multi_worker_mirrored",
            "job": {"script": "bench/job.py", "args": resume_args(s)},
            "hosts": {"lab1": fields},
            "tasks": {"worker": ["lab1:20000", "lab1:20001"]},
            "restart": {"policy": "on-failure", "max_restarts": 1},
            "timeouts": {"startup_seconds": 300, "grace_seconds": 5}}))
        for i in range(runs):
            resume_run(s, tmp, i, None, path=path, figure="recovery_lab")
