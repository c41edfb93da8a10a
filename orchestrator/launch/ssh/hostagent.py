"""The coordinator's end of a lab host's agent (worker_entry.agent): one SSH session that
carries all of the host's tasks.

    agent = HostAgent(name, host, transport, drop)   # exec `python -m worker_entry.agent`
    handles = agent.start([(task, attempt, standby)])  # their START frames at once, then the pids
    handle.poll(), lines(), terminate(), kill(), request_stacks(), go(), discard(), close()
    agent.close()                                    # QUIT: the agent kills what is left

One reader thread per host (`agent-<host>`) takes the channel's frames apart: each task's
output into its TaskOutput (fed, no thread of its own), its pid, its exit; and it sends our
BEAT every markers.beat_seconds (a tenth of the host's lifeline). A host is lost (every task
on it: `lost contact with lab2: …`)
when the channel closes, when nothing came from it for its `lifeline_seconds`, or when a
frame is malformed; its connection is then dropped (the next start connects anew). The
agent, on its side, stops its tasks when our beats stop. Frames are written under a lock,
whole (sendall), by whichever thread asks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from orchestrator.launch import BackendError
from orchestrator.launch.output import TaskOutput
from orchestrator.planning.plan import TaskPlan
from orchestrator.planning.spec import HostSpec
from worker_entry import frames, markers, portlocks
from worker_entry.markers import beat_seconds

if TYPE_CHECKING:
    import paramiko

CLOSE_SECONDS = 2.0  # an agent told to quit: its exit awaited this long
FIRST_BEAT_SECONDS = 30.0  # python's start on a slow host, before the agent answers
LOST = "lost contact with"
EXIT_LOST = 255  # ssh's own code for a lost connection; `exit_reason` says which
_EARLY_MAX = 1 << 20  # a standby's output before GO (it writes nothing): held up to this
_SYNC_MAX = 64 << 10  # a login shell's chatter before the agent's SYNC


class SshError(BackendError):
    """A host could not be reached, authenticated or used; the message names the host."""


def refused(name: str, address: str, error: BaseException) -> SshError:
    """A session sshd would not open (`ChannelException`: its MaxSessions, or sessions
    turned off), said so: the host, what sshd said, what to change."""
    said = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return SshError(f"host {name} ({address}): sshd refused a new session ({said}); tfo "
                    "holds at most 2 sessions on a host at once: set `MaxSessions` to 2 or "
                    "more in the host's sshd_config (its default is 10)")


# sshd frees a session's slot only once its command has exited and both ends' CLOSE are
# through: a session opened right after another was closed (the probe's or the copy's, then
# the agent's) can meet MaxSessions for a moment. Refusals are tried again this long.
REFUSED_RETRY_SECONDS = (0.05, 0.2, 0.5, 1.0)


def open_session(transport: paramiko.Transport, name: str, address: str,
                 timeout: float, sleep: Callable[[float], None] = time.sleep
                 ) -> paramiko.Channel:
    """A new session; one sshd still refuses after REFUSED_RETRY_SECONDS raises `refused`."""
    import paramiko

    for wait in (*REFUSED_RETRY_SECONDS, None):
        try:
            return transport.open_session(timeout=timeout)
        except paramiko.ChannelException as e:
            if wait is None:
                raise refused(name, address, e) from None
            sleep(wait)
    raise AssertionError("unreachable")


def agent_command(host: HostSpec, env: Mapping[str, str] | None = None) -> str:
    """The shell line that starts a host's agent, with `env`: the startup variables its
    tasks share (worker_entry.forkstart), so that it can fork them. Names that are not shell
    names are left out (those tasks are exec'd); values are quoted, a leading ~ expanded."""
    workdir = _remote_path(host.workdir)
    return (f"mkdir -p {workdir} && cd {workdir} && {exports(env)}exec "
            f"{shlex.quote(host.python)} -m worker_entry.agent {host.lifeline_seconds:g}")


_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def exports(env: Mapping[str, str] | None) -> str:
    """`export K=V && ` for each variable, quoted, a leading ~ expanded there; a name that is
    no shell name is left out."""
    return "".join(f"export {k}={_remote_path(v)} && " for k, v in (env or {}).items()
                   if _SHELL_NAME.fullmatch(k))


def _remote_path(path: str) -> str:
    """Quoted, but a leading ~ still expands on the remote side."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (shlex.quote(path[1:]) if len(path) > 1 else "")
    return shlex.quote(path)


class HostAgent:
    """One host's agent and its tasks (by slot)."""

    def __init__(self, name: str, host: HostSpec, transport: paramiko.Transport,
                 drop: Callable[[], None], env: Mapping[str, str] | None = None,
                 probe: paramiko.Channel | None = None) -> None:
        """Opens the session, starts the agent with `env` (agent_command), or tells the
        preflight's `probe`, still waiting on its channel, to become it; then waits for its
        SYNC (bounded); SshError if not."""
        import paramiko

        self.name, self.host, self._drop = name, host, drop
        self._timeout, self.quiet = host.connect_timeout_seconds, host.lifeline_seconds
        self._send_lock = threading.Lock()
        self._lock = threading.Condition()
        self._tasks: dict[int, AgentTask] = {}
        self._answers: dict[int, bytes] = {}  # slot → STARTED/FAILED payload, until taken
        self._next_slot = 1
        self.lost: str | None = None  # why the host is lost
        self._closed = False
        self._reader = frames.Reader(frames.TO_COORDINATOR)
        try:
            if probe is not None:  # preflight._PROBE, started with the same `env`
                self._chan = probe
                probe.sendall(f"agent {host.lifeline_seconds:g}\n".encode())
            else:
                self._chan = open_session(transport, name, host.address, self._timeout)
                self._chan.set_combine_stderr(True)
                self._chan.exec_command(agent_command(host, env))
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise SshError(f"host {name} ({host.address}): could not start its agent: "
                           f"{e or type(e).__name__}") from None
        self._sync()
        self.heard = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"agent-{name}", daemon=True)
        self._thread.start()

    def _sync(self) -> None:
        """Skip what comes before SYNC; SshError with what the host said instead."""
        seen = b""
        until = time.monotonic() + max(FIRST_BEAT_SECONDS, self._timeout)
        self._chan.settimeout(0.5)
        while frames.SYNC not in seen:
            try:
                data = self._chan.recv(4096)
            except OSError:  # socket.timeout
                data = None
            if data == b"" or time.monotonic() > until or len(seen) > _SYNC_MAX:
                with contextlib.suppress(Exception):  # an adopted probe's stderr is apart
                    if self._chan.recv_stderr_ready():
                        seen += self._chan.recv_stderr(4096)
                self._chan.close()
                said = seen.decode(errors="replace").strip().splitlines()[-1:] or [""]
                raise SshError(f"host {self.name} ({self.host.address}): its agent did not "
                               f"start (`{self.host.python} -m worker_entry.agent` in "
                               f"{self.host.workdir}): {said[0][:300] or 'no answer'}")
            seen += data or b""
        rest = seen.split(frames.SYNC, 1)[1]
        if rest:
            self._dispatch(rest)

    # ---- requests -------------------------------------------------------------------
    def send(self, kind: bytes, slot: int = 0, payload: bytes = b"") -> bool:
        if self.lost is not None:
            return False
        try:
            with self._send_lock:
                self._chan.sendall(frames.frame(kind, slot, payload))
        except (OSError, EOFError) as e:
            self._lose(f"the connection dropped ({e or type(e).__name__})")
            return False
        return True

    def start(self, items: list[tuple[TaskPlan, int, bool]]) -> list[AgentTask | Exception]:
        """Each task's START at once, then each answer (its pid), in order."""
        handles: list[AgentTask] = []
        for task, attempt, standby in items:
            with self._lock:
                slot, self._next_slot = self._next_slot, self._next_slot + 1
                handle = AgentTask(self, slot, task, attempt, standby)
                self._tasks[slot] = handle
            handles.append(handle)
            env = {**task.env, "TFO_ATTEMPT": str(attempt),
                   markers.LIFELINE_ENV: markers.LIFELINE_STDIN}
            if standby:
                env[markers.STANDBY_ENV] = "1"
            self.send(frames.START, slot, json.dumps(
                {"command": task.command, "env": env, "cwd": task.cwd, "port": task.port,
                 "owner": portlocks.owner_of(task.env)}).encode())
        until = time.monotonic() + self._timeout + 5.0  # a fork each: milliseconds
        answers: list[AgentTask | Exception] = []
        for handle in handles:
            with self._lock:
                while handle.slot not in self._answers and self.lost is None \
                        and time.monotonic() < until:
                    self._lock.wait(0.1)
                said = self._answers.pop(handle.slot, None)
            if said is None:
                why = self.lost or f"no answer in {self._timeout + 5:g} s"
                self._lose(why)
                answers.append(SshError(f"host {self.name} ({self.host.address}): could not "
                                        f"start {handle.task.name}: {why}"))
                self._forget(handle)
            elif said.isdigit():
                handle.pid = int(said)
                answers.append(handle)
            else:
                self._forget(handle)
                answers.append(SshError(f"host {self.name}: could not start "
                                        f"{handle.task.name}: "
                                        f"{said[1:].decode(errors='replace')[:300]}"))
        return answers

    def _forget(self, handle: AgentTask) -> None:
        """No more frames for it: it ended, was discarded, or never started."""
        with self._lock:
            self._tasks.pop(handle.slot, None)
        handle._close_exit_fd()

    def close(self) -> None:
        """QUIT (the agent kills its tasks and exits), its exit awaited for CLOSE_SECONDS at
        most (its channel's end: tfo returns with nothing of the run left on the host), and
        close the channel."""
        self._closed = True
        if self.send(frames.QUIT):
            until = time.monotonic() + CLOSE_SECONDS
            with self._lock:
                while self.lost is None and time.monotonic() < until:
                    self._lock.wait(0.05)
        with contextlib.suppress(Exception):  # its reader may be dropping the connection
            self._chan.close()

    @property
    def alive(self) -> bool:
        return self.lost is None and not self._closed

    def silence(self) -> float:
        """The silence that means lost once it is over, else 0."""
        return self.quiet if time.monotonic() - self.heard > self.quiet else 0.0

    # ---- the reader thread ----------------------------------------------------------
    def _run(self) -> None:
        beat, beat_at = beat_seconds(self.quiet), 0.0
        while self.lost is None:
            now = time.monotonic()
            if now - beat_at >= beat:
                beat_at = now
                self.send(frames.BEAT)
            try:
                # Woken by the host's frames, else when the next beat is due.
                self._chan.settimeout(max(0.05, beat_at + beat - now))
                data = self._chan.recv(65536)
            except TimeoutError:
                self.check_silence()
                continue
            except OSError:
                data = b""
            if not data:
                self._lose("the connection dropped" if not self._closed else "closed")
                return
            self.heard = time.monotonic()
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        try:
            found = self._reader.feed(data)
        except frames.FrameError as e:
            self._lose(f"its agent's stream is broken ({e})")
            return
        for kind, slot, payload in found:
            if kind in (frames.STARTED, frames.FAILED):
                with self._lock:
                    self._answers[slot] = payload if kind == frames.STARTED \
                        else b"!" + payload
                    self._lock.notify_all()
                continue
            with self._lock:
                handle = self._tasks.get(slot)
            if handle is None:
                continue
            if kind == frames.OUTPUT:
                handle.output_bytes(payload)
            elif kind == frames.EXITED:
                with contextlib.suppress(ValueError):
                    handle.exited(int(payload))

    def _lose(self, why: str) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.lost = why
            handles = list(self._tasks.values())
            self._lock.notify_all()
        if not self._closed:
            for h in handles:
                h.host_lost(f"{LOST} {self.name}: {why}")
        with contextlib.suppress(Exception):
            self._chan.close()
        self._drop()

    def check_silence(self) -> None:
        if self.lost is None and not self._closed and (quiet := self.silence()):
            self._lose(f"no heartbeat for {quiet:g} s")


def _task_output(task: TaskPlan) -> TaskOutput:
    """A task's output, fed by its host's reader (no thread of its own)."""
    return TaskOutput(task.log_path, None, f"ssh-{task.name}")


class ExitSignal:
    """An eventfd, readable once a task exited or its host is lost: the supervisor sleeps on
    it (polling 128 handles every 50 ms cost an idle coordinator more than its tasks' beats).
    The owner sets and closes it under one lock: a set never writes to a closed fd."""

    def __init__(self) -> None:
        self.fd: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def set(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.eventfd_write(self.fd, 1)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class AgentTask:
    """One task (one attempt) on a host's agent; the TaskHandle the supervisor holds."""

    def __init__(self, agent: HostAgent, slot: int, task: TaskPlan, attempt: int,
                 standby: bool) -> None:
        self._agent, self.slot, self.task, self.attempt = agent, slot, task, attempt
        self.pid: int | None = None
        self.warm = False  # a standby that was told to go
        self.exit_reason: str | None = None
        self._returncode: int | None = None
        self._lock = threading.Lock()
        self._exit = ExitSignal()  # set and closed under the lock
        self._early = bytearray()  # a standby's output before GO
        self._output: TaskOutput | None = None if standby else _task_output(task)

    # ---- from the reader thread ------------------------------------------------------
    def output_bytes(self, data: bytes) -> None:
        with self._lock:
            if self._output is not None:
                self._output.feed(data)
            elif len(self._early) < _EARLY_MAX:
                self._early += data

    def exited(self, code: int) -> None:
        with self._lock:
            if self._returncode is None:
                self._returncode = code
                self._exit.set()
            if self._output is not None:
                self._output.end()

    def host_lost(self, why: str) -> None:
        with self._lock:
            if self._returncode is not None:
                return
            self._returncode, self.exit_reason = EXIT_LOST, why
            self._exit.set()
            if self._output is not None:
                self._output.note(f"[tfo] {why}; the task stops itself on its side")
                self._output.end()

    def _close_exit_fd(self) -> None:
        with self._lock:
            self._exit.close()

    # ---- the TaskHandle -------------------------------------------------------------
    @property
    def exit_fd(self) -> int | None:
        return self._exit.fd

    def poll(self) -> int | None:
        if self._returncode is None:
            self._agent.check_silence()
        return self._returncode

    def lines(self) -> list[str]:
        return self._output.lines() if self._output is not None else []

    def relink_log(self, path: str) -> bool:
        """The run directory was made again: the attempt's log goes on at `path`."""
        return self._output is not None and self._output.relink(path)

    def terminate(self) -> None:
        self._agent.send(frames.SIGNAL, self.slot, b"TERM")

    def kill(self) -> None:
        self._agent.send(frames.SIGNAL, self.slot, b"KILL")

    def request_stacks(self) -> None:
        self._agent.send(frames.INPUT, self.slot, markers.STACKS)

    def go(self) -> None:
        """A standby's turn: it runs as a task started now would (worker_entry.standby)."""
        with self._lock:
            self._output = _task_output(self.task)
            early, self._early = bytes(self._early), bytearray()
            if early:
                self._output.feed(early)
            if self._returncode is not None:
                self._output.end()
        self._agent.send(frames.INPUT, self.slot, markers.GO)
        self.warm = True

    def discard(self) -> None:
        """End a standby that was never used. Its temp dir is the running attempt's."""
        self.kill()
        self._agent._forget(self)

    def close(self, timeout: float = 1.0) -> list[str]:
        assert self._output is not None, "a standby that never ran is discarded, not closed"
        rest = self._output.close(timeout)
        self._agent.send(frames.CLEAN, self.slot, self.task.tmp_dir.encode())
        self._agent._forget(self)
        return rest
