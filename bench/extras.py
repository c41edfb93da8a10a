"""`python bench/run.py --extras`: the parameter-server job's wall time and peak RSS per
role, and the SSH lab's `tfo check` and bring-up on 1 and 2 hosts (they need real sshd and
network namespaces; skipped where the lab cannot run)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from bench.run import PY, REPO, Setting, detail, events


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

    ok, reason = sshlab.netns_supported()
    if not ok:
        print(f"ssh: skipped, {reason}")
        return
    sshlab.ensure_openssh()
    with sshlab.lab_hosts(tmp / "lab") as hosts:
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
