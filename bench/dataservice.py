"""`python bench/run.py --only dataservice` (issue 43): an input-bound 2-worker MWMS job
(tests/scripts/data_service.py) whose every element waits DELAY_MS first, as reading from
remote storage does (latency-bound, not CPU-bound: tf.data's sleep transformation), with 0,
1 and 2 data workers. 0: each trainer runs its own shard's pipeline, as the tutorial does;
1 and 2: tfo's tf.data service, `distributed_epoch`. Figures: training throughput (elements
trained per second, over the slower trainer's loop) and the share of that loop the trainers
spent waiting for input rather than computing.

Skipped in the quick setting (it needs TensorFlow).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from bench.run import FIGURES, REPO, Figure, Setting, add, detail, tfo

SCRIPT = REPO / "tests/scripts/data_service.py"
ELEMENTS, BATCH, DELAY_MS = 480, 8, 20.0
COUNTS = (0, 1, 2)

for _n in COUNTS:
    FIGURES[f"ds_throughput_{_n}"] = Figure(
        f"ds_throughput_{_n}", f"input-bound job ({DELAY_MS:g} ms latency an element), "
        f"{_n} data workers: elements/s", "/s", None)
    FIGURES[f"ds_waiting_{_n}"] = Figure(
        f"ds_waiting_{_n}", f"… {_n} data workers: share of the step waiting for input",
        "×", None)


def _spec(tmp: Path, n: int, seen: Path) -> Path:
    args = ["--elements", str(ELEMENTS), "--epochs", "1", "--batch", str(BATCH),
            "--delay_ms", str(DELAY_MS), "--seen_dir", str(seen)]
    service = "" if not n else (
        "  dispatcher: localhost\n  data_worker: [" + ", ".join(["localhost"] * n) + "]\n")
    path = tmp / f"ds{n}.yaml"
    path.write_text(f"name: ds{n}\njob: {{script: {SCRIPT}, args: {json.dumps(args)}}}\n"
                    f"tasks:\n  worker: [localhost, localhost]\n{service}"
                    "timeouts: {startup_seconds: 600}\n")
    return path


def bench_dataservice(s: Setting, tmp: Path) -> None:
    if s.fake:
        print("dataservice: skipped in the quick setting (it needs TensorFlow)", flush=True)
        return
    for n in COUNTS:
        seen = tmp / f"seen{n}"
        proc = tfo("run", str(_spec(tmp, n, seen)), "--run-dir", str(tmp / f"run{n}"))
        try:
            rc = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: tfo and its tasks
                proc.wait()
        if rc != 0:
            raise RuntimeError(f"the {n}-data-worker job failed (exit {rc})")
        timing = [json.loads((seen / f"worker:{i}.timing.json").read_text()) for i in (0, 1)]
        elements = sum(t["elements"] for t in timing)
        seconds = max(t["seconds"] for t in timing)
        add(f"ds_throughput_{n}", elements / seconds)
        waiting = sum(t["waiting"] for t in timing)
        add(f"ds_waiting_{n}", waiting / (waiting + sum(t["computing"] for t in timing)))
        detail(f"ds_elements_{n}", elements)
