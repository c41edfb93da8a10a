"""The terminal as people read it (issue 40): what a user sees at the end of a run, at the
widths people work in. Tables render at fixed widths (rich's Console(width=N)) from
recorded rows; two real runs check the endings a table test cannot: Ctrl-C pressed again
and again, and a failing worker's final screen."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, kill_tree, run_processes, tfo_cmd, wait_until
from tests.test_liveview import tfo_env, user_dir

SCRIPTS = REPO / "tests" / "scripts"


def last_text_line(text: str) -> str:
    return next(line for line in reversed(text.splitlines()) if line.strip())


# ---- real runs ----------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_ctrl_c_pressed_again_and_again_still_ends_with_the_verdict(tmp_path: Path):
    """Ctrl-C, then Ctrl-C again every 0.1 s until tfo exits (a user who wants out): the
    second lands while the first's teardown ends, or after. tfo still prints the table, the
    run directory and the verdict, and leaves nothing running. Before the fix a late one was
    a KeyboardInterrupt out of the pipeline: "interrupted by SIGINT while supervising;
    nothing was started", and no table."""
    cwd = user_dir(tmp_path / "user")
    out, err = (tmp_path / "stdout").open("w+"), (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(tfo_cmd("run", "--workers", "2", "--", "python",
                                    str(SCRIPTS / "save_on_term.py")),
                            cwd=cwd, stdout=out, stderr=err, start_new_session=True,
                            env=tfo_env(cwd))
    try:
        assert wait_until(lambda: all(f"[worker:{i}] step 2" in
                                      (tmp_path / "stdout").read_text() for i in (0, 1)), 60), \
            (tmp_path / "stderr").read_text()[-2000:]
        until = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < until:
            proc.send_signal(signal.SIGINT)
            time.sleep(0.1)
        assert proc.wait(timeout=5) == 130
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    text = (tmp_path / "stderr").read_text()
    assert "nothing was started" not in text, text
    assert "worker:0" in text and "worker:1" in text and "stopped" in text, text
    (run_dir,) = (cwd / "runs").iterdir()
    assert f"run directory: runs/{run_dir.name}" in text or str(run_dir) in text, text
    assert last_text_line(text).startswith("job interrupted: interrupted by SIGINT"), text
    run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
    assert not run_processes(run_id)
