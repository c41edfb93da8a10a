"""The live view's cost: the coordinator's own CPU seconds and peak RSS over one training run,
with the live table on (tfo on a pseudo-terminal) against off (piped), runs alternated.

    python bench/liveview.py [--seconds 60] [--pairs 2]

The job is tests/scripts/live_progress.py on 2 localhost workers (a step every 0.05 s with
tfo's progress callback), sized to train about --seconds. The coordinator's CPU and VmHWM are
read from /proc/<tfo pid> until it exits: its own time, not its tasks' (getrusage of a parent
would add every reaped child's). Prints one line per run and the medians; writes
bench/liveview.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def own_cpu_and_hwm(pid: int) -> tuple[float, int] | None:
    """utime + stime of `pid` itself (seconds) and its peak RSS (bytes), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS
    hwm = next(int(line.split()[1]) * 1024 for line in status.splitlines()
               if line.startswith("VmHWM:"))
    return cpu, hwm


def one_run(live: bool, steps: int, workdir: Path) -> dict:
    spec = workdir / "live.yaml"
    spec.write_text(f"""\
name: liveview-bench
job:
  script: {REPO}/tests/scripts/live_progress.py
  args: [--epochs, "1", --steps, "{steps}", --sleep, "0.05"]
tasks:
  worker: [localhost:auto, localhost:auto]
""")
    cmd = [sys.executable, "-m", "orchestrator", "run", str(spec), "--run-dir",
           str(workdir / f"run-{time.monotonic_ns()}")]
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "40"}
    if live:
        leader, follower = pty.openpty()
        proc = subprocess.Popen(cmd, cwd=REPO, stdin=follower, stdout=follower, stderr=follower,
                                env=env, start_new_session=True)
        os.close(follower)
        reader = leader
    else:
        proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        reader = proc.stdout.fileno()
    t0, last = time.monotonic(), None
    while True:
        sample = own_cpu_and_hwm(proc.pid)
        if sample is not None and proc.poll() is None:
            last = sample
        if select.select([reader], [], [], 0.2)[0]:
            try:
                if not os.read(reader, 65536):
                    break
            except OSError:  # EIO: the terminal's last writer is gone
                break
        elif proc.poll() is not None:
            break
    code = proc.wait(timeout=60)
    if live:
        os.close(leader)
    assert last is not None and code == 0, f"tfo exited {code}"
    return {"live": live, "wall": time.monotonic() - t0, "cpu": last[0], "rss_mib": last[1] / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    steps = int(args.seconds / 0.07)  # a step is the 0.05 s sleep plus the step itself
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.pairs):
            for live in (True, False):
                r = one_run(live, steps, Path(tmp))
                runs.append(r)
                print(f"live view {'on ' if live else 'off'}: wall {r['wall']:.1f} s, "
                      f"coordinator CPU {r['cpu']:.2f} s, peak RSS {r['rss_mib']:.1f} MiB",
                      flush=True)
    summary = {}
    for live in (True, False):
        rs = [r for r in runs if r["live"] is live]
        summary["on" if live else "off"] = {
            k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu", "rss_mib")}
    for k, v in summary.items():
        print(f"median, live view {k}: wall {v['wall']:.1f} s, CPU {v['cpu']:.2f} s "
              f"({v['cpu'] / v['wall']:.4f} of a core), peak RSS {v['rss_mib']:.1f} MiB")
    (REPO / "bench" / "liveview.json").write_text(json.dumps({"runs": runs, "median": summary},
                                                             indent=2))


if __name__ == "__main__":
    main()
