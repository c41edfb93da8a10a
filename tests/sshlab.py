"""Real-SSH test infrastructure: private sshd instances and a tiny "lab" network.

Self-contained (standard library only; fabric/paramiko are imported lazily by the
helpers that need them).  Everything here must run as root on Linux.

Public API
----------
ensure_openssh(timeout=600)                       -> None
netns_supported()                                 -> (bool, reason)
make_keys(dirpath)                                -> Keys
make_host_key(dirpath, name='host_ed25519')       -> (private, public)
start_sshd(workdir, address='127.0.0.1', port=None, netns=None, *, name=None,
           keys=None, host_key=None, known_hosts=None,
           client_alive_interval=None, client_alive_count_max=3,
           extra_config=(), start_timeout=10.0, kill_sessions=True)
                                                  -> contextmanager[SshHost]
lab_network(prefix='tfo', count=2)                -> contextmanager[list[(netns, address)]]
lab_hosts(workdir, prefix='tfo', count=2, subnet=LAB_SUBNET, **sshd_kwargs)
                                                  -> contextmanager[list[SshHost]]
partition(netns)                                  -> contextmanager (veth down/up)
lossy(netns, share)                               -> contextmanager (drop a share of packets)
power_off(netns, keep=())                         -> contextmanager (cut + kill its processes)
fabric_connection(host, *, key=None, connect_timeout=10, strict=True, **kw)
                                                  -> fabric.Connection (host keys checked)
ssh_argv(host, *, key=None, connect_timeout=10)   -> list[str] (OpenSSH CLI client argv)
cleanup_stale(prefix='tfo')                       -> list[str]  (removes leftovers of dead runs)

Host-key checking with fabric: fabric.Connection always builds its SSHClient
with AutoAddPolicy and never reads any known_hosts file (it ignores
UserKnownHostsFile / StrictHostKeyChecking from ssh_config).  The working
incantation is, after constructing the Connection and before opening it:

    conn.client.load_host_keys(known_hosts_path)
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())

Unknown host -> paramiko.SSHException("Server '[addr]:port' not found in
known_hosts"); known host with a different key -> paramiko.BadHostKeyException.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

try:
    from tests.procs import alive
except ImportError:  # imported as a plain module with tests/ on sys.path (test_sshlab's client)
    from procs import alive

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
LAB_SUBNET = ipaddress.ip_network("10.200.0.0/24")
LAB_BRIDGE_ADDR = "10.200.0.1"
LAB_HOST_BASE = 11  # lab1 = 10.200.0.11, lab2 = 10.200.0.12, ...

_apt_updated = False
_apt_lock = threading.Lock()


class SshLabError(RuntimeError):
    """Raised when the SSH lab cannot be set up."""


# --------------------------------------------------------------------------- utils


def _run(argv: Sequence[str], *, timeout: float = 30, check: bool = True,
         env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        cp = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise SshLabError(f"command timed out after {timeout}s: {' '.join(argv)}") from e
    except FileNotFoundError as e:
        raise SshLabError(f"command not found: {argv[0]}") from e
    if check and cp.returncode != 0:
        raise SshLabError(
            f"command failed (rc={cp.returncode}): {' '.join(argv)}\n"
            f"stdout: {cp.stdout.strip()}\nstderr: {cp.stderr.strip()}")
    return cp


def _ip(*args: str, check: bool = True, timeout: float = 15) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check=check, timeout=timeout)


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _descendants(pid: int) -> list[int]:
    kids = _children_map()
    out, stack = [], list(kids.get(pid, []))
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(kids.get(p, []))
    return out


def _terminate_pids(pids: Sequence[int], grace: float = 3.0) -> None:
    """SIGTERM the given pids, wait up to `grace` s, then SIGKILL survivors."""
    pids = [p for p in pids if p > 1 and p != os.getpid()]
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if alive(p):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)


def _free_port(address: str) -> int:
    fam = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "<no log>"


# ------------------------------------------------------------------ ensure_openssh


def apt_install(packages: Sequence[str], timeout: float = 600) -> None:
    """`apt-get install` the packages (root; `apt-get update` at most once per process).
    Service start-up during the install is suppressed via policy-rc.d: no system daemon is
    left running."""
    global _apt_updated
    if os.geteuid() != 0:
        raise SshLabError(f"{', '.join(packages)}: missing and we are not root")
    if not shutil.which("apt-get"):
        raise SshLabError(f"{', '.join(packages)}: missing and apt-get is unavailable")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", NEEDRESTART_MODE="a")
    deadline = time.monotonic() + timeout
    policy = Path("/usr/sbin/policy-rc.d")
    created_policy = False
    try:
        if not policy.exists():
            policy.write_text("#!/bin/sh\nexit 101\n")
            policy.chmod(0o755)
            created_policy = True
        if not _apt_updated:
            _run(["apt-get", "update"], env=env, timeout=max(10.0, deadline - time.monotonic()))
            _apt_updated = True
        _run(["apt-get", "install", "-y", "--no-install-recommends",
              "-o", "Dpkg::Options::=--force-confdef",
              "-o", "Dpkg::Options::=--force-confold", *packages], env=env,
             timeout=max(10.0, deadline - time.monotonic()))
    except SshLabError as e:
        raise SshLabError(f"could not install {', '.join(packages)}: {e}") from e
    finally:
        if created_policy:
            with contextlib.suppress(OSError):
                policy.unlink()


def ensure_openssh(timeout: float = 600) -> None:
    """Install openssh-server/client with apt if /usr/sbin/sshd is missing.
    Ensures /run/sshd (privilege-separation dir) exists.
    """
    with _apt_lock:
        if not (os.path.exists(SSHD) and os.path.exists(SSH_KEYGEN)
                and shutil.which("ssh")):
            apt_install(["openssh-server", "openssh-client"], timeout)
            if not os.path.exists(SSHD):
                raise SshLabError(f"apt-get install succeeded but {SSHD} is missing")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        os.chmod("/run/sshd", 0o755)


# ------------------------------------------------------------------------- keys


@dataclasses.dataclass(frozen=True)
class Keys:
    client_key: str        # private key, authorized
    client_pub: str
    wrong_key: str         # private key, NOT in authorized_keys
    wrong_pub: str
    authorized_keys: str   # contains client_pub only
    host_key: str          # sshd host private key
    host_pub: str


def _keygen(path: Path, comment: str) -> tuple[str, str]:
    for p in (path, path.with_name(path.name + ".pub")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    _run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    os.chmod(path, 0o600)
    return str(path), str(path) + ".pub"


def make_host_key(dirpath, name: str = "host_ed25519") -> tuple[str, str]:
    d = Path(dirpath)
    d.mkdir(parents=True, exist_ok=True)
    return _keygen(d / name, f"sshlab-{name}")


def make_keys(dirpath) -> Keys:
    """ed25519 host key, authorized client key, unauthorized ('wrong') client key."""
    if not os.path.exists(SSH_KEYGEN):
        raise SshLabError(f"{SSH_KEYGEN} missing; call ensure_openssh() first")
    d = Path(dirpath)
    d.mkdir(parents=True, exist_ok=True)
    host_key, host_pub = make_host_key(d)
    client_key, client_pub = _keygen(d / "client_ed25519", "sshlab-client")
    wrong_key, wrong_pub = _keygen(d / "wrong_ed25519", "sshlab-wrong")
    ak = d / "authorized_keys"
    ak.write_text(Path(client_pub).read_text())
    os.chmod(ak, 0o600)
    return Keys(client_key, client_pub, wrong_key, wrong_pub, str(ak), host_key, host_pub)


# ------------------------------------------------------------------------- sshd


@dataclasses.dataclass
class SshHost:
    name: str
    address: str
    port: int
    user: str = "root"
    key: str = ""                 # authorized private client key
    known_hosts: str = ""         # known_hosts file containing this host's key
    sshd_pid: int = 0
    wrong_key: str = ""           # private key that is NOT authorized
    netns: str | None = None
    log: str = ""                 # sshd -E log file
    workdir: str = ""
    start_seconds: float = 0.0    # sshd spawn -> banner readable

    @property
    def host_spec(self) -> str:
        """Spec as an SSH client writes it: addr, or [addr]:port when port != 22."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


def _known_hosts_lines(address: str, port: int, host_pub: str) -> list[str]:
    keytype, keyb64 = Path(host_pub).read_text().split()[:2]
    lines = [f"[{address}]:{port} {keytype} {keyb64}"]
    if port == 22:
        lines.append(f"{address} {keytype} {keyb64}")
    return lines


def _write_sshd_config(path: Path, *, address: str, port: int, host_key: str,
                       authorized_keys: str, pidfile: Path,
                       client_alive_interval: int | None,
                       client_alive_count_max: int,
                       extra_config: Sequence[str]) -> None:
    listen = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    lines = [
        f"Port {port}",
        f"ListenAddress {listen}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"PidFile {pidfile}",
        "StrictModes no",
        "UsePAM no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "MaxAuthTries 10",
        "LoginGraceTime 30",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "AllowTcpForwarding yes",
        "Subsystem sftp internal-sftp",
        "LogLevel VERBOSE",
    ]
    if client_alive_interval:
        lines += [f"ClientAliveInterval {int(client_alive_interval)}",
                  f"ClientAliveCountMax {int(client_alive_count_max)}"]
    lines += list(extra_config)
    path.write_text("\n".join(lines) + "\n")


def _wait_sshd_ready(proc: subprocess.Popen, log: Path, address: str, port: int,
                     timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_err = "not listening yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SshLabError(
                f"sshd exited early (rc={proc.returncode}) on {address}:{port}\n"
                f"--- sshd log ---\n{_tail(log)}")
        try:
            listening = "Server listening on" in log.read_text(errors="replace")
        except OSError:
            listening = False
        if listening:
            try:
                with socket.create_connection((address, port), timeout=1.0) as s:
                    s.settimeout(2.0)
                    banner = s.recv(64)
                if banner.startswith(b"SSH-"):
                    return
                last_err = f"unexpected banner {banner!r}"
            except OSError as e:
                last_err = repr(e)
        time.sleep(0.02)
    raise SshLabError(
        f"sshd on {address}:{port} not ready after {timeout}s ({last_err})\n"
        f"--- sshd log ---\n{_tail(log)}")


@contextlib.contextmanager
def start_sshd(workdir, address: str = "127.0.0.1", port: int | None = None,
               netns: str | None = None, *, name: str | None = None,
               keys: Keys | None = None, host_key: tuple[str, str] | None = None,
               known_hosts=None, client_alive_interval: int | None = None,
               client_alive_count_max: int = 3, extra_config: Sequence[str] = (),
               start_timeout: float = 10.0, kill_sessions: bool = True
               ) -> Iterator[SshHost]:
    """Run a private sshd (`sshd -D`) and yield an SshHost describing it.

    keys: client keys/authorized_keys to use (default: make_keys(workdir/'keys')).
    host_key: (private, public) host key (default: keys.host_key when keys were
        generated here, otherwise a fresh host key in workdir).
    known_hosts: file to append this host's key to (default: workdir/known_hosts,
        truncated first).
    port: default = a free port on `address` (or 22 inside a netns).
    kill_sessions: on exit also stop the per-connection sshd processes and the
        commands they run (descendants of the listener); otherwise only the
        listener is stopped.
    """
    ensure_openssh()
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    if keys is None:
        keys = make_keys(wd / "keys")
        if host_key is None:
            host_key = (keys.host_key, keys.host_pub)
    if host_key is None:
        host_key = make_host_key(wd)
    if port is None:
        port = 22 if netns else _free_port(address)
    cfg = wd / "sshd_config"
    log = wd / "sshd.log"
    pidfile = wd / "sshd.pid"
    with contextlib.suppress(FileNotFoundError):
        log.unlink()
    _write_sshd_config(cfg, address=address, port=port, host_key=host_key[0],
                       authorized_keys=keys.authorized_keys, pidfile=pidfile,
                       client_alive_interval=client_alive_interval,
                       client_alive_count_max=client_alive_count_max,
                       extra_config=extra_config)
    argv = [SSHD, "-D", "-f", str(cfg), "-E", str(log)]
    if netns:
        # `ip netns exec` setns()+execvp()s, so the Popen pid is sshd itself.
        argv = ["ip", "netns", "exec", netns, *argv]
    if known_hosts is None:
        known_hosts = wd / "known_hosts"
        Path(known_hosts).write_text("")
    with open(known_hosts, "a") as f:
        f.write("\n".join(_known_hosts_lines(address, port, host_key[1])) + "\n")

    t0 = time.monotonic()
    with open(wd / "sshd.stderr", "wb") as stderr_f:  # the child keeps its own copy
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stderr_f,
                                stderr=stderr_f, start_new_session=True, close_fds=True)
    host = SshHost(name=name or f"sshd-{address}-{port}", address=address, port=port,
                   user="root", key=keys.client_key, known_hosts=str(known_hosts),
                   sshd_pid=proc.pid, wrong_key=keys.wrong_key, netns=netns,
                   log=str(log), workdir=str(wd))
    try:
        _wait_sshd_ready(proc, log, address, port, start_timeout)
        host.start_seconds = time.monotonic() - t0
        yield host
    finally:
        if kill_sessions and proc.poll() is None:
            # per-connection sshds (own sessions, via setsid) and their commands;
            # stopped while the listener is still there to reap them
            _terminate_pids(_descendants(proc.pid))
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


# ---------------------------------------------------------------------- network


def netns_supported() -> tuple[bool, str]:
    """Try to create and delete a throwaway netns (+ a veth pair and a bridge)."""
    if os.geteuid() != 0:
        return False, "not root"
    if not shutil.which("ip"):
        return False, "iproute2 `ip` not found"
    tag = secrets.token_hex(3)
    ns, br, v0, v1 = f"sshlab-probe-{tag}", f"slbr{tag}", f"slv{tag}a", f"slv{tag}b"
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", br, "type", "bridge")
        _ip("link", "add", v0, "type", "veth", "peer", "name", v1)
        _ip("link", "set", v1, "netns", ns)
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        return True, "ok"
    except SshLabError as e:
        return False, f"network namespaces unusable: {e}"
    finally:
        _ip("link", "del", v0, check=False)
        _ip("link", "del", br, check=False)
        _ip("netns", "del", ns, check=False)


_ALIAS_PREFIX = "sshlab"


def _link_alias(prefix: str) -> str:
    return f"{_ALIAS_PREFIX} {prefix} pid={os.getpid()}"


def _route_conflict(subnet: ipaddress.IPv4Network = LAB_SUBNET) -> str | None:
    cp = _ip("-j", "-4", "addr", "show", check=False)
    try:
        data = json.loads(cp.stdout or "[]")
    except ValueError:
        return None
    for link in data:
        for a in link.get("addr_info", []):
            try:
                net = ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network
            except (KeyError, ValueError):
                continue
            if net.overlaps(subnet):
                return f"{a['local']}/{a['prefixlen']} on {link.get('ifname')}"
    return None


def _kill_netns_pids(ns: str) -> None:
    cp = _ip("netns", "pids", ns, check=False)
    pids = [int(x) for x in cp.stdout.split() if x.isdigit()]
    if pids:
        _terminate_pids(pids)


@contextlib.contextmanager
def lab_network(prefix: str = "tfo", count: int = 2,
                subnet: ipaddress.IPv4Network = LAB_SUBNET
                ) -> Iterator[list[tuple[str, str]]]:
    """Bridge <subnet>.1 (10.200.0.1/24) in the root netns + `count` namespaces on veths.

    Yields [(netns_name, address), ...] with addresses 10.200.0.11, .12, ...
    On exit kills any process still inside the namespaces, then deletes the
    namespaces, veths and bridge (also when setup fails half-way).
    Only one lab network can exist at a time per subnet (the Slurm lab has its own).
    """
    if not 1 <= count <= 50:
        raise ValueError("count must be in 1..50")
    ok, reason = netns_supported()
    if not ok:
        raise SshLabError(reason)
    cleanup_stale(prefix)  # only touches leftovers whose owning pid is dead
    conflict = _route_conflict(subnet)
    if conflict:
        raise SshLabError(
            f"{subnet} already in use ({conflict}); another lab network is up "
            f"or a crashed run left one behind (see sshlab.cleanup_stale())")
    tag = secrets.token_hex(3)
    short = "".join(c for c in prefix if c.isalnum())[:3] or "slb"
    bridge = f"{short}br{tag}"                       # <= 11 chars (IFNAMSIZ 15)
    alias = _link_alias(prefix)
    namespaces: list[str] = []
    veths: list[str] = []
    result: list[tuple[str, str]] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "alias", alias)
        gateway = str(subnet.network_address + 1)
        _ip("addr", "add", f"{gateway}/{subnet.prefixlen}", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i in range(1, count + 1):
            ns = f"{prefix}-lab{i}-{os.getpid()}-{tag}"
            addr = str(subnet.network_address + LAB_HOST_BASE + i - 1)
            host_if, peer_if = f"{short}v{i}{tag}", f"{short}p{i}{tag}"
            _ip("netns", "add", ns)
            namespaces.append(ns)
            _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
            veths.append(host_if)
            _ip("link", "set", host_if, "alias", alias)
            _ip("link", "set", host_if, "master", bridge)
            _ip("link", "set", peer_if, "netns", ns)
            nsip = ("netns", "exec", ns, "ip")
            _ip(*nsip, "link", "set", peer_if, "name", "eth0")
            _ip(*nsip, "addr", "add", f"{addr}/{subnet.prefixlen}", "dev", "eth0")
            _ip(*nsip, "link", "set", "lo", "up")
            _ip(*nsip, "link", "set", "eth0", "up")
            _ip(*nsip, "route", "add", "default", "via", gateway, check=False)
            _ip("link", "set", host_if, "up")
            result.append((ns, addr))
        yield result
    finally:
        for ns in namespaces:
            _kill_netns_pids(ns)
        for v in veths:
            _ip("link", "del", v, check=False)
        _ip("link", "del", bridge, check=False)
        for ns in namespaces:
            _ip("netns", "del", ns, check=False)


def _root_veth_of(netns: str) -> str:
    """Root-netns name of the veth peer of `netns`'s eth0."""
    cp = _ip("netns", "exec", netns, "cat", "/sys/class/net/eth0/iflink", check=False)
    if cp.returncode != 0 or not cp.stdout.strip().isdigit():
        raise SshLabError(f"{netns} is not a live lab_network namespace")
    peer = int(cp.stdout.strip())
    for link in json.loads(_ip("-j", "link", "show").stdout or "[]"):
        if link.get("ifindex") == peer:
            return link["ifname"]
    raise SshLabError(f"no root-side veth (ifindex {peer}) for {netns}")


@contextlib.contextmanager
def partition(netns: str) -> Iterator[None]:
    """Cut a lab namespace off the bridge (root-side veth down), restore on exit.

    No FIN/RST is sent: TCP peers only notice via keepalives/timeouts.
    """
    veth = _root_veth_of(netns)
    _ip("link", "set", veth, "down")
    try:
        yield
    finally:
        _ip("link", "set", veth, "up", check=False)


# cBPF for cls_bpf: A = a random u32 (SKF_AD_OFF + SKF_AD_RANDOM); A >= K: no match (0),
# else match (-1). The kernel here has no netem, no gact (`action drop`) and no iptables,
# but has mirred: a match is redirected to a veth that is down, which drops it.
_LOSS_BPF = "4,32 0 0 4294963256,53 0 1 {k},6 0 0 0,6 0 0 4294967295"


@contextlib.contextmanager
def lossy(netns: str, share: float) -> Iterator[None]:
    """Drop `share` (0..1) of the packets both ways between the bridge and `netns`, each
    one at random, as a bad link would; restored on exit. No netem needed: a cBPF filter
    on the root-side veth's clsact redirects the unlucky ones to a down veth."""
    if not 0 < share < 1:
        raise ValueError("share must be in (0, 1)")
    veth = _root_veth_of(netns)
    sink = f"{veth[:13]}k"
    alias = _ip("-j", "link", "show", veth).stdout
    prog = _LOSS_BPF.format(k=int(share * 2**32))
    _ip("link", "add", sink, "type", "veth", "peer", "name", f"{veth[:13]}q")
    try:
        with contextlib.suppress(ValueError, IndexError, KeyError):
            _ip("link", "set", sink, "alias", json.loads(alias)[0]["ifalias"], check=False)
        _run(["tc", "qdisc", "add", "dev", veth, "clsact"])
        for way in ("ingress", "egress"):
            _run(["tc", "filter", "add", "dev", veth, way, "bpf", "bytecode", prog,
                  "action", "mirred", "egress", "redirect", "dev", sink])
        yield
    finally:
        _run(["tc", "qdisc", "del", "dev", veth, "clsact"], check=False)
        _ip("link", "del", sink, check=False)


@contextlib.contextmanager
def power_off(netns: str, keep: Sequence[int] = ()) -> Iterator[None]:
    """A silent power loss of a lab host: its link goes down and every process in it dies
    (but `keep`, its sshd say, so it can come back), with no FIN or RST to anyone. The
    link comes back on exit."""
    with partition(netns):
        cp = _ip("netns", "pids", netns, check=False)
        for pid in (int(x) for x in cp.stdout.split() if x.isdigit()):
            if pid not in keep:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        yield


def cleanup_stale(prefix: str = "tfo") -> list[str]:
    """Remove namespaces/links left by *dead* processes of earlier runs."""
    removed: list[str] = []
    cp = _ip("netns", "list", check=False)
    for line in cp.stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        parts = ns.split("-")
        if (ns.startswith(f"{prefix}-lab") and len(parts) >= 4 and parts[-2].isdigit()
                and not alive(int(parts[-2]))):
            _kill_netns_pids(ns)
            _ip("netns", "del", ns, check=False)
            removed.append(f"netns {ns}")
    cp = _ip("-j", "link", "show", check=False)
    try:
        links = json.loads(cp.stdout or "[]")
    except ValueError:
        links = []
    for link in links:
        alias = link.get("ifalias", "")
        if alias.startswith(f"{_ALIAS_PREFIX} {prefix} pid="):
            pid = alias.rsplit("=", 1)[1]
            if pid.isdigit() and not alive(int(pid)):
                _ip("link", "del", link["ifname"], check=False)
                removed.append(f"link {link['ifname']}")
    return removed


# -------------------------------------------------------------------- lab hosts


@contextlib.contextmanager
def lab_hosts(workdir, prefix: str = "tfo", count: int = 2,
              subnet: ipaddress.IPv4Network = LAB_SUBNET, **sshd_kwargs
              ) -> Iterator[list[SshHost]]:
    """Two (or `count`) namespaces, each running sshd on <addr>:22 with sshd's stock limits
    (MaxSessions 10, MaxStartups 10:30:100), as a lab machine has them.

    All hosts share one client key / wrong key / authorized_keys and one
    known_hosts file containing every host's (distinct) host key.
    """
    ensure_openssh()
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    keys = make_keys(wd / "keys")
    known_hosts = wd / "known_hosts"
    known_hosts.write_text("")
    with lab_network(prefix, count=count, subnet=subnet) as net, \
            contextlib.ExitStack() as stack:
        hosts = []
        for i, (ns, addr) in enumerate(net, start=1):
            name = f"lab{i}"
            hk = make_host_key(wd / name)
            hosts.append(stack.enter_context(start_sshd(
                wd / name, address=addr, port=22, netns=ns, name=name, keys=keys,
                host_key=hk, known_hosts=known_hosts, **sshd_kwargs)))
        yield hosts


# ---------------------------------------------------------------------- clients


def fabric_connection(host: SshHost, *, key: str | None = None,
                      connect_timeout: float = 10, strict: bool = True, **kwargs):
    """fabric.Connection to `host` with host-key checking against host.known_hosts.

    Agent and ~/.ssh keys are disabled so only `key` (default host.key) is tried.
    """
    import fabric
    import paramiko

    ck = dict(kwargs.pop("connect_kwargs", {}) or {})
    ck.setdefault("key_filename", key or host.key)
    ck.setdefault("look_for_keys", False)
    ck.setdefault("allow_agent", False)
    ck.setdefault("banner_timeout", connect_timeout)
    ck.setdefault("auth_timeout", connect_timeout)
    conn = fabric.Connection(host.address, user=host.user, port=host.port,
                             connect_timeout=connect_timeout, connect_kwargs=ck,
                             **kwargs)
    if strict:
        conn.client.load_host_keys(host.known_hosts)
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return conn


def ssh_argv(host: SshHost, *, key: str | None = None,
             connect_timeout: int = 10) -> list[str]:
    """argv prefix for the OpenSSH CLI client with strict host-key checking."""
    return ["ssh", "-F", "/dev/null", "-i", key or host.key, "-p", str(host.port),
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={host.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={int(connect_timeout)}",
            f"{host.user}@{host.address}"]
