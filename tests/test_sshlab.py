"""Self-tests for tests/sshlab.py (real sshd, real network namespaces)."""

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:  # tests/ is a package (tests/__init__.py): use the same module as conftest
    from . import sshlab
except ImportError:  # pragma: no cover - tests/ used as a plain directory
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sshlab

from tests.conftest import SSH_LAB  # noqa: E402
from tests.procs import alive  # noqa: E402

paramiko = pytest.importorskip("paramiko")
pytest.importorskip("fabric")

pytestmark = [pytest.mark.ssh, SSH_LAB,
              pytest.mark.skipif(os.geteuid() != 0, reason="sshlab needs root")]

NETNS_OK, NETNS_REASON = (sshlab.netns_supported() if os.geteuid() == 0
                          else (False, "not root"))
needs_netns = pytest.mark.skipif(not NETNS_OK,
                                 reason=f"network namespaces unavailable: {NETNS_REASON}")


@pytest.fixture(scope="module", autouse=True)
def _openssh():
    sshlab.ensure_openssh()


@pytest.fixture
def sshd(tmp_path):
    with sshlab.start_sshd(tmp_path / "sshd") as host:
        yield host
    assert not alive(host.sshd_pid)


def _wait_for_file(path: Path, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.01)
    return None


def _lifeline_cmd(ready: Path, eof: Path) -> str:
    """Remote command: touch `ready`, block on stdin, write EOF time to `eof`."""
    code = (f"import sys,time,os; open({str(ready)!r},'w').write(str(os.getpid())); "
            f"sys.stdin.buffer.read(); open({str(eof)!r},'w').write(repr(time.time()))")
    return f'python3 -c "{code}"'


# ------------------------------------------------------------------ loopback sshd


@pytest.mark.timeout(60)
def test_loopback_echo_with_host_key_checking(sshd):
    assert sshd.port != 22 and sshd.address == "127.0.0.1"
    with sshlab.fabric_connection(sshd) as conn:
        assert isinstance(conn.client._policy, paramiko.RejectPolicy)
        r = conn.run("echo hello; id -u", hide=True, in_stream=False)
    assert r.stdout.split() == ["hello", "0"]


@pytest.mark.timeout(60)
def test_unknown_and_mismatched_host_key_rejected(sshd, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        sshlab.fabric_connection(
            dataclasses.replace(sshd, known_hosts=str(empty))).open()

    _, other_pub = sshlab.make_host_key(tmp_path / "other")
    bad = tmp_path / "bad_known_hosts"
    bad.write_text("\n".join(sshlab._known_hosts_lines(sshd.address, sshd.port,
                                                       other_pub)) + "\n")
    with pytest.raises(paramiko.BadHostKeyException):
        sshlab.fabric_connection(dataclasses.replace(sshd, known_hosts=str(bad))).open()


@pytest.mark.timeout(60)
def test_wrong_key_rejected(sshd):
    conn = sshlab.fabric_connection(sshd, key=sshd.wrong_key)
    with pytest.raises(paramiko.AuthenticationException):
        conn.open()
    conn.close()


@pytest.mark.timeout(60)
def test_openssh_cli_client(sshd):
    ok = subprocess.run(sshlab.ssh_argv(sshd) + ["echo cli-ok"], capture_output=True,
                        text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert ok.returncode == 0 and ok.stdout.strip() == "cli-ok", ok.stderr
    bad = subprocess.run(sshlab.ssh_argv(sshd, key=sshd.wrong_key) + ["true"],
                         capture_output=True, text=True, timeout=30,
                         stdin=subprocess.DEVNULL)
    assert bad.returncode == 255 and "Permission denied" in bad.stderr


@pytest.mark.timeout(60)
def test_lifeline_eof_when_connection_closed(sshd, tmp_path):
    ready, eof = tmp_path / "ready", tmp_path / "eof"
    conn = sshlab.fabric_connection(sshd)
    # in_stream=False: fabric forwards nothing and never half-closes the
    # channel, so the remote stdin stays open for as long as the session lives.
    promise = conn.run(_lifeline_cmd(ready, eof), hide=True, in_stream=False,
                       pty=False, asynchronous=True)
    assert _wait_for_file(ready, 10)
    time.sleep(0.5)
    assert not eof.exists(), "remote stdin hit EOF while the connection was up"
    t0 = time.time()
    conn.close()
    got = _wait_for_file(eof, 10)
    assert got is not None, "remote never saw EOF after close()"
    assert float(got) - t0 < 5
    with contextlib.suppress(Exception):  # the remote command died with the session
        promise.join()


_CLIENT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import sshlab
conn = sshlab.fabric_connection(sshlab.SshHost(**json.loads(sys.argv[2])))
conn.run(sys.argv[3], hide=True, in_stream=False, pty=False, asynchronous=True)
time.sleep(600)
"""


@pytest.mark.timeout(60)
def test_lifeline_eof_when_client_killed(sshd, tmp_path):
    ready, eof = tmp_path / "ready", tmp_path / "eof"
    child = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, os.path.dirname(sshlab.__file__),
         json.dumps(dataclasses.asdict(sshd)), _lifeline_cmd(ready, eof)],
        stdin=subprocess.DEVNULL)
    try:
        assert _wait_for_file(ready, 20)
        time.sleep(0.3)
        assert not eof.exists()
        t0 = time.time()
        child.kill()
        child.wait(10)
        got = _wait_for_file(eof, 10)
        assert got is not None, "remote never saw EOF after the client was killed"
        assert float(got) - t0 < 5
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


# ---------------------------------------------------------------------- lab hosts


@needs_netns
@pytest.mark.timeout(90)
def test_lab_hosts_addresses_and_cross_host_tcp(tmp_path):
    with sshlab.lab_hosts(tmp_path / "lab") as hosts:
        assert [(h.name, h.address, h.port) for h in hosts] == [
            ("lab1", "10.200.0.11", 22), ("lab2", "10.200.0.12", 22)]
        assert len({h.known_hosts for h in hosts}) == 1
        c1, c2 = (sshlab.fabric_connection(h) for h in hosts)
        try:
            assert c1.run("hostname -I", hide=True, in_stream=False).stdout.split() \
                == ["10.200.0.11"]
            assert c2.run("hostname -I", hide=True, in_stream=False).stdout.split() \
                == ["10.200.0.12"]

            server = ("import socket; s=socket.socket(); "
                      "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                      "s.bind(('10.200.0.11', 20000)); s.listen(); s.settimeout(20); "
                      "print('listening', flush=True); a, p = s.accept(); "
                      "a.sendall(b'hi ' + p[0].encode()); a.close()")
            srv = c1.run(f'python3 -c "{server}"', hide=True, in_stream=False,
                         asynchronous=True)
            client = ("import socket, time\n"
                      "for _ in range(100):\n"
                      "    try: s = socket.create_connection(('10.200.0.11', 20000), 2); break\n"
                      "    except OSError: time.sleep(0.1)\n"
                      "print(s.recv(100).decode())")
            r = c2.run(f"python3 -c \"{client}\"", hide=True, in_stream=False)
            assert r.stdout.strip() == "hi 10.200.0.12"
            assert srv.join().stdout.strip() == "listening"
        finally:
            c1.close()
            c2.close()

        # 10.200.0.99 is on the lab bridge (no host there): bounded failure.
        route = subprocess.run(["ip", "route", "get", "10.200.0.99"],
                               capture_output=True, text=True).stdout
        assert "src 10.200.0.1 " in route, route  # never leaves via eth0
        t0 = time.monotonic()
        with pytest.raises(OSError):  # TimeoutError or NoValidConnectionsError
            sshlab.fabric_connection(dataclasses.replace(hosts[0], address="10.200.0.99"),
                                     connect_timeout=3).open()
        assert time.monotonic() - t0 < 10
        namespaces = [h.netns for h in hosts]
        pids = [h.sshd_pid for h in hosts]

    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listing for ns in namespaces)
    assert not any(alive(p) for p in pids)
    assert "10.200.0." not in subprocess.run(["ip", "-4", "addr"], capture_output=True,
                                             text=True).stdout


@needs_netns
@pytest.mark.timeout(90)
def test_lifeline_eof_on_partition_needs_client_alive(tmp_path):
    """Without FIN/RST only sshd's ClientAliveInterval notices a dead client."""
    with sshlab.lab_hosts(tmp_path / "lab", count=1, client_alive_interval=1,
                          client_alive_count_max=2) as (h,):
        ready, eof = tmp_path / "ready", tmp_path / "eof"
        conn = sshlab.fabric_connection(h)
        conn.run(_lifeline_cmd(ready, eof), hide=True, in_stream=False,
                 asynchronous=True)
        try:
            assert _wait_for_file(ready, 10)
            with sshlab.partition(h.netns):
                t0 = time.time()
                got = _wait_for_file(eof, 20)
                assert got is not None, "no EOF after partition despite ClientAlive"
                assert float(got) - t0 < 15
        finally:
            conn.client.close()


_COUNT_UDP = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
              "s.bind(('0.0.0.0', 9999)); s.settimeout(3); n = 0; print('ready', flush=True)\n"
              "try:\n    while True: s.recv(16); n += 1\nexcept OSError: print(n)")


def _udp_received(ns: str, address: str, count: int) -> int:
    """Datagrams of `count` sent from here that a listener in `ns` received."""
    import socket

    listener = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c", _COUNT_UDP],
                                stdout=subprocess.PIPE, text=True)
    try:
        # Sent once it listens: a python started in a namespace on a busy machine took more
        # than the 1 s this waited before (0 of 2000 received, make test failed so once).
        assert listener.stdout is not None and listener.stdout.readline() == "ready\n"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(count):
                s.sendto(b"x", (address, 9999))
                time.sleep(0.0005)
        return int(listener.communicate(timeout=20)[0])
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()


@needs_netns
@pytest.mark.timeout(90)
def test_lossy_drops_about_the_share_asked_and_is_undone(tmp_path):
    with sshlab.lab_network(count=1) as [(ns, address)]:
        # A clean pass first, which also resolves the address: under loss the first ARP
        # exchanges can all be dropped for 3 s, the listener's limit, and nothing sent in
        # that time arrives (0 of 2000 received, CI failed so once). A lossy link drops
        # ARP too; what this test measures is the share of the datagrams.
        assert _udp_received(ns, address, 200) == 200
        with sshlab.lossy(ns, 0.3):
            got = _udp_received(ns, address, 2000)
        assert 1200 < got < 1600, got  # 30 % of 2000 lost, give or take
        assert _udp_received(ns, address, 500) == 500
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert f"{sshlab._root_veth_of(ns)[:13]}k" not in links
