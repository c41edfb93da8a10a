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
markers.beat_seconds (a tenth of the host's `lifeline_seconds`, 3 s for 30), the agent one
back when it sent nothing else that long. The agent stops its tasks (it closes their wrappers'
stdin) when the channel closes or goes quiet for the host's `lifeline_seconds` (a dropped
connection or a cut network, even where sshd sends no keepalives); the coordinator counts
every task of a host lost when nothing came from it that long: `lost contact with lab2: no
heartbeat for 30 s`.

Every remote call is bounded by the host's `connect_timeout_seconds` (paramiko's own waits
for a channel or a command's start are an hour, or forever): a call that gets no answer in
time drops the host's connection (`remote.bounded`), and the next use connects again, which says
whether the host can be reached. A lost host's connection is dropped too: its transport is
not reused (launch/remote.py). Per-host work (checks, the code sync, starting a batch,
closing) runs for all hosts at once, FAN_OUT at a time. The code sync is launch/codesync.py.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from orchestrator.launch import BackendError, HostBackend, TaskHandle, answered
from orchestrator.launch.gpus import NVIDIA_SMI, TIMEOUT_SECONDS, GpuReport, parse
from orchestrator.launch.ports import free_ports
from orchestrator.launch.preflight import HostCheck, check_remote
from orchestrator.launch.spares import Spares
from orchestrator.launch.ssh.codesync import (
    BIG_FILE,
    CodeSync,
    Workdir,
    big_file_note,
    job_packages,
)
from orchestrator.launch.ssh.hostagent import AgentTask, HostAgent, SshError
from orchestrator.launch.ssh.projectfiles import Listing, SyncFile, project_files
from orchestrator.launch.ssh.remote import (
    PROBE_SECONDS,
    bounded,
    close_channel,
    connect,
    in_parallel,
    run_remote,
)
from orchestrator.planning.plan import Plan, TaskPlan
from orchestrator.planning.spec import HostSpec, SpecError
from worker_entry.forkstart import shared_startup_env

if TYPE_CHECKING:  # fabric and paramiko cost 0.16 s to import: only when a host is reached
    import fabric
    import paramiko

SESSIONS = 2  # at most at once on a host, whatever its tasks: the agent's, and one more


class SshBackend(HostBackend):
    """The coordinator's connections to the lab machines named in the spec."""

    def __init__(self, hosts: Mapping[str, HostSpec]) -> None:
        self.hosts = hosts
        self._conns: dict[str, fabric.Connection] = {}
        self._lock = threading.Lock()
        self._connecting: dict[str, threading.Lock] = {}  # by host
        self._agents: dict[str, HostAgent] = {}
        self._code = CodeSync(hosts, self.connection, self.drop)
        self._starting: dict[str, threading.Lock] = {}  # by host: one agent started at once
        self._spares = Spares(self._start_standby)
        self._files: list[SyncFile] | None = None  # expect_code's
        self._agent_env: dict[str, dict[str, str]] = {}  # by host: agent_env
        self._probes: dict[str, paramiko.Channel] = {}  # by host: a preflight probe waiting

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
                bounded(conn.close, 2.0, f"host {name}", lambda: None)

    def agent(self, name: str, probe: paramiko.Channel | None = None) -> HostAgent:
        """The host's live agent, started if need be (on a new connection where the last
        one was lost), from its preflight's `probe` where that still waits."""
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
            agent = bounded(lambda: HostAgent(name, host, transport,
                                              lambda: self.drop(name),
                                              self._agent_env.get(name), probe),
                            host.connect_timeout_seconds + 31,
                            f"host {name} ({host.address}): starting its agent",
                            lambda: self.drop(name))
            self._agents[name] = agent
            return agent

    def _start_standby(self, task: TaskPlan, attempt: int) -> AgentTask:
        answer = start_on_agents([(task, attempt, True)], self.agent)[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

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

    def expect_code(self, plan: Plan) -> None:
        """The job's files the sync will copy: the preflight's probe asks each host which
        are there already, and whether the rest fits (one command for both questions). Not
        found here: the sync names it, with "nothing was started"."""
        try:
            self._files = code_listing(plan).files
        except SpecError:
            self._files = None

    def check(self, tasks: list[TaskPlan]) -> list[HostCheck]:
        """Every host's probe at once (each one command: preflight._PROBE); with the files
        `expect_code` named, what the sync will copy there, planned, and whether it fits."""
        by_host: dict[str, list[TaskPlan]] = {}
        for t in tasks:
            by_host.setdefault(t.host, []).append(t)
        files = self._files
        for name, on in by_host.items():  # what each host's agent starts with
            self._agent_env[name] = agent_env([t.env for t in on])

        def one(name: str) -> HostCheck:
            host = self.hosts[name]
            row, there, probe = check_host(name, host, by_host[name], self.connection,
                                           lambda: self.drop(name),
                                           [f.rel for f in files] if files else None,
                                           self._agent_env[name])
            if files and there is not None and row.reachable and not row.problems:
                try:
                    self._code.plan(name, files, host.workdir, Workdir(
                        there["root"], there["free"], {k: tuple(v) for k, v in
                                                       there["there"].items()}))
                except SshError as e:
                    row.problems.append(str(e))
            if probe is not None and not row.problems:
                self._probes[name] = probe  # it may become the host's agent (sync)
            else:
                close_channel(probe)
            return row

        return in_parallel(one, by_host)

    def sync(self, plan: Plan, tasks: list[TaskPlan]) -> Iterator[str]:
        """Each host's copy at once; what to say, as it comes (a big file is named before
        its copy begins). Interrupted (a signal's exception in this thread), the copies stop
        at their next chunk and remove what they had half written."""
        listing = code_listing(plan)
        names = list(dict.fromkeys(t.host for t in tasks))
        for name in names:
            self._agent_env.setdefault(name, agent_env([t.env for t in tasks if t.host == name]))
        files = listing.files
        yield from listing.notes()  # what was left out: credentials, symlinks out
        for f in files:
            if f.size >= BIG_FILE:
                yield big_file_note(f, len(names))

        def sync_and_start_agent(name: str) -> int:
            """The host's code, then its agent, warm before the first start (its python's
            start overlaps the other hosts' syncs). An agent that does not start here is
            tried again, and named, at the start."""
            workdir = self.hosts[name].workdir
            probe = self._probes.pop(name, None)
            if probe is not None and not self._code.up_to_date(name, files, workdir):
                close_channel(probe)  # the copy's sftp session is the second; the agent's
                probe = None  # python starts after it, on the new code
            copied = self._code.copy(name, files, workdir)
            with contextlib.suppress(SshError):
                self.agent(name, probe)
            return copied

        try:
            copied = in_parallel(sync_and_start_agent, names)
        except BaseException:
            self._code.stop()
            raise
        for name, count in zip(names, copied, strict=True):
            yield f"{name}: code synced ({count} file(s) copied)"

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
        started = iter(start_on_agents(cold, self.agent))
        yield from answered([w if w is not None else next(started) for w in warm])

    def standby(self, task: TaskPlan, attempt: int) -> int | None:
        """Start a warm spare for the task's `attempt` on its host; its pid there, None if
        one already waits."""
        return self._spares.make(task, attempt)

    def close(self) -> None:
        """Every host's agent told to quit (it kills what is left there), all hosts at once;
        then the connections closed."""
        self._spares.close()
        probes, self._probes = self._probes, {}
        for probe in probes.values():  # `tfo check`'s, or a run that did not start: EOF
            close_channel(probe)
        agents, self._agents = self._agents, {}
        in_parallel(lambda n: agents[n].close(), agents)
        in_parallel(self.drop, list(self._conns))


def code_listing(plan: Plan) -> Listing:
    """What the sync sends: the job's packages' files, less what it must not send."""
    return project_files(job_packages(plan), plan.spec.job.code_include)


def agent_env(envs: list[Mapping[str, str]]) -> dict[str, str]:
    """What a host's agent starts with: the startup variables its tasks share, so that it can
    fork them (worker_entry.forkstart); and their TFO_RUN_DIR. A forked task's environment
    as /proc/PID/environ shows it (ps e, psutil) is the agent's, from its exec: the run's
    processes are still found by it."""
    env = shared_startup_env(envs)
    run_dirs = {e.get("TFO_RUN_DIR") for e in envs}
    if len(run_dirs) == 1 and (run_dir := run_dirs.pop()):
        env["TFO_RUN_DIR"] = run_dir
    return env


def start_on_agents(items: list[tuple[TaskPlan, int, bool]], agent: Callable[[str], HostAgent]
                    ) -> list[AgentTask | Exception]:
    """(task, attempt, standby) started, each host's in one request to its agent, all
    hosts at once; each answered in order."""
    by_host: dict[str, list[int]] = {}
    for i, (task, _, _) in enumerate(items):
        by_host.setdefault(task.host, []).append(i)

    def on_host(name: str) -> list[AgentTask | Exception]:
        try:
            on = agent(name)
        except SshError as e:
            return [e] * len(by_host[name])
        return on.start([items[i] for i in by_host[name]])

    answers: list[AgentTask | Exception | None] = [None] * len(items)
    for name, got in zip(by_host, in_parallel(on_host, by_host), strict=True):
        for i, answer in zip(by_host[name], got, strict=True):
            answers[i] = answer
    return [a for a in answers if a is not None]


def check_host(name: str, host: HostSpec, tasks: list[TaskPlan],
               connection: Callable[[str], fabric.Connection], drop: Callable[[], None],
               files: list[str] | None = None, env: Mapping[str, str] | None = None
               ) -> tuple[HostCheck, dict | None, paramiko.Channel | None]:
    """The host's preflight, bounded: a channel can wait an hour for an answer."""
    try:
        row, there, probe = bounded(
            lambda: check_remote(name, host, tasks, lambda: connection(name), files, env),
            2 * host.connect_timeout_seconds + PROBE_SECONDS, f"host {name} ({host.address})",
            drop)
    except SshError as e:
        row, there, probe = HostCheck(name, host.address, ports=[t.port for t in tasks],
                                      problems=[f"{e} while checking it"]), None, None
    row.sessions = SESSIONS
    return row, there, probe


def remote_gpus(conn: fabric.Connection) -> GpuReport:
    """Over an open connection (SshBackend keeps it), for `gpus: auto` before the plan (the
    preflight's probe asks its own)."""
    try:
        status, out, err = run_remote(conn, NVIDIA_SMI, TIMEOUT_SECONDS)
    except Exception as e:  # noqa: BLE001 - a refused session or a dropped connection
        return GpuReport([], f"nvidia-smi -L: {e or type(e).__name__}")
    if status is None:
        return GpuReport([], f"nvidia-smi -L gave no answer in {TIMEOUT_SECONDS:.0f} s")
    return parse(status, out, err)
