"""The run directory's own faults, while the job runs: deleted under it, or its disk full.

    watch = RunDirWatch(run_dir)            # before anything starts: plan.json kept in memory
    watch.check(job, now)                   # each round; looks every CHECK_SECONDS
    watch.notes                             # what the summary says of it

Deleted (`rm -rf runs/` at epoch 3, a cleanup script): tfo still holds events.jsonl and each
task's log open, and Linux reads a deleted file back through /proc/self/fd. Within
CHECK_SECONDS the directory is made again with what tfo holds written back (events.jsonl,
the logs, plan.json and cluster.yaml from memory, a new lock), the events go on there, and
what is gone for good (the backups, the model, TensorBoard's files, the tasks' temp files:
written by the tasks, never held by tfo) is said: a `[tfo]` line, a `run_dir_restored`
event, and a line in the summary. If it cannot be made again, the job stops, saying so.

A write of events.jsonl that fails (a full disk: ENOSPC) stops the job at once: its reason
names the file and the error, the file ends at its last whole record (rundir.EventLog), and
`tfo status` reads it as a run that ended abnormally.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import IO

from orchestrator.loop.decide import JobState
from orchestrator.loop.job import Job
from orchestrator.runs.rundir import CLUSTER, EVENTS, LOCK, LOGS, PLAN, RunDir, unlinked, write_back

CHECK_SECONDS = 1.0  # a deleted run directory is noticed within this (a listdir and fstats)
RESTORED = {PLAN, CLUSTER, EVENTS, LOGS, LOCK}  # what tfo can put back
# What the tasks wrote there, and what its loss means.
LOST_WORDS = {"backup": "backup/ (BackupAndRestore's state: a restart starts over)",
              "model": "model/", "tensorboard": "tensorboard/",
              "tmp": "tmp/ (the tasks' temp files)"}


class RunDirWatch:
    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        # plan.json, cluster.yaml: written back from here, with their modes (plan.json's
        # env may hold secrets), as is the directory's own.
        self._kept: dict[str, tuple[bytes, int]] = {}
        for name in (PLAN, CLUSTER):
            with contextlib.suppress(OSError):
                path = Path(run_dir.path, name)
                self._kept[name] = (path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
        try:
            self._mode = stat.S_IMODE(os.stat(run_dir.path).st_mode)
        except OSError:
            self._mode = 0o700
        self._seen = self._entries() or set()
        self._checked_at = float("-inf")
        self._lock: IO[bytes] | None = None  # the new lock, once the directory was made again
        self.notes: list[str] = []  # for the summary

    def _entries(self) -> set[str] | None:
        try:
            return set(os.listdir(self.run_dir.path))
        except OSError:
            return None

    def check(self, job: Job, now: float) -> None:
        if job.events.error is not None:
            return full(job, job.events.error)
        if now - self._checked_at < CHECK_SECONDS:
            return None
        self._checked_at = now
        entries = self._entries()
        logs = [r for r in job.records.values() if r.log is not None and unlinked(r.log.fileno())]
        if entries is not None and not job.events.unlinked and not logs \
                and not (self._seen & RESTORED) - entries:
            self._seen |= entries
            return None
        return self._restore(job, entries or set())

    def _restore(self, job: Job, entries: set[str]) -> None:
        rd = self.run_dir
        lost = sorted(self._seen - entries - RESTORED)
        try:
            Path(rd.path).mkdir(mode=self._mode, parents=True, exist_ok=True)
            Path(rd.logs).mkdir(mode=self._mode, exist_ok=True)
            if job.events.unlinked:
                job.events.relink()
            for name, (data, mode) in self._kept.items():
                path = Path(rd.path, name)
                if not path.exists():
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
            for rec in job.records.values():
                if rec.log is None or not unlinked(rec.log.fileno()):
                    continue
                rec.log.flush()
                relink = getattr(rec.handle, "relink_log", None)
                if relink is None or not relink(rec.task.log_path):  # no live output: ours
                    os.close(write_back(rec.log.fileno(), rec.task.log_path))
                rec.log.close()
                rec.log = open(rec.task.log_path, "a", buffering=1)  # noqa: SIM115 (kept)
            if not Path(rd.path, LOCK).exists():
                self._relock()
        except OSError as e:
            return job.end(JobState.FAILED, f"run directory {rd.path} was deleted during the "
                           f"run and cannot be made again ({e.strerror or e}); the job was "
                           "stopped")
        words = (f"run directory {rd.path} was deleted during the run; made again, with "
                 "events.jsonl, plan.json and the logs written back from tfo's open files"
                 + (f"; lost: {', '.join(LOST_WORDS.get(n, n) for n in lost)}" if lost else ""))
        job.events.write("run_dir_restored", lost=lost)
        job.echo("tfo", words)
        self.notes.append(words)
        self._seen = self._entries() or set()
        return None

    def _relock(self) -> None:
        lock = open(Path(self.run_dir.path, LOCK), "a+b")  # noqa: SIM115 (held for the run)
        with contextlib.suppress(OSError):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"{os.getpid()}\n".encode())
        lock.flush()
        self._lock = lock

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()


def full(job: Job, error: OSError) -> None:
    """events.jsonl cannot be written (ENOSPC, EIO, ...): the job stops, naming the file."""
    hint = ("the file system holding the run directory is full; free space there or give "
            "--run-dir on another" if error.errno in (errno.ENOSPC, errno.EDQUOT) else
            "the run directory cannot be written")
    job.end(JobState.FAILED, f"cannot write {error.filename}: {error.strerror}: {hint}; the "
            "job was stopped (events.jsonl ends at its last whole event)")
