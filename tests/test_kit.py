"""The test kit: orchestrator.run from Python and the pytest plugin's `tf_cluster` fixture
(its fault helpers, the stacks of a hang, the GPU marker, its warm pool), used as a user
would: these tests run their clusters through the fixture themselves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import orchestrator
from orchestrator.errors import SpecError
from tests.conftest import REPO
from tests.procs import alive

pytestmark = [pytest.mark.tf]

STEPS = '''\
import tensorflow as tf


def allreduce_ones(ctx):
    strategy = ctx.strategy

    @tf.function
    def step():
        return strategy.run(lambda: tf.constant(1.0))

    for _ in range(5):
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, step(), axis=None)
    return float(total)
'''

# The example, four times over.
USER_TESTS = '''\
import pytest


@pytest.mark.parametrize("n", range(4))
def test_allreduce(tf_cluster, n):
    result = tf_cluster.run("mypkg.steps:allreduce_ones", workers=2)
    assert result.ok
    assert [t.value for t in result.tasks.values()] == [2.0, 2.0]
'''


def user_project(tmp_path: Path, tests: str) -> Path:
    """A new project: a package with steps.py and a test file; no conftest, no config. tfo
    is this checkout's (linked in, as bench/kit.py does): the environment's editable install
    may be another checkout's."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "steps.py").write_text(STEPS)
    (tmp_path / "test_steps.py").write_text(tests)
    for package in ("orchestrator", "worker_entry"):
        (tmp_path / package).symlink_to(REPO / package)
    return tmp_path


def user_env(tmp: Path) -> dict[str, str]:
    """Nothing of ours but tfo installed (the plugin is loaded through its entry point); its
    temporary files (the pool's, pytest's, the runs') under `tmp`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")
           and not k.startswith(("PYTEST_XDIST", "TFO_"))}
    (tmp / "tmp").mkdir(exist_ok=True)
    return {**env, "TMPDIR": str(tmp / "tmp")}


PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]


def user_pytest(project: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*PYTEST, *args], cwd=project, capture_output=True, text=True,
                          timeout=timeout, env=user_env(project))


def started_under(tmp: Path) -> set[int]:
    """Processes whose environment names `tmp`: the session's pool standbys (their pool
    file) and tasks (their run directory), wherever they were reparented."""
    found = set()
    for p in psutil.process_iter():
        try:
            if any(str(tmp) in v for v in p.environ().values()):
                found.add(p.pid)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.mark.timeout(450)
def test_a_new_project_runs_the_example_under_xdist_and_leaves_nothing(tmp_path: Path):
    project = user_project(tmp_path, USER_TESTS)
    proc = subprocess.Popen([*PYTEST, "-n", "2"], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=user_env(project),
                            start_new_session=True)
    seen: set[int] = set()
    try:
        while proc.poll() is None:
            seen |= started_under(tmp_path / "tmp")
            time.sleep(0.5)
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, out[-6000:]
    assert "4 passed" in out, out[-3000:]
    assert len(seen) >= 4, seen  # the pools' standbys and the tasks were there
    left = _alive(seen)
    assert left == [], f"processes outlived the pytest session: {left}"
    # The session's warm pools served the later tests: their tasks started warm.
    starts = [json.loads(line) for found in (tmp_path / "tmp").glob("**/events.jsonl")
              for line in found.read_text().splitlines() if '"task_started"' in line]
    assert len(starts) == 8 and sum(1 for e in starts if e.get("warm")) >= 4, starts


# Two tests on one session pool (issue 37 item 9). Each task returns what it can see of its
# start: where its `tensorflow` module object lies (an import of its own: each lands
# elsewhere, ASLR; processes forked from one import share the address), a draw of numpy's
# global random state, its and its wrapper's executable, its wrapper's parent and start. Each
# wrapper is the pytest process's own exec'd child, no process of the session is a fork
# server, and the second test's tasks were started (and imported) while the first ran.
# The first finds the pool's standbys there already as it starts (not once tfo planned its
# cluster); the last checks that the pool started no standby that no test took: the first
# test's replacements served the second, and none was started after the last.
EXECD_TESTS = """\
import os
import sys
import time

import psutil

SEEN = []


def check(result, since=None):
    assert result.ok, result
    values = [t.value for t in result.tasks.values()]
    for tf_id, draw, exe, wrapper_exe, wrapper_parent, wrapper_born in values:
        assert wrapper_parent == os.getpid(), values  # exec'd by this process, not adopted
        assert exe == wrapper_exe == os.path.realpath(sys.executable), values
        if since is not None:
            assert wrapper_born < since, (values, since)  # started while the last test ran
    paths = [e["path"] for t in result.tasks.values() for e in t.events
             if e["event"] == "task_started"]
    assert paths == ["warm", "warm"], paths
    assert values[0][1] != values[1][1], values
    SEEN.extend(v[0] for v in values)
    found = [p.cmdline() for p in psutil.Process().children(recursive=True)]
    assert not [c for c in found if "worker_entry.forkserver" in c], found


def test_one(tf_cluster, tf_cluster_pool):
    assert len(tf_cluster_pool.pids) == 2
    check(tf_cluster.run("mypkg.steps:where", workers=2))


def test_two(tf_cluster, tf_cluster_pool):
    check(tf_cluster.run("mypkg.steps:where", workers=2), since=time.time())
    assert len(tf_cluster_pool.pids) == tf_cluster_pool.taken == 4, tf_cluster_pool.pids
    print("IDS", sorted(SEEN))
"""

WHERE = """

def where():
    import os

    import numpy as np
    import psutil

    wrapper = psutil.Process().parent()
    return (id(tf), float(np.random.rand()), os.path.realpath("/proc/self/exe"),
            os.path.realpath(f"/proc/{wrapper.pid}/exe"), wrapper.ppid(), wrapper.create_time())
"""


def aslr() -> bool:
    with open("/proc/sys/kernel/randomize_va_space") as f:
        return f.read().strip() != "0"


@pytest.mark.timeout(300)
def test_the_pools_tasks_are_execd_standbys_that_imported_tensorflow_themselves(tmp_path: Path):
    project = user_project(tmp_path, EXECD_TESTS)
    (project / "mypkg" / "steps.py").write_text(STEPS + WHERE)
    res = user_pytest(project, "-s", timeout=280)
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout[-4000:]
    ids = json.loads(res.stdout.split("IDS ", 1)[1].split("]", 1)[0] + "]")
    assert len(ids) == 4, ids
    if aslr():  # 4 tasks, 4 imports: one module object each
        assert len(set(ids)) == 4, ids


# A session killed outright (the CI's timeout, an OOM kill) while its cluster trains.
HANGING_TESTS = """\
def test_hangs(tf_cluster):
    tf_cluster.run("mypkg.steps:forever", workers=2)
"""

FOREVER = """

def forever():
    import time
    print("TRAINING", flush=True)
    time.sleep(600)
"""


@pytest.mark.timeout(180)
def test_a_killed_session_leaves_nothing(tmp_path: Path):
    project = user_project(tmp_path, HANGING_TESTS)
    (project / "mypkg" / "steps.py").write_text(STEPS + FOREVER)
    proc = subprocess.Popen([*PYTEST, "-s"], cwd=project, env=user_env(project),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and sum(
                "TRAINING" in log.read_text(errors="replace")
                for log in (tmp_path / "tmp").glob("**/logs/*.log")) < 2:
            time.sleep(0.2)
        seen = started_under(tmp_path / "tmp")
        os.kill(proc.pid, signal.SIGKILL)  # the pytest process alone
        proc.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _alive(seen):
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _alive(seen):  # what the test asserts against: not left behind either
            os.kill(pid, signal.SIGKILL)
    assert len(seen) >= 4, seen  # 2 wrappers, 2 tasks (at least)
    assert _alive(seen) == [], f"outlived the killed session: {_alive(seen)}"


def _alive(pids: set[int]) -> list[int]:
    return [pid for pid in pids if alive(pid)]


def test_the_gpu_marker_skips_with_its_reason_where_too_few_gpus(tmp_path: Path):
    tests = ("import pytest\n\n\n@pytest.mark.tf_cluster(gpus=64)\n"
             "def test_many_gpus(tf_cluster):\n    raise AssertionError('ran')\n")
    res = user_pytest(user_project(tmp_path, tests))
    assert res.returncode == 0, res.stdout[-3000:]
    assert "1 skipped" in res.stdout
    assert "needs 64 GPU(s); this machine has" in res.stdout, res.stdout
    assert "(nvidia-smi -L)" in res.stdout


@pytest.mark.timeout(120)
def test_values_come_back_in_plan_order(tf_cluster):
    result = tf_cluster.run("tests.jobs.kit:allreduce_ones", workers=2)
    assert result.ok
    assert list(result.tasks) == ["worker:0", "worker:1"]
    assert [t.value for t in result.tasks.values()] == [2.0, 2.0]
    for t in result.tasks.values():
        assert t.exit_code in (0, -9) and t.attempts == 1  # -9: stopped in its teardown
        assert [e["event"] for e in t.events][0] == "task_started"
        assert "task_done" in [e["event"] for e in t.events]


@pytest.mark.timeout(120)
def test_a_value_too_large_does_not_come_back_and_says_why(tf_cluster):
    result = tf_cluster.run("tests.jobs.kit:big_value", workers=1)
    assert result.ok, result
    task = result.tasks["worker:0"]
    assert task.value is None
    assert "bytes of JSON; at most 16,384" in task.value_error


@pytest.mark.timeout(180)
def test_kill_at_an_epoch_restarts_the_group_and_shows_the_attempts(tf_cluster):
    # max_restarts 1: its one kill spends it, so no standbys are made for a second restart.
    result = tf_cluster.run("tests.jobs.kit:fit_epochs", workers=2, restart="on-failure",
                            max_restarts=1, kill={"worker:1": {"epoch": 1}})
    assert result.ok, result
    assert result.restarts == 1
    assert {n: t.attempts for n, t in result.tasks.items()} == {"worker:0": 2, "worker:1": 2}
    exits = [e for e in result.tasks["worker:1"].events if e["event"] == "task_exited"]
    assert exits[0]["returncode"] == -9  # SIGKILLed at epoch 1 of its first attempt
    assert "[tfo] fault: kill worker:1 at epoch 1" in result.tasks["worker:1"].log
    assert [t.value for t in result.tasks.values()] == [{"epochs": 3, "attempt": 1}] * 2


@pytest.mark.timeout(180)
def test_preempt_sends_sigterm_through_the_wrapper(tf_cluster):
    # max_restarts 1: the step has no preemption handler, so the stopped worker's restart is
    # counted and spends it: no standbys are made for a second restart.
    result = tf_cluster.run("tests.jobs.kit:fit_epochs", workers=2, restart="on-failure",
                            max_restarts=1, preempt={"worker:0": {"step": 2}})
    assert result.ok, result
    events = [e["event"] for e in result.tasks["worker:0"].events]
    assert "task_sigterm" in events  # the wrapper got it and passed it on
    assert result.tasks["worker:0"].attempts == 2


@pytest.mark.timeout(120)
def test_a_hang_fails_at_the_timeout_with_every_tasks_stack(tf_cluster):
    result = tf_cluster.run("tests.jobs.kit:fit_epochs", workers=2, timeout=20,
                            stall={"worker:1": {"epoch": 1}})
    assert not result.ok
    assert "deadline of 20 s reached" in result.reason
    shown = repr(result)  # what a failed `assert result.ok` prints
    for task in ("worker:0", "worker:1"):
        assert f"{task}: " in shown and f"--- {task}'s Python stack where it hung" in shown
        # Each stack reaches the user's own frame: the fit that waits, or the stalled step.
        assert "tests/jobs/kit.py" in "\n".join(result.tasks[task].stack), shown
    assert "strike" in result.tasks["worker:1"].stack[0], shown  # where the fault sleeps


def test_a_bad_spec_raises_the_field_named_error_and_starts_nothing(tmp_path: Path):
    with pytest.raises(SpecError, match="job.entry: .*has no function 'nope'"):
        orchestrator.run(entry="tests.jobs.kit:nope", workers=2, run_dir=tmp_path / "r")
    with pytest.raises(SpecError, match="--workers 0: at least 1"):
        orchestrator.run(entry="tests.jobs.kit:allreduce_ones", workers=0)
    with pytest.raises(SpecError, match=r"kill\['worker:1'\]: give \{'epoch': N\}"):
        orchestrator.run(entry="tests.jobs.kit:allreduce_ones", kill={"worker:1": 2})
    assert not (tmp_path / "r").exists()


def test_a_bad_cluster_file_s_error_names_the_file(tmp_path: Path):
    """A cluster file is checked once, under its own name (it was read into data that the
    pipeline then checked as "the cluster made from the command line")."""
    path = tmp_path / "c.yaml"
    path.write_text("name: x\njob: {entry: 'tests.jobs.kit:allreduce_ones'}\n"
                    "tasks: {worker: ['localhost:0']}\n")
    with pytest.raises(SpecError) as raised:
        orchestrator.run(path, run_dir=tmp_path / "r")
    assert str(raised.value).startswith(f"{path}: "), raised.value
    assert "port 0 is outside 1-65535" in str(raised.value)
    assert not (tmp_path / "r").exists()


def test_import_orchestrator_stays_light():
    code = ("import sys, orchestrator; orchestrator.run; "
            "print(sorted(m for m in ('pydantic', 'tensorflow', 'yaml', "
            "'orchestrator.loop.supervise')"
            " if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_a_quiet_run_prints_nothing(tmp_path: Path):
    run_dir = str(tmp_path / "r")
    code = textwrap.dedent(f"""\
        import orchestrator
        r = orchestrator.run(entry="tests.jobs.kit:big_value", workers=1, run_dir={run_dir!r})
        assert r.ok, r
    """)
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout == "" and res.stderr == ""
