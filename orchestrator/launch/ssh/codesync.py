"""The job's code copied to the lab hosts' workdirs (`CodeSync`), over a host's connection:
what to copy (`job_packages`; which of their files, launch/projectfiles.py: no ignored files,
credentials or symlinks out of the project), what is there already (same size, mtime and
mode: skipped), whether it fits (the workdir's free space, checked first: the preflight's
probe asks, `plan`). Each file is written as `.tfo-partial`, its mode set before its first
byte (a 0600 file is never readable by others there), a sparse one's data only (its holes
stay holes), and renamed, removed on failure or interrupt; the sftp session is closed before
the host's agent opens its own (at most 2 sessions on a host at once)."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.launch.ssh.hostagent import SshError, _remote_path
from orchestrator.launch.ssh.projectfiles import SyncFile
from orchestrator.launch.ssh.remote import PROBE_SECONDS, bounded, remote_exec, run_remote
from orchestrator.planning.plan import Plan
from orchestrator.planning.spec import HostSpec, SpecError

if TYPE_CHECKING:  # fabric and paramiko cost 0.16 s to import: only when a host is reached
    import fabric
    import paramiko

@dataclass
class Workdir:
    """What a host says of its workdir: its path there, free bytes, and the job's files
    already there (relative path → size, whole-second mtime, permission bits)."""

    root: str
    free: int | None
    there: dict[str, tuple[int, int, int]]


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


class CodeSync:
    """Copies to the hosts; `stop` interrupts the copies under way (a signal in the caller)."""

    def __init__(self, hosts: Mapping[str, HostSpec],
                 connection: Callable[[str], fabric.Connection],
                 drop: Callable[[str], None]) -> None:
        self.hosts = hosts
        self._connection, self._drop = connection, drop  # the backend's: one per host
        self._cancel = threading.Event()  # the code sync was interrupted
        self._partials: set[tuple[str, str]] = set()  # (host, file) being written now
        self._planned: dict[str, tuple[tuple, str, list[SyncFile]]] = {}

    def copy(self, host: str, files: list[SyncFile], workdir: str) -> int:
        """Copy `files` (projectfiles) into the host's workdir, skipping files whose size,
        mtime and mode already match; first check that what will be written fits there. Each file
        goes to a `.tfo-partial` name and is renamed when whole: a copy that fails or is
        interrupted removes its partial file. Returns files copied."""
        planned = self._planned.pop(host, None)
        if planned is not None and planned[0] == _files_key(files, workdir):
            root, todo = planned[1], planned[2]  # fits looked a moment ago
        else:
            root, todo = self._to_copy(host, files, workdir)
        if not todo:
            return 0
        conn = self._connection(host)
        sftp = self._sftp(host, conn)
        try:
            for f in todo:
                self._put(host, conn, sftp, f, f"{root}/{f.rel}")
        finally:
            sftp.close()  # its session: the agent's comes next
        return len(todo)

    def up_to_date(self, host: str, files: list[SyncFile], workdir: str) -> bool:
        """The host has every file as it is here, as its preflight's probe said a moment
        ago (`plan`): nothing to copy."""
        planned = self._planned.get(host)
        return planned is not None and planned[0] == _files_key(files, workdir) \
            and not planned[2]

    def stop(self) -> None:
        """The copies interrupted: each stops at its next chunk and removes its partial file;
        one that did not stop in time has it removed on a session of its own."""
        self._cancel.set()
        until = time.monotonic() + 2.0  # the copies stop and remove their partial files
        while self._partials and time.monotonic() < until:
            time.sleep(0.02)
        for host, partial in list(self._partials):  # a copy that did not stop in time
            remote_exec(self._connection(host), f"rm -f {shlex.quote(partial)}",
                        self.hosts[host].connect_timeout_seconds)

    def _to_copy(self, host: str, files: list[SyncFile], workdir: str
                 ) -> tuple[str, list[SyncFile]]:
        """`plan` with what the host says now (one command): where the preflight's probe
        did not ask, or the files changed since."""
        timeout = self.hosts[host].connect_timeout_seconds
        conn = self._connection(host)
        where = f"{_remote_path(workdir)}"
        # The files' sizes, mtimes and modes there in the same command (GNU stat), where the
        # list fits in one argument; else one sftp stat each (a round trip each).
        listed = " ".join(shlex.quote(f.rel) for f in files)
        stat_them = len(listed) < _STAT_ARGS_MAX
        status, out, err = run_remote(
            conn, f"mkdir -p {where} && cd {where} && pwd && df -Pk . && echo {_STATS} && "
            f"{{ stat -c '%s %Y %a %n' -- {listed if stat_them else '.'} 2>/dev/null; true; }}",
            timeout + PROBE_SECONDS, lambda: self._drop(host), host)
        if status != 0:
            raise SshError(f"host {host}: cannot use workdir {workdir}: "
                           f"{err.strip()[-200:] or 'no answer'} (hosts.{host}.workdir)")
        head, _, stats = out.partition(f"{_STATS}\n")
        state = Workdir(head.splitlines()[0].strip(), _df_free(head), {})
        for line in stats.splitlines():
            with contextlib.suppress(ValueError):
                size, mtime, mode, rel = line.split(" ", 3)
                state.there[rel] = (int(size), int(mtime), int(mode, 8))
        if not stat_them:
            sftp = self._sftp(host, conn)
            try:
                for f in files:
                    with contextlib.suppress(OSError):
                        rst = sftp.stat(f"{state.root}/{f.rel}")
                        state.there[f.rel] = (rst.st_size or 0, int(rst.st_mtime or 0),
                                              (rst.st_mode or 0) & 0o777)
            finally:
                sftp.close()
        return self.plan(host, files, workdir, state)

    def plan(self, host: str, files: list[SyncFile], workdir: str, state: Workdir
             ) -> tuple[str, list[SyncFile]]:
        """(the workdir's path there, the files to copy: not there with the same size, mtime
        and mode), kept for the sync that follows; SshError where they do not fit in its free
        space. `state` is what the host said of its workdir: the preflight's probe asks."""
        todo = [f for f in files
                if state.there.get(f.rel) != (f.size, int(f.path.stat().st_mtime), f.mode)]
        need = sum(f.written for f in todo)
        if state.free is not None and need > state.free:
            raise SshError(f"host {host}: no space left in {state.root}: the code sync writes "
                           f"{_size(need)} there, {_size(state.free)} free "
                           f"(hosts.{host}.workdir)")
        self._planned[host] = (_files_key(files, workdir), state.root, todo)
        return state.root, todo

    def _sftp(self, host: str, conn: fabric.Connection) -> paramiko.SFTPClient:
        timeout = self.hosts[host].connect_timeout_seconds
        sftp = bounded(conn.client.open_sftp, timeout, f"host {host}: opening sftp",
                       lambda: self._drop(host))
        sftp.get_channel().settimeout(timeout + PROBE_SECONDS)  # each request's answer
        return sftp

    def _put(self, host: str, conn: fabric.Connection, sftp: paramiko.SFTPClient, f: SyncFile,
             remote: str) -> None:
        partial = remote + ".tfo-partial"
        self._partials.add((host, partial))
        path, size = f.path, f.written

        def check_cancel() -> None:
            if self._cancel.is_set():
                raise SshError(f"host {host}: code sync interrupted")

        st = path.stat()
        try:
            _sftp_makedirs(sftp, remote.rsplit("/", 1)[0])
            _send(sftp, f, partial, check_cancel)
            sftp.utime(partial, (st.st_atime, st.st_mtime))
            sftp.posix_rename(partial, remote)
        except BaseException as e:  # an interrupt too: no partial file is left behind
            # On a channel of its own: the sftp session may be mid-request.
            remote_exec(conn, f"rm -f {shlex.quote(partial)}",
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


_STATS = "--tfo-stats--"
_STAT_ARGS_MAX = 100_000  # Linux takes 128 KiB in one argument (the command is one)


def _files_key(files: list[SyncFile], workdir: str) -> tuple:
    """What a host's list of files to copy depends on here: the files as they are now."""
    return workdir, tuple((f.rel, f.size, int(f.path.stat().st_mtime), f.mode) for f in files)


BIG_FILE = 64 << 20  # a file the sync names: it goes to every host
_CHUNK = 32768  # an sftp write's most (paramiko's, and OpenSSH's servers')


def big_file_note(f: SyncFile, hosts: int) -> str:
    """What the sync says of a file of BIG_FILE or more before it copies it."""
    how = (f"sparse: {_size(f.on_disk)} on disk here, kept sparse there" if f.sparse
           else "copied whole")
    return (f"sync: {f.rel} is {_size(f.size)} ({how}), to each host ({hosts}); move it out of "
            "the job's code directory if the tasks do not need it")


def _send(sftp: paramiko.SFTPClient, f: SyncFile, remote: str,
          check_cancel: Callable[[], None]) -> None:
    """`f` written to `remote`: its mode set first, then its data; a sparse file's data
    extents only, at their offsets (the server's writes past the end leave holes), and its
    length set last."""
    with open(f.path, "rb") as src, sftp.open(remote, "wb") as dst:
        dst.chmod(f.mode)  # before any byte: the file was made with the server's umask
        dst.set_pipelined(True)
        for start, end in (_extents(src.fileno()) if f.sparse else [(0, None)]):
            src.seek(start)
            dst.seek(start)
            pos = start
            while end is None or pos < end:
                data = src.read(_CHUNK if end is None else min(_CHUNK, end - pos))
                if not data:
                    break
                dst.write(data)
                pos += len(data)
                check_cancel()
        if f.sparse:
            dst.truncate(os.fstat(src.fileno()).st_size)  # a hole at its end too


def _extents(fd: int) -> Iterator[tuple[int, int | None]]:
    """A file's data extents (SEEK_DATA/SEEK_HOLE); the whole file where the filesystem
    cannot tell."""
    size, pos = os.fstat(fd).st_size, 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole after pos
                return
            yield pos, None
            return
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, end
        pos = end


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
