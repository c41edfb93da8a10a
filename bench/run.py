"""Benchmarks: speed and memory figures of tfo on this machine (`make bench`).

Prints each figure and saves them all to bench/results/<timestamp>.json. Figures:
- coordinator: `tfo --help` and `tfo plan` wall time (no TensorFlow on that side)
- mwms: wall time of `tfo run clusters/localhost.yaml`, time from run start to both
  workers' first training step, peak RSS of the coordinator and of each task
- ps: wall time of `tfo run clusters/localhost-ps.yaml`, peak RSS per role
- faults: detection (kill → task_exited), group teardown, restart → resumed epoch
- ssh: `tfo check` and bring-up (run start → every task ready) on 1 and on 2 lab hosts
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PY = sys.executable
RESULTS: dict[str, dict] = {}


def record(group: str, name: str, value: float, unit: str) -> None:
    RESULTS.setdefault(group, {})[name] = {"value": round(value, 3), "unit": unit}
    print(f"{group:12s} {name:40s} {value:10.3f} {unit}", flush=True)


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


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


def bench_coordinator() -> None:
    for label, args in (("tfo --help", ["--help"]),
                        ("tfo plan localhost.yaml", ["plan", "clusters/localhost.yaml"])):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run([PY, "-m", "orchestrator", *args], cwd=REPO, capture_output=True,
                           check=True)
            times.append(time.perf_counter() - t)
        record("coordinator", f"{label} (best of 5)", min(times), "s")


def bench_mwms(tmp: Path) -> None:
    rd = tmp / "mwms"
    code, wall, peaks, coord = run_sampled(["run", "clusters/localhost.yaml"], rd)
    assert code == 0, f"mwms run failed ({code})"
    ev = events(rd)
    start = next(e["time"] for e in ev if e["event"] == "run_started")
    first = [e["time"] for e in ev if e["event"] == "task_first_step"]
    record("mwms", "wall time of tfo run", wall, "s")
    record("mwms", "run start -> both workers' first step", max(first) - start, "s")
    record("mwms", "coordinator peak RSS", coord / 2**20, "MiB")
    for task, rss in sorted(peaks.items()):
        record("mwms", f"{task} peak RSS", rss / 2**20, "MiB")


def bench_ps(tmp: Path) -> None:
    rd = tmp / "ps"
    code, wall, peaks, coord = run_sampled(["run", "clusters/localhost-ps.yaml"], rd)
    assert code == 0, f"ps run failed ({code})"
    record("ps", "wall time of tfo run", wall, "s")
    record("ps", "coordinator peak RSS", coord / 2**20, "MiB")
    for task, rss in sorted(peaks.items()):
        record("ps", f"{task} peak RSS", rss / 2**20, "MiB")


def bench_faults(tmp: Path) -> None:
    spec = tmp / "faults.yaml"
    spec.write_text("""\
name: bench-faults
job: {entry: "tests.jobs.faulty:train", args: {epochs: 4, epoch_sleep: 2}}
tasks: {worker: [localhost:20000, localhost:20001]}
restart: {policy: on-failure, max_restarts: 1, backoff_seconds: 0}
""")
    rd = tmp / "faults"
    killed: dict[str, float] = {}

    def kill_in_epoch_2(ev: list[dict]) -> bool:
        if any(e["event"] == "task_epoch" and e["task"] == "worker:1" and e["epoch"] == 1
               for e in ev):
            time.sleep(1.0)
            pid = next(e["pid"] for e in ev if e["event"] == "task_started"
                       and e["task"] == "worker:1")
            killed["t"] = time.time()
            os.kill(pid, signal.SIGKILL)
            return True
        return False

    code, _, _, _ = run_sampled(["run", str(spec)], rd, on_event=kill_in_epoch_2)
    assert code == 0, f"fault run failed ({code})"
    ev = events(rd)
    def when(event: str, task: str) -> float:
        return next(e["time"] for e in ev if e["event"] == event and e["task"] == task)

    exited, stopped = when("task_exited", "worker:1"), when("task_stopped", "worker:0")
    resumed = next(e for e in ev if e["event"] == "task_epoch" and e["attempt"] == 1)
    record("faults", "detection (SIGKILL -> task_exited)", exited - killed["t"], "s")
    record("faults", "group teardown (SIGKILL -> peer stopped)", stopped - killed["t"], "s")
    record("faults", "restart -> resumed training", resumed["time"] - stopped, "s")
    record("faults", "resumed at epoch (0-based)", resumed["epoch"], "epoch")


def bench_ssh(tmp: Path) -> None:
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
            record("ssh", f"tfo check, {count} host(s)", time.perf_counter() - t, "s")
            rd = tmp / f"lab{count}-run"
            code, _, _, _ = run_sampled(["run", str(spec)], rd)
            assert code == 0, f"lab run on {count} host(s) failed ({code})"
            ev = events(rd)
            start = next(e["time"] for e in ev if e["event"] == "run_started")
            ready = max(e["time"] for e in ev if e["event"] == "task_ready")
            record("ssh", f"bring-up, {count} host(s) (start -> all ready)", ready - start, "s")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tfo-bench-") as d:
        tmp = Path(d)
        bench_coordinator()
        bench_mwms(tmp)
        bench_ps(tmp)
        bench_faults(tmp)
        bench_ssh(tmp)
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / time.strftime("%Y%m%d-%H%M%S.json")
    path.write_text(json.dumps({"machine": {"cpus": os.cpu_count(),
                                            "memory_gib": round(psutil.virtual_memory().total
                                                                / 2**30, 1)},
                                "results": RESULTS}, indent=2))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
