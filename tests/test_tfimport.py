"""TensorFlow's import in a task runs with the garbage collector paused (worker_entry/
tfimport.py), and nothing else about the job's code changes: real task processes
(`python -m worker_entry`, a script job), with a stand-in `tensorflow` package that records
what its import saw, and once with the real one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_task

# Stands in for TensorFlow: its import makes objects (and cyclic garbage, as a real import
# does), and records whether the collector ran meanwhile and what the script had set.
FAKE_TF = """\
import gc, os
SEEN = {"gc_on_in_import": gc.isenabled(), "level": os.environ.get("FAKE_TF_CPP_MIN_LOG_LEVEL")}
made = []
for _ in range(20000):
    cycle = []
    cycle.append(cycle)
    made.append({"k": cycle})
"""

# A user's script as they write them: it sets something before importing TensorFlow. It also
# makes an object in a reference cycle before the import and drops it after: only the
# collector frees it, at the latest in Python's last collection at exit (frozen for good, it
# would never be finalized: a file that way loses its buffered writes).
SCRIPT = """\
import gc, json, os, sys
if "--gc-off" in sys.argv:
    gc.disable()
os.environ["FAKE_TF_CPP_MIN_LOG_LEVEL"] = "3"


class Finalized:
    def __del__(self, write=os.write):
        write(2, b"FINALIZED\\n")


held = Finalized()
held.me = held
import tensorflow as tf
if hasattr(tf, "constant"):
    assert int(tf.constant(1) + 1) == 2
del held
print("SEEN " + json.dumps({**getattr(tf, "SEEN", {}), "gc_on_after": gc.isenabled(),
                            "frozen": gc.get_freeze_count()}), flush=True)
if "--gc-off" in sys.argv:
    gc.enable()
"""


def run_script_task(tmp_path: Path, *args: str, fake: bool = True) -> dict:
    """One real task process running SCRIPT, as tfo's plan starts it; what it printed."""
    (tmp_path / "train.py").write_text(SCRIPT)
    path: tuple[str, ...] = ()
    if fake:
        (tmp_path / "fake" / "tensorflow").mkdir(parents=True)
        (tmp_path / "fake" / "tensorflow" / "__init__.py").write_text(FAKE_TF)
        path = (str(tmp_path / "fake"),)
    res = run_task({"script": "train.py", "args": list(args)}, tmp_path, path)
    assert res.returncode == 0, res.stderr[-3000:]
    seen = json.loads(res.stdout.split("SEEN ", 1)[1].splitlines()[0])
    return {**seen, "finalized": res.stderr.count("FINALIZED")}


@pytest.mark.timeout(60)
def test_tensorflows_import_runs_without_the_collector_and_the_script_runs_as_written(tmp_path):
    seen = run_script_task(tmp_path)
    assert seen["gc_on_in_import"] is False
    assert seen["level"] == "3"  # what the script set before its import, TensorFlow saw
    assert seen["gc_on_after"] is True
    assert seen["frozen"] > 20000  # the import's objects, out of later collections' way
    assert seen["finalized"] == 1  # unfrozen at exit: the last collection still finalized it


@pytest.mark.timeout(60)
def test_a_script_that_turned_the_collector_off_keeps_it_off_and_nothing_frozen(tmp_path):
    seen = run_script_task(tmp_path, "--gc-off")
    assert (seen["gc_on_in_import"], seen["gc_on_after"], seen["frozen"]) == (False, False, 0)
    assert seen["finalized"] == 1


@pytest.mark.timeout(120)
def test_the_real_tensorflow_is_imported_so_and_works(tmp_path):
    seen = run_script_task(tmp_path, fake=False)
    assert seen["gc_on_after"] is True
    assert seen["frozen"] > 100_000  # TensorFlow's own objects: some 600,000 here
    assert seen["finalized"] == 1
