"""Issue 31 item 6: a job whose tasks are all on this machine cannot be reached from another
one (orchestrator/launch/loopback.py), while its tasks still reach out."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.launch import loopback
from tests.conftest import run_tfo, wait_until, write_spec
from tests.helpers import Tfo

# The network namespace this test makes: its own prefix and subnet, beside the SSH and Slurm
# labs' (10.200.0.0/24, the three-host 10.220.0.0/24, 10.201.0.0/24).
PREFIX = "tfod"
SUBNET = ipaddress.ip_network("10.210.0.0/24")
BRIDGE = "10.210.0.1"  # this machine, as the namespace reaches it


@pytest.mark.parametrize(("addresses", "confined"), [
    (["localhost:2000", "localhost:2001"], True),
    (["127.0.0.1:5", "[::1]:6"], True),
    (["localhost:2000", "lab1:2001"], False),  # a lab host must reach the local task
    (["10.0.0.5:2000"], False),
    ([], False),
])
def test_only_an_all_loopback_cluster_is_confined(addresses, confined):
    assert loopback.loopback_only(addresses) is confined


def test_the_preload_keeps_the_users_own():
    shim = Path("/c/loopback.so")
    assert loopback.with_preload({}, shim)["LD_PRELOAD"] == "/c/loopback.so"
    assert loopback.with_preload({"LD_PRELOAD": "/u/x.so"}, shim)["LD_PRELOAD"] == \
        "/c/loopback.so /u/x.so"


def test_without_a_compiler_the_warning_says_what_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    path, why = loopback.try_build(tmp_path)
    assert path is None and "no-such-cc" in why
    text = loopback.unconfined_warning(why, [20001, 20000])
    assert "(ports 20000, 20001) listen on every interface" in text
    assert "C compiler" in text and "firewall" in text


BIND_ALL = """\
import socket
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", 0)); s.listen()
t = socket.socket(); t.bind(("", 0)); t.listen()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("", 0))
print(s.getsockname()[0], t.getsockname()[0], u.getsockname()[0])
"""


def test_the_shim_binds_tcp_to_the_loopback_and_leaves_udp(tmp_path):
    shim = loopback.build_shim(tmp_path)
    out = subprocess.run([sys.executable, "-c", BIND_ALL], capture_output=True, text=True,
                         timeout=30, env=loopback.with_preload(dict(os.environ), shim))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["::ffff:127.0.0.1", "127.0.0.1", "0.0.0.0"]


def _probe_from(ns: str, host: str, port: int) -> str:
    """Connect from inside network namespace `ns`: 'open', or the error's name."""
    code = (f"import socket\ntry:\n socket.create_connection(({host!r}, {port}), timeout=5)\n"
            " print('open')\nexcept OSError as e:\n print(type(e).__name__)")
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or out.stderr.strip()


SPEC = """\
name: loopback
strategy: multi_worker_mirrored
job:
  script: tests/scripts/reach_out.py
  args: {args}
tasks:
  worker: [localhost:auto]
restart: {{policy: never}}
timeouts: {{startup_seconds: 120, grace_seconds: 5}}
"""


@pytest.mark.tf
@pytest.mark.timeout(240)
def test_a_local_job_is_not_reachable_from_another_machine_but_reaches_out(tmp_path, run_dir):
    from tests import sshlab

    ok, why = sshlab.netns_supported()
    if not ok:
        pytest.skip(f"no network namespaces here: {why}")
    served = tmp_path / "www"
    served.mkdir()
    (served / "data.bin").write_bytes(b"the training data\n")
    with sshlab.lab_network(prefix=PREFIX, count=1, subnet=SUBNET) as [(ns, addr)]:
        # "Another machine" also serves the script's data: the task must still reach it.
        www = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "http.server",
                                "--bind", addr, "8080", "--directory", str(served)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tfo = None
        try:
            assert wait_until(lambda: _probe_from(ns, addr, 8080) == "open", 20)
            release, out = tmp_path / "release", tmp_path / "got.bin"
            spec = write_spec(tmp_path / "cluster.yaml", SPEC.format(args=json.dumps([
                "--url", f"http://{addr}:8080/data.bin", "--out", str(out),
                "--release", str(release)])))
            tfo = Tfo(spec, run_dir)
            tfo.wait_event("task_ready", "worker:0", timeout=150)
            port = json.loads((run_dir / "plan.json").read_text())["tasks"][0]["port"]
            from_there = _probe_from(ns, BRIDGE, port)
            with socket.create_connection(("localhost", port), timeout=5):
                pass  # the job's own tasks still reach it
            release.touch()
            rc, err = tfo.finish(timeout=120)
            assert rc == 0, err[-3000:]
            assert from_there == "ConnectionRefusedError", from_there
            assert out.read_bytes() == b"the training data\n"  # it reached out
        finally:
            if tfo is not None:
                tfo.close()
            www.kill()
            www.wait()


def test_where_no_shim_builds_tfo_says_so_once_at_the_start(tmp_path, run_dir):
    spec = write_spec(tmp_path / "cluster.yaml", SPEC.replace(
        "reach_out.py", "close_output.py").format(args='["--how", "streams"]'))
    env = {**os.environ, "CC": str(tmp_path / "no-cc"), "XDG_CACHE_HOME": str(tmp_path / "c")}
    res = run_tfo("run", str(spec), "--run-dir", str(run_dir), env=env, timeout=60)
    assert res.returncode == 0, res.output[-2000:]
    said = [line for line in res.stderr.splitlines() if "listen on every interface" in line]
    port = json.loads((run_dir / "plan.json").read_text())["tasks"][0]["port"]
    assert len(said) == 1 and said[0].startswith(
        f"tfo: warning: this job's TensorFlow servers (port {port}) listen on every "
        "interface"), res.stderr
