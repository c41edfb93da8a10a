"""Backup directories where the tasks keep them, read and filled by the coordinator for an
elastic resize (orchestrator/loop/resizing.py): on this machine through
orchestrator/elastic/backups.py, on a lab host through its SSH connection (a listing and the
`checkpoint` file to read one; sftp, through the coordinator, to fill one from any host's).
Each call is bounded by the host's connect timeout (a host that stops answering mid-resize
fails the copy, not the loop)."""

from __future__ import annotations

import posixpath
import shlex
import tempfile
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.elastic import backups
from orchestrator.planning.spec import LOCALHOST

if TYPE_CHECKING:
    import fabric

    from orchestrator.planning.spec import HostSpec

Dir = tuple[str, str]  # (host, path there), as elastic.Dir
Connect = Callable[[str], "tuple[fabric.Connection, HostSpec]"]  # host → its connection


def _sh(path: str) -> str:
    """A path for the host's shell: `~/x` as "$HOME"/'x', anything else quoted."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (f"/{shlex.quote(path[2:])}" if path[2:] else "")
    return shlex.quote(path)


def _sftp(path: str) -> str:
    """A path for sftp, which starts in the login directory: `~/x` as `x`."""
    return path[2:] if path.startswith("~/") else path


class BackupStore:
    """`held` and `copy` for any task's backup directory. `connect`: a lab host's
    connection (SshBackend.connection); None: this machine's only."""

    def __init__(self, connect: Connect | None = None, hosts: Collection[str] = ()) -> None:
        self._connect, self._hosts = connect, frozenset(hosts)

    def reaches(self, host: str) -> bool:
        """Its directories can be read and filled from here: this machine's, a lab host's."""
        return host == LOCALHOST or (self._connect is not None and host in self._hosts)

    def held(self, d: Dir) -> frozenset[int]:
        host, path = d
        if host == LOCALHOST:
            return backups.held(path)
        conn, spec = self._conn(host)
        chief = f"{_sh(path)}/{backups.SUBDIR}"
        out = conn.run(f"cat {chief}/{backups.STATE} 2>/dev/null; echo '@@tfo@@'; "
                       f"ls -1 {chief} 2>/dev/null", hide=True, warn=True, in_stream=False,
                       timeout=spec.connect_timeout_seconds * 3).stdout
        state, _, names = out.partition("@@tfo@@\n")
        return backups.saves_in(state, set(names.split()))

    def copy(self, source: Dir, target: Dir, save: int) -> None:
        """Make `target` hold backup `save`, copied from `source` (backups.copy_backup's
        steps: built beside the target, renamed once whole)."""
        if source[0] == target[0] == LOCALHOST:
            return backups.copy_backup(source[1], target[1], save)
        with tempfile.TemporaryDirectory(prefix="tfo-backup-") as tmp:
            here = source[1] if source[0] == LOCALHOST else self._fetch(source, save, tmp)
            if target[0] == LOCALHOST:
                return backups.copy_backup(here, target[1], save)
            self._send(here, target, save)
        return None

    def remove(self, d: Dir) -> None:
        """The backups in `d` gone (backups.remove_backup's step)."""
        host, path = d
        if host == LOCALHOST:
            return backups.remove_backup(path)
        conn, spec = self._conn(host)
        conn.run(f"rm -rf {_sh(path)}/{backups.SUBDIR}", hide=True, in_stream=False,
                 timeout=spec.connect_timeout_seconds * 3)
        return None

    def carry(self, host: str, old: str, new: str) -> bool:
        """A whole backup directory `old` copied to `new` on `host` (a rerun's); False: no
        `old` there."""
        if host == LOCALHOST:
            return backups.carry_backup(old, new)
        conn, spec = self._conn(host)
        out = conn.run(f"if [ -d {_sh(old)} ]; then mkdir -p {_sh(new)} && "
                       f"cp -pR {_sh(old)}/. {_sh(new)}/ && echo carried; fi",
                       hide=True, in_stream=False, timeout=spec.connect_timeout_seconds * 3)
        return "carried" in out.stdout

    def _conn(self, host: str) -> tuple[fabric.Connection, HostSpec]:
        if self._connect is None or host not in self._hosts:
            raise OSError(f"{host}: no connection to read its backups through")
        return self._connect(host)

    def _fetch(self, source: Dir, save: int, tmp: str) -> str:
        conn, _ = self._conn(source[0])
        sftp = conn.sftp()
        remote = posixpath.join(_sftp(source[1]), backups.SUBDIR)
        local = Path(tmp) / "source" / backups.SUBDIR
        local.mkdir(parents=True)
        for name in sftp.listdir(remote):
            if name.startswith(f"ckpt-{save}."):
                sftp.get(posixpath.join(remote, name), str(local / name))
        (local / backups.STATE).write_text(backups.state_text(save))
        return str(local.parent)

    def _send(self, here: str, target: Dir, save: int) -> None:
        conn, spec = self._conn(target[0])
        chief, partial = (f"{_sh(target[1])}/{backups.SUBDIR}{end}" for end in ("", ".tfo-partial"))
        limit = spec.connect_timeout_seconds * 3
        conn.run(f"rm -rf {partial} && mkdir -p {partial}", hide=True, in_stream=False,
                 timeout=limit)
        sftp = conn.sftp()
        remote = posixpath.join(_sftp(target[1]), f"{backups.SUBDIR}.tfo-partial")
        files = sorted(p for p in (Path(here) / backups.SUBDIR).glob(f"ckpt-{save}.*"))
        if not any(p.name == f"ckpt-{save}.index" for p in files):
            raise FileNotFoundError(f"{here}: no backup ckpt-{save} to copy")
        for p in files:
            sftp.put(str(p), posixpath.join(remote, p.name))
        with sftp.open(posixpath.join(remote, backups.STATE), "w") as f:
            f.write(backups.state_text(save))
        conn.run(f"rm -rf {chief} && mv {partial} {chief}", hide=True, in_stream=False,
                 timeout=limit)


def for_lab(hosts: Mapping[str, HostSpec], ssh: Callable[[], Any]) -> BackupStore:
    """The store of a run whose lab hosts are reached over SSH (`ssh()`: the run's
    SshBackend, made on first use)."""
    lab = [name for name, h in hosts.items() if h.backend == "ssh"]
    return BackupStore(lambda host: (ssh().connection(host), hosts[host]), lab)
