"""Tasks on lab machines over SSH (fabric; placement kind `ssh`), with the same handle
interface as local ones.

    hosts = SshBackend(spec.hosts)             # one fabric Connection per host, opened lazily
    hosts.sync(plan, tasks)                    # copy the job's code, skipping unchanged files
    handles = hosts.start_batch(items)         # each host's tasks in one request to its agent
    handle = hosts.start(task, attempt=0)      # poll(), lines(), terminate(), kill()
    hosts.standby(task, attempt=1)             # a warm spare on the task's host (spares.py)
    hosts.close()

A host's tasks run under one agent (`python -m worker_entry.agent`, over one SSH session;
launch/hostagent.py is our end): it forks each task's wrapper in a session of its own and
carries their output, exits, signals, stacks requests and standbys' GO as frames over its
channel. So tfo holds at most 2 sessions on a host at once (the agent's; the code sync's
sftp or a partial file's removal before it), whatever the tasks, standbys and restarts:
sshd's stock `MaxSessions` is 10. A session sshd refuses anyway is said so, with the
setting to change (`hostagent.refused`). Nothing from the spec reaches a shell but the
host's python and workdir, quoted; a task's command and environment travel as JSON.

The lifeline runs both ways, per host: the coordinator sends a BEAT frame every
HEARTBEAT_SECONDS, the agent one back. The agent stops its tasks (it closes their wrappers'
stdin) when the channel closes or goes quiet for the host's `lifeline_seconds` (a dropped
connection or a cut network, even where sshd sends no keepalives); the coordinator counts
every task of a host lost when nothing came from it that long: `lost contact with lab2: no
heartbeat for 30 s`.

Every remote call is bounded by the host's `connect_timeout_seconds` (paramiko's own waits
for a channel or a command's start are an hour, or forever): a call that gets no answer in
time drops the host's connection (`_bounded`), and the next use connects again, which says
whether the host can be reached. A lost host's connection is dropped too: its transport is
not reused. Per-host work (checks, the code sync, starting a batch, closing) runs for all
hosts at once, FAN_OUT at a time.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from orchestrator.launch import BackendError, HostBackend, TaskHandle, answered
from orchestrator.launch.gpus import GpuReport, remote_gpus
from orchestrator.launch.hostagent import (
    AgentTask,
    HostAgent,
    SshError,
    _remote_path,
    refused,
)
from orchestrator.launch.ports import free_ports
from orchestrator.launch.preflight import HostCheck, check_remote
from orchestrator.launch.spares import Spares
from orchestrator.plan import Plan, TaskPlan
from orchestrator.rundir import RUNS
from orchestrator.spec import HostSpec, SpecError

if TYPE_CHECKING:  # fabric and paramiko cost 0.16 s to import: only when a host is reached
    import fabric
    import paramiko

SESSIONS = 2  # at most at once on a host, whatever its tasks: the agent's, and one more
FAN_OUT = 64  # hosts worked on at once: 500 hosts do not open 500 connections in an instant
PROBE_SECONDS = 60.0  # a command's own run on the host (the preflight's probe, a mkdir)
_TRANSPORT_WAKE_SECONDS = 1.0  # paramiko's own: 0.1 (its close does not wait for it)
T = TypeVar("T")
_SKIP_DIRS = {"__pycache__", ".git", ".venv", RUNS, ".pytest_cache", ".ruff_cache"}


def _bounded(call: Callable[[], T], timeout: float, what: str,
                give_up: Callable[[], None]) -> T:
    """`call()` in a daemon thread, waited for `timeout` s: paramiko waits an hour for a
    channel and forever for a command's start over a silent network. On time out
    `give_up()` (drop the connection: that ends the call) and SshError(what). The wait is
    a join, so a signal's handler still runs (and may raise) at once."""
    result: list = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            error.append(e)

    thread = threading.Thread(target=run, name="ssh-call", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        give_up()
        raise SshError(f"{what}: no answer in {timeout:g} s; dropped the connection")
    if error:
        raise error[0]
    return result[0]


def connect(name: str, host: HostSpec) -> fabric.Connection:
    """An open, authenticated connection; host keys checked unless the spec opts out."""
    import fabric
    import paramiko

    timeout = host.connect_timeout_seconds
    kwargs: dict = {"look_for_keys": host.key is None, "allow_agent": host.key is None,
                    "banner_timeout": timeout, "auth_timeout": timeout}
    if host.key:
        kwargs["key_filename"] = os.path.expanduser(host.key)
    conn = fabric.Connection(host.address, user=host.user, port=host.port,
                             connect_timeout=timeout, connect_kwargs=kwargs)
    # fabric always auto-adds unknown host keys; we check them unless told not to.
    if host.check_host_key:
        known = os.path.expanduser(host.known_hosts or "~/.ssh/known_hosts")
        with contextlib.suppress(FileNotFoundError):
            conn.client.load_host_keys(known)
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        conn.open()
    except paramiko.BadHostKeyException:
        raise SshError(f"host {name} ({host.address}): its host key does not match "
                       f"known_hosts; if the machine was reinstalled, update known_hosts") from None
    except paramiko.AuthenticationException:
        raise SshError(f"host {name} ({host.address}): authentication failed for user "
                       f"{host.user or '(default)'} with key {host.key or '(agent/default)'}"
                       ) from None
    except paramiko.SSHException as e:
        if "not found in known_hosts" in str(e):
            raise SshError(f"host {name} ({host.address}): unknown host key; add it with "
                           f"`ssh-keyscan -p {host.port} {host.address} >> ~/.ssh/known_hosts` "
                           f"or set check_host_key: false") from None
        raise SshError(f"host {name} ({host.address}): SSH error: {e}") from None
    except (OSError, EOFError) as e:
        why = e.strerror or str(e) or type(e).__name__
        raise SshError(f"host {name} ({host.address}:{host.port}): unreachable: tried to "
                       f"connect for {timeout:g} s (connect_timeout_seconds): {why}") from None
    transport = conn.client.get_transport()
    if transport is not None:  # its thread looks for a close every 0.1 s, idle or not: 1 s
        transport.sock.settimeout(_TRANSPORT_WAKE_SECONDS)
    return conn


def _run_remote(conn: fabric.Connection, command: str, timeout: float,
                give_up: Callable[[], None] = lambda: None, name: str = ""
                ) -> tuple[int | None, str, str]:
    """A short command on the host, on a session of its own, bounded in time even over a
    cut network (fabric's `run` can wait an hour for a channel there, and its runner's
    threads cost more than the command here): (exit status, stdout, stderr); status None
    where it did not end in `timeout`. A session sshd refuses raises `refused`'s SshError."""
    import paramiko

    transport = conn.client.get_transport()
    if transport is None or not transport.is_active():
        raise SshError("connection lost")

    def run() -> tuple[int | None, str, str]:
        try:
            chan = transport.open_session(timeout=timeout)
        except paramiko.ChannelException as e:
            raise refused(name or conn.host, conn.host, e) from None
        try:
            chan.settimeout(timeout)
            chan.exec_command(command)
            out, err = chan.makefile("rb").read(), chan.makefile_stderr("rb").read()
            status = chan.recv_exit_status()  # comes after the output's end: bounded above
            return status, out.decode(errors="replace"), err.decode(errors="replace")
        except OSError:  # socket.timeout: no end in time
            return None, "", ""
        finally:
            chan.close()

    return _bounded(run, timeout + 1, "remote command", give_up)


def _remote_exec(conn: fabric.Connection, command: str, timeout: float = 5.0) -> int | None:
    """`_run_remote`'s exit status, or None (no answer, or no session)."""
    import paramiko

    try:
        return _run_remote(conn, command, timeout)[0]
    except (paramiko.SSHException, OSError, EOFError, SshError):
        return None


def job_packages(plan: Plan) -> list[tuple[Path, Path]]:
    """What a lab machine needs of the job's code, as (file or directory, the local directory
    that stands for the host's workdir): worker_entry, and the job's code directory (its
    contents) or the entry's or module's top-level package."""
    import worker_entry

    pkg = Path(worker_entry.__file__).parent
    pkgs = [(pkg, pkg.parent)]
    job, workdir = plan.spec.job, Path(plan.workdir)
    code = job.code_dir()
    if code is not None:
        path = workdir / code
        if not path.is_dir():
            raise SpecError(f"job.{'code' if job.code else job.kind}: {path} is not a directory "
                            "(the job's code, synced to the lab hosts)")
        return [*pkgs, (path, path)]
    top = job.package
    if top != "worker_entry":
        for candidate in (workdir / top, workdir / f"{top}.py"):
            if candidate.exists():
                pkgs.append((candidate, workdir))
                break
        else:
            raise SpecError(f"job.{job.kind}: package {top!r} not found in {workdir}; run tfo "
                            f"from the directory that holds it, or set job.code")
    return pkgs


class SshBackend(HostBackend):
    """The coordinator's connections to the lab machines named in the spec."""

    def __init__(self, hosts: Mapping[str, HostSpec]) -> None:
        self.hosts = hosts
        self._conns: dict[str, fabric.Connection] = {}
        self._lock = threading.Lock()
        self._connecting: dict[str, threading.Lock] = {}  # by host
        self._cancel = threading.Event()  # the code sync was interrupted
        self._partials: set[tuple[str, str]] = set()  # (host, file) being written now
        self._agents: dict[str, HostAgent] = {}
        self._planned: dict[str, tuple[tuple, str, list[tuple[Path, str, int]]]] = {}
        self._starting: dict[str, threading.Lock] = {}  # by host: one agent started at once
        self._spares = Spares(self._start_standby)

    def connection(self, name: str) -> fabric.Connection:
        """The host's open connection, made if need be. One connect per host at a time, and
        none under the backend's lock: `drop` and `close` never wait for a silent host."""
        with self._lock:
            connecting = self._connecting.setdefault(name, threading.Lock())
        with connecting:
            with self._lock:
                conn = self._conns.get(name)
            transport = conn.client.get_transport() if conn else None
            if conn is None or transport is None or not transport.is_active():
                conn = connect(name, self.hosts[name])
                with self._lock:
                    self._conns[name] = conn
            return conn

    def drop(self, name: str) -> None:
        """Never use the host's connection again: it lost a task or did not answer. Its
        tasks' channels end with it (lost); the next use connects again."""
        with self._lock:
            conn = self._conns.pop(name, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                _bounded(conn.close, 2.0, f"host {name}", lambda: None)

    def agent(self, name: str) -> HostAgent:
        """The host's live agent, started if need be (on a new connection where the last
        one was lost)."""
        with self._lock:
            starting = self._starting.setdefault(name, threading.Lock())
        with starting:
            agent = self._agents.get(name)
            if agent is not None and agent.alive:
                return agent
            host = self.hosts[name]
            transport = self.connection(name).client.get_transport()
            if transport is None or not transport.is_active():
                raise SshError(f"host {name}: connection lost")
            agent = _bounded(lambda: HostAgent(name, host, transport,
                                               lambda: self.drop(name)),
                             host.connect_timeout_seconds + 31,
                             f"host {name} ({host.address}): starting its agent",
                             lambda: self.drop(name))
            self._agents[name] = agent
            return agent

    def _start_standby(self, task: TaskPlan, attempt: int) -> AgentTask:
        answer = self._launch([(task, attempt, True)])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _launch(self, items: list[tuple[TaskPlan, int, bool]]) -> list[AgentTask | Exception]:
        """(task, attempt, standby) started, each host's in one request to its agent, all
        hosts at once; each answered in order."""
        by_host: dict[str, list[int]] = {}
        for i, (task, _, _) in enumerate(items):
            by_host.setdefault(task.host, []).append(i)

        def on_host(name: str) -> list[AgentTask | Exception]:
            try:
                agent = self.agent(name)
            except SshError as e:
                return [e] * len(by_host[name])
            return agent.start([items[i] for i in by_host[name]])

        answers: list[AgentTask | Exception | None] = [None] * len(items)
        for name, got in zip(by_host, in_parallel(on_host, by_host), strict=True):
            for i, answer in zip(by_host[name], got, strict=True):
                answers[i] = answer
        return [a for a in answers if a is not None]

    def gpus(self, hosts: list[str], ask: bool) -> dict[str, GpuReport]:
        """Asked only with `ask`; a host that cannot be reached stays unknown: the preflight
        reports it."""
        def ask_one(name: str) -> GpuReport | None:
            try:
                return remote_gpus(self.connection(name))
            except BackendError:
                return None

        names = hosts if ask else []
        found = in_parallel(ask_one, names)  # every host at once, as the preflight
        return {name: r for name, r in zip(names, found, strict=True) if r is not None}

    def allocate(self, names: list[str], avoid: set[int]) -> dict[str, int]:
        # Free here, and checked on the host by preflight.
        return dict(zip(names, free_ports(len(names), avoid=avoid), strict=True))

    def check(self, tasks: list[TaskPlan]) -> list[HostCheck]:
        by_host: dict[str, list[TaskPlan]] = {}
        for t in tasks:
            by_host.setdefault(t.host, []).append(t)
        return in_parallel(lambda n: self._check(n, by_host[n]), by_host)

    def _check(self, name: str, tasks: list[TaskPlan]) -> HostCheck:
        """The host's preflight, bounded: fabric's `run` waits an hour for a channel."""
        host = self.hosts[name]
        try:
            row = _bounded(lambda: check_remote(name, host, tasks,
                                                lambda: self.connection(name)),
                           2 * host.connect_timeout_seconds + PROBE_SECONDS,
                           f"host {name} ({host.address})", lambda: self.drop(name))
        except SshError as e:
            row = HostCheck(name, host.address, ports=[t.port for t in tasks],
                            problems=[f"{e} while checking it"])
        row.sessions = SESSIONS
        return row

    def sync(self, plan: Plan, tasks: list[TaskPlan]) -> Iterator[str]:
        """Each host's copy at once; what to say, as it comes (a big file is named before
        its copy begins). Interrupted (a signal's exception in this thread), the copies stop
        at their next chunk and remove what they had half written."""
        packages = job_packages(plan)
        names = list(dict.fromkeys(t.host for t in tasks))
        files = local_files(packages)
        for _, rel, size, sparse in files:
            if size >= BIG_FILE:
                yield (f"sync: {rel} is {_size(size)}{sparse}, copied whole to each host "
                       f"({len(names)}); move it out of the job's code directory if the tasks "
                       "do not need it")
        try:
            copied = in_parallel(lambda n: self._sync_and_start_agent(n, files), names)
        except BaseException:
            self._cancel.set()
            until = time.monotonic() + 2.0  # the copies stop and remove their partial files
            while self._partials and time.monotonic() < until:
                time.sleep(0.02)
            for host, partial in list(self._partials):  # a copy that did not stop in time
                _remote_exec(self.connection(host), f"rm -f {shlex.quote(partial)}",
                             self.hosts[host].connect_timeout_seconds)
            raise
        for name, count in zip(names, copied, strict=True):
            yield f"{name}: code synced ({count} file(s) copied)"

    def _sync_and_start_agent(self, name: str, files: list[tuple[Path, str, int, str]]
                              ) -> int:
        """The host's code, then its agent, warm before the first start (its python's start
        overlaps the other hosts' syncs). An agent that does not start here is tried again,
        and named, at the start."""
        copied = self.sync_code(name, files, self.hosts[name].workdir)
        with contextlib.suppress(SshError):
            self.agent(name)
        return copied

    def start(self, task: TaskPlan, attempt: int) -> TaskHandle:
        """The task's warm spare for this attempt, if one waits; else a new task."""
        answer = next(self.start_batch([(task, attempt)]))
        if isinstance(answer, Exception):
            raise answer
        return answer

    def start_batch(self, items: Iterable[tuple[TaskPlan, int]]
                    ) -> Iterator[TaskHandle | Exception]:
        """Each task's warm spare where one waits; the others started together, each host's
        in one request to its agent (launch.BatchLauncher)."""
        items = list(items)
        warm = [self._spares.take(task, attempt) for task, attempt in items]
        cold = [(t, a, False) for (t, a), w in zip(items, warm, strict=True) if w is None]
        started = iter(self._launch(cold))
        yield from answered([w if w is not None else next(started) for w in warm])

    def standby(self, task: TaskPlan, attempt: int) -> int | None:
        """Start a warm spare for the task's `attempt` on its host; its pid there, None if
        one already waits."""
        return self._spares.make(task, attempt)

    def sync_code(self, host: str, files: list[tuple[Path, str, int, str]],
                  workdir: str) -> int:
        """Copy `files` (local_files) into the host's workdir, skipping files whose size and
        mtime already match; first check that what will be written fits there. Each file
        goes to a `.tfo-partial` name and is renamed when whole: a copy that fails or is
        interrupted removes its partial file. Returns files copied."""
        planned = self._planned.pop(host, None)
        if planned is not None and planned[0] == _files_key(files, workdir):
            root, todo = planned[1], planned[2]  # sync_fits looked a moment ago
        else:
            root, todo = self._to_copy(host, files, workdir)
        if not todo:
            return 0
        conn = self.connection(host)
        sftp = self._sftp(host, conn)
        try:
            for path, rel, size in todo:
                self._put(host, conn, sftp, path, f"{root}/{rel}", size)
        finally:
            sftp.close()  # its session: the agent's comes next
        return len(todo)

    def sync_fits(self, plan: Plan, hosts: list[str]) -> dict[str, str]:
        """The preflight's question, for each host at once: does what the sync will write
        fit in its workdir? The problems, by host."""
        try:
            files = local_files(job_packages(plan))
        except SpecError:
            return {}  # the sync names it, with "nothing was started"

        def fits(host: str) -> str | None:
            try:
                self._to_copy(host, files, self.hosts[host].workdir)
            except SshError as e:
                return str(e)
            return None

        found = in_parallel(fits, hosts)
        return {h: problem for h, problem in zip(hosts, found, strict=True) if problem}

    def _to_copy(self, host: str, files: list[tuple[Path, str, int, str]], workdir: str
                 ) -> tuple[str, list[tuple[Path, str, int]]]:
        """(the workdir's path there, the files to copy: not there with the same size and
        mtime), kept for the sync that follows; SshError where they do not fit in its
        free space."""
        timeout = self.hosts[host].connect_timeout_seconds
        conn = self.connection(host)
        where = f"{_remote_path(workdir)}"
        # The files' sizes and mtimes there in the same command (GNU stat), where the list
        # fits in one argument; else one sftp stat each (a round trip each).
        listed = " ".join(shlex.quote(rel) for _, rel, _, _ in files)
        stat_them = len(listed) < _STAT_ARGS_MAX
        status, out, err = _run_remote(
            conn, f"mkdir -p {where} && cd {where} && pwd && df -Pk . && echo {_STATS} && "
            f"{{ stat -c '%s %Y %n' -- {listed if stat_them else '.'} 2>/dev/null; true; }}",
            timeout + PROBE_SECONDS, lambda: self.drop(host), host)
        if status != 0:
            raise SshError(f"host {host}: cannot use workdir {workdir}: "
                           f"{err.strip()[-200:] or 'no answer'} (hosts.{host}.workdir)")
        head, _, stats = out.partition(f"{_STATS}\n")
        root, free = head.splitlines()[0].strip(), _df_free(head)
        there: dict[str, tuple[int, int]] = {}
        for line in stats.splitlines():
            with contextlib.suppress(ValueError):
                size, mtime, rel = line.split(" ", 2)
                there[rel] = (int(size), int(mtime))
        if not stat_them:
            sftp = self._sftp(host, conn)
            try:
                for _, rel, _, _ in files:
                    with contextlib.suppress(OSError):
                        rst = sftp.stat(f"{root}/{rel}")
                        there[rel] = (rst.st_size or 0, int(rst.st_mtime or 0))
            finally:
                sftp.close()
        todo = [(path, rel, size) for path, rel, size, _ in files
                if there.get(rel) != (size, int(path.stat().st_mtime))]
        need = sum(size for _, _, size in todo)
        if free is not None and need > free:
            raise SshError(f"host {host}: no space left in {root}: the code sync writes "
                           f"{_size(need)} there, {_size(free)} free (hosts.{host}.workdir)")
        self._planned[host] = (_files_key(files, workdir), root, todo)
        return root, todo

    def _sftp(self, host: str, conn: fabric.Connection) -> paramiko.SFTPClient:
        timeout = self.hosts[host].connect_timeout_seconds
        sftp = _bounded(conn.client.open_sftp, timeout, f"host {host}: opening sftp",
                        lambda: self.drop(host))
        sftp.get_channel().settimeout(timeout + PROBE_SECONDS)  # each request's answer
        return sftp

    def _put(self, host: str, conn: fabric.Connection, sftp: paramiko.SFTPClient, path: Path,
             remote: str, size: int) -> None:
        partial = remote + ".tfo-partial"
        self._partials.add((host, partial))

        def check_cancel(done: int, total: int) -> None:
            if self._cancel.is_set():
                raise SshError(f"host {host}: code sync interrupted")

        st = path.stat()
        try:
            _sftp_makedirs(sftp, remote.rsplit("/", 1)[0])
            sftp.put(str(path), partial, callback=check_cancel)
            sftp.utime(partial, (st.st_atime, st.st_mtime))
            sftp.posix_rename(partial, remote)
        except BaseException as e:  # an interrupt too: no partial file is left behind
            # On a channel of its own: the sftp session may be mid-request.
            _remote_exec(conn, f"rm -f {shlex.quote(partial)}",
                         self.hosts[host].connect_timeout_seconds)
            if not isinstance(e, OSError):
                raise
            free = _remote_free(sftp, remote.rsplit("/", 1)[0])
            why = "no space left on the device" if free is not None and free < size \
                else (e.strerror or str(e))
            raise SshError(f"host {host}: could not copy {path} to {remote} ({_size(size)}): "
                           f"{why}" + (f" ({_size(free)} free there)" if free is not None
                                       else "")) from None
        finally:
            self._partials.discard((host, partial))

    def close(self) -> None:
        """Every host's agent told to quit (it kills what is left there), all hosts at once;
        then the connections closed."""
        self._spares.close()
        agents, self._agents = self._agents, {}
        in_parallel(lambda n: agents[n].close(), agents)
        in_parallel(self.drop, list(self._conns))


_STATS = "--tfo-stats--"
_STAT_ARGS_MAX = 100_000  # Linux takes 128 KiB in one argument (the command is one)


def _files_key(files: list[tuple[Path, str, int, str]], workdir: str) -> tuple:
    """What a host's list of files to copy depends on here: the files as they are now."""
    return workdir, tuple((rel, size, int(path.stat().st_mtime)) for path, rel, size, _ in files)


BIG_FILE = 64 << 20  # a file the sync names: it goes to every host, whole


def local_files(packages: list[tuple[Path, Path]]) -> list[tuple[Path, str, int, str]]:
    """What the sync copies: (path, path relative to the host's workdir, size, ", sparse:
    N on disk here" or ""), without caches and byte code."""
    found = []
    for pkg, base in packages:
        paths = [pkg] if pkg.is_file() else sorted(
            p for p in pkg.rglob("*") if p.is_file()
            and not _SKIP_DIRS & set(p.relative_to(pkg).parts)
            and p.suffix not in (".pyc", ".pyo"))
        for path in paths:
            st = path.stat()
            on_disk = st.st_blocks * 512
            sparse = f" (sparse: {_size(on_disk)} on disk here)" \
                if on_disk < st.st_size // 2 else ""
            found.append((path, path.relative_to(base).as_posix(), st.st_size, sparse))
    return found


def in_parallel(call: Callable[[str], T], names: Iterable[str], fan_out: int = FAN_OUT
                ) -> list[T]:
    """`call(name)` for each name, `fan_out` at a time, in daemon threads: a signal's
    exception in the caller does not wait for a host that does not answer (each call is
    bounded anyway). The first error is raised once all are done."""
    names = list(names)
    results: dict[str, T] = {}
    errors: list[BaseException] = []
    finished = threading.Semaphore(0)

    def run(name: str) -> None:
        try:
            results[name] = call(name)
        except BaseException as e:  # noqa: BLE001 - raised in the caller
            errors.append(e)
        finally:
            finished.release()

    todo, running = list(reversed(names)), 0
    while todo or running:
        while todo and running < fan_out:
            threading.Thread(target=run, args=(todo.pop(),), name="ssh-host",
                             daemon=True).start()
            running += 1
        if finished.acquire(timeout=0.1):
            running -= 1
    if errors:
        raise errors[0]
    return [results[n] for n in names]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _df_free(out: str) -> int | None:
    """Available bytes from `df -Pk`'s last line, or None."""
    try:
        return int(out.strip().splitlines()[-1].split()[3]) * 1024
    except (IndexError, ValueError):
        return None


def _remote_free(sftp: paramiko.SFTPClient, path: str) -> int | None:
    """Free bytes at `path` on the host (OpenSSH's statvfs extension), or None."""
    from paramiko.message import Message
    from paramiko.sftp import CMD_EXTENDED

    with contextlib.suppress(Exception):
        _, msg = sftp._request(CMD_EXTENDED, "statvfs@openssh.com", path)
        assert isinstance(msg, Message)
        fields = [msg.get_int64() for _ in range(11)]  # bsize, frsize, blocks, bfree, bavail
        return fields[1] * fields[4]
    return None


def _sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = path.strip("/").split("/")
    current = ""
    for part in parts:
        current += "/" + part
        try:
            if stat.S_ISDIR(sftp.stat(current).st_mode):
                continue
        except OSError:
            sftp.mkdir(current)
