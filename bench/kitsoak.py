"""The test kit's soak (issue 37 item 9): consecutive 2-worker `tf_cluster` runs, none may hang.

    python bench/kitsoak.py --runs 200          # 100 in plain pytest sessions, 100 under -n 2
    python bench/run.py --only kitsoak          # make bench's share: SOAK_RUNS runs

Each run is the testing guide's `fit` (docs/guide/testing.md: a MultiWorkerMirrored Dense
model, its variables' initial values broadcast, 3 epochs of all-reduces) as a user's test,
`tf_cluster.run("soakpkg.steps:fit", workers=2)`, its tasks taken from the session's warm
pool (exec'd standbys, tfo's warm spares). The runs come in pytest sessions of `--tests`
tests, alternately plain (one pool) and `pytest -n 2` (two sessions' pools and clusters at
once, where the hang was seen: 1 run in 3 of a 3-test file). A test's cluster
fails at its stall check or at `DEADLINE` s, so a hang costs one test, not the soak, and is
told apart from other failures by its result (a stall or the deadline).

While it runs, `HangCatcher` watches the soak's tasks: one that has lived `OLD` s and used
under 2 % of a core for the last `IDLE` s has its native and Python stacks
taken (py-spy where installed, then gdb) with the sockets of every kit process (`ss`), into
the soak's directory: the evidence a hang leaves, before the stall check kills it. Taking a
stack stops the task (ptrace) while it lasts, so the bar is high and each tool's time is
short: at load 30-45 on 2 cores, a task that had trained two epochs in the last 25 s used
under 0.5 s of CPU in them, a chief's last checkpoint to its `done` took up to 12 s in runs
that passed, and gdb loading TensorFlow's symbols held a task stopped past its test's
deadline (2026-11-27, the first soak of exec'd standbys: docs/evidence/kit-hang/).

The project imports tfo from this checkout (its packages linked in), whatever the
environment installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
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


class HangCatcher(threading.Thread):
    """Takes the stacks of a soak task that sits idle in its entry (see the module's doc)."""

    POLL, OLD, IDLE, IDLE_CPU = 5.0, 40.0, 45.0, 0.02
    TOOL_SECONDS = 20  # each tool's bound: the task is stopped while one is attached

    def __init__(self, root: Path, out: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.out = str(root), out
        self.caught: list[str] = []  # a file per hung task
        self._seen: dict[int, list[tuple[float, float]]] = {}  # pid: (when, CPU s) samples
        self._taken: set[int] = set()
        self._done = threading.Event()

    def stop(self) -> None:
        self._done.set()
        self.join()

    def run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self._done.wait(self.POLL):
            now = time.monotonic()
            for pid, cpu, age in self._tasks(tick):
                samples = self._seen.setdefault(pid, [])
                samples.append((now, cpu))
                old = [c for t, c in samples if now - t >= self.IDLE]
                if (age > self.OLD and old and cpu - old[-1] < self.IDLE_CPU * self.IDLE
                        and pid not in self._taken):
                    self._taken.add(pid)
                    self._take(pid)
            self._seen = {p: v for p, v in self._seen.items() if os.path.exists(f"/proc/{p}")}

    def _tasks(self, tick: int) -> list[tuple[int, float, float]]:
        """(pid, CPU s, age s) of each soak task in its directory: a process named
        `tfo-<task>` (a standby waiting for GO is `tfo-task`) whose parent is too (its
        wrapper, idle by design, is not one). By the name, not the command line."""
        stats, found = {}, []
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
                comm = stat[stat.find(b"(") + 1:stat.rfind(b")")]
                if comm.startswith(b"tfo-") and comm != b"tfo-task" \
                        and os.readlink(f"/proc/{name}/cwd").startswith(self.root):
                    stats[int(name)] = stat[stat.rfind(b")") + 2:].split()
            except OSError:
                continue
        for pid, fields in stats.items():
            if int(fields[1]) in stats:  # its parent is a tfo- process: its wrapper
                cpu = (int(fields[11]) + int(fields[12])) / tick
                found.append((pid, cpu, uptime - int(fields[19]) / tick))
        return found

    def _take(self, pid: int) -> None:
        path = self.out / f"hang-{pid}.txt"
        parts = [f"pid {pid}, caught {time.strftime('%H:%M:%S')}"]
        try:
            with open(f"/proc/{pid}/comm") as f:
                parts.append(f.read().strip())
        except OSError:
            return  # gone meanwhile: it was not hung
        commands = [["ss", "-tanp"]]
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if os.path.exists(spy):
            commands.append([spy, "dump", "--native", "--pid", str(pid)])
        commands.append(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"])
        for command in commands:
            try:
                res = subprocess.run(command, capture_output=True, text=True,
                                     timeout=self.TOOL_SECONDS)
                parts.append(f"$ {' '.join(command)}\n{res.stdout}{res.stderr}")
            except (OSError, subprocess.TimeoutExpired) as e:
                parts.append(f"$ {' '.join(command)}: {e}")
        path.write_text("\n\n".join(parts))
        self.caught.append(str(path))


def soak(tmp: Path, runs: int, tests: int = 10, say=print) -> dict:  # noqa: ANN001
    """`runs` kit runs in sessions of `tests`, plain and under -n 2 alternately (a plain
    session first); stops early at a hang (kept for its stacks, in the run's events)."""
    root = project(tmp / "kit-soak", tests)
    total = {"runs": 0, "passed": 0, "hangs": [], "failed": [], "slowest": 0.0,
             "seconds": 0.0, "sessions": []}
    catcher = HangCatcher(root, tmp)
    catcher.start()
    try:
        _sessions(root, tmp, runs, tests, total, say)
    finally:
        catcher.stop()
    total["stacks"] = catcher.caught
    for path in catcher.caught:
        say(f"  stacks of a hung task: {path}")
    return total


def _sessions(root: Path, tmp: Path, runs: int, tests: int, total: dict,
              say) -> None:  # noqa: ANN001
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
    print(json.dumps({k: (len(v) if isinstance(v, list) and k not in ("sessions", "stacks")
                          else v) for k, v in total.items() if k != "sessions"}))
    return 0 if not total["hangs"] and not total["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
