"""Before anything starts: can every host run its tasks? (`tfo check`, and `tfo run` first.)

    rows = backends.check(plan)       # each backend's HostChecks, then same_versions(rows)
    [p for row in rows for p in row.problems]

Per host: reachable, authenticated, python found, tensorflow and tf_keras installed and their
versions (the same everywhere), the task ports free, the workdir writable; and its cores and
available memory (`warm_spares: auto` asks them). Nothing here imports TensorFlow: versions
come from package metadata. The backends call these; this module knows no backend.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.console import printable
from orchestrator.launch import BackendError
from orchestrator.launch.gpus import GpuReport, local_gpus, remote_gpus
from orchestrator.launch.hostagent import refused
from orchestrator.launch.ports import port_problem
from orchestrator.plan import TaskPlan
from orchestrator.spec import LOCALHOST, HostSpec

TF_PACKAGES = ("tensorflow", "tf_keras")

# Runs on the host with its own python: versions, ports, workdir; prints one JSON line.
_PROBE = """
import json, os, socket, sys, tempfile
from importlib import metadata
def mem_available():  # bytes; what psutil.virtual_memory().available says on Linux
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
def ver(name):
    try:
        return metadata.version(name)
    except Exception:
        return None
ports, workdir = json.loads(sys.argv[1]), os.path.expanduser(sys.argv[2])
busy = []
for port in ports:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
    except OSError:
        busy.append(port)
    finally:
        s.close()
try:
    os.makedirs(workdir, exist_ok=True)
    tempfile.TemporaryFile(dir=workdir).close()
    writable = None
except OSError as e:
    writable = f"{e.strerror}: {workdir}"
print(json.dumps({"python": sys.version.split()[0], "tensorflow": ver("tensorflow"),
                  "tf_keras": ver("tf_keras"), "busy": busy, "workdir_error": writable,
                  "cpus": os.cpu_count(), "mem_available": mem_available()}))
"""


@dataclass
class HostCheck:
    host: str
    address: str
    reachable: bool = False
    python: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    gpus: GpuReport | None = None  # what nvidia-smi -L reports there
    cpus: int | None = None
    mem_available: int | None = None  # bytes
    sessions: int | None = None  # SSH sessions tfo holds there at most at once (its agent's)
    problems: list[str] = field(default_factory=list)


def check_local(tasks: list[TaskPlan]) -> HostCheck:
    """This machine's row. Whether TensorFlow is installed is asked of the import system
    (0.1 ms); its version, of package metadata (`local_versions`: importlib.metadata costs
    0.01-0.02 s to import), only where it is compared or shown. `tfo plan` checks nothing."""
    import psutil

    row = HostCheck(LOCALHOST, "127.0.0.1", reachable=True, python=sys.version.split()[0],
                    cpus=os.cpu_count(), mem_available=psutil.virtual_memory().available)
    row.ports = [t.port for t in tasks]
    row.gpus = local_gpus()
    for name in TF_PACKAGES:
        if importlib.util.find_spec(name) is None:
            row.problems.append(f"localhost: {name} is not installed for {sys.executable}")
    for t in tasks:
        if p := port_problem(t.port):
            row.problems.append(f"{t.name} (localhost:{t.port}): {p}")
    return row


def local_versions(row: HostCheck) -> None:
    """The versions of TF_PACKAGES installed here, into this machine's row."""
    from importlib import metadata

    for name in TF_PACKAGES:
        try:
            row.versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            row.versions[name] = None


def check_remote(name: str, h: HostSpec, tasks: list[TaskPlan],
                 connect: Callable[[], Any]) -> HostCheck:
    """`connect()` gives the host's open fabric Connection, or raises BackendError."""
    row = HostCheck(name, h.address)
    row.ports = [t.port for t in tasks]
    try:
        conn = connect()
    except BackendError as e:
        row.problems.append(str(e))
        return row
    row.reachable = True
    cmd = (f"{shlex.quote(h.python)} -c {shlex.quote(_PROBE)} "
           f"{shlex.quote(json.dumps(row.ports))} {shlex.quote(h.workdir)}")
    try:
        res = conn.run(cmd, hide=True, warn=True, in_stream=False, timeout=60)
    except Exception as e:  # noqa: BLE001 - any failure is this host's problem to report
        import paramiko  # loaded: the connection is paramiko's

        refusal = isinstance(e, paramiko.ChannelException)
        row.problems.append(str(refused(name, h.address, e)) if refusal
                            else f"host {name}: probe failed: {e}")
        return row
    if res.exited == 127 or "No such file" in res.stderr or "not found" in res.stderr:
        # What the host said (exit and last line): a "not found" can be something else.
        said = res.stderr.strip().splitlines()[-1:] or [""]
        row.problems.append(f"host {name}: python {h.python!r} not found; set hosts.{name}.python "
                            f"to an interpreter that has tensorflow (exit {res.exited}: "
                            f"{printable(said[0][:200])})")
        return row
    try:
        probe = json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        row.problems.append(f"host {name}: {h.python} failed: {res.stderr.strip()[-300:]}")
        return row
    row.python = probe["python"]
    row.cpus, row.mem_available = probe.get("cpus"), probe.get("mem_available")
    row.gpus = remote_gpus(conn)
    for pkg in TF_PACKAGES:
        row.versions[pkg] = probe[pkg]
        if probe[pkg] is None:
            row.problems.append(f"host {name}: {pkg} is not installed for {h.python}")
    for port in probe["busy"]:
        task = next(t.name for t in tasks if t.port == port)
        row.problems.append(f"{task} ({name}:{port}): port {port} is in use on {h.address}")
    if probe["workdir_error"]:
        row.problems.append(f"host {name}: workdir not writable: {probe['workdir_error']} "
                            f"(hosts.{name}.workdir)")
    return row


def same_versions(rows: list[HostCheck], shown: bool = False) -> list[HostCheck]:
    """The same TensorFlow everywhere: mixed versions break collectives and checkpoints.
    This machine's are looked up here, where there are others to compare, or to be shown."""
    if shown or len(rows) > 1:
        for r in rows:
            if r.host == LOCALHOST and not r.versions:
                local_versions(r)
    for pkg in TF_PACKAGES:
        seen = {r.versions.get(pkg) for r in rows if r.versions.get(pkg)}
        if len(seen) > 1:
            for r in rows:
                if r.versions.get(pkg):
                    r.problems.append(f"host {r.host}: {pkg} {r.versions[pkg]} differs from "
                                      f"other hosts ({', '.join(sorted(seen))})")
    return rows
