"""The test kit's soak (issue 37 item 9): consecutive 2-worker `tf_cluster` runs, none may hang.

    python bench/kitsoak.py --runs 200          # 100 in plain pytest sessions, 100 under -n 2
    python bench/run.py --only kitsoak          # make bench's share: SOAK_RUNS runs

Each run is the testing guide's `fit` (docs/guide/testing.md: a MultiWorkerMirrored Dense
model, its variables' initial values broadcast, 3 epochs of all-reduces) as a user's test,
`tf_cluster.run("soakpkg.steps:fit", workers=2)`, its tasks taken from the session's warm
pool (forked from its fork server). The runs come in pytest sessions of `--tests` tests,
alternately plain (one pool) and `pytest -n 2` (two sessions' pools, fork servers and
clusters at once, where the hang was seen: 1 run in 3 of a 3-test file). A test's cluster
fails at its stall check or at `DEADLINE` s, so a hang costs one test, not the soak, and is
told apart from other failures by its result (a stall or the deadline).

The project imports tfo from this checkout (its packages linked in), whatever the
environment installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEADLINE = 120  # s: a test's cluster that runs longer fails (with its stacks)
SOAK_RUNS = 40  # make bench's share (the 200 take 20-40 minutes on 2 cores)

STEPS = '''\
import tensorflow as tf


def fit(ctx):
    with ctx.strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
        model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensors((tf.ones([16, 4]), tf.ones([16, 1]))).repeat()
    history = model.fit(data, epochs=3, steps_per_epoch=4, verbose=0,
                        callbacks=ctx.callbacks())
    return len(history.history["loss"])
'''

TESTS = '''\
import pytest


@pytest.mark.parametrize("n", range({tests}))
def test_fit(tf_cluster, n):
    result = tf_cluster.run("soakpkg.steps:fit", workers=2, timeout={deadline})
    assert result.ok, result
    assert [t.value for t in result.tasks.values()] == [3, 3]
'''


def project(root: Path, tests: int) -> Path:
    from bench.kit import link_checkout

    (root / "soakpkg").mkdir(parents=True, exist_ok=True)
    (root / "soakpkg" / "__init__.py").write_text("")
    (root / "soakpkg" / "steps.py").write_text(STEPS)
    (root / "test_soak.py").write_text(TESTS.format(tests=tests, deadline=DEADLINE))
    link_checkout(root)
    return root


def session(root: Path, xdist: bool, out: Path) -> dict:
    """One pytest session of the project's tests: its outcome per test, from its JUnit XML."""
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")
           and not k.startswith(("PYTEST_XDIST", "TFO_"))}
    env.update(PYTHONPATH=str(root), TF_USE_LEGACY_KERAS="1")
    xml = out / "junit.xml"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_soak.py",
            f"--junitxml={xml}", f"--basetemp={out / 'tmp'}",
            *(["-n", "2"] if xdist else ["-p", "no:xdist"])]
    started = time.monotonic()
    res = subprocess.run(args, cwd=root, capture_output=True, text=True, env=env,
                         timeout=DEADLINE * 20 + 600)
    took = time.monotonic() - started
    cases = ET.parse(xml).getroot().iter("testcase") if xml.exists() else iter(())
    got = {"xdist": xdist, "seconds": round(took, 1), "passed": 0, "hangs": [], "failed": [],
           "slowest": 0.0}
    for case in cases:
        got["slowest"] = max(got["slowest"], float(case.get("time", 0)))
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is None:
            if case.find("skipped") is None:
                got["passed"] += 1
            continue
        text = (failure.get("message") or "") + (failure.text or "")
        kind = "hangs" if any(w in text for w in ("stall", "deadline")) else "failed"
        got[kind].append(f"{case.get('name')}: {text[-1500:]}")
    if res.returncode not in (0, 1) or got["passed"] + len(got["hangs"]) + len(got["failed"]) == 0:
        got["failed"].append(f"pytest exited {res.returncode}: {res.stdout[-2000:]}"
                             f"{res.stderr[-1000:]}")
    return got


def soak(tmp: Path, runs: int, tests: int = 10, say=print) -> dict:  # noqa: ANN001
    """`runs` kit runs in sessions of `tests`, plain and under -n 2 alternately (a plain
    session first); stops early at a hang (kept for its stacks, in the run's events)."""
    root = project(tmp / "kit-soak", tests)
    total = {"runs": 0, "passed": 0, "hangs": [], "failed": [], "slowest": 0.0,
             "seconds": 0.0, "sessions": []}
    i = 0
    while total["runs"] < runs:
        n = min(tests, runs - total["runs"])
        if n != tests:
            project(root, n)
        got = session(root, xdist=i % 2 == 1, out=tmp / f"kit-soak-{i}")
        i += 1
        total["runs"] += n
        total["passed"] += got["passed"]
        total["hangs"] += got["hangs"]
        total["failed"] += got["failed"]
        total["slowest"] = max(total["slowest"], got["slowest"])
        total["seconds"] += got["seconds"]
        total["sessions"].append({k: got[k] for k in ("xdist", "seconds", "passed", "slowest")}
                                 | {"hangs": len(got["hangs"]), "failed": len(got["failed"])})
        say(f"kit soak session {i} ({'-n 2' if got['xdist'] else 'plain'}): {n} runs, "
            f"{got['passed']} passed, {len(got['hangs'])} hung, {len(got['failed'])} failed "
            f"otherwise, slowest test {got['slowest']:.1f} s, {got['seconds']:.0f} s; "
            f"{total['runs']} runs so far", flush=True)
        for line in got["hangs"] + got["failed"]:
            say("  " + line.replace("\n", "\n  "))
        if got["hangs"]:
            break
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--tests", type=int, default=10, help="tests per pytest session")
    parser.add_argument("--dir", type=Path, default=None, help="where the sessions' files go")
    args = parser.parse_args()
    import tempfile

    sys.path.insert(0, str(REPO))  # `python bench/kitsoak.py`: bench.kit
    tmp = args.dir or Path(tempfile.mkdtemp(prefix="tfo-kitsoak-"))
    total = soak(tmp, args.runs, args.tests)
    print(json.dumps({k: (len(v) if isinstance(v, list) and k != "sessions" else v)
                      for k, v in total.items() if k != "sessions"}))
    return 0 if not total["hangs"] and not total["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
