"""What `tfo run --metrics-port` costs the coordinator (issue 42): its CPU per wall second
with 64 light tasks (bench/job.py --fake, one step of 10 minutes: they sit there), in three
arms, alternated run after run:

- off: no endpoint;
- idle: the endpoint, nobody scraping (the loop's snapshot, once a second);
- scraped: the endpoint scraped once a second, as a Prometheus with scrape_interval 1s would.

The window starts once every task is ready and the start has settled; the scrape runs in this
process (its CPU is not the coordinator's; the answer's rendering on tfo's HTTP thread is).

    python bench/metrics_cost.py [--tasks 64] [--runs 2] [--window 20]
    COST coord_cpu off|idle|scraped <median cores> <each run's>
    COST scrape_bytes <size of one /metrics answer>
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.run import FULL, cpu_seconds, events, job_args, kill_group, spec, tfo  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(tmp: Path, arm: str, n: int, window: float, i: int) -> tuple[float, int]:
    rd = tmp / f"{arm}-{i}"
    path = spec(tmp / "light.json", "bench-metrics",
                job_args(FULL, fake=True, epochs=1, steps_per_epoch=1, step_seconds=600), n)
    port = free_port()
    extra = [] if arm == "off" else ["--metrics-port", str(port)]
    proc = tfo("run", str(path), "--run-dir", str(rd), *extra)
    size, stop = 0, threading.Event()

    def scrape() -> None:
        nonlocal size
        while not stop.wait(1.0):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    size = len(r.read())
            except OSError:
                pass
    try:
        coord = psutil.Process(proc.pid)
        until = time.monotonic() + 600
        while sum(e["event"] == "task_ready" for e in events(rd)) < n:
            if proc.poll() is not None or time.monotonic() > until:
                raise RuntimeError(f"{n} light tasks did not all come up; see {rd}")
            time.sleep(0.2)
        scraper = threading.Thread(target=scrape, daemon=True)
        if arm == "scraped":
            scraper.start()
        time.sleep(2.0)  # the start's own work settles
        c0, t0 = cpu_seconds(coord), time.monotonic()
        time.sleep(window)
        per_second = (cpu_seconds(coord) - c0) / (time.monotonic() - t0)
    finally:
        stop.set()
        kill_group(proc)
    return per_second, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--tmp", type=Path, default=Path("/tmp/tfo-bench-metrics"))
    a = ap.parse_args()
    a.tmp.mkdir(parents=True, exist_ok=True)
    found: dict[str, list[float]] = {"off": [], "idle": [], "scraped": []}
    size = 0
    for i in range(a.runs):
        for arm in (found if i % 2 == 0 else reversed(list(found))):
            cpu, got = one_run(a.tmp, arm, a.tasks, a.window, i)
            found[arm].append(round(cpu, 4))
            size = max(size, got)
            print(f"  {arm} run {i}: {cpu:.4f} cores", flush=True)
    for arm, values in found.items():
        print(f"COST coord_cpu {arm} {statistics.median(values):.4f} {values}")
    print(f"COST scrape_bytes {size}")


if __name__ == "__main__":
    main()
