"""`make bench`'s harness on its tiny setting (no TensorFlow but in warm spares): every
figure of issue 13 is measured and written, with its median, min, max and whether it met its
target."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import PYTHON, REPO

FIGURES = {"wall_ratio", "first_step_ratio", "throughput_ratio", "coord_cpu_2", "coord_cpu_64",
           "kill_detected", "kill_stopped", "resume", "resume_cold", "help", "plan",
           "plan_json_time", "plan_json_linear", "plan_json_mb"}


def test_quick_bench_measures_every_figure(tmp_path: Path) -> None:
    done = subprocess.run([PYTHON, "bench/run.py", "--quick", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert not FIGURES - set(results["figures"])
    for key, f in results["figures"].items():
        assert f["n"] >= 1 and f["min"] <= f["median"] <= f["max"], key
        assert f["met"] in (True, False, None), key
    assert set(results["coordinator_cpu_curve"]) == {"2", "4"}
    assert (tmp_path / "results.png").stat().st_size > 10_000
    table = done.stdout
    assert "tfo --help" in table and ("met" in table or "MISSED" in table)
