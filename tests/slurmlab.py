"""A private Slurm cluster for the tests: munged, slurmctld and two slurmd "nodes".

    ensure_slurm()                          # apt-get install slurmctld slurmd slurm-client munge
    with slurm_lab(tmp_dir) as lab:         # node1, node2 on 10.201.0.11, .12
        subprocess.run(["srun", "-N2", "hostname"], env=lab.env())

Each node is a network namespace of sshlab.lab_network (on its own subnet, 10.201.0.0/24)
and a UTS namespace with the node's hostname; the nodes resolve each other by name through
/etc/netns/<ns>/hosts.
slurmctld and munged run in the root namespace (the coordinator's), on the bridge's address;
srun's I/O reaches the nodes over the bridge, and they connect back to it there. Every
daemon is stopped by pid; the namespaces, hosts files and cgroups are removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tests import sshlab
from tests.procs import alive
from tests.sshlab import SshLabError

SUBNET = ipaddress.ip_network("10.201.0.0/24")
GATEWAY = str(SUBNET.network_address + 1)
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun", "/usr/sbin/munged")
NODES = ("node1", "node2")
PARTITION = "lab"
CPUS_PER_NODE = 4  # more than the machine has, on purpose: tasks of a job share a node
_install_lock = threading.Lock()


class SlurmLabError(SshLabError):
    """The Slurm lab could not be set up."""


def slurm_installed() -> bool:
    return all(os.path.exists(b) for b in BINARIES)


def ensure_slurm() -> None:
    """Install Debian's Slurm and munge when missing (what `make slurm` does)."""
    with _install_lock:
        if not slurm_installed():
            sshlab.apt_install(list(PACKAGES))
        if not slurm_installed():
            raise SlurmLabError(f"apt-get install {' '.join(PACKAGES)} succeeded but one of "
                                f"{', '.join(BINARIES)} is missing")


@dataclasses.dataclass
class SlurmLab:
    workdir: Path
    conf: str  # SLURM_CONF: every Slurm command of the tests and of tfo reads it
    nodes: dict[str, str]  # node name → address
    netns: dict[str, str]  # node name → network namespace
    partition: str = PARTITION
    pids: dict[str, int] = dataclasses.field(default_factory=dict)  # daemon → pid
    start_seconds: float = 0.0

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.conf, **extra}

    def run(self, *argv: str, timeout: float = 15) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def jobs(self) -> list[str]:
        """`squeue`: the jobs still queued or running, as 'id state name'."""
        cp = self.run("squeue", "-h", "-o", "%i %T %j")
        if cp.returncode != 0:
            raise SlurmLabError(f"squeue failed: {cp.stderr.strip()}")
        return cp.stdout.split("\n")[:-1]

    def job_state(self, job_id: str) -> str:
        """The controller's record of a job (kept MinJobAge seconds after it ended)."""
        cp = self.run("scontrol", "-o", "show", "job", job_id)
        for field in cp.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "UNKNOWN"

    def node_processes(self, node: str) -> list[int]:
        """Every pid in the node's namespace but its slurmd."""
        cp = subprocess.run(["ip", "netns", "pids", self.netns[node]], capture_output=True,
                            text=True, timeout=10)
        return [int(p) for p in cp.stdout.split() if p.isdigit()
                and int(p) != self.pids.get(f"slurmd-{node}")]

    def clients(self) -> list[int]:
        """Live salloc and srun processes that talk to this lab (a leak, once a run ended)."""
        found = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() not in ("salloc", "srun"):
                        continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if f"SLURM_CONF={self.conf}".encode() in f.read().split(b"\0") \
                            and alive(int(entry)):
                        found.append(int(entry))
            except (OSError, ValueError):
                continue
        return found

    def log(self, daemon: str) -> str:
        return sshlab._tail(self.workdir / f"{daemon}.log", 60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _write_conf(wd: Path, ctl_port: int, munge_socket: Path, nodes: dict[str, str]) -> Path:
    short = socket.gethostname().split(".")[0]
    names = ",".join(nodes)
    lines = [
        "ClusterName=tfolab",
        f"SlurmctldHost={short}({GATEWAY})",
        f"SlurmctldPort={ctl_port}",
        "SlurmdPort=6818",  # each node has its own network namespace
        "AuthType=auth/munge",
        f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={wd}/state",
        f"SlurmdSpoolDir={wd}/spool-%n",
        f"SlurmctldPidFile={wd}/slurmctld.pid",
        f"SlurmdPidFile={wd}/slurmd-%n.pid",
        f"SlurmctldLogFile={wd}/slurmctld.log",
        f"SlurmdLogFile={wd}/slurmd-%n.log",
        "SlurmdParameters=config_overrides",  # the nodes' CPUs as written here
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "MpiDefault=none",
        "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=300",
        "SlurmdTimeout=30",
        "SlurmctldTimeout=30",
        "MessageTimeout=5",
        *(f"NodeName={n} NodeHostname={n} NodeAddr={a} CPUs={CPUS_PER_NODE} State=UNKNOWN"
          for n, a in nodes.items()),
        f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP",
    ]
    conf = wd / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    # proctrack/cgroup: every process of a step in its own freezer cgroup, found and killed
    # on scancel however it detached (setsid, double fork).
    (wd / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
    return conf


@contextlib.contextmanager
def _hosts_entries(netns: list[str], nodes: dict[str, str]) -> Iterator[None]:
    """The nodes' names, in each namespace's hosts file: `ip netns exec` binds
    /etc/netns/<ns>/hosts over /etc/hosts. (The coordinator needs none: slurmctld knows the
    nodes' addresses, and srun asks it.)"""
    table = "".join(f"{a} {n}\n" for n, a in nodes.items())
    made = []
    try:
        for ns in netns:
            d = Path("/etc/netns") / ns
            d.mkdir(parents=True, exist_ok=True)
            made.append(d)
            (d / "hosts").write_text(f"127.0.0.1 localhost\n{table}")
        yield
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)


def cleanup_stale() -> list[str]:
    """What a killed test run left: its namespaces and links, cgroups, hosts files."""
    removed = sshlab.cleanup_stale("tfoslurm")
    for d in FREEZER.glob("tfolab-*"):
        pid = d.name.split("-")[1]
        if pid.isdigit() and not alive(int(pid)):
            _remove_cgroup(d)
            removed.append(f"cgroup {d}")
    for d in Path("/etc/netns").glob("tfoslurm-*"):
        if not (Path("/run/netns") / d.name).exists():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(f"{d}")
    return removed


FREEZER = Path("/sys/fs/cgroup/freezer")


def _node_cgroup(node: str) -> Path:
    """The node's own freezer cgroup: both slurmds share this machine's hierarchy, and
    each must see only its own steps (job 5's step 0 on node1 and on node2 are one path)."""
    path = FREEZER / f"tfolab-{os.getpid()}-{node}"
    path.mkdir(exist_ok=True)
    return path


def _remove_cgroup(path: Path) -> None:
    """rmdir, deepest first: a cgroup directory goes only once it has no children."""
    for d in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


def _node_shell(node: str, cgroup: Path, conf: Path) -> str:
    """What runs in the node's namespaces: `ip netns exec` mounted a fresh /sys there, without
    the cgroup mounts; proctrack/cgroup needs the freezer one, so the node's own cgroup is
    mounted where Slurm looks for it. Then its hostname, then slurmd as that node."""
    return (f"mount -t tmpfs tfolab /sys/fs/cgroup && mkdir /sys/fs/cgroup/freezer "
            f"/sys/fs/cgroup/.all && mount -t cgroup -o freezer freezer /sys/fs/cgroup/.all && "
            f"mount --bind /sys/fs/cgroup/.all/{cgroup.name} /sys/fs/cgroup/freezer && "
            f"umount /sys/fs/cgroup/.all && hostname {node} && "
            f"exec /usr/sbin/slurmd -D -N {node} -f {conf}")


def _node_idle(lab: SlurmLab, node: str) -> bool:
    cp = lab.run("sinfo", "-h", "-n", node, "-o", "%t")
    return cp.stdout.strip() == "idle"


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, env=env)


def _wait(what: str, ready, proc: subprocess.Popen, log: Path, timeout: float) -> None:  # noqa: ANN001
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise SlurmLabError(f"{what} exited (rc={proc.returncode})\n{sshlab._tail(log)}")
        if ready():
            return
        time.sleep(0.05)
    raise SlurmLabError(f"{what} not ready after {timeout:g} s\n{sshlab._tail(log)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextlib.contextmanager
def slurm_lab(workdir: Path | str, start_timeout: float = 30.0) -> Iterator[SlurmLab]:
    """munged, slurmctld and a slurmd per node, all up and the nodes idle; torn down after."""
    ensure_slurm()
    cleanup_stale()
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with sshlab.lab_network("tfoslurm", count=len(NODES), subnet=SUBNET) as net, \
            contextlib.ExitStack() as stack:
        nodes = {name: addr for name, (_, addr) in zip(NODES, net, strict=True)}
        netns = {name: ns for name, (ns, _) in zip(NODES, net, strict=True)}
        stack.enter_context(_hosts_entries(list(netns.values()), nodes))
        munge_socket = wd / "munge.sock"
        key = wd / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        conf = _write_conf(wd, _free_port(), munge_socket, nodes)
        for d in ("state", *(f"spool-{n}" for n in nodes)):
            (wd / d).mkdir(exist_ok=True)
        env = {**os.environ, "SLURM_CONF": str(conf)}
        lab = SlurmLab(wd, str(conf), nodes, netns)
        procs: list[subprocess.Popen] = []
        stack.callback(lambda: [_stop(p) for p in reversed(procs)])

        munged = _spawn(["/usr/sbin/munged", "--foreground", "--force",
                         f"--socket={munge_socket}", f"--key-file={key}",
                         f"--pid-file={wd}/munged.pid", f"--log-file={wd}/munged.log",
                         f"--seed-file={wd}/munged.seed"], wd / "munged.out", env)
        procs.append(munged)
        lab.pids["munged"] = munged.pid
        _wait("munged", munge_socket.exists, munged, wd / "munged.log", start_timeout)

        ctld = _spawn(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf)],
                      wd / "slurmctld.out", env)
        procs.append(ctld)
        lab.pids["slurmctld"] = ctld.pid
        _wait("slurmctld", lambda: lab.run("scontrol", "ping").returncode == 0, ctld,
              wd / "slurmctld.log", start_timeout)

        daemons = {}
        for name, ns in netns.items():
            # Its own hostname (a UTS namespace) in its own network namespace.
            cgroup = _node_cgroup(name)
            stack.callback(_remove_cgroup, cgroup)
            d = daemons[name] = _spawn(["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
                                        _node_shell(name, cgroup, conf)],
                                       wd / f"slurmd-{name}.out", env)
            procs.append(d)
            lab.pids[f"slurmd-{name}"] = d.pid
        for name in nodes:
            _wait(f"slurmd on {name}", lambda n=name: _node_idle(lab, n),
                  daemons[name], wd / f"slurmd-{name}.log", start_timeout)
        lab.start_seconds = time.monotonic() - t0
        try:
            yield lab
        finally:
            lab.run("scancel", "--full", "-u", "root")  # a test's leftover, if any
            sshlab._terminate_pids(lab.clients())
