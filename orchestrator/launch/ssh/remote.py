"""Calls to a lab host over SSH (fabric, paramiko), each bounded in time, and per-host work for
many hosts at once. paramiko's own waits for a channel or a command's start are an hour, or
forever: a call that gets no answer in time drops the host's connection (`bounded`), and the
next use connects again, which says whether the host can be reached."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from orchestrator.launch.ssh.hostagent import SshError, open_session
from orchestrator.planning.spec import HostSpec

# paramiko logs a refused or failed channel at ERROR, which Python's last-resort handler
# prints on the user's terminal as "Secsh channel 2 open FAILED"; tfo says what went wrong
# in its own words (the host, what to change). A NullHandler keeps the records for an
# application that configures logging (they still propagate to its handlers).
logging.getLogger("paramiko").addHandler(logging.NullHandler())

if TYPE_CHECKING:  # fabric and paramiko cost 0.16 s to import: only when a host is reached
    import fabric
    import paramiko

FAN_OUT = 64  # hosts worked on at once: 500 hosts do not open 500 connections in an instant
PROBE_SECONDS = 60.0  # a command's own run on the host (the preflight's probe, a mkdir)
_TRANSPORT_WAKE_SECONDS = 1.0  # paramiko's own: 0.1 (its close does not wait for it)
T = TypeVar("T")


def bounded(call: Callable[[], T], timeout: float, what: str,
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


def run_remote(conn: fabric.Connection, command: str, timeout: float,
                give_up: Callable[[], None] = lambda: None, name: str = "",
                stdin: bytes = b"") -> tuple[int | None, str, str]:
    """A short command on the host, on a session of its own, bounded in time even over a
    cut network (fabric's `run` can wait an hour for a channel there, and its runner's
    threads cost more than the command here): (exit status, stdout, stderr); status None
    where it did not end in `timeout`. `stdin` is its input, then EOF. A session sshd
    refuses raises `refused`'s SshError."""
    transport = _transport(conn)

    def run() -> tuple[int | None, str, str]:
        chan = _session(transport, conn, timeout, name)
        try:
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = chan.makefile("rb").read(), chan.makefile_stderr("rb").read()
            status = chan.recv_exit_status()  # comes after the output's end: bounded above
            return status, out.decode(errors="replace"), err.decode(errors="replace")
        except OSError:  # socket.timeout: no end in time
            return None, "", ""
        finally:
            chan.close()

    return bounded(run, timeout + 1, "remote command", give_up)


def open_command(conn: fabric.Connection, command: str, stdin: bytes, timeout: float,
                 name: str = "") -> tuple[paramiko.Channel | None, int | None, str, str]:
    """A command that answers one line and then waits for more (the preflight's probe, which
    may become the host's agent), bounded as run_remote: (its channel, still open, None, what
    it printed up to its first line's end, ""); or where it ended first, (None, its exit
    status, stdout, stderr); status None: no answer in `timeout`, the channel closed."""
    transport = _transport(conn)

    def run() -> tuple[paramiko.Channel | None, int | None, str, str]:
        chan = _session(transport, conn, timeout, name)
        out = b""
        try:
            chan.exec_command(command)
            chan.sendall(stdin)
            while not _answered(out) and len(out) < 1 << 20:  # past a login shell's chatter
                data = chan.recv(65536)
                if not data:  # it ended: what it said, and how
                    err = chan.makefile_stderr("rb").read()
                    status = chan.recv_exit_status()
                    chan.close()
                    return None, status, out.decode(errors="replace"), \
                        err.decode(errors="replace")
                out += data
        except OSError:  # socket.timeout: no answer in time
            chan.close()
            return None, None, "", ""
        return chan, None, out.decode(errors="replace"), ""

    return bounded(run, timeout + 1, "remote command", lambda: None)


def _transport(conn: fabric.Connection) -> paramiko.Transport:
    transport = conn.client.get_transport()
    if transport is None or not transport.is_active():
        raise SshError("connection lost")
    return transport


def _session(transport: paramiko.Transport, conn: fabric.Connection, timeout: float,
             name: str) -> paramiko.Channel:
    """A session of its own, each wait on it bounded by `timeout`; one sshd refuses raises
    `refused`'s SshError."""
    chan = open_session(transport, name or conn.host, conn.host, timeout)
    chan.settimeout(timeout)
    return chan


def close_channel(chan: paramiko.Channel | None) -> None:
    if chan is not None:
        with contextlib.suppress(Exception):
            chan.close()


def _answered(out: bytes) -> bool:
    """A whole line that is a JSON object came last."""
    return out.endswith(b"\n") and out.rstrip(b"\n").rsplit(b"\n", 1)[-1].startswith(b"{")


def remote_exec(conn: fabric.Connection, command: str, timeout: float = 5.0) -> int | None:
    """`run_remote`'s exit status, or None (no answer, or no session)."""
    import paramiko

    try:
        return run_remote(conn, command, timeout)[0]
    except (paramiko.SSHException, OSError, EOFError, SshError):
        return None


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
