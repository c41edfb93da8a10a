"""The run directory, its one owner: where a run's plan, events, logs and scratch live.

    rd = RunDir.default("demo-20250101-120000-ab12")  # runs/<id>, absolute
    rd.log_path("worker", 1)                          # …/logs/worker-1.log
    rd.create(plan.to_json())                         # logs/ and plan.json, before anything starts
    events = rd.open_events(); events.write("task_started", "worker:1", pid=123)
    RunDir.find("last")                               # or a run directory, an id, an id's prefix
    runs, broken = list_runs()                        # RunInfo of each run under runs/ (tfo runs)

Paths are POSIX strings: a lab host's run directory (`RunDir.on_host`) lives under its
workdir, which may start with ~.

    runs/<run-id>/
        plan.json              what runs: enough to run it again (`tfo rerun`)
        cluster.yaml           only for `tfo run -- COMMAND`: the cluster file the flags made
        events.jsonl           one JSON record a line: every step the supervisor took
        logs/<role>-<i>.log    each task's complete output, every attempt
        tmp/<role>-<i>/        each task's TMPDIR, removed when it ends
        backup/<role>-<i>/     each task's BackupAndRestore state
        model/                 the default job.model_dir
        tensorboard/           the chief's training scalars (train/), the evaluator's (eval/)
        supervisor-error.log   only if tfo itself failed
        lock                   held (flock) by the tfo running it; holds that tfo's pid

The directory is its user's alone (0700), plan.json and cluster.yaml too (0600): they hold
the spec's `env:` values, an API token as often as not.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import posixpath
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, Any, BinaryIO

RUNS = "runs"  # under the directory tfo runs in, and under each lab host's workdir
PLAN, EVENTS, LOGS, TMP, BACKUP = "plan.json", "events.jsonl", "logs", "tmp", "backup"
TENSORBOARD = "tensorboard"
CLUSTER = "cluster.yaml"
CRASH_LOG = "supervisor-error.log"
LOCK = "lock"  # flock'ed by the tfo that runs it, while it runs
LAST = "last"


PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600  # a run's files are its user's alone
SHOWN_MATCHES = 10  # runs an ambiguous prefix lists (5,000 of them made a 140 KB message)


class RunDirError(Exception):
    """No such run, or more than one matches; the message says which and what to give."""


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, readable by its user only from its first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)  # a file that was there keeps its mode through O_CREAT
    with open(fd, "w") as f:
        f.write(text)


def task_file(role: str, index: int) -> str:
    """The name of a task's log, temp and backup entries: `worker-1`."""
    return f"{role}-{index}"


@dataclass(frozen=True)
class RunPaths:
    """Where a run's files are: the layout above, as POSIX strings, for this machine or a lab
    host (`on_host`); pure, nothing is read or made. RunDir adds the files themselves."""

    path: str

    @classmethod
    def default(cls, run_id: str, root: Path = Path(RUNS)) -> RunDir:
        return cls(str((root / run_id).resolve()))

    @classmethod
    def on_host(cls, workdir: str, run_id: str) -> RunDir:
        """A lab host's mirror of the run, under its workdir."""
        return cls(posixpath.join(workdir, RUNS, run_id))

    def __str__(self) -> str:
        return self.path

    def _join(self, *parts: str) -> str:
        return posixpath.join(self.path, *parts)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def plan_path(self) -> str:
        return self._join(PLAN)

    @property
    def cluster_path(self) -> str:
        return self._join(CLUSTER)

    @property
    def events_path(self) -> str:
        return self._join(EVENTS)

    @property
    def logs(self) -> str:
        return self._join(LOGS)

    @property
    def tmp(self) -> str:
        return self._join(TMP)

    @property
    def tensorboard(self) -> str:
        return self._join(TENSORBOARD)

    @property
    def crash_log(self) -> str:
        return self._join(CRASH_LOG)

    def log_path(self, role: str, index: int) -> str:
        return self._join(LOGS, f"{task_file(role, index)}.log")

    def tmp_dir(self, role: str, index: int) -> str:
        return self._join(TMP, task_file(role, index))

    def backup_dir(self, role: str, index: int) -> str:
        return self._join(BACKUP, task_file(role, index))


class RunDir(RunPaths):
    """A run directory on this machine: its lock, plan.json, events and logs, and finding a
    past run (`find`)."""

    def check_new(self) -> None:
        """Refuse a directory that holds a run already: two runs in one would mix their
        events, logs and plan.json. Raises RunDirError."""
        held = [n for n in (PLAN, EVENTS) if Path(self._join(n)).exists()]
        if held:
            raise RunDirError(f"run directory {self.path} holds a run already "
                              f"({', '.join(held)}): give a new --run-dir, or leave it out "
                              f"for a new {RUNS}/<run-id>; `tfo rerun {self.path}` runs it "
                              "again in a new one")

    def create(self, plan: dict[str, Any]) -> IO[bytes]:
        """The directory, its lock, logs/ and plan.json. The lock (flock on `lock`) is held
        by the returned file until it is closed or this process ends (the kernel lets go,
        even after SIGKILL). Raises RunDirError for a directory another tfo holds or that
        holds a run already, OSError."""
        Path(self.path).mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        os.chmod(self.path, PRIVATE_DIR)  # a --run-dir that was there already too
        lock = open(self._join(LOCK), "a+b")  # noqa: SIM115 (held for the run)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read(32).decode(errors="replace").strip() or "?"
            lock.close()
            raise RunDirError(f"run directory {self.path} is in use by another tfo (pid "
                              f"{holder}): give another --run-dir") from None
        try:
            self.check_new()  # again, under the lock: the other may have just finished
            lock.truncate(0)
            lock.write(f"{os.getpid()}\n".encode())
            lock.flush()
            Path(self.logs).mkdir(parents=True, exist_ok=True)
            write_private(Path(self.plan_path), json.dumps(plan, indent=2))
        except BaseException:
            lock.close()
            raise
        return lock

    def read_plan(self) -> dict[str, Any]:
        """plan.json as written; raises OSError or ValueError."""
        return json.loads(Path(self.plan_path).read_text())

    def open_events(self) -> EventLog:
        return EventLog(Path(self.events_path))

    def read_events(self) -> tuple[list[dict[str, Any]], int]:
        return read_events(Path(self.events_path))

    def held(self) -> bool:
        """Whether a tfo holds the run's lock now (it runs the job)."""
        try:
            with open(self._join(LOCK), "rb") as f:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    def task_logs(self) -> dict[str, Path]:
        """Each task's log by task name (`worker:1`), in name order."""
        return {p.stem.replace("-", ":", 1): p for p in sorted(Path(self.logs).glob("*.log"))}

    def remove_tmp(self) -> None:
        """tmp/ once it is empty: every task removed its own."""
        with contextlib.suppress(OSError):
            Path(self.tmp).rmdir()

    @classmethod
    def find(cls, ref: str | None = None, root: Path = Path(RUNS)) -> RunDir:
        """A run directory (a path), `last` (None too: the latest run under runs/), a run id
        or a prefix of one naming exactly one run; raises RunDirError."""
        if ref is None or ref == LAST:
            runs = sorted(root.glob(f"*/{EVENTS}"), key=lambda p: p.stat().st_mtime)
            if not runs:
                raise RunDirError(f"no run found under {root}/; give a run directory")
            return cls(str(runs[-1].parent))
        path = Path(ref)
        if "/" in ref or path.exists():
            return cls(str(path))
        found = sorted(p for p in root.glob(f"{ref}*") if p.is_dir())
        exact = [p for p in found if p.name == ref]
        if exact or len(found) == 1:
            return cls(str((exact or found)[0]))
        if not found:
            raise RunDirError(f"no run {ref!r} under {root}/; give a run directory, a run id, "
                              f"a prefix of one, or {LAST}")
        names = [p.name for p in found]
        more = len(names) - SHOWN_MATCHES
        listed = ", ".join(names[:SHOWN_MATCHES]) + (f" and {more} more" if more > 0 else "")
        raise RunDirError(f"{ref!r} names {len(found)} runs under {root}/: {listed}; give "
                          f"more of the id")


class Outcome(str, Enum):
    """A run as its events tell it: a job's final state, still running, or lost (its
    coordinator is gone and wrote no job_finished: killed, or its machine went down)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    RUNNING = "running"
    LOST = "lost"


@dataclass(frozen=True)
class RunInfo:
    """One line of `tfo runs`."""

    run_id: str
    name: str
    started: float  # unix time
    duration: float  # seconds, to the job's end, or to now while it runs
    outcome: Outcome
    reason: str
    restarts: int | None  # job-level, once it finished


# job_finished is the last record: it is found in the file's last bytes, however long the run.
_TAIL_BYTES = 64 * 1024


def outcome(run_started: dict[str, Any], job_finished: dict[str, Any] | None) -> Outcome:
    if job_finished is not None:
        try:
            return Outcome(job_finished.get("state"))
        except ValueError:
            return Outcome.FAILED
    return Outcome.LOST if coordinator_gone(run_started) else Outcome.RUNNING


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("event"), str) else None


def run_info(rd: RunDir) -> RunInfo:
    """What `tfo runs` says of one run, from plan.json, and the first and the last records of
    events.jsonl; raises OSError or ValueError for a run directory that is not a run's."""
    plan = rd.read_plan()
    name = plan.get("name") if isinstance(plan, dict) else None
    with open(rd.events_path, "rb") as f:
        first = _record(f.readline())
        f.seek(0, 2)
        f.seek(max(0, f.tell() - _TAIL_BYTES))
        tail = f.read().splitlines()
    if first is None or first["event"] != "run_started" or not isinstance(
            first.get("time"), int | float) or not isinstance(name, str):
        raise ValueError(f"{rd.events_path}: does not start with run_started")
    last = next((r for r in map(_record, reversed(tail)) if r is not None), None)
    finished = last if last is not None and last["event"] == "job_finished" else None
    end = finished.get("time") if finished else None
    restarts = finished.get("restarts") if finished else None
    return RunInfo(
        run_id=rd.name, name=name, started=first["time"],
        duration=(end if isinstance(end, int | float) else time.time()) - first["time"],
        outcome=outcome(first, finished), reason=str(finished.get("reason", "")) if finished
        else "", restarts=restarts if isinstance(restarts, int) else None)


def list_runs(root: Path = Path(RUNS)) -> tuple[list[RunInfo], int]:
    """Every run under `root`, oldest first, and how many directories there are not
    readable runs (no plan.json, no run_started: skipped, counted)."""
    runs, broken = [], 0
    for path in sorted(p for p in root.glob("*") if p.is_dir()):
        try:
            runs.append(run_info(RunDir(str(path))))
        except (OSError, ValueError):
            broken += 1
    return sorted(runs, key=lambda r: r.started), broken


def run_over(rd: RunDir) -> bool:
    """Whether nothing more will be written: the job finished, its coordinator is gone, or
    the directory is no readable run."""
    try:
        return run_info(rd).outcome is not Outcome.RUNNING
    except (OSError, ValueError):
        return True


# `tfo logs` reads a log this much at a time, whatever its size (it was read whole: 2.7 GB of
# memory for a 751 MB log); a longer line is printed in pieces of this size.
LOG_CHUNK = 1 << 20


def read_lines(path: Path, offset: int, whole: bool) -> Iterator[tuple[str, bool, int]]:
    """The lines of a log from byte `offset`, one at a time: (text, whether it ends a line,
    the offset after it). Complete lines only, unless `whole` (nothing more will be written);
    a line longer than LOG_CHUNK comes in pieces, every piece but its last `False`."""
    with open(path, "rb") as f:
        f.seek(offset)
        while piece := f.readline(LOG_CHUNK):
            ended = piece.endswith(b"\n")
            if not ended and len(piece) < LOG_CHUNK and not whole:
                return  # a line still being written: the next look reads it whole
            offset += len(piece)
            # Short and unended: the file's last line, whole.
            yield piece.rstrip(b"\n").decode(errors="replace"), \
                ended or len(piece) < LOG_CHUNK, offset


def last_lines(path: Path, n: int, keep: Callable[[str], bool],
               whole: bool) -> tuple[list[str], int]:
    """The last `n` lines of a log that `keep` accepts, read from its end, and the offset
    after them (where `tfo logs -f` goes on). Without `whole` a last line not yet ended is
    left for later. Memory: those lines and LOG_CHUNK, not the log."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return [], 0
        f.seek(end - 1)
        ended = f.read(1) == b"\n"
        backwards = _lines_backwards(f, end)
        unended = next(backwards)  # b"" after a final newline
        if not ended and not whole:
            end -= len(unended)
        found: list[str] = []
        for raw in itertools.chain([unended] if not ended and whole else [], backwards):
            line = raw.decode(errors="replace")
            if keep(line):
                found.append(line)
                if len(found) == n:
                    break
    return found[::-1], end


def _lines_backwards(f: BinaryIO, end: int) -> Iterator[bytes]:
    """The lines of the file's first `end` bytes, the last first, without their newlines (the
    first one yielded is b"" when those bytes end with one)."""
    pos, rest = end, b""
    while pos > 0:
        step = min(LOG_CHUNK, pos)
        pos -= step
        f.seek(pos)
        lines = (f.read(step) + rest).split(b"\n")
        rest = lines.pop(0)
        yield from reversed(lines)
    yield rest


class EventLog:
    """events.jsonl: one JSON object a line, with `time` (unix seconds) and `event`.

    Each record is one write(2) to a file opened O_APPEND. A write that fails (a full disk)
    cuts the file back to its last whole record (ftruncate needs no space) and nothing more
    is written: `error` says why, naming the file, and the loop stops the job. Deleted under
    us (`rm -rf` of the run directory), `relink` puts what it held back at its path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = _open_append(path)
        self.error: OSError | None = None

    def write(self, event: str, task: str | None = None, **fields: Any) -> None:
        if self.error is not None or self._fd < 0:
            return
        record = {"time": round(time.time(), 4), "event": event, "task": task, **fields}
        data = (json.dumps(record, default=str) + "\n").encode()
        try:
            if os.write(self._fd, data) < len(data):  # the disk filled up within it
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            self._cut_to_last_record()
            self.error = OSError(e.errno, e.strerror, str(self.path))

    def _cut_to_last_record(self) -> None:
        with contextlib.suppress(OSError):
            size = os.fstat(self._fd).st_size
            tail = os.pread(self._fd, min(size, _TAIL_BYTES), max(0, size - _TAIL_BYTES))
            if not tail.endswith(b"\n"):
                os.ftruncate(self._fd, size - len(tail) + tail.rfind(b"\n") + 1)

    @property
    def unlinked(self) -> bool:
        """The file was deleted (its directory too, maybe) while we write it."""
        return self._fd >= 0 and unlinked(self._fd)

    def relink(self) -> None:
        """What the deleted file held, written back at its path, and the writes go on there.
        Raises OSError (the directory cannot be made again)."""
        old, self._fd = self._fd, write_back(self._fd, self.path)
        os.close(old)

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def _open_append(path: Path | str) -> int:
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)


def write_back(fd: int, path: Path | str) -> int:
    """A deleted file we still hold open (`fd`, left open), copied whole to `path` (made
    anew): a new O_APPEND descriptor of it. Linux opens a deleted file again through
    /proc/self/fd. Raises OSError."""
    new = _open_append(path)
    try:
        os.ftruncate(new, 0)
        with open(f"/proc/self/fd/{fd}", "rb") as old:
            while chunk := old.read(LOG_CHUNK):
                os.write(new, chunk)
    except BaseException:
        os.close(new)
        raise
    return new


def unlinked(fd: int) -> bool:
    """Whether the open file `fd` was deleted (its directory too, maybe)."""
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return False


def read_events(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of an events.jsonl, and how many lines were not records (a line cut
    short by a crash, garbage): skipped, never fatal. Raises OSError."""
    records, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            records.append(record)
        else:
            bad += 1
    return records, bad


def coordinator_identity() -> dict[str, Any]:
    """Who supervises the run, for `tfo status` to tell a live run from a dead one; the
    create time tells a reused pid apart."""
    import psutil  # only where a run starts or is looked at: `tfo plan` and `--help` go without

    me = psutil.Process()
    return {"coordinator_pid": me.pid, "coordinator_created": me.create_time(),
            "coordinator_host": socket.gethostname()}


def coordinator_gone(run_started: dict[str, Any]) -> bool:
    """Whether the coordinator named in a run_started record is gone. False when that
    cannot be told: a run from an older tfo, or one supervised from another machine."""
    pid, created = run_started.get("coordinator_pid"), run_started.get("coordinator_created")
    if not isinstance(pid, int) or not isinstance(created, int | float) \
            or run_started.get("coordinator_host") != socket.gethostname():
        return False
    import psutil

    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - created) > 1.0 or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
