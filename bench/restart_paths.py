"""A restart's path that skips TensorFlow's import, measured: a standby that imported it
ahead and waits (a warm spare, orchestrator/launch/spares.py; the kit's pool standbys too).

    python bench/restart_paths.py [--n 5]      # prints, writes bench/results/restart_paths.json

GO reaches a standby that already waits: no time on the restart's path beyond a pipe
write; what it takes off the path is an exec'd standby's start → waiting
(`exec_to_waiting`, TensorFlow's import); it holds its whole RSS (`standby_rss_mib`), per
task. Waiting is seen as the standby's process tree asleep with its CPU time still for
0.1 s (subtracted). Issue 39 also measured (a), a task forked at the restart from a
per-host process that imported TensorFlow (the kit's fork server, removed by issue 37
item 9: docs/evidence/kit-hang/); its figures are in bench/results/ of that time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

QUIET = 0.1


def tree(pid: int) -> list[psutil.Process]:
    p = psutil.Process(pid)
    return [p, *p.children(recursive=True)]


def waiting_after(pid: int, since: float, limit: float = 300.0) -> float:
    """Seconds from `since` until `pid`'s tree waits (asleep, CPU still for QUIET s)."""
    last, still_since = None, None
    while time.monotonic() - since < limit:
        try:
            procs = tree(pid)
            cpu = sum(sum(p.cpu_times()[:2]) for p in procs)
            asleep = len(procs) >= 2 and all(p.status() == psutil.STATUS_SLEEPING
                                             for p in procs)
        except psutil.Error:
            cpu, asleep = None, False
        now = time.monotonic()
        if cpu != last or not asleep:
            last, still_since = cpu, now
        elif now - still_since >= QUIET:
            return still_since - since
        time.sleep(0.01)
    raise RuntimeError(f"standby {pid} never waited within {limit:g} s")


def measure(n: int) -> dict:
    from orchestrator.launch.pool import WarmPool

    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tfo-paths-") as d:
        pool = WarmPool(Path(d), size=0)
        try:
            for _ in range(n):
                pool.size += 1
                t = time.monotonic()
                pool.fill()
                handle = pool._held[-1]  # noqa: SLF001 - the bench looks inside
                out.setdefault("exec_to_waiting", []).append(
                    round(waiting_after(handle.pid, t), 4))
                rss = sum(p.memory_info().rss for p in tree(handle.pid))
                out.setdefault("standby_rss_mib", []).append(round(rss / 2**20, 1))
        finally:
            pool.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    figures: dict[str, list[float]] = {}
    for k, v in measure(args.n).items():
        figures.setdefault(k, []).extend(v)
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v),
                   "samples": v} for k, v in figures.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"figures": summary, "load_average": os.getloadavg(), "cpus": os.cpu_count()}
    (args.out / "restart_paths.json").write_text(json.dumps(result, indent=2) + "\n")
    for k, s in summary.items():
        print(f"{k}: median {s['median']:.3g} (range {s['min']:.3g}-{s['max']:.3g}, n {s['n']})")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
