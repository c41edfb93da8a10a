"""Tasks on lab machines over SSH (fabric; placement kind `ssh`), with the same handle
interface as local ones.

    hosts = SshBackend(spec.hosts)             # one fabric Connection per host, opened lazily
    hosts.sync(plan, tasks)                    # copy the job's code, skipping unchanged files
    handle = hosts.start(task, attempt=0)      # poll(), lines(), terminate(), kill()
    hosts.standby(task, attempt=1)             # a warm spare on the task's host (spares.py)
    hosts.close()

Each task is one SSH exec channel running `exec env K=V … python -m worker_entry` in the
host's workdir: sshd makes every session its own process group, and `exec` keeps the
shell's pid, so the group to signal is the pid the shell prints first. Every value from the
spec reaches the remote shell through shlex.quote.

The lifeline runs both ways. The coordinator sends a byte down each task's stdin every
HEARTBEAT_SECONDS; the task's wrapper kills the task and all it started when stdin closes or
goes quiet for the host's `lifeline_seconds` (a dropped connection or a cut network, even
where sshd sends no keepalives), and exits EXIT_LIFELINE. The wrapper in turn writes BEAT to
the task's output as often, so the coordinator knows the task is lost when the output goes
quiet that long: `lost contact with lab2: no heartbeat for 30 s`.

Every remote call is bounded by the host's `connect_timeout_seconds` (paramiko's own waits
for a channel or a command's start are an hour, or forever): a call that gets no answer in
time drops the host's connection (`_bounded`), and the next use connects again, which says
whether the host can be reached. A task lost to silence drops its host's connection too: its
transport is not reused. How a task ended is its `exit_reason`: sshd's exit-signal (paramiko
ignores it; `_record_exit_signal` keeps it) as `signal SIGKILL`, a lost connection as lost.

A standby (a warm spare, `warm_spares: true`) is the same channel with STANDBY_ENV=1: its
task imports TensorFlow on the host and waits. The coordinator beats down its stdin as for
any task, but reads nothing but its pid line until GO: the standby writes nothing, not even
beats, so silence is no sign of a lost one until then.
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

from orchestrator.launch import BackendError, HostBackend
from orchestrator.launch.gpus import GpuReport, remote_gpus
from orchestrator.launch.output import TaskOutput
from orchestrator.launch.ports import free_ports
from orchestrator.launch.preflight import HostCheck, check_remote
from orchestrator.launch.spares import Spares
from orchestrator.plan import Plan, TaskPlan
from orchestrator.rundir import RUNS
from orchestrator.spec import HostSpec, SpecError
from worker_entry import markers
from worker_entry.markers import HEARTBEAT_SECONDS

if TYPE_CHECKING:  # fabric and paramiko cost 0.16 s to import: only when a host is reached
    import fabric
    import paramiko

FIRST_BEAT_SECONDS = 30.0  # python's start on a slow host, before its wrapper beats
PROBE_SECONDS = 60.0  # a command's own run on the host (the preflight's probe, a mkdir)
_PID_PREFIX = "@tfo-pid "
_PID_LINE_MAX = 64  # the pid line comes first and is short; anything else is output
T = TypeVar("T")
_SKIP_DIRS = {"__pycache__", ".git", ".venv", RUNS, ".pytest_cache", ".ruff_cache"}


class SshError(BackendError):
    """A host could not be reached, authenticated or used; the message names the host."""


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


_signals_recorded = False


def _record_exit_signal() -> None:
    """paramiko answers sshd's `exit-signal` request as unhandled and drops it: keep its
    signal name on the channel (`tfo_exit_signal`), so a task killed by a signal reads as
    that signal, as it does locally, not as a lost connection."""
    global _signals_recorded
    import paramiko

    if _signals_recorded:
        return
    _signals_recorded = True
    from paramiko.common import MSG_CHANNEL_REQUEST

    table = paramiko.Transport._channel_handler_table  # how the transport dispatches
    handle = table[MSG_CHANNEL_REQUEST]

    def recording(chan: paramiko.Channel, m: paramiko.Message) -> None:
        at = m.packet.tell()
        with contextlib.suppress(Exception):
            if m.get_text() == "exit-signal":
                m.get_boolean()  # want reply: never for exit-signal
                chan.tfo_exit_signal = m.get_text()  # "KILL", "TERM", ...
        m.packet.seek(at)
        handle(chan, m)

    table[MSG_CHANNEL_REQUEST] = recording


def connect(name: str, host: HostSpec) -> fabric.Connection:
    """An open, authenticated connection; host keys checked unless the spec opts out."""
    import fabric
    import paramiko

    _record_exit_signal()
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
    return conn


def remote_command(task: TaskPlan, extra_env: dict[str, str]) -> str:
    """The shell line for one task, built from quoted parts only: nothing the spec or the
    plan says (env keys and values, paths, the command) reaches the remote shell unquoted.
    The spec already refuses env keys that are not shell names; quoting each `K=V` whole
    means a bad one could still never run anything."""
    env = {**task.env, **extra_env}
    assigns = " ".join(_remote_assign(k, v) for k, v in env.items())
    workdir = _remote_path(task.cwd)
    return (f"mkdir -p {workdir} && cd {workdir} && echo {_PID_PREFIX}$$ && "
            f"exec env {assigns} " + " ".join(shlex.quote(a) for a in task.command))


def _remote_assign(key: str, value: str) -> str:
    """`'K=V'` for `env`; a value starting with ~/ keeps its ~ expanding on the host."""
    if value == "~" or value.startswith("~/"):
        return shlex.quote(f"{key}=") + _remote_path(value)
    return shlex.quote(f"{key}={value}")


def _remote_path(path: str) -> str:
    """Quoted, but a leading ~ still expands on the remote side."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (shlex.quote(path[1:]) if len(path) > 1 else "")
    return shlex.quote(path)


class SshHandle:
    """One remote task: an SSH exec channel plus a heartbeat down its stdin."""

    def __init__(self, task: TaskPlan, attempt: int, conn: fabric.Connection,
                 host: HostSpec, drop: Callable[[], None], standby: bool = False) -> None:
        """`drop()` closes the host's connection, so that the next use connects again."""
        self.task, self.attempt, self._conn, self._drop = task, attempt, conn, drop
        self._timeout, self._quiet = host.connect_timeout_seconds, host.lifeline_seconds
        self.warm = False  # a standby that was told to go
        self.exit_reason: str | None = None  # how it ended, where an exit code says less
        self._remote_pid: int | None = None
        self._head: bytes | None = b""  # output before the pid line was seen; None after
        self._returncode: int | None = None
        self._closed = threading.Event()
        self._lost = False  # the connection is gone: no remote commands any more
        self._started = time.monotonic()
        self._heard: float | None = None  # when the task's output (or beat) last arrived
        transport = conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise SshError(f"host {task.host}: connection lost")
        env = {"TFO_ATTEMPT": str(attempt),
               markers.LIFELINE_ENV: markers.lifeline(heartbeat=True, seconds=self._quiet)}
        if standby:
            env[markers.STANDBY_ENV] = "1"

        def open_and_exec() -> paramiko.Channel:
            import paramiko

            try:
                chan = transport.open_session(timeout=self._timeout)
                chan.set_combine_stderr(True)
                chan.exec_command(remote_command(task, env))
                return chan
            except (paramiko.SSHException, EOFError, OSError) as e:
                raise SshError(f"host {task.host} ({host.address}): could not start "
                               f"{task.name}: {e or type(e).__name__}") from None

        self._chan = _bounded(open_and_exec, self._timeout + 1,
                              f"host {task.host} ({host.address}): starting {task.name}", drop)
        self._beat = threading.Thread(target=self._heartbeat, name=f"beat-{task.name}",
                                      daemon=True)
        self._beat.start()
        # A standby's output waits in the channel until go(): nobody's attempt yet.
        self._output: TaskOutput | None = None
        if standby:
            self._read_pid_line()
        else:
            self._read_output()
            until = time.monotonic() + self._timeout  # the pid line comes before all else
            while self._head is not None and time.monotonic() < until and not self._eof():
                time.sleep(0.01)

    def _read_output(self) -> None:
        self._started, self._heard = time.monotonic(), None
        self._output = TaskOutput(self.task.log_path, self._recv, f"ssh-{self.task.name}")

    def _read_pid_line(self) -> None:
        """A standby's pid line, read here: its reader starts at go()."""
        self._chan.settimeout(self._timeout)
        try:
            while self._head is not None:
                data = self._chan.recv(_PID_LINE_MAX)
                if not data:
                    break
                self._early = self._take_pid(data.replace(markers.BEAT, b""))
        except OSError:  # socket.timeout too
            pass
        finally:
            self._chan.settimeout(None)
        self._head = None
        if self._remote_pid is None:
            said = self._early.decode(errors="replace").strip().splitlines()
            self._closed.set()
            self._chan.close()
            raise SshError(f"host {self.task.host}: the standby of {self.task.name} did not "
                           f"start{': ' + said[0][:200] if said else ''}")

    def go(self) -> None:
        """A standby's turn: it runs as a task started now would (worker_entry.standby)."""
        with contextlib.suppress(OSError):
            self._chan.send(markers.GO)
        self.warm = True
        self._read_output()

    def discard(self) -> None:
        """End a standby that was never used. The task's temp dir on the host is the running
        attempt's, not its own to remove."""
        self.kill()
        self._closed.set()
        self._chan.close()

    def _eof(self) -> bool:
        return self._chan.exit_status_ready() and self._output is not None \
            and self._output.done

    @property
    def pid(self) -> int | None:
        return self._remote_pid

    _early = b""  # what a standby printed after its pid line, before go()

    def _recv(self) -> bytes:
        """The task's output for TaskOutput: without the watchdog's beats, and without the
        pid line that comes first; b"" at the end."""
        if self._early:
            early, self._early = self._early, b""
            return early
        while True:
            try:
                data = self._chan.recv(65536)
            except OSError:
                data = b""
            if not data:
                head, self._head = self._head or b"", None
                return head
            self._heard = time.monotonic()
            data = data.replace(markers.BEAT, b"")
            if self._head is not None:
                data = self._take_pid(data)
            if data:
                return data

    def _take_pid(self, data: bytes) -> bytes:
        """Holds output back until the first line is complete; takes the pid from it."""
        assert self._head is not None
        head = self._head + data
        if b"\n" not in head and len(head) <= _PID_LINE_MAX:
            self._head = head
            return b""
        self._head = None
        first, _, rest = head.partition(b"\n")
        if first.startswith(_PID_PREFIX.encode()):
            with contextlib.suppress(ValueError):
                self._remote_pid = int(first[len(_PID_PREFIX):])
                return rest
        return head

    def _heartbeat(self) -> None:
        while not self._closed.wait(HEARTBEAT_SECONDS):
            try:
                if self._chan.send_ready():
                    self._chan.send(b".")
            except OSError:
                return

    def poll(self) -> int | None:
        if self._returncode is not None:
            return self._returncode
        if self._chan.exit_status_ready():
            # -1: no status: killed by a signal (sshd said which), or the connection dropped.
            self._returncode, self.exit_reason = exit_of(
                self._chan.recv_exit_status(), getattr(self._chan, "tfo_exit_signal", None),
                self.task.host, self._quiet)
            if self.exit_reason and self.exit_reason.startswith(LOST):
                self._lose(self.exit_reason)
        elif (self._output is not None and (silent := self._silent())) \
                or not self._transport_ok():
            why = f"no heartbeat for {silent:g} s" if self._output is not None and silent \
                else "the connection dropped"
            self._returncode, self.exit_reason = EXIT_LOST, f"{LOST} {self.task.host}: {why}"
            self._lose(self.exit_reason)
        return self._returncode

    def _lose(self, why: str) -> None:
        """The connection is gone or silent: say so in the log, never use it again (the
        task's wrapper stops the task on its side once our heartbeats stop arriving)."""
        self._lost = True
        if self._output is not None:
            self._output.note(f"[tfo] {why}; the task stops itself on its side")
        self._chan.close()
        self._drop()

    def _silent(self) -> float:
        """The silence that means lost once it is over, else 0."""
        assert self._output is not None
        if self._output.waiting:  # we are not reading: the task waits for us
            return 0.0
        now = time.monotonic()
        if self._heard is None:
            limit = max(FIRST_BEAT_SECONDS, self._quiet)
            return limit if now - self._started > limit else 0.0
        return self._quiet if now - self._heard > self._quiet else 0.0

    def _transport_ok(self) -> bool:
        transport = self._chan.get_transport()
        return transport is not None and transport.is_active()

    def lines(self) -> list[str]:
        return self._output.lines() if self._output is not None else []

    def _signal_group(self, sig: str) -> None:
        if self._lost:
            return
        if self._remote_pid is None:
            self._chan.close()  # no pid yet: closing the lifeline makes the task stop itself
            return
        if _remote_exec(self._conn, f"kill -{sig} -- -{self._remote_pid} 2>/dev/null",
                        self._timeout) is None:
            self._lost = True  # no answer: the connection is dropped; the lifeline ends it
            self._drop()

    def terminate(self) -> None:
        self._signal_group("TERM")

    def kill(self) -> None:
        self._signal_group("KILL")

    def request_stacks(self) -> None:
        with contextlib.suppress(OSError):  # the heartbeat's channel: the wrapper reads it
            if not self._lost and self._chan.send_ready():
                self._chan.send(markers.STACKS)

    def close(self, timeout: float = 1.0) -> list[str]:
        assert self._output is not None, "a standby that never ran is discarded, not closed"
        rest = self._output.close(timeout)
        self._closed.set()
        if not self._lost:
            tmp = _remote_path(self.task.tmp_dir)
            if _remote_exec(self._conn, f"rm -rf {tmp}; rmdir $(dirname {tmp}) 2>/dev/null",
                            self._timeout) is None:
                self._drop()
        self._chan.close()
        return rest


LOST = "lost contact with"
EXIT_LOST = 255  # ssh's own code for a lost connection; `exit_reason` says which


def exit_of(status: int, signal_name: str | None, host: str,
            quiet: float) -> tuple[int, str | None]:
    """(returncode, exit_reason) from what sshd said: an exit status, or -1 and perhaps the
    signal that ended the wrapper; nothing means the connection dropped."""
    import signal as signals

    if status == markers.EXIT_LIFELINE:  # the wrapper heard nothing from us that long
        return status, f"{LOST} {host}: no heartbeat reached the task for {quiet:g} s"
    if status >= 0:
        return status, None
    if signal_name:
        try:
            return -signals.Signals[f"SIG{signal_name}"].value, None
        except KeyError:
            return EXIT_LOST, f"signal SIG{signal_name}"
    return EXIT_LOST, f"{LOST} {host}: the connection dropped"


def _remote_exec(conn: fabric.Connection, command: str, timeout: float = 5.0) -> int | None:
    """Run a short command on the host, bounded in time even over a cut network (fabric's
    `run` can wait an hour for a channel there). Its exit status, or None (no answer)."""
    import paramiko

    transport = conn.client.get_transport()
    if transport is None or not transport.is_active():
        return None

    def run() -> int | None:
        chan = transport.open_session(timeout=timeout)
        chan.exec_command(command)
        until = time.monotonic() + timeout
        while not chan.exit_status_ready() and time.monotonic() < until:
            time.sleep(0.02)
        status = chan.recv_exit_status() if chan.exit_status_ready() else None
        chan.close()
        return status

    try:
        return _bounded(run, timeout + 1, "remote command", lambda: None)
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
        self._spares = Spares(lambda task, attempt: self._handle(task, attempt, standby=True))

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

    def _handle(self, task: TaskPlan, attempt: int, standby: bool = False) -> SshHandle:
        return SshHandle(task, attempt, self.connection(task.host), self.hosts[task.host],
                         lambda: self.drop(task.host), standby=standby)

    def gpus(self, hosts: list[str], ask: bool) -> dict[str, GpuReport]:
        """Asked only with `ask`; a host that cannot be reached stays unknown: the preflight
        reports it."""
        reports = {}
        for name in hosts if ask else []:
            try:
                reports[name] = remote_gpus(self.connection(name))
            except BackendError:
                continue
        return reports

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
            return _bounded(lambda: check_remote(name, host, tasks,
                                                 lambda: self.connection(name)),
                            2 * host.connect_timeout_seconds + PROBE_SECONDS,
                            f"host {name} ({host.address})", lambda: self.drop(name))
        except SshError as e:
            return HostCheck(name, host.address, ports=[t.port for t in tasks],
                             problems=[f"{e} while checking it"])

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
            copied = in_parallel(lambda n: self.sync_code(n, files, self.hosts[n].workdir),
                                 names)
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

    def start(self, task: TaskPlan, attempt: int) -> SshHandle:
        """The task's warm spare for this attempt, if one waits; else a new channel."""
        return self._spares.take(task, attempt) or self._handle(task, attempt)

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
        conn, sftp, root, todo = self._to_copy(host, files, workdir)
        for path, rel, size in todo:
            self._put(host, conn, sftp, path, f"{root}/{rel}", size)
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
                 ) -> tuple[fabric.Connection, paramiko.SFTPClient, str,
                            list[tuple[Path, str, int]]]:
        """(connection, sftp, the workdir's path there, the files to copy: not there with
        the same size and mtime); SshError where they do not fit in its free space."""
        timeout = self.hosts[host].connect_timeout_seconds
        conn = self.connection(host)
        where = f"{_remote_path(workdir)}"
        res = _bounded(lambda: conn.run(f"mkdir -p {where} && cd {where} && pwd && df -Pk .",
                                        hide=True, warn=True, in_stream=False),
                       timeout + PROBE_SECONDS, f"host {host}: preparing the workdir",
                       lambda: self.drop(host))
        if res.exited != 0:
            raise SshError(f"host {host}: cannot use workdir {workdir}: "
                           f"{res.stderr.strip()[-200:]} (hosts.{host}.workdir)")
        root, free = res.stdout.splitlines()[0].strip(), _df_free(res.stdout)
        sftp = _bounded(conn.sftp, timeout, f"host {host}: opening sftp",
                        lambda: self.drop(host))
        sftp.get_channel().settimeout(timeout + PROBE_SECONDS)  # each request's answer
        todo = []
        for path, rel, size, _ in files:
            with contextlib.suppress(OSError):
                rst = sftp.stat(f"{root}/{rel}")
                if rst.st_size == size and int(rst.st_mtime) == int(path.stat().st_mtime):
                    continue
            todo.append((path, rel, size))
        need = sum(size for _, _, size in todo)
        if free is not None and need > free:
            raise SshError(f"host {host}: no space left in {root}: the code sync writes "
                           f"{_size(need)} there, {_size(free)} free (hosts.{host}.workdir)")
        return conn, sftp, root, todo

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
        self._spares.close()
        for name in list(self._conns):
            self.drop(name)


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


def in_parallel(call: Callable[[str], T], names: Iterable[str]) -> list[T]:
    """`call(name)` for each name at once, in daemon threads: a signal's exception in the
    caller does not wait for a host that does not answer (each call is bounded anyway)."""
    names = list(names)
    results: dict[str, T] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            results[name] = call(name)
        except BaseException as e:  # noqa: BLE001 - raised in the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,), name=f"ssh-{n}", daemon=True)
               for n in names]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.1)
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
