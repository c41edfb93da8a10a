"""Lab machines over real SSH: a private sshd on loopback, and two "lab machines" as network
namespaces (10.200.0.11 and .12) each with its own sshd on port 22. No mocks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import sshlab
from tests.conftest import (
    SSH_LAB,
    events,
    kill_tree,
    run_processes,
    run_tfo,
    task_pids,
    wait_until,
    write_spec,
)
from tests.test_faults import Tfo

pytestmark = [pytest.mark.ssh, SSH_LAB]


def host_yaml(name: str, h: sshlab.SshHost, workdir: Path, **over: object) -> str:
    fields = {"address": h.address, "port": h.port, "user": h.user, "key": h.key,
              "known_hosts": h.known_hosts, "python": sys.executable, "workdir": str(workdir),
              "connect_timeout_seconds": 3, **over}
    return f"  {name}: {json.dumps(fields)}\n"


@pytest.fixture(scope="module")
def loopback_sshd(tmp_path_factory):
    sshlab.ensure_openssh()
    with sshlab.start_sshd(tmp_path_factory.mktemp("sshd")) as host:
        yield host


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    ok, reason = sshlab.netns_supported()
    if not ok:
        pytest.skip(f"network namespaces are not permitted here: {reason}")
    sshlab.ensure_openssh()
    with sshlab.lab_hosts(tmp_path_factory.mktemp("lab")) as hosts:
        yield hosts


def stop(tfo: Tfo) -> None:
    """Kill tfo and, on every host, anything of its run."""
    tfo.close()
    plan = tfo.run_dir / "plan.json"
    if plan.exists():
        for p in run_processes(json.loads(plan.read_text())["run_id"]):
            kill_tree(p.pid)


def netns_pids(ns: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10)
    return {int(p) for p in out.stdout.split()}


def listening(ns: str, port: int) -> bool:
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltnH", f"sport = :{port}"],
                         capture_output=True, text=True, timeout=10)
    return f":{port}" in out.stdout


def lab_spec(lab, tmp_path: Path, entry: str = "worker_entry.examples.digits:train",
             args: str = "{epochs: 3}") -> Path:
    lab1, lab2 = lab
    return write_spec(tmp_path / "lab.yaml", f"""\
name: lab-mwms
job: {{entry: "{entry}", args: {args}}}
hosts:
{host_yaml("lab1", lab1, tmp_path / "lab1")}{host_yaml("lab2", lab2, tmp_path / "lab2")}
tasks:
  worker: [lab1:20000, lab2:20000]
""")


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_mwms_across_two_lab_hosts(lab, run_dir: Path, tmp_path: Path):
    lab1, lab2 = lab
    spec = lab_spec(lab, tmp_path, entry="tests.jobs.faulty:train",
                    args="{epochs: 3, epoch_sleep: 1}")
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:1", epoch=0)
        pids = task_pids(run_dir)
        # Each worker runs on its own host, listening on that host's address.
        assert pids["worker:0"] in netns_pids(lab1.netns)
        assert pids["worker:1"] in netns_pids(lab2.netns)
        assert listening(lab1.netns, 20000) and listening(lab2.netns, 20000)
        code, err = tfo.finish()
        assert code == 0, err[-4000:]
    finally:
        tfo.close()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["cluster"]["worker"] == [
        "10.200.0.11:20000", "10.200.0.12:20000"]
    # The code was copied to each host's workdir; the chief saved on its own host only.
    assert (tmp_path / "lab1" / "worker_entry" / "runner.py").exists()
    assert (tmp_path / "lab2" / "tests" / "jobs" / "faulty.py").exists()
    run_id = plan["run_id"]
    assert (tmp_path / "lab1" / "runs" / run_id / "model" / "saved_model" / "saved_model.pb"
            ).exists()
    assert not list((tmp_path / "lab2").rglob("saved_model.pb"))
    assert not (tmp_path / "lab2" / "runs" / run_id / "tmp").exists()
    # Output came back into the local logs.
    assert "trained steps=66" in (run_dir / "logs" / "worker-1.log").read_text()
    assert run_processes(run_id) == []


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_sigkill_coordinator_leaves_nothing_on_the_hosts(lab, run_dir: Path, tmp_path: Path):
    spec = lab_spec(lab, tmp_path, entry="tests.jobs.faulty:train",
                    args="{epochs: 5, epoch_sleep: 30}")
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:1", epoch=0)
        run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
        assert len(run_processes(run_id)) >= 2
        tfo.proc.kill()
        t0 = time.monotonic()
        gone = wait_until(lambda: not run_processes(run_id), 10)
        assert gone, f"still running 10 s after: {run_processes(run_id)}"
        print(f"remote tasks gone {time.monotonic() - t0:.2f} s after SIGKILL of tfo")
    finally:
        stop(tfo)


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_cut_network_is_seen_from_both_ends(lab, run_dir: Path, tmp_path: Path):
    """Cut lab2's link: its task stops itself (no heartbeat from us) and the coordinator
    notices the loss (no heartbeat from it), then stops worker:0 on lab1 over SSH."""
    lab1, lab2 = lab
    spec = lab_spec(lab, tmp_path, entry="tests.jobs.faulty:train",
                    args="{epochs: 5, epoch_sleep: 30}")
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_epoch", "worker:1", epoch=0)
        pids = task_pids(run_dir)
        with sshlab.partition(lab2.netns):  # no FIN, no RST: the packets just stop
            t0, cut_at = time.monotonic(), time.time()
            gone = wait_until(lambda: pids["worker:1"] not in netns_pids(lab2.netns), 10)
            took = time.monotonic() - t0
            assert gone, "the remote task outlived its cut lifeline by more than 10 s"
            print(f"remote task stopped itself {took:.2f} s after the network cut")
            code, err = tfo.finish(timeout=60)
            print(f"coordinator finished {time.monotonic() - t0:.2f} s after the cut")
        assert code == 1, err[-3000:]
        assert "lost the connection to lab2" in err
        lost = next(e for e in events(run_dir) if e["event"] == "task_exited")
        assert lost["task"] == "worker:1" and lost["time"] - cut_at < 10
        # worker:0 on lab1 was stopped over SSH (its process group signalled remotely).
        assert pids["worker:0"] not in netns_pids(lab1.netns)
        stopped = next(e for e in events(run_dir) if e["event"] == "task_stopped")
        assert stopped["task"] == "worker:0"
    finally:
        stop(tfo)


@pytest.mark.timeout(120)
def test_preflight_names_every_problem(loopback_sshd, lab, run_dir: Path, tmp_path: Path):
    h = loopback_sshd
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT from earlier tests
    holder.bind(("127.0.0.1", 20101))
    holder.listen()
    try:
        spec = write_spec(tmp_path / "bad.yaml", f"""\
name: preflight
job: {{entry: "worker_entry.examples.digits:train"}}
hosts:
{host_yaml("good", h, tmp_path / "good")}\
{host_yaml("badkey", h, tmp_path / "bk", key=h.wrong_key)}\
{host_yaml("nopython", h, tmp_path / "np", python="/nonexistent/python3")}\
{host_yaml("ghost", lab[0], tmp_path / "gh", address="10.200.0.99")}\
{host_yaml("busy", h, tmp_path / "busy")}
tasks:
  worker: [good:20100, badkey:20102, nopython:20103, ghost:20104, busy:20101]
""")
        t0 = time.monotonic()
        res = run_tfo("check", str(spec), timeout=60)
        took = time.monotonic() - t0
        assert res.returncode == 1, res.output
        rows = {line.split("│")[1].strip(): line for line in res.stdout.splitlines()
                if line.startswith("│")}
        assert set(rows) == {"good", "badkey", "nopython", "ghost", "busy"}
        assert "ok" in rows["good"] and "2.21" in rows["good"]
        # Its cores and free memory, as the host says (`warm_spares: auto` asks them).
        cells = [c.strip() for c in rows["good"].split("│")]
        assert cells[9] == str(os.cpu_count()) and cells[10].endswith(" GiB"), cells
        assert "problem" in rows["badkey"] and "problem" in rows["ghost"]
        assert "host badkey (127.0.0.1): authentication failed" in res.stderr
        assert "host nopython: python '/nonexistent/python3' not found" in res.stderr
        assert "host ghost (10.200.0.99:22): unreachable" in res.stderr
        assert "worker:4 (busy:20101): port 20101 is in use" in res.stderr
        assert "host good" not in res.stderr
        assert took < 30  # in parallel: one unreachable host does not serialize the rest
        print(f"tfo check over 5 hosts: {took:.2f} s")

        run = run_tfo("run", str(spec), "--run-dir", str(run_dir), timeout=60)
        assert run.returncode == 2, run.output
        assert "nothing was started" in run.stderr and "authentication failed" in run.stderr
        assert not run_dir.exists()
        assert "Traceback" not in run.output + res.output
    finally:
        holder.close()


@pytest.mark.timeout(60)
def test_unknown_host_key_is_refused_unless_opted_out(loopback_sshd, tmp_path: Path):
    h = loopback_sshd
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    text = f"""\
name: hostkey
job: {{entry: "worker_entry.examples.digits:train"}}
hosts:
{host_yaml("lab", h, tmp_path / "w", known_hosts=str(empty))}\
{host_yaml("trusting", h, tmp_path / "w2", known_hosts=str(empty), check_host_key=False)}
tasks:
  worker: [lab:20105, trusting:20106]
"""
    res = run_tfo("check", str(write_spec(tmp_path / "c.yaml", text)), timeout=30)
    assert res.returncode == 1
    assert "host lab (127.0.0.1): unknown host key" in res.stderr
    assert "host trusting" not in res.stderr


@pytest.mark.timeout(60)
def test_env_keys_and_values_never_run_on_the_host(loopback_sshd, tmp_path: Path):
    """Issue 8.1: an env key or value that would run a command if unquoted runs nothing."""
    h = loopback_sshd
    key_pwned, value_pwned = tmp_path / "pwned-by-key", tmp_path / "pwned-by-value"
    bad_key = f"A$(touch {key_pwned})"
    bad_value = f"$(touch {value_pwned}); `touch {value_pwned}`"
    text = f"""\
name: inject
job: {{entry: "worker_entry.examples.digits:train"}}
hosts:
{host_yaml("lab", h, tmp_path / "w")}
tasks:
  worker: [lab:20107]
env: {json.dumps({bad_key: "v", "NOTE": bad_value})}
"""
    spec_file = write_spec(tmp_path / "inject.yaml", text)
    for cmd in ("plan", "run"):
        res = run_tfo(cmd, str(spec_file), "--run-dir", str(tmp_path / "run"), timeout=30)
        assert res.returncode == 2, res.output
        assert "env" in res.stderr and bad_key in res.stderr, res.stderr
        assert "Traceback" not in res.output
    # Past the spec (a plan built by other means), the remote shell still runs nothing:
    # the task's command is `env`, which prints the environment it was given.
    from dataclasses import replace

    from orchestrator.launch.ssh import SshBackend
    from orchestrator.plan import make_plan
    from orchestrator.spec import load_spec

    spec = load_spec(write_spec(tmp_path / "ok.yaml", text.replace(bad_key, "SAFE")))
    task = make_plan(spec, run_id="inject", run_dir=tmp_path / "run", workdir=tmp_path).tasks[0]
    task = replace(task, command=["/usr/bin/env"], env={**task.env, bad_key: "v"})
    Path(task.log_path).parent.mkdir(parents=True)  # the handle writes the task's log
    hosts = SshBackend(spec.hosts)
    try:
        handle = hosts.start(task, 0)
        assert wait_until(lambda: handle.poll() is not None, 20) is not False
        assert handle.poll() == 0
        output = handle.lines() + handle.close()
    finally:
        hosts.close()
    env = dict(line.split("=", 1) for line in output if "=" in line)
    assert env[bad_key] == "v" and env["NOTE"] == bad_value
    assert not key_pwned.exists() and not value_pwned.exists()


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_tutorial_script_runs_on_two_lab_hosts(lab, run_dir: Path, tmp_path: Path):
    """job.script over SSH: its directory is synced into each host's workdir, unchanged
    files skipped, and the script runs there as on a laptop."""
    lab1, lab2 = lab
    spec = write_spec(tmp_path / "lab.yaml", f"""\
name: lab-script
job:
  script: tests/scripts/mwms_keras.py
  args: [--epochs, "2", --model_path, out/keras-model, --backup_dir, backup]
hosts:
{host_yaml("lab1", lab1, tmp_path / "lab1")}{host_yaml("lab2", lab2, tmp_path / "lab2")}
tasks:
  worker: [lab1:20000, lab2:20000]
""")
    res = run_tfo("run", str(spec), "--run-dir", str(run_dir), timeout=240)
    assert res.returncode == 0, res.output[-4000:]
    assert "lab1: code synced (" in res.output
    # The script's directory's contents are in the workdir, where the task ran it.
    assert (tmp_path / "lab2" / "mwms_keras.py").exists()
    assert (tmp_path / "lab1" / "out" / "keras-model" / "saved_model.pb").exists()
    assert not list((tmp_path / "lab2").rglob("saved_model.pb"))
    # A second run copies nothing new.
    res = run_tfo("run", str(spec), "--run-dir", str(run_dir / "again"), timeout=240)
    assert res.returncode == 0, res.output[-4000:]
    assert "lab1: code synced (0 file(s) copied)" in res.output


def spares_spec(lab, tmp_path: Path, epochs: int, epoch_sleep: float) -> Path:
    lab1, lab2 = lab
    return write_spec(tmp_path / "lab.yaml", f"""\
name: lab-spares
job: {{entry: tests.jobs.faulty:train, args: {{epochs: {epochs}, epoch_sleep: {epoch_sleep}}}}}
hosts:
{host_yaml("lab1", lab1, tmp_path / "lab1")}{host_yaml("lab2", lab2, tmp_path / "lab2")}
tasks:
  worker: [lab1:20000, lab2:20000]
restart: {{policy: on-failure, max_restarts: 1, backoff_seconds: 0, warm_spares: true}}
timeouts: {{grace_seconds: 5}}
""")


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_sigkill_coordinator_leaves_no_standby_on_the_hosts(lab, run_dir: Path,
                                                            tmp_path: Path):
    """A standby's lifeline is its channel, as a task's: the coordinator gone, it goes."""
    tfo = Tfo(spares_spec(lab, tmp_path, 5, 30), run_dir)
    try:
        tfo.wait_event("task_standby_started", "worker:1", attempt=1, timeout=180)
        from tests.test_spares import gone, standbys

        run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
        standby = standbys(run_dir)[("worker:1", 1)]
        assert standby in {p.pid for p in run_processes(run_id)}
        tfo.proc.kill()
        assert wait_until(lambda: not run_processes(run_id), 15), \
            f"still running 15 s after: {run_processes(run_id)}"
        assert gone(standby)
    finally:
        stop(tfo)


@pytest.mark.tf
@pytest.mark.timeout(300)
def test_a_restart_on_a_lab_host_is_served_by_its_warm_spare(lab, run_dir: Path,
                                                             tmp_path: Path):
    """warm_spares: true over SSH: each worker's standby waits on its own host, TensorFlow
    imported; a SIGKILLed worker's restart (both workers: one restart unit) gets them."""
    from tests.test_faults import kill_task
    from tests.test_spares import assert_restart_served_by_spares, gone, standbys

    lab2 = lab[1]
    spec = spares_spec(lab, tmp_path, 5, 2)
    tfo = Tfo(spec, run_dir)
    try:
        tfo.wait_event("task_standby_started", "worker:1", attempt=1, timeout=180)
        spares = standbys(run_dir)
        assert spares[("worker:1", 1)] in netns_pids(lab2.netns)  # on the task's own host
        tfo.wait_event("task_epoch", "worker:1", epoch=1, timeout=120)
        killed_at = kill_task(tfo, "worker:1")
        code, err = tfo.finish()
        assert code == 0, err[-3000:]
    finally:
        stop(tfo)
    # sshd reports no exit status for a session whose process was killed: 255
    assert_restart_served_by_spares(run_dir, killed_at, 255)
    spares = standbys(run_dir)
    assert all(gone(pid) for pid in spares.values())
