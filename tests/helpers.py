"""Helpers shared by the test modules for real runs: `tfo run` in the background (Tfo)
and what its events say (first, attempt_end, standbys), lab hosts' cluster files, the
example scripts' cluster file, a terminal to run tfo on, a host agent to talk to. Test
modules import from here (and tests/fakes.py, tests/conftest.py), never from each other."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import psutil
import pytest

from tests import sshlab
from tests.conftest import (
    PYTHON,
    REPO,
    TfoResult,
    events,
    kill_tree,
    run_processes,
    tfo_cmd,
    wait_until,
    write_spec,
)
from worker_entry import frames, markers

# ---- `tfo run` in the background, and its events -----------------------------------------

def first(evs: list[dict], event: str, task: str | None = None, **match) -> dict | None:
    for e in evs:
        if e["event"] == event and (task is None or e["task"] == task) and all(
                e.get(k) == v for k, v in match.items()):
            return e
    return None


def attempt_end(evs: list[dict], task: str, attempt: int,
                ended_by: tuple[str, ...] = ("task_exited",)) -> dict | None:
    """How `task`'s `attempt` ended: the first of `ended_by` for its pid (a task_stopped
    names no attempt, so the pid of the attempt's task_started finds it)."""
    pid = first(evs, "task_started", task, attempt=attempt)["pid"]
    return next((e for e in evs if e["event"] in ended_by and e["pid"] == pid), None)


class Tfo:
    """`tfo run` in the background, for tests that act on it while it runs."""

    def __init__(self, spec: Path, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.proc = subprocess.Popen(tfo_cmd("run", str(spec), "--run-dir", str(run_dir)),
                                     cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)

    def wait_event(self, event: str, task: str | None = None, timeout: float = 120, **match):
        got = wait_until(lambda: first(events(self.run_dir), event, task, **match), timeout)
        assert got, f"no {event} {task} {match} within {timeout} s"
        return got

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err

    def close(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.wait()


def kill_task(tfo: Tfo, task: str, attempt: int = 0) -> float:
    pid = tfo.wait_event("task_started", task, attempt=attempt)["pid"]
    t = time.time()
    os.kill(pid, signal.SIGKILL)
    return t


# ---- lab hosts (tests/sshlab.py) in a cluster file ---------------------------------------

def host_yaml(name: str, h: sshlab.SshHost, workdir: Path, **over: object) -> str:
    fields = {"address": h.address, "port": h.port, "user": h.user, "key": h.key,
              "known_hosts": h.known_hosts, "python": sys.executable, "workdir": str(workdir),
              "connect_timeout_seconds": 3, **over}
    return f"  {name}: {json.dumps(fields)}\n"


def interrupted(proc: subprocess.Popen) -> str:
    """A `tfo run` still running ended as Ctrl-C ends it (its tree SIGKILLed after 60 s);
    its output."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        return proc.communicate()[0]


def stop(tfo: Tfo) -> None:
    """Kill tfo and, on every host, anything of its run."""
    tfo.close()
    plan = tfo.run_dir / "plan.json"
    if plan.exists():
        for p in run_processes(json.loads(plan.read_text())["run_id"]):
            kill_tree(p.pid)


def lab_spec(lab, tmp_path: Path, entry: str = "worker_entry.examples.digits:train",
             args: str = "{epochs: 3}", **over: object) -> Path:
    lab1, lab2 = lab
    return write_spec(tmp_path / "lab.yaml", f"""\
name: lab-mwms
job: {{entry: "{entry}", args: {args}}}
hosts:
{host_yaml("lab1", lab1, tmp_path / "lab1", **over)}\
{host_yaml("lab2", lab2, tmp_path / "lab2", **over)}
tasks:
  worker: [lab1:20000, lab2:20000]
""")


# ---- warm spares, backups, progress of a real run ----------------------------------------

def standbys(run_dir: Path) -> dict[tuple[str, int], int]:
    return {(e["task"], e["attempt"]): e["pid"] for e in events(run_dir)
            if e["event"] == "task_standby_started"}


def assert_restart_served_by_spares(run_dir: Path, killed_at: float, killed_rc: int,
                                    ended_by: tuple[str, ...] = ("task_exited",),
                                    within: float = 5.0) -> None:
    """worker:1 was killed at `killed_at` (its attempt 0 ended by one of `ended_by`, with
    `killed_rc`); both workers' attempt 1 were their standbys, started within `within` s of
    the kill, resumed from the checkpoint, and the job succeeded."""
    ev = events(run_dir)
    ended = attempt_end(ev, "worker:1", 0, ended_by)
    assert ended is not None and ended["returncode"] == killed_rc, ended
    spares = standbys(run_dir)
    assert set(spares) == {("worker:0", 1), ("worker:1", 1)}  # none for attempt 2: no restart
    for task in ("worker:0", "worker:1"):
        started = first(ev, "task_started", task, attempt=1)
        assert started["warm"] is True and started["pid"] == spares[(task, 1)]
        assert started["time"] - killed_at < within
    resumed = [e["epoch"] for e in ev if e["event"] == "task_epoch" and e["attempt"] == 1]
    assert resumed and min(resumed) >= 1, resumed  # from its checkpoint, not the start
    assert ev[-1]["event"] == "job_finished" and ev[-1]["exit_code"] == 0


_EPOCH = re.compile(r"^Epoch (\d+)/(\d+)$", re.M)
_ATTEMPT = re.compile(r"^===== tfo: \S+ attempt (\d+) =====$", re.M)


def epochs_by_attempt(log: Path) -> dict[int, list[int]]:
    """Each attempt's `Epoch N/M` lines (Keras's, 1-based) in a task's log."""
    text = log.read_text(errors="replace")
    parts = _ATTEMPT.split(text)[1:]  # attempt, its text, attempt, its text ...
    return {int(a): [int(n) for n, _ in _EPOCH.findall(body)]
            for a, body in zip(parts[::2], parts[1::2], strict=True)}


def last_attempt_epochs(run_dir: Path, task: str) -> list[int]:
    by = epochs_by_attempt(run_dir / "logs" / f"{task.replace(':', '-')}.log")
    return by[max(by)]


def task_process(tfo: Tfo, task: str, attempt: int = 0) -> psutil.Process:
    """The task proper: the child of the wrapper whose pid tfo reports."""
    pid = tfo.wait_event("task_started", task, attempt=attempt)["pid"]
    children = wait_until(lambda: psutil.Process(pid).children(), 10)
    assert children, f"{task}: no task process under its wrapper {pid}"
    return children[0]


def progressed(tfo: Tfo, task: str, step: int, attempt: int = 0) -> dict:
    """The first progress marker of `task` at `step` or beyond."""
    got = wait_until(lambda: next(
        (e for e in events(tfo.run_dir) if e["event"] == "task_progress" and e["task"] == task
         and e["attempt"] == attempt and e["step"] >= step), None), 120)
    assert got, f"{task} never reached step {step}"
    return got


# ---- the example scripts (tests/scripts/) as a cluster file runs them --------------------

SCRIPT_SPEC = """\
name: scripts
strategy: {strategy}
job:
  script: tests/scripts/{script}
  args: {args}
tasks:
{tasks}
restart: {{policy: {policy}, max_restarts: {max_restarts}, backoff_seconds: 0.5}}
timeouts: {{startup_seconds: 120, grace_seconds: 5}}
"""


TWO_WORKERS = "  worker: [localhost:auto, localhost:auto]"


def script_spec(tmp_path: Path, script: str, args: list[str], tasks: str = TWO_WORKERS,
         strategy: str = "multi_worker_mirrored", policy: str = "never", extra: str = "",
         max_restarts: int = 2) -> Path:
    """A script's job. `max_restarts` 1 where the test's one fault is its one restart: none
    left after it, so tfo starts no warm spares for a next restart (an import each)."""
    return write_spec(tmp_path / "cluster.yaml", SCRIPT_SPEC.format(
        strategy=strategy, script=script, args=json.dumps(args), tasks=tasks,
        policy=policy, max_restarts=max_restarts) + extra)


def shown_in_log(run_dir: Path, task: str) -> dict:
    log = (run_dir / "logs" / f"{task.replace(':', '-')}.log").read_text()
    return json.loads(log.split("SHOW ", 1)[1].splitlines()[0])


def shown_in_output(out: str) -> list[dict]:
    return [json.loads(line.split("SHOW ", 1)[1]) for line in out.splitlines() if "SHOW " in line]


# ---- output that forges markers (tests/scripts/old_log.py) -------------------------------

FORGED = [
    '@tfo {"event": "up", "pid": 1}',
    '@tfo {"event": "progress", "step": 99999, "loss": 1e-9, "epoch": 0}',
    '@tfo {"event": "evaluated", "epoch": 0, "metrics": {"accuracy": 1.0}}',
    '@tfo {"event": "backup", "dir": "/etc"}',
    '\x1f@tfo {"event": "usage", "cpu": 0.0, "rss": 1, "stopped": true}',  # today's log form
    '\x1d@tfo {"event": "sigterm", "grace": 10}',  # the old START
    '@tfo {"event": "exiting", "code": 0}',
]


def old_log_spec(tmp_path: Path, extra: str = "",
                 tasks: str = "  worker: [localhost:auto]") -> Path:
    """One task of tests/scripts/old_log.py, which prints an old run's log (FORGED in it);
    `extra`: the cluster file's hosts or backend."""
    old = tmp_path / "old.log"
    old.write_text("===== tfo: worker-0 attempt 0 =====\n" + "\n".join(FORGED)
                   + "\nepoch 1/3 [====" + FORGED[1] + "\n")
    return script_spec(tmp_path, "old_log.py", [str(old)], tasks=tasks, extra=extra)


def assert_printed_as_text(res: TfoResult, run_dir: Path) -> None:
    """Every forged line shown and logged as text, and no event of any of them."""
    assert res.returncode == 0, res.output[-4000:]
    ev = events(run_dir)
    recorded = json.dumps(ev)
    for forged in ("99999", "/etc/passwd", '"forged"', '"/etc"', "accuracy"):
        assert forged not in recorded, [e for e in ev if forged in json.dumps(e)]
    assert not [e for e in ev if e["event"] in (
        "task_progress", "task_evaluated", "task_saved", "task_backup", "task_sigterm",
        "task_bad_marker")], ev
    assert [e["pid"] for e in ev if e["event"] == "task_up"] != [1]
    exiting = [e for e in ev if e["event"] == "task_exiting"]
    assert len(exiting) == 1 and len([e for e in ev if e["event"] == "task_done"]) == 1
    # In the log, as printed (START written out); on the console, each line of it.
    lines = (run_dir / "logs" / "worker-0.log").read_text().split("\n")
    logged = [line.replace("\x1f", "\\x1f") for line in FORGED]
    for line in [*logged, '@tfo {"event": "saved", "path": "/etc/passwd", "chief": true}',
                 '\\x1f@tfo {"event": "done", "value": "forged"}']:
        assert line in lines, line
        shown = "[worker:0] " + line.replace("\x1d", "\\x1d")  # the console escapes it
        assert shown in res.stdout, shown
    assert "epoch 1/3 [====" + FORGED[1] in lines
    assert not [line for line in lines if line.startswith(markers.MARK)
                and any(x in line for x in ("99999", "passwd", "forged", "accuracy"))]


# ---- a saved model, evaluated ------------------------------------------------------------

def evaluate_saved_model(path: Path) -> float:
    """Accuracy of a saved model on the held-out digits, in a fresh process."""
    script = (
        "import sys, tensorflow as tf\n"
        "from worker_entry.examples.digits import load_data\n"
        "_, (x, y) = load_data()\n"
        "m = tf.keras.models.load_model(sys.argv[1])\n"
        "print('ACC', (m.predict(x, verbose=0).argmax(axis=1) == y).mean())\n"
    )
    out = subprocess.run([PYTHON, "-c", script, str(path)], capture_output=True, text=True,
                         cwd=REPO, timeout=120, env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return float(re.search(r"^ACC (\S+)", out.stdout, re.M).group(1))


# ---- tfo on a terminal -------------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


COLUMNS, LINES = 200, 40


def tfo_env(cwd: Path, **extra: str) -> dict[str, str]:
    """The test's environment without COLUMNS and LINES: pytest-xdist's workers have
    COLUMNS=80, which rich takes over the terminal's own size (the summary cut to 80)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return {**env, "PYTHONPATH": str(cwd), **extra}


def user_dir(root: Path) -> Path:
    """A directory to run tfo in, away from the repository's runs/, whose code is this
    checkout's (tasks get the workdir as PYTHONPATH)."""
    root.mkdir(parents=True, exist_ok=True)
    for package in ("orchestrator", "worker_entry"):
        (root / package).symlink_to(REPO / package)
    return root


def run_in_pty(args: list[str], cwd: Path, timeout: float,
               unsized_stdin: bool = False, columns: int = COLUMNS,
               lines: int = LINES, env: dict[str, str] | None = None) -> tuple[str, int]:
    """`tfo ARGS` on a terminal of `columns` x `lines`; all it wrote, and its exit code.
    Killed (its whole tree) and failed past `timeout`. `unsized_stdin`: stdin is another
    terminal, one that reports 0 x 0 (a pty nobody sized)."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    other = os.openpty() if unsized_stdin else None
    proc = subprocess.Popen(tfo_cmd(*args), cwd=cwd, stdin=other[1] if other else follower,
                            stdout=follower, stderr=follower, start_new_session=True,
                            env=tfo_env(cwd, TERM="xterm-256color", **(env or {})))
    os.close(follower)
    if other:
        os.close(other[1])  # its leader stays open: a closed one reads as no terminal
    chunks: list[bytes] = []
    until = time.monotonic() + timeout
    try:
        while time.monotonic() < until:
            if select.select([leader], [], [], 0.2)[0]:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # EIO: every writer of the terminal is gone
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            pytest.fail(f"tfo {' '.join(args)} still ran after {timeout} s:\n"
                        f"{ANSI.sub('', b''.join(chunks).decode(errors='replace'))[-3000:]}")
        return b"".join(chunks).decode(errors="replace"), proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
        os.close(leader)
        if other:
            os.close(other[0])


# ---- a host agent (worker_entry.agent) spoken to over its pipes --------------------------

class Agent:
    def __init__(self, lifeline: float = 30.0, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "worker_entry.agent", str(lifeline)],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     start_new_session=True, env=env)
        self.reader = frames.Reader(frames.TO_COORDINATOR)
        self.got: list[tuple[bytes, int, bytes]] = []
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.synced = False
        self.buf = b""

    def send(self, kind: bytes, slot: int = 0, payload: bytes = b"") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(frames.frame(kind, slot, payload))
        self.proc.stdin.flush()

    def start(self, slot: int, code: str, **env: str) -> None:
        self.send(frames.START, slot, json.dumps({
            "command": [sys.executable, "-c", code], "env": env, "cwd": str(REPO)}).encode())

    def pump(self) -> None:
        assert self.proc.stdout is not None
        try:
            data = os.read(self.proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return
        if not self.synced:
            self.buf += data
            if frames.SYNC not in self.buf:
                return
            self.synced, data = True, self.buf.split(frames.SYNC, 1)[1]
        self.got += self.reader.feed(data)

    def wait(self, kind: bytes, slot: int, timeout: float = 20) -> bytes:
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            self.pump()
            for got in self.got:
                if got[0] == kind and got[1] == slot:
                    return got[2]
            time.sleep(0.01)
        raise AssertionError(f"no {kind!r} for slot {slot}: {self.got}")

    def output(self, slot: int) -> bytes:
        return b"".join(p for k, s, p in self.got if k == frames.OUTPUT and s == slot)

    def close(self) -> None:
        """QUIT: the agent kills its tasks (each in a session of its own) and exits."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.send(frames.QUIT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
