"""Shared test helpers: run `tfo` as a user would, read a run's events, and check that
nothing of a run is left behind (processes, ports).

`make test` is CPU-bound (2 cores): a TensorFlow process's import is most of a real test's
CPU (about 4 s). A job with restarts left gets a warm spare per task by default
(`warm_spares: auto`), each one more import: a test job that never restarts, or whose
resize discards them, says `warm_spares: false` unless the spares are what it tests; one
whose single fault is its single restart says `max_restarts: 1`, so that no standbys are
made for a second restart once the first has spent the budget."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# `make test` runs the suite in three pytest-xdist workers (--dist loadgroup). Tests that
# share a fixed resource are put in one group, so one worker runs them one after another
# (xdist hands out the groups first, the largest first: --loadscope-reorder, its default).
FIXED_PORTS = pytest.mark.xdist_group("fixed-ports")  # jobs on localhost:20000-20014
PORTS_20100 = pytest.mark.xdist_group("ports-20100")  # two-job port-lock tests: 20100-20101
SSH_LAB = pytest.mark.xdist_group("sshlab")  # the netns lab: lab1/lab2 on 10.200.0.0/24
# The three-host lab (the lab3 fixture: elastic and backup tests) is a network of its own, so
# its tests run beside SSH_LAB's in another worker.
SSH_LAB3 = pytest.mark.xdist_group("sshlab3")  # lab1-lab3 on 10.220.0.0/24
SLURM_LAB = pytest.mark.xdist_group("slurmlab")  # the Slurm lab on 10.201.0.0/24
# Tests that read one shared run of a tutorial script (keras_tutorial, ctl_tutorial below):
# one worker, so the run is made once.
TUTORIALS = pytest.mark.xdist_group("tutorials")

# How a training task that succeeded shows its end in the tables: its exit code 0, or, once
# a peer exited and it only waited in TensorFlow's teardown, stopped there (supervise.py).
ENDED = "(?:exit code 0|stopped in teardown)"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under --dist loadgroup, xdist marks a grouped test by suffixing its node id with
    @group; a pytest that ignores that (9.2: pytest-xdist#1386) would run a group in both
    workers at once, and the labs and ports would collide. Refuse to run that way."""
    if not getattr(config.option, "loadgroup", False):  # set in xdist's workers only
        return
    lost = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(f"--dist loadgroup is not in effect ({lost[0]} has no @group): "
                                "pytest 9.2 breaks it (pytest-xdist#1386); install pytest<9.2")


@dataclass
class TfoResult:
    returncode: int
    stdout: str
    stderr: str
    ended_at: float  # unix time when tfo exited

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def tfo_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "orchestrator", *args]


def run_tfo(*args: str, timeout: float = 240, cwd: Path = REPO,
            env: dict[str, str] | None = None) -> TfoResult:
    """Run `tfo ARGS` to completion; on timeout kill its whole group and fail."""
    proc = subprocess.Popen(tfo_cmd(*args), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"tfo {' '.join(args)} did not finish in {timeout} s\n{out[-3000:]}"
                    f"\n{err[-3000:]}")
    return TfoResult(proc.returncode, out, err, time.time())


def run_task(job: dict, workdir: Path, path: tuple[str, ...] = (),
             timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """One real task process (`python -m worker_entry`) run to its end, with the environment
    tfo's plan gives it and no coordinator (no lifeline). Its PYTHONPATH: `path`, then
    `workdir`, then the repo."""
    from orchestrator.planning.plan import make_plan
    from orchestrator.planning.spec import parse_spec

    spec = parse_spec({"name": "t", "job": job, "tasks": {"worker": ["localhost:1"]}})
    task = make_plan(spec, run_id="r", run_dir=workdir / "run", workdir=workdir).tasks[0]
    env = {**os.environ, **task.env,
           "PYTHONPATH": os.pathsep.join([*path, str(workdir), str(REPO)])}
    env.pop("TFO_LIFELINE", None)
    # The task's wrapper forks it; the task dies with the wrapper (its parent-death signal).
    # No lifeline, no coordinator: its stdout is the task's, as text (no frames).
    return subprocess.run(task.command, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=timeout)


def frame_lines(stream: BinaryIO) -> Iterator[str]:
    """A wrapper's stdout, read as it comes, as the lines tfo takes from it: the task's text,
    and each marker a line starting with markers.START."""
    from worker_entry import channel
    from worker_entry.markers import START

    reader, text = channel.Reader(), b""
    while data := stream.read1(65536):
        for kind, payload in reader.feed(data):
            if kind in (channel.MARKER, channel.OWN):
                yield START + payload.decode()
            else:
                text += payload + (b"\n" if kind == channel.SAY else b"")
                *whole, text = text.split(b"\n")
                yield from (line.decode(errors="replace") for line in whole)
    if text:
        yield text.decode(errors="replace")


def unframe(data: bytes, log: Path) -> str:
    """A wrapper's stdout as tfo writes it to the task's log: the task's text, and each
    marker a line of its own starting with markers.START."""
    from orchestrator.launch.output import TaskOutput

    out = TaskOutput(str(log), None, "unframe")
    out.feed(data)
    out.end()
    return log.read_text(errors="replace")


def kill_tree(pid: int) -> None:
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        procs = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def task_pids(run_dir: Path, attempt: int = 0) -> dict[str, int]:
    """The pid of each task's given attempt, from the run's task_started events."""
    return {e["task"]: e["pid"] for e in events(run_dir)
            if e["event"] == "task_started" and e["attempt"] == attempt}


def run_processes(run_id: str) -> list[psutil.Process]:
    """Every live process whose environment says it belongs to this run: a task's TFO_JOB,
    or a lab host's agent's TFO_RUN_DIR (what its forked tasks' /proc environ shows too)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
            if (run_id in env.get("TFO_JOB", "") or run_id in env.get("TFO_RUN_DIR", "")) \
                    and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_until(pred, timeout: float, interval: float = 0.05):  # noqa: ANN001
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    return pred()


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's `size=`, e.g. 16k, 24m) at `path`, to fill up: unmounted
    afterwards; the test is skipped, saying why, where mount is refused (not root)."""
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill up (needs root): {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


LEFT_GRACE_SECONDS = 5.0


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """A run directory; afterwards, anything of the run still alive is killed and fails."""
    rd = tmp_path / "run"
    yield rd
    plan = rd / "plan.json"
    if plan.exists():
        run_id = json.loads(plan.read_text())["run_id"]
        # A test that ended its run by SIGKILL (Tfo.close, kill_tree) leaves processes that
        # are dying, not left: a TensorFlow task takes a moment to unmap 600 MB and be reaped
        # (once seen as `tfo-chief:0` running at the check, a zombie by its message). What
        # still runs LEFT_GRACE_SECONDS on was left behind.
        left = run_processes(run_id)
        if left:
            _, alive = psutil.wait_procs(left, timeout=LEFT_GRACE_SECONDS)
            left = [p for p in alive if p.pid in {q.pid for q in run_processes(run_id)}]
        for p in left:
            kill_tree(p.pid)
        assert not left, f"processes of the run left behind: {[p.pid for p in left]}"


# Runs a command and prints its exit status and peak RSS (KiB): the kernel's own count of the
# largest child, in a process of its own so no earlier child of the tests is counted.
_PEAK_RSS = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:], "
             "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode; "
             "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_rss(cmd: list[str], timeout: float = 120, cwd: Path = REPO) -> tuple[int, int, float]:
    """`cmd`'s exit status, its peak RSS in bytes, and its wall time in seconds (output
    dropped)."""
    t0 = time.monotonic()
    out = subprocess.run([PYTHON, "-c", _PEAK_RSS, *cmd], cwd=cwd, capture_output=True,
                         text=True, timeout=timeout, check=True).stdout.split()
    return int(out[0]), int(out[1]) * 1024, time.monotonic() - t0


# The SSH lab's fixtures (tests/sshlab.py), one per test module that uses them.
@pytest.fixture(scope="module")
def loopback_sshd(tmp_path_factory):
    """A real sshd on this host's loopback."""
    from tests import sshlab

    sshlab.ensure_openssh()
    with sshlab.start_sshd(tmp_path_factory.mktemp("sshd")) as host:
        yield host


def _lab_hosts(tmp_path_factory, count: int, **network):
    from tests import sshlab

    ok, reason = sshlab.netns_supported()
    if not ok:
        pytest.skip(f"network namespaces are not permitted here: {reason}")
    sshlab.ensure_openssh()
    with sshlab.lab_hosts(tmp_path_factory.mktemp("lab"), count=count, **network) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Two lab hosts, lab1 and lab2, each in a network namespace of its own."""
    yield from _lab_hosts(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def lab3(tmp_path_factory):
    """Three lab hosts, on a network of their own (SSH_LAB3: not `lab`'s, so the two can be
    up at once)."""
    import ipaddress

    yield from _lab_hosts(tmp_path_factory, 3, prefix="tfl3",
                          subnet=ipaddress.ip_network("10.220.0.0/24"))


# ---- one run of a TensorFlow tutorial script, read by several tests -----------------------

@dataclass
class TutorialRun:
    """A tutorial script run unmodified by `tfo run` on 2 workers, 3 epochs of 60 steps (what
    its saved model needs to score, test_scripts.reload_accuracy): tfo's result, the run
    directory, `root` (its cluster file; backups and checkpoints under it), and /tmp's
    autograph files before and after the run."""

    res: TfoResult
    run_dir: Path
    root: Path
    autograph: tuple[set[str], set[str]]


def autograph_files() -> set[str]:
    return set(glob.glob("/tmp/__autograph_generated_file*"))


def tutorial_run(root: Path, script: str, args: list[str]) -> TutorialRun:
    from tests.helpers import script_spec

    before = autograph_files()
    run_dir = root / "run"
    res = run_tfo("run", str(script_spec(root, script, ["--epochs", "3", "--steps_per_epoch",
                                                        "60", *args])),
                  "--run-dir", str(run_dir), timeout=280)
    after = autograph_files()
    run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
    left = run_processes(run_id)
    for p in left:
        kill_tree(p.pid)
    assert not left, f"processes of the run left behind: {[p.pid for p in left]}"
    return TutorialRun(res, run_dir, root, (before, after))


@pytest.fixture(scope="session")
def keras_tutorial(tmp_path_factory: pytest.TempPathFactory) -> TutorialRun:
    """TensorFlow's multi-worker Keras tutorial (tests/scripts/mwms_keras.py): its model at
    run/model/keras-model, its backups at root/backup."""
    root = tmp_path_factory.mktemp("keras-tutorial")
    return tutorial_run(root, "mwms_keras.py", [
        "--model_path", str(root / "run" / "model" / "keras-model"),
        "--backup_dir", str(root / "backup")])


@pytest.fixture(scope="session")
def ctl_tutorial(tmp_path_factory: pytest.TempPathFactory) -> TutorialRun:
    """TensorFlow's multi-worker custom-loop tutorial (tests/scripts/mwms_ctl.py): its
    model at run/model/ctl-model, its checkpoints at root/ckpt/ckpt."""
    root = tmp_path_factory.mktemp("ctl-tutorial")
    return tutorial_run(root, "mwms_ctl.py", [
        "--model_path", str(root / "run" / "model" / "ctl-model"),
        "--checkpoint_dir", str(root / "ckpt" / "ckpt")])
