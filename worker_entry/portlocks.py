"""Ports a tfo job holds on a host for its lifetime, between its attempts too (`Reservations`).

A port that is free now may be a live job's, between two attempts of its task: the kernel
cannot tell, so each job reserves its ports: one file per port and network namespace (ports
are per namespace) under a per-user runtime directory, `flock`ed while the job lives and
naming its run. The kernel lets go when the holder ends, SIGKILL too: nothing goes stale.
Locally the coordinator holds them (launch/local.py); on a lab host the preflight's probe
(this file's source runs in it: standard library only, self-contained) and then the host's
agent (worker_entry/agent.py), which is the probe where the code was there already, else
takes each task's port at its start. Two jobs reserve in ascending port order and stop at
the first one held: of two started together, one gets all its ports.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat

RUNTIME_ENV = "TFO_RUNTIME_DIR"  # where the reservations are, if not /tmp/tfo-<uid>


def runtime_dir() -> str | None:
    """This user's directory for them, 0700 and theirs (anything else is another user's
    trap: not used); None where there is none."""
    path = os.environ.get(RUNTIME_ENV) or f"/tmp/tfo-{os.getuid()}"
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def _namespace() -> str:
    """This network namespace's id: the same port in another one is another port."""
    try:
        return f"net{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        return socket.gethostname()


def owner_line(run_id: str | None, run_dir: str | None) -> str:
    """What a reservation says of its holder, for the message another job shows."""
    return (f"run {run_id or '?'} ({run_dir or '?'}; tfo pid {os.getpid()} on "
            f"{socket.gethostname()})")


def owner_of(env: dict[str, str]) -> str:
    """The owner line of the run a task's environment (its TFO_JOB) belongs to."""
    try:
        job = json.loads(env.get("TFO_JOB") or "{}")
    except ValueError:
        job = {}
    if not isinstance(job, dict):
        job = {}
    return owner_line(job.get("run_id"), job.get("run_dir"))


def _same_file(fd: int, path: str) -> bool:
    """The locked file is still the one at `path` (not one its last holder removed)."""
    try:
        st, at = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (at.st_dev, at.st_ino)


class Reservations:
    """The ports this process holds, each an open, locked file; `reserve` one, `close` all
    (or end the process)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.held: dict[int, int] = {}  # port -> its locked file
        self.where = runtime_dir()
        self.space = _namespace()

    def _path(self, port: int) -> str:
        assert self.where is not None
        return os.path.join(self.where, f"port-{self.space}-{port}")

    def reserve(self, port: int) -> str | None:
        """None: the port is this job's now (or was); else who holds it (their line). Where
        no reservation can be made at all (no runtime directory), None: the bind check
        still stands."""
        if port in self.held or self.where is None:
            return None
        path = self._path(port)
        for _ in range(8):  # a holder removes its file as it lets go: the new one is locked
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
                os.close(fd)
                return holder or "another tfo job"
            if _same_file(fd, path):
                self._write(fd)
                self.held[port] = fd
                return None
            os.close(fd)  # locked a file its holder had just removed: again
        return None
    def reserve_all(self, ports: list[int]) -> dict[int, str]:
        """{port: holder} for the first port held by another (ascending order: of two jobs
        started together one gets them all), {} once all are this job's."""
        for port in sorted(set(ports)):
            holder = self.reserve(port)
            if holder is not None:
                return {port: holder}
        return {}

    def rename(self, owner: str) -> None:
        """The run is known now (ports `auto` are reserved before it has an id)."""
        self.owner = owner
        for fd in self.held.values():
            self._write(fd)

    def _write(self, fd: int) -> None:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, self.owner.encode("utf-8", "replace"), 0)
        except OSError:
            pass  # the lock is what counts; its words are for the other job's message

    def release(self, port: int) -> None:
        """Its file removed, then let go: the directory keeps only live jobs' ports."""
        fd = self.held.pop(port, None)
        if fd is not None:
            with contextlib.suppress(OSError):  # gone already: the lock is what counts
                os.unlink(self._path(port))
            os.close(fd)

    def close(self) -> None:
        for port in list(self.held):
            self.release(port)
