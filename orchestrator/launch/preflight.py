"""Before anything starts: can every host run its tasks? (`tfo check`, and `tfo run` first.)

    rows = backends.check(plan)       # each backend's HostChecks, then same_versions(rows)
    [p for row in rows for p in row.problems]

Per host: reachable, authenticated, python found, tensorflow and tf_keras installed and their
versions (the same everywhere), the task ports free, the workdir writable; and its cores and
available memory (`warm_spares: auto` asks them). Each training task's profiler port
(`TaskPlan.profiler_port`) is checked free on its host too, in the same probe: one taken is a
note (`HostCheck.notes`), not a problem, as at run time it costs the task its profiler, not
its training. Nothing here imports TensorFlow: versions come from package metadata. The
backends call these; this module knows no backend.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.launch import BackendError, HostCheck
from orchestrator.launch.gpus import TIMEOUT_SECONDS as GPU_SECONDS
from orchestrator.launch.gpus import local_gpus
from orchestrator.launch.gpus import parse as parse_gpus
from orchestrator.launch.ports import port_problem
from orchestrator.launch.printable import printable
from orchestrator.launch.ssh.hostagent import SshError, exports
from orchestrator.launch.ssh.remote import PROBE_SECONDS, close_channel, open_command
from orchestrator.planning.plan import TaskPlan
from orchestrator.planning.spec import LOCALHOST, HostSpec
from worker_entry import portlocks

TF_PACKAGES = ("tensorflow", "tf_keras")

# Runs on the host with its own python: the job's ports reserved (worker_entry/portlocks.py's
# source comes first: the probe holds them, and so does the agent it may become), versions,
# ports, workdir, cores, memory, GPUs (its nvidia-smi -L), and the job's files already in the
# workdir (their names on stdin, as JSON) with its free space: one command where there were
# four (the sync's own question too).
_PROBE = Path(portlocks.__file__).read_text() + """
import json, os, shutil, socket, subprocess, sys, tempfile
from importlib import metadata
def gpus(timeout):
    found = shutil.which("nvidia-smi")
    if found is None:
        return [127, "", "nvidia-smi: not found"]
    try:
        done = subprocess.run([found, "-L"], capture_output=True, text=True, errors="replace",
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [124, "", "no answer in %g s" % timeout]
    except OSError as e:
        return [126, "", str(e)]
    return [done.returncode, done.stdout[-65536:], done.stderr[-4096:]]
def files_there(names):
    there = {}
    for name in names:
        try:
            st = os.stat(name)
        except OSError:
            continue
        there[name] = [st.st_size, int(st.st_mtime), st.st_mode & 0o777]
    try:
        vfs = os.statvfs(".")
        free = vfs.f_bavail * vfs.f_frsize
    except OSError:
        free = None
    return {"root": os.getcwd(), "free": free, "there": there}
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
asked = json.loads(sys.stdin.readline() or "{}")
reservations = Reservations(asked.get("owner") or owner_line(None, None))
reserved = reservations.reserve_all(ports)
def bindable(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()
busy = [port for port in ports if port not in reserved and not bindable(port)]
profiler_busy = [port for port in asked.get("profiler_ports", []) if not bindable(port)]
code = None
try:
    os.makedirs(workdir, exist_ok=True)
    tempfile.TemporaryFile(dir=workdir).close()
    writable = None
    if asked.get("files") is not None:
        os.chdir(workdir)
        code = files_there(asked["files"])
except OSError as e:
    writable = f"{e.strerror}: {workdir}"
print(json.dumps({"python": sys.version.split()[0], "tensorflow": ver("tensorflow"),
                  "tf_keras": ver("tf_keras"), "busy": busy, "workdir_error": writable,
                  "cpus": os.cpu_count(), "mem_available": mem_available(),
                  "gpus": gpus(asked.get("gpu_seconds", 20)), "code": code,
                  "reserved": reserved, "profiler_busy": profiler_busy}), flush=True)
# Told `agent SECONDS` (its code is there, unchanged), this python becomes the host's agent:
# one interpreter start and one session less per host. EOF, or no word in time: done.
import select
if select.select([0], [], [], asked.get("agent_wait", 0))[0]:
    word = sys.stdin.readline().split()
    if word[:1] == ["agent"] and code is not None:
        os.chdir(code["root"])
        from worker_entry import agent
        agent.main(word[1:], reservations)
reservations.close()
"""
AGENT_WAIT_SECONDS = 600.0  # a probe waits this long to become its host's agent


def run_owner(tasks: list[TaskPlan]) -> str:
    """What the job's port reservations say of it: its run, run directory, tfo's pid."""
    return portlocks.owner_of(tasks[0].env if tasks else {})


def reserved_problem(task: str, where: str, port: int, holder: str) -> str:
    return (f"{task} ({where}:{port}): port {port} is reserved by {holder}, which may be "
            f"between two attempts of its task; wait for it to end, or give another port")


def profiler_note(task: str, where: str, port: int, why: str) -> str:
    """A profiler's port taken: the task trains, without a profiler (not a problem: the run
    starts; worker_entry/profiler.py says it in the task's log too)."""
    return (f"{task} ({where}:{port}): its profiler's port {port} {why}: the task will train "
            "without a profiler (tfo profile cannot capture it)")


def check_local(tasks: list[TaskPlan], reserved: Mapping[int, str] | None = None) -> HostCheck:
    """This machine's row; `reserved`, the ports another live tfo job holds (local.py).
    Whether TensorFlow is installed is asked of the import system (0.1 ms); its version, of
    package metadata (`local_versions`: importlib.metadata costs 0.01-0.02 s to import), only
    where it is compared or shown. `tfo plan` checks nothing."""
    import psutil

    row = HostCheck(LOCALHOST, "127.0.0.1", reachable=True, python=sys.version.split()[0],
                    cpus=os.cpu_count(), mem_available=psutil.virtual_memory().available)
    row.ports = [t.port for t in tasks]
    row.gpus = local_gpus()
    for name in TF_PACKAGES:
        if importlib.util.find_spec(name) is None:
            row.problems.append(f"localhost: {name} is not installed for {sys.executable}")
    for t in tasks:
        if reserved and t.port in reserved:
            row.problems.append(reserved_problem(t.name, LOCALHOST, t.port, reserved[t.port]))
        elif p := port_problem(t.port):
            row.problems.append(f"{t.name} (localhost:{t.port}): {p}")
        if t.profiler_port is not None and (p := port_problem(t.profiler_port)):
            row.notes.append(profiler_note(t.name, LOCALHOST, t.profiler_port,
                                           p.removeprefix(f"port {t.profiler_port} ")))
    return row


def local_versions(row: HostCheck) -> None:
    """The versions of TF_PACKAGES installed here, into this machine's row."""
    from importlib import metadata

    for name in TF_PACKAGES:
        try:
            row.versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            row.versions[name] = None


def check_remote(name: str, h: HostSpec, tasks: list[TaskPlan], connect: Callable[[], Any],
                 files: list[str] | None = None, env: Mapping[str, str] | None = None
                 ) -> tuple[HostCheck, dict | None, Any]:
    """`connect()` gives the host's open fabric Connection, or raises BackendError. One
    command (_PROBE) asks everything; with `files` (paths relative to the workdir) it says
    which are there and the workdir's free space too. The row, that answer (or None), and
    the probe's channel, still open where it answered with no problem: told `agent`, that
    python (started with `env`, the agent's startup variables) becomes the host's agent."""
    row = HostCheck(name, h.address)
    row.ports = [t.port for t in tasks]
    try:
        conn = connect()
    except BackendError as e:
        row.problems.append(str(e))
        return row, None, None
    row.reachable = True
    cmd = (f"{exports(env)}exec {shlex.quote(h.python)} -c {shlex.quote(_PROBE)} "
           f"{shlex.quote(json.dumps(row.ports))} {shlex.quote(h.workdir)}")
    wait = AGENT_WAIT_SECONDS if files is not None else 0
    asked = json.dumps({"files": files, "gpu_seconds": GPU_SECONDS, "agent_wait": wait,
                        "owner": run_owner(tasks), "profiler_ports": [
                            t.profiler_port for t in tasks if t.profiler_port is not None]})
    try:
        chan, status, out, err = open_command(
            conn, cmd, (asked + "\n").encode(), h.connect_timeout_seconds + PROBE_SECONDS,
            name=name)
    except SshError as e:  # a refused session, said so with the setting to change
        row.problems.append(str(e))
        return row, None, None
    except Exception as e:  # noqa: BLE001 - any failure is this host's problem to report
        row.problems.append(f"host {name}: probe failed: {e or type(e).__name__}")
        return row, None, None
    probe = _read_probe(name, h, row, tasks, (chan, status, out, err))
    if probe is None or row.problems or probe.get("code") is None:
        close_channel(chan)
        return row, probe and probe.get("code"), None
    return row, probe["code"], chan


def _read_probe(name: str, h: HostSpec, row: HostCheck, tasks: list[TaskPlan],
                answer: tuple[Any, int | None, str, str]) -> dict | None:
    """The probe's answer (open_command's) into `row`, its problems named; the answer, or
    None."""
    chan, status, out, err = answer
    if chan is None and status is None:
        row.problems.append(f"host {name}: probe failed: no answer in "
                            f"{h.connect_timeout_seconds + PROBE_SECONDS:g} s")
        return None
    if chan is None and (status == 127 or "No such file" in err or "not found" in err):
        # What the host said (exit and last line): a "not found" can be something else.
        said = err.strip().splitlines()[-1:] or [""]
        row.problems.append(f"host {name}: python {h.python!r} not found; set hosts.{name}.python "
                            f"to an interpreter that has tensorflow (exit {status}: "
                            f"{printable(said[0][:200])})")
        return None
    try:
        probe = json.loads(out.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        row.problems.append(f"host {name}: {h.python} failed: {err.strip()[-300:]}")
        return None
    row.python = probe["python"]
    row.cpus, row.mem_available = probe.get("cpus"), probe.get("mem_available")
    row.gpus = parse_gpus(*probe["gpus"])
    for pkg in TF_PACKAGES:
        row.versions[pkg] = probe[pkg]
        if probe[pkg] is None:
            row.problems.append(f"host {name}: {pkg} is not installed for {h.python}")
    for port, holder in probe.get("reserved", {}).items():
        task = next(t.name for t in tasks if t.port == int(port))
        row.problems.append(reserved_problem(task, name, int(port), printable(holder[:300])))
    for port in probe["busy"]:
        task = next(t.name for t in tasks if t.port == port)
        row.problems.append(f"{task} ({name}:{port}): port {port} is in use on {h.address}")
    for port in probe.get("profiler_busy", []):
        task = next(t.name for t in tasks if t.profiler_port == port)
        row.notes.append(profiler_note(task, name, port, f"is in use on {h.address}"))
    if probe["workdir_error"]:
        row.problems.append(f"host {name}: workdir not writable: {probe['workdir_error']} "
                            f"(hosts.{name}.workdir)")
    return probe


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
