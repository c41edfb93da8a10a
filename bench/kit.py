"""`python bench/run.py --only kit`: 10 consecutive cluster tests, each a 2-worker
MultiWorkerMirrored cluster running 5 steps of an all-reduce, written (a) with tfo's
`tf_cluster` fixture and (b) with TensorFlow's `tf.__internal__.distribute.
multi_process_runner`, one pytest run each, alternated (a b, then b a); wall time of each
pytest run, and tfo ÷ TF's runner per pair. Target: ≤ 0.5. And the memory a pytest
worker's warm pool holds between two tests (`pool_memory`).

TF's runner needs `dill` (else it skips every test) and `test_main()` under `__main__`
(else NotInitializedError): the file sets the flag test_main sets, since pytest calls no
`__main__`; and pytest's options go in PYTEST_ADDOPTS, as absl in its subprocesses parses
sys.argv and refuses pytest's flags.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = 10

STEPS = '''\
import tensorflow as tf


def allreduce_ones(ctx=None):
    strategy = ctx.strategy if ctx is not None else tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        return strategy.run(lambda: tf.constant(1.0))

    for _ in range(5):
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, step(), axis=None)
    return float(total)
'''

TFO_TESTS = f'''\
import pytest


@pytest.mark.parametrize("n", range({TESTS}))
def test_allreduce(tf_cluster, n):
    result = tf_cluster.run("benchpkg.steps:allreduce_ones", workers=2)
    assert result.ok
    assert [t.value for t in result.tasks.values()] == [2.0, 2.0]
'''

MPR_TESTS = f'''\
import socket

import pytest
import tensorflow as tf
from tensorflow.python.distribute import multi_process_lib

from benchpkg.steps import allreduce_ones

# What multi_process_runner.test_main() sets under `__main__`; pytest calls no such thing.
multi_process_lib._test_main_called = True
mpr = tf.__internal__.distribute.multi_process_runner


def free_ports(n):
    """create_cluster_spec's ports without portpicker (not a TensorFlow dependency)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.parametrize("n", range({TESTS}))
def test_allreduce(n):
    cluster = {{"worker": [f"localhost:{{port}}" for port in free_ports(2)]}}
    result = mpr.run(allreduce_ones, cluster, timeout=120)
    assert result.return_value == [2.0, 2.0]
'''


# What a pytest worker holds between two cluster tests: every process the session's pool
# keeps (its standbys, and whatever serves them), once their imports are done. Three tests:
# the second measures after its run (the third's standbys are held by then).
MEM_TESTS = '''\
import json
import time

import psutil


def _quiet(procs):
    """Once `procs` all sleep and their CPU time stood still for 2 s: their imports done (a
    standby importing at nice 19 on a busy machine is runnable, not asleep, while it waits
    for a core)."""
    last, since = None, time.monotonic()
    while time.monotonic() - since < 2.0:
        cpu = sum(sum(p.cpu_times()[:2]) for p in procs)
        asleep = all(p.status() == psutil.STATUS_SLEEPING for p in procs)
        if cpu != last or not asleep:
            last, since = cpu, time.monotonic()
        time.sleep(0.2)


def test_a(tf_cluster):
    assert tf_cluster.run("benchpkg.steps:allreduce_ones", workers=2).ok


def test_b(tf_cluster):
    assert tf_cluster.run("benchpkg.steps:allreduce_ones", workers=2).ok
    procs = psutil.Process().children(recursive=True)
    _quiet(procs)
    info = [p.memory_full_info() for p in procs]
    print("POOLMEM", json.dumps({"processes": len(procs),
                                 "rss_mib": sum(i.rss for i in info) / 2**20,
                                 "pss_mib": sum(i.pss for i in info) / 2**20,
                                 "uss_mib": sum(i.uss for i in info) / 2**20}))


def test_c(tf_cluster):
    assert tf_cluster.run("benchpkg.steps:allreduce_ones", workers=2).ok
'''


def project(tmp: Path) -> Path:
    root = tmp / "kit-bench"
    (root / "benchpkg").mkdir(parents=True, exist_ok=True)
    (root / "benchpkg" / "__init__.py").write_text("")
    (root / "benchpkg" / "steps.py").write_text(STEPS)
    (root / "test_tfo.py").write_text(TFO_TESTS)
    (root / "test_mpr.py").write_text(MPR_TESTS)
    (root / "test_mem.py").write_text(MEM_TESTS)
    link_checkout(root)
    return root


def link_checkout(root: Path) -> None:
    """This checkout's tfo first on the project's path (its plugin, and every task's
    worker_entry: the pool gives tasks the project as PYTHONPATH), whatever the environment
    installed: an editable install may point at another checkout."""
    for package in ("orchestrator", "worker_entry"):
        link = root / package
        if not link.exists():
            link.symlink_to(REPO / package)


def warm_starts(basetemp: Path) -> tuple[int, int]:
    """(tasks started warm, tasks started) in a tfo arm's runs (their events.jsonl)."""
    found = {p.resolve() for p in basetemp.glob("*/tfo-run-*/events.jsonl")}  # pytest's
    # `<test>current` links to each test's directory would count every run twice
    starts = [json.loads(line) for events in found
              for line in events.read_text().splitlines() if '"task_started"' in line]
    return sum(1 for e in starts if e.get("warm")), len(starts)


def one_run(root: Path, arm: str, basetemp: Path, tests: int = TESTS,
            flags: tuple[str, ...] = ()) -> tuple[float, str]:
    """Wall seconds and output of one pytest run of the arm's file; raises unless all tests
    passed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(PYTEST_ADDOPTS=f"-q -p no:cacheprovider --basetemp={basetemp}",
               TF_USE_LEGACY_KERAS="1", PYTHONPATH=str(root))
    t = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "pytest", *flags, f"test_{arm}.py"], cwd=root,
                         capture_output=True, text=True, timeout=1200, env=env)
    took = time.monotonic() - t
    if res.returncode != 0 or f"{tests} passed" not in res.stdout:
        raise RuntimeError(f"{arm}: {res.stdout[-3000:]}{res.stderr[-2000:]}")
    return took, res.stdout


def pool_memory(tmp: Path) -> dict:
    """What one pytest worker's pool holds between tests, its imports done: processes, and
    their RSS, PSS (shared pages split among their sharers) and USS (their own), MiB."""
    _, out = one_run(project(tmp), "mem", tmp / "kit-mem", tests=3, flags=("-s",))
    return json.loads(out.split("POOLMEM ", 1)[1].splitlines()[0])


def pairs(tmp: Path, n: int, say=print) -> list[tuple[float, float]]:  # noqa: ANN001
    """(tfo, TF's runner) wall seconds, `n` pairs, alternating which goes first."""
    root = project(tmp)
    got = []
    for i in range(n):
        order = ("tfo", "mpr") if i % 2 == 0 else ("mpr", "tfo")
        walls = {arm: one_run(root, arm, tmp / f"kit-{arm}-{i}")[0] for arm in order}
        warm, started = warm_starts(tmp / f"kit-tfo-{i}")
        say(f"kit pair {i}: tfo {walls['tfo']:.1f} s ({warm} of {started} tasks warm), "
            f"multi_process_runner {walls['mpr']:.1f} s, ratio {walls['tfo'] / walls['mpr']:.2f}")
        got.append((walls["tfo"], walls["mpr"]))
    return got
