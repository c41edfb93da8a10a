"""Fixed ports held between jobs on a host (worker_entry/portlocks.py): a job's ports are
its own for its lifetime, between its task's attempts too; another job asking for one gets
tfo's exit 2 naming the port and the run that holds it."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.launch.ports import free_ports
from tests.conftest import (
    PORTS_20100,
    REPO,
    SSH_LAB,
    events,
    kill_tree,
    run_tfo,
    tfo_cmd,
    write_spec,
)
from tests.helpers import Tfo, host_yaml
from worker_entry import portlocks

# Outside FIXED_PORTS' 20000-20014: these tests need no lock of their own.
PORTS = (20100, 20101)


def test_a_port_is_one_jobs_until_it_lets_go(tmp_path: Path, monkeypatch):
    """Two holders (flock: per open file, so two in one process conflict as two processes
    do): the second is told who holds it; ascending order and a stop at the first port held
    give one of two jobs all its ports; `close` lets go; an `auto` pick skips a held port."""
    monkeypatch.setenv(portlocks.RUNTIME_ENV, str(tmp_path / "rt"))
    first, second = portlocks.Reservations("run A"), portlocks.Reservations("run B")
    assert first.reserve_all([20101, 20100]) == {}
    assert second.reserve_all([20102, 20100, 20101]) == {20100: "run A"}
    assert set(second.held) == set()  # stopped at 20100: 20102 is tried after it
    first.rename("run A (renamed)")
    assert second.reserve(20101) == "run A (renamed)"
    first.close()
    assert second.reserve_all([20100, 20101]) == {}
    assert (os.stat(tmp_path / "rt").st_mode & 0o777) == 0o700
    held = second.held
    picked = free_ports(3, reserve=lambda p: first.reserve(p) is None)
    assert len(set(picked)) == 3 and not set(picked) & set(held)
    assert first.reserve(20100) == "run B"
    second.close()
    first.close()
    assert not list((tmp_path / "rt").iterdir())  # let go: the files are removed


def _contend(name: str, inside, overlaps, turns) -> None:
    mine = portlocks.Reservations(name)
    for _ in range(3000):
        if mine.reserve(20100) is None:
            with inside.get_lock():
                inside.value += 1
                turns.value += 1
                overlaps.value += inside.value > 1
            with inside.get_lock():
                inside.value -= 1
            mine.release(20100)


@pytest.mark.timeout(120)
def test_a_port_let_go_and_taken_again_is_never_held_twice(tmp_path: Path, monkeypatch):
    """A holder removes its file as it lets go; one that opened it just before must not
    then hold the removed file while another holds the new one. 4 processes, 3000 turns
    each: without the check that the locked file is still the one at its path, 4 overlaps."""
    monkeypatch.setenv(portlocks.RUNTIME_ENV, str(tmp_path / "rt"))
    inside, overlaps, turns = (multiprocessing.Value("i", 0) for _ in range(3))
    procs = [multiprocessing.get_context("fork").Process(
        target=_contend, args=(f"p{i}", inside, overlaps, turns)) for i in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(100)
    assert [proc.exitcode for proc in procs] == [0] * 4
    assert overlaps.value == 0 and turns.value > 0


def test_a_runtime_dir_that_is_not_the_users_alone_is_not_used(tmp_path: Path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    monkeypatch.setenv(portlocks.RUNTIME_ENV, str(shared))
    assert portlocks.runtime_dir() is None
    assert portlocks.Reservations("x").reserve(20100) is None  # the bind check still stands


def spec(tmp_path: Path, name: str, script: Path, args: list[str], extra: str = "") -> Path:
    workers = ", ".join(f"localhost:{p}" for p in PORTS)
    return write_spec(tmp_path / f"{name}.yaml", f"""\
name: {name}
job: {{script: {script}, args: {json.dumps(args)}}}
tasks:
  worker: [{workers}]
{extra}""")


def run_id(run_dir: Path) -> str:
    return json.loads((run_dir / "plan.json").read_text())["run_id"]


@PORTS_20100  # under -n 2, the two tests on PORTS in one worker (they ran at once: [2, 2])
@pytest.mark.timeout(180)
def test_two_jobs_on_the_same_fixed_ports_started_together(tmp_path: Path):
    """Both passed the port check (nothing listened yet) and one failed in its task
    (TensorFlow's `Could not start gRPC server`, rc 1). Now one runs and the other exits 2
    naming the port and the run that holds it."""
    specs = [spec(tmp_path, f"pair{i}", LISTEN_SLEEP, ["6"]) for i in range(2)]
    dirs = [tmp_path / f"run{i}" for i in range(2)]
    procs = [subprocess.Popen(tfo_cmd("run", str(s), "--run-dir", str(d)), cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for s, d in zip(specs, dirs, strict=True)]
    try:
        outs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], (codes, outs[0][-1500:], "----", outs[1][-1500:])
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    said = outs[loser]
    assert f"port {PORTS[0]} is reserved by run {run_id(dirs[winner])}" in said, said[-3000:]
    assert "nothing was started" in said or "cannot start" in said, said[-3000:]
    assert not (dirs[loser] / "events.jsonl").exists() or not any(
        e["event"] == "task_started" for e in events(dirs[loser]))


# listen_sleep.py (beside it), failing its first attempt after a second.
FAILS_ONCE = """\
import os, runpy, sys
first = os.environ.get("TFO_ATTEMPT") == "0"
sys.argv = ["listen_sleep.py", "1" if first else "3"]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "listen_sleep.py"))
if first:
    sys.exit(1)
"""
LISTEN_SLEEP = REPO / "tests" / "scripts" / "listen_sleep.py"


def fails_once(directory: Path) -> Path:
    (directory / "listen_sleep.py").write_text(LISTEN_SLEEP.read_text())
    script = directory / "fails_once.py"
    script.write_text(FAILS_ONCE)
    return script


@PORTS_20100
@pytest.mark.timeout(240)
def test_a_job_between_its_attempts_keeps_its_ports(tmp_path: Path, run_dir: Path):
    """A's task failed and waits 20 s to restart: its ports are free to the kernel. B, on
    the same ports, gets exit 2 naming the port and A's run (before: B started and took
    them, and A's restart failed); A restarts on them and succeeds."""
    script = fails_once(tmp_path)
    a = Tfo(spec(tmp_path, "first", script, [],
                 "restart: {policy: on-failure, max_restarts: 1, backoff_seconds: 20}\n"),
            run_dir)
    try:
        a.wait_event("task_restarted", "worker:0", timeout=120)
        assert not any(e["event"] == "task_started" and e.get("attempt") == 1
                       for e in events(run_dir))  # between its attempts
        b = run_tfo("run", str(spec(tmp_path, "second", script, [])), "--run-dir",
                    str(tmp_path / "second"), timeout=100)
        assert b.returncode == 2, b.output[-3000:]
        assert f"port {PORTS[0]} is reserved by run {run_id(run_dir)}" in b.output, \
            b.output[-3000:]
        rc, err = a.finish(timeout=150)
        assert rc == 0, err[-3000:]
    finally:
        a.close()
    started = [e for e in events(run_dir) if e["event"] == "task_started"]
    assert {e.get("attempt") for e in started} == {0, 1}
    after = portlocks.Reservations("the test")  # nothing of A holds a port now
    assert after.reserve_all(list(PORTS)) == {}
    after.close()


@SSH_LAB
@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_a_lab_job_between_its_attempts_keeps_its_port(lab, tmp_path: Path,  # noqa: F811
                                                       run_dir: Path):
    """On a lab host a second job once took port 20000 while the first was between
    attempts. Now the host's agent holds it for the first job's lifetime: the second job's
    preflight probe is refused it, exit 2 naming the port and the first run."""
    code = tmp_path / "code"
    code.mkdir()
    fails_once(code)

    def lab_spec(name: str, extra: str = "") -> Path:
        return write_spec(tmp_path / f"{name}.yaml", f"""\
name: {name}
job: {{script: {code}/fails_once.py}}
hosts:
{host_yaml("lab1", lab[0], tmp_path / "lab1")}\
tasks:
  worker: [lab1:20000]
{extra}""")

    a = Tfo(lab_spec("first", "restart: {policy: on-failure, max_restarts: 1, "
                              "backoff_seconds: 20}\n"), run_dir)
    try:
        a.wait_event("task_restarted", "worker:0", timeout=150)
        assert not any(e["event"] == "task_started" and e.get("attempt") == 1
                       for e in events(run_dir))  # between its attempts
        b = run_tfo("run", str(lab_spec("second")), "--run-dir", str(tmp_path / "second"),
                    timeout=120)
        assert b.returncode == 2, b.output[-3000:]
        assert f"worker:0 (lab1:20000): port 20000 is reserved by run {run_id(run_dir)}" \
            in b.output, b.output[-3000:]
        rc, err = a.finish(timeout=150)
        assert rc == 0, err[-3000:]
    finally:
        a.close()


def test_an_auto_port_is_never_one_an_ipv6_listener_holds(monkeypatch):
    """The kernel's IPv4 pick does not see a listener on `[::1]:P` (v6 only); a task's gRPC
    server binds both families and would fail there. Each v4 pick is offered a port that
    such a listener holds first: it is passed over."""
    import socket

    from orchestrator.launch import ports

    v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    v6.bind(("::1", 0))
    v6.listen()
    held = v6.getsockname()[1]
    try:
        v4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        v4.bind(("0.0.0.0", held))  # IPv4 alone says it is free
        v4.close()
        assert not ports._free_on_ipv6(held)
        seen: list[int] = []
        real = ports._free_on_ipv6

        def first_the_held_one(port: int) -> bool:
            seen.append(port)
            return real(held if len(seen) == 1 else port)

        monkeypatch.setattr(ports, "_free_on_ipv6", first_the_held_one)
        picked = ports.free_ports(2)
        assert len(picked) == 2 and seen[0] not in picked and len(seen) == 3
    finally:
        v6.close()
